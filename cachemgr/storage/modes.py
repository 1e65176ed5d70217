"""Modes and capabilities (layer 0): the modes of the files and folders cachemgr creates in a
shared cache (:func:`file_mode_in`, :func:`dir_mode_in`, :func:`ensure_dir`), giving files back
to the sharing group (:func:`share_modes`, :func:`share_file`; ``CAP_FOWNER``:
:func:`has_cap_fowner`), and saying why a path cannot be used (:func:`access_hint`).

Files are group read/write and folders group-writable and setgid, never world-writable
(docs/design.md#sharing-and-locking).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

from cachemgr.constants import shared_file_mode
from cachemgr.peer import group_name, user_name
from cachemgr.storage import accessfix

#: Files are group read/write, never world-writable (docs/design.md#sharing-and-locking); others may
#: read them only where their folder lets others in (:func:`file_mode_in`).
FILE_MODE = 0o664


#: Folders are group-writable and setgid so new files keep the group
#: (docs/design.md#sharing-and-locking); others get what the folder above gives them, at most
#: ``r-x`` (:func:`dir_mode_in`).
DIR_MODE = 0o2775


#: What others may be given at most (read, and search for folders; never write).
OTHERS_AT_MOST = 0o005


def _others_given(folder_mode: int) -> int:
    """Others' bits a folder of mode ``folder_mode`` passes on to what cachemgr creates in
    it: only a folder shared on purpose — setgid, as the documented deployment makes the
    root (``chmod 2770``, or the old ``2775``) — says who may read the cache. Any other
    folder (``$HOME`` at ``0755``, ``/tmp`` at ``1777``, one made under umask ``022``) says
    nothing about it: there cachemgr gives others nothing, so it never makes a folder that
    its own "readable by every local user" warning then reports
    (docs/shared-cache.md#outsiders-read-nothing)."""
    return folder_mode & OTHERS_AT_MOST if folder_mode & stat.S_ISGID else 0


def file_mode_in(folder_mode: int) -> int:
    """The mode of a file cachemgr creates in a folder of mode ``folder_mode``: group
    read/write whatever the umask; readable by others only when a setgid folder gives others
    read (a ``2770`` root: ``0660``; a ``2775`` one: ``0664``; a ``0755`` one: ``0660``) —
    never more than the folder (docs/shared-cache.md#outsiders-read-nothing)."""
    return shared_file_mode(folder_mode)


def dir_mode_in(parent_mode: int) -> int:
    """The mode of a folder cachemgr creates in a folder of mode ``parent_mode``: ``rwx``
    for owner and group, others' bits as a setgid parent gives them (at most ``r-x``; none
    from any other parent: :func:`_others_given`), setgid where the parent has it (new files
    keep the sharing group; docs/design.md#where-the-cache-lives, #sharing-and-locking)."""
    return 0o770 | _others_given(parent_mode) | (parent_mode & stat.S_ISGID)


def _folder_mode(path: Path, dir_fd: int | None) -> int:
    """The mode of ``path``'s folder: ``dir_fd`` when given (the open folder), else its
    parent by name."""
    return os.fstat(dir_fd).st_mode if dir_fd is not None else os.stat(path.parent).st_mode


def file_mode_for(path: Path, dir_fd: int | None = None) -> int:
    """The mode a file cachemgr creates at ``path`` gets: :func:`file_mode_in` of its folder
    (``dir_fd`` when given, the open folder; else ``path``'s parent by name).

    :raises OSError: the folder cannot be ``stat``-ed.
    """
    return file_mode_in(_folder_mode(path, dir_fd))


def make_missing_folders(path: Path, mode_for: Callable[[Path], int]) -> None:
    """Create ``path`` and its missing parents, top down, each given ``mode_for(folder)``
    whatever the umask (set after ``mkdir``); one made meanwhile by another process is left.

    :raises OSError: e.g. ``EACCES`` or ``ENOTDIR``.
    """
    missing = []
    cur = path
    while not cur.exists():
        missing.append(cur)
        if cur.parent == cur:
            break
        cur = cur.parent
    for folder in reversed(missing):
        mode = mode_for(folder)
        try:
            os.mkdir(folder, mode & 0o777)
        except FileExistsError:
            continue
        os.chmod(folder, mode)


def ensure_dir(path: Path) -> Path:
    """Create ``path`` (and parents) group-shareable where missing; return it.

    New folders get :func:`dir_mode_in` their parent's mode: ``rwx`` for owner and group,
    others what the parent gives them (``2770`` under a ``2770`` root), the setgid bit when
    the parent has it (docs/design.md#where-the-cache-lives, #sharing-and-locking). Never
    world-writable.

    :raises OSError: e.g. ``EACCES`` or ``ENOTDIR`` (a file where a folder is expected).
    """
    make_missing_folders(path, lambda folder: dir_mode_in(os.stat(folder.parent).st_mode))
    if not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
    return path


def access_hint(path: Path, want: str = "writable") -> str:
    """One line saying why ``path`` is not ``want`` (writable/readable) by this user in a
    shared cache, and what to do (docs/design.md#sharing-and-locking) — instead of CANN's silent
    skip.

    Names the path, the user, the path's owner, group and mode, and a fix that follows from
    those modes (:func:`cachemgr.storage.accessfix.fix`: give the folder to a sharing group,
    ``chgrp G DIR && chmod 2770 DIR``, or join the group that may already; never group
    ``root``), or another cache folder.
    """
    user = user_name()
    head = f"{path} is not {want} by user {user}"
    try:
        st = os.stat(path)
        read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError as exc:
        return f"{head}: {exc.strerror}"
    if read_only and want == "writable":
        return f"{head}: it is on a read-only filesystem; use a writable cache folder"
    owner, group = user_name(st.st_uid), group_name(st.st_gid)
    head += f": it belongs to {owner}:{group}, mode {stat.filemode(st.st_mode)}"
    if st.st_uid == os.geteuid():
        return f"{head}; give yourself access (chmod u+rwX {path})"
    in_group = st.st_gid in set(os.getgroups()) | {os.getegid()}
    return head + accessfix.fix(path, st, want, user, owner, group, in_group)


#: CAP_FOWNER's bit in ``/proc/self/status`` ``CapEff`` (linux/capability.h).
CAP_FOWNER_BIT = 3


def has_cap_fowner() -> bool:
    """True when this process may change the mode of files it does not own (root, or
    ``AmbientCapabilities=CAP_FOWNER`` in the systemd unit)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_FOWNER_BIT & 1)
    except (OSError, ValueError):
        pass
    return os.geteuid() == 0


#: Which files of a folder may be given back: ``(name, lstat) -> bool`` (the cache's own
#: names, not renamed in: :func:`cachemgr.storage.groupmodes.ours`); None = every file.
Wanted: TypeAlias = Callable[[str, os.stat_result], bool] | None


def share_modes(
    folder: Path, fowner: bool | None = None, dir_fd: int | None = None, wanted: Wanted = None
) -> int:
    """Give a chip folder and its regular files back the group-sharing modes
    (docs/design.md#sharing-and-locking): ``g+rw`` on files, ``g+rwxs`` on the
    folder. CANN GE forces ``0640`` files and
    ``0750`` folders whatever the umask (``te_file_utils.cc`` ``CopyFileToCacheDir``,
    ``CreateMultiLevelDir``; ``te_cache_utils.cc`` ``LockAndOpenCacheFile``), which locks the
    other members of the group out. Only files this user owns, or every file with
    ``CAP_FOWNER``; never through a symlink (each file is opened ``O_NOFOLLOW`` and changed by
    descriptor). Returns how many it repaired: files that lacked ``g+rw``, and the folder when
    it lacked ``g+rwx`` — a folder cachemgr just made without the setgid bit (its parent has
    none: docs/design.md#where-the-cache-lives) gets it quietly, not counted, as nothing was wrong
    with it. Errors on one file are skipped. The folder is listed as a stream, never held as a list:
    a chip folder of 1,000,000 entries has 2,000,000 names (~170 MB as a list).

    :param dir_fd: ``folder``, open (:class:`~cachemgr.storage.safedir.SafeDir`: reached without
        following a link at any step, docs/security.md item 1); it stays open.
    :param wanted: only the files it accepts are changed
        (docs/security.md#3b-outsiders-read-nothing-ges-modes-are-given-back-on-sight).
    """
    fowner = has_cap_fowner() if fowner is None else fowner
    me = os.geteuid()
    changed = 0
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        dir_fd = os.dup(dir_fd) if dir_fd is not None else os.open(folder, flags | os.O_DIRECTORY)
    except OSError:
        return changed
    try:
        st = os.fstat(dir_fd)
        want = stat.S_IMODE(st.st_mode) | 0o2070
        if (st.st_uid == me or fowner) and stat.S_IMODE(st.st_mode) != want:
            with contextlib.suppress(OSError):
                os.fchmod(dir_fd, want & ~0o002)
                changed += (st.st_mode & 0o070) != 0o070
        with os.scandir(dir_fd) as it:
            for de in it:
                changed += _share_file(dir_fd, de.name, flags, me, fowner, st.st_gid, wanted)
    finally:
        os.close(dir_fd)
    return changed


def share_file(dir_fd: int, name: str, fowner: bool, gid: int, wanted: Wanted = None) -> bool:
    """Give one file of the open folder ``dir_fd`` back to the group (``g+rw``) as
    :func:`share_modes` does for each: a regular file with one name, of group ``gid`` (the
    folder's), owned by this user unless ``fowner`` (``CAP_FOWNER``); never through a link.
    Returns True when its mode was changed; errors are False. Only a file ``wanted`` accepts
    (docs/security.md#3b-outsiders-read-nothing-ges-modes-are-given-back-on-sight)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    return _share_file(dir_fd, name, flags, os.geteuid(), fowner, gid, wanted)


def _share_file(
    dir_fd: int, name: str, flags: int, me: int, fowner: bool, gid: int, wanted: Wanted
) -> bool:
    """One file of :func:`share_modes`: a regular file with one link (a hard link to a file
    elsewhere is never changed), of the folder's group, lacking ``g+rw``."""
    try:
        st = os.lstat(name, dir_fd=dir_fd)
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISREG(st.st_mode) or mode & 0o060 == 0o060:
            return False
        if st.st_nlink != 1 or st.st_gid != gid:
            return False
        if st.st_uid != me and not fowner:
            return False
        if wanted is not None and not wanted(name, st):
            return False
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        again = os.fstat(fd)
        if (again.st_ino, again.st_dev) != (st.st_ino, st.st_dev) or again.st_nlink != 1:
            return False
        if wanted is not None and not wanted(name, again):  # renamed in meanwhile
            return False
        os.fchmod(fd, (stat.S_IMODE(again.st_mode) | 0o060) & ~0o002)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
