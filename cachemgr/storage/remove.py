"""Tolerant removal (layer 0): of one name (:func:`safe_unlink`) and of whole trees, by
descriptor and never through a link (:func:`remove_tree_at`, :func:`remove_tree`,
:func:`open_up_tree`).

Removing a file that is already gone (``ENOENT``) or that another NFS host holds
(``ESTALE``) is normal, never fatal (docs/design.md#size-limits-and-eviction,
#sharing-and-locking).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Collection
from pathlib import Path
from typing import Any

from cachemgr.storage.kinds import GONE_ERRNOS, lstat_or_none

# the logger's name is the one these warnings always had (console.LOG_FORMAT shows it)
log = logging.getLogger("cachemgr.storage.fsutil")


def safe_unlink(path: Path, dir_fd: int | None = None) -> bool:
    """Remove ``path`` (a link itself, never its target); return True if this call removed
    it, False if it was already gone.

    ``ENOENT`` and ``ESTALE`` (another NFS host removed or holds it) are normal.

    :param dir_fd: the open folder of ``path`` (``unlinkat``).
    :raises OSError: for any other error (e.g. ``EACCES``).
    """
    return unlink_in(path.parent, path.name, dir_fd)


def unlink_in(folder: Path, name: str, dir_fd: int | None = None) -> bool:
    """:func:`safe_unlink` of ``folder / name``, the path built only for a failure's message
    (``unlinkat(dir_fd, name)`` with ``dir_fd``, the open ``folder``): gc removes tens of
    thousands of files, and a ``Path`` per file was a large part of its Python work.

    :raises OSError: anything but ``ENOENT``/``ESTALE``, its ``filename`` the full path.
    """
    try:
        os.unlink(name if dir_fd is not None else folder / name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in GONE_ERRNOS:
            return False
        exc.filename = str(folder / name)  # the full name for messages
        raise
    return True


def remove_tree_at(dir_fd: int, name: str, shown: Path) -> bool:
    """Remove the folder ``name`` of the open folder ``dir_fd`` with everything below it,
    by descriptor (``shutil.rmtree`` with ``dir_fd``: no link is followed; a link inside is
    removed as a link). A ``name`` that is not a real folder (a link, a file) is left.

    Entries already gone (ENOENT/ESTALE) are fine; every other failure is one warning
    naming ``shown`` / its path (``shown``: the folder ``dir_fd`` is, for messages).

    :returns: True when the folder is gone, False when it stays (not a folder, or a part
        could not be removed).
    :raises OSError: ``name`` cannot be examined (other than gone).
    """
    import shutil  # here: only the commands that remove trees pay for it

    st = lstat_or_none(Path(name), dir_fd)
    if st is None:
        return True
    if not stat.S_ISDIR(st.st_mode):
        return False
    failed = False

    def onerror(func: object, path: str, exc_info: tuple[object, BaseException, object]) -> None:
        nonlocal failed
        exc = exc_info[1]
        if isinstance(exc, OSError) and exc.errno in GONE_ERRNOS:
            return
        failed = True
        log.warning("cannot remove %s: %s", shown / path, exc)

    try:
        shutil.rmtree(name, dir_fd=dir_fd, onerror=onerror)
    except RecursionError:  # nested deeper than Python's stack (3.11's rmtree recurses)
        failed = False
        _remove_deep(dir_fd, name, shown, onerror)
    return not failed


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _remove_deep(dir_fd: int, name: str, shown: Path, onerror: Any) -> None:
    """:func:`remove_tree_at` without recursion, for trees of any depth: one descriptor
    open at a time, going down into the first folder left and back up through ``..``,
    checked against the (device, inode) remembered on the way down (a folder moved
    meanwhile stops the removal: one warning). Failures go to ``onerror``; a folder that
    cannot be emptied is not entered again."""
    names, ids, skip = [name], [], set[tuple[int, int]]()
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        onerror(os.open, name, (None, exc, None))
        return
    ids.append(_ident(os.fstat(fd)))
    while True:
        sub = _next_folder(fd, "/".join(names), onerror, skip)
        if sub is not None:
            try:
                down = os.open(sub, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                onerror(os.open, "/".join([*names, sub]), (None, exc, None))
                try:
                    skip.add(_ident(os.stat(sub, dir_fd=fd, follow_symlinks=False)))
                except OSError:
                    break  # gone or unreachable: this folder is done
                continue
            os.close(fd)
            fd, names, ids = down, [*names, sub], [*ids, _ident(os.fstat(down))]
            continue
        if len(names) == 1:
            os.close(fd)
            _rmdir(dir_fd, name, name, onerror)
            return
        try:
            up = os.open("..", _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            onerror(os.open, "/".join(names[:-1]), (None, exc, None))
            return
        finally:
            os.close(fd)
        if _ident(os.fstat(up)) != ids[-2]:
            os.close(up)
            moved = OSError(errno.ESTALE, "moved while it was being removed")
            onerror(os.open, "/".join(names[:-1]), (None, moved, None))
            return
        if not _rmdir(up, names[-1], "/".join(names), onerror):
            skip.add(ids[-1])
        fd, names, ids = up, names[:-1], ids[:-1]


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _next_folder(fd: int, shown: str, onerror: Any, skip: set[tuple[int, int]]) -> str | None:
    """Unlink every non-folder in the open folder ``fd``; the name of a folder in it not in
    ``skip``, or None."""
    try:
        entries = list(os.scandir(fd))
    except OSError as exc:
        onerror(os.scandir, shown, (None, exc, None))
        return None
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                if _ident(entry.stat(follow_symlinks=False)) not in skip:
                    return entry.name
                continue
            os.unlink(entry.name, dir_fd=fd)
        except OSError as exc:
            onerror(os.unlink, f"{shown}/{entry.name}", (None, exc, None))
    return None


def _rmdir(dir_fd: int, name: str, shown: str, onerror: Any) -> bool:
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except OSError as exc:
        onerror(os.rmdir, shown, (None, exc, None))
        return exc.errno in GONE_ERRNOS
    return True


def open_up_tree(path: Path, skip: Collection[str] = ()) -> None:
    """Give the owner ``rwx`` on ``path`` and every folder below it that this user owns,
    never following a link: a process of this user (a compiler in its build folder) may have
    left folders it made unlistable (``000``) or whose files cannot be removed (``500``),
    and nothing else could empty them. Failures are skipped (the removal reports them).
    ``skip``: names of ``path``'s own sub-folders not walked here, because their walker
    opens them up as it goes (:func:`open_up_folder`; the build folder's mirror tree).

    Meant for private folders only (this user's, ``0700``), where no other process of
    another user could swap a name for a link meanwhile.
    """
    uid = os.geteuid()
    stack = [path]
    while stack:
        folder = stack.pop()
        try:
            fd = os.open(folder, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            _open_up_fd(fd, uid)
            rfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            try:
                for name in os.listdir(rfd):
                    if folder is path and name in skip:
                        continue
                    sub = lstat_or_none(Path(name), rfd)
                    if sub is not None and stat.S_ISDIR(sub.st_mode):
                        stack.append(folder / name)
            finally:
                os.close(rfd)
        except OSError:
            continue
        finally:
            os.close(fd)


def open_up_folder(path: Path, st: os.stat_result | None = None, uid: int | None = None) -> None:
    """:func:`open_up_tree` of the one folder ``path`` (not below it): its owner — when it
    is this user (``uid``, default the effective one) — gets ``rwx``, never through a link.
    ``st``: its ``lstat`` when known; a folder whose mode already gives the owner ``rwx`` is
    not opened at all. Failures are skipped (the removal reports them)."""
    uid = os.geteuid() if uid is None else uid
    if st is not None and (st.st_uid != uid or st.st_mode & 0o700 == 0o700):
        return
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        _open_up_fd(fd, uid)
    except OSError:
        pass
    finally:
        os.close(fd)


def _open_up_fd(fd: int, uid: int) -> None:
    """The folder open as ``fd`` (``O_PATH``), when ``uid`` owns it, gives its owner ``rwx``.

    :raises OSError: it cannot be changed.
    """
    st = os.fstat(fd)
    if st.st_uid == uid and st.st_mode & 0o700 != 0o700:
        os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) | 0o700)


def remove_tree(path: Path) -> bool:
    """:func:`remove_tree_at` of ``path`` through its parent folder's descriptor; a parent
    that is gone means ``path`` is gone too (True); one that cannot be opened is one
    warning (False)."""
    try:
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in GONE_ERRNOS:
            return True
        log.warning("cannot remove %s: %s", path, exc)
        return False
    try:
        return remove_tree_at(dfd, path.name, path.parent)
    finally:
        os.close(dfd)
