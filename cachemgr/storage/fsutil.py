"""Small filesystem helpers (layer 0): atomic writes, fcntl locks, tolerant removal.

Rules that hold everywhere in cachemgr:

* writes go to a unique ``*.temp`` name in the destination folder and are ``rename()``-d into
  place (docs/design.md#writing-and-reading-an-entry), so a reader sees either nothing or a whole
  file;
* locks are POSIX record locks (``fcntl(F_SETLK)``), the kind CANN's processes take and the
  kind NFSv4 carries across hosts (docs/design.md#sharing-and-locking); "busy" is a ``False``
  return, not an error;
* removing a file that is already gone (``ENOENT``) or that another NFS host holds
  (``ESTALE``) is normal, never fatal (docs/design.md#size-limits-and-eviction,
  #sharing-and-locking).
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import fcntl
import functools
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, TypeAlias

from cachemgr.constants import short_host
from cachemgr.errors import LockBusyError
from cachemgr.peer import group_name as group_name  # uid/gid → names: one definition
from cachemgr.peer import user_name as user_name
from cachemgr.storage import accessfix

log = logging.getLogger(__name__)

#: Suffix of a write in progress (docs/design.md#files-of-an-entry).
TEMP_SUFFIX = ".temp"
#: Errors that mean "the file is not there any more" — normal in a shared cache.
GONE_ERRNOS = frozenset({errno.ENOENT, errno.ESTALE})
#: Files are group read/write, never world-writable (docs/design.md#sharing-and-locking); others may
#: read them only where their folder lets others in (:func:`file_mode_in`).
FILE_MODE = 0o664
#: Folders are group-writable and setgid so new files keep the group
#: (docs/design.md#sharing-and-locking); others get what the folder above gives them, at most
#: ``r-x`` (:func:`dir_mode_in`).
DIR_MODE = 0o2775
#: What others may be given at most (read, and search for folders; never write).
OTHERS_AT_MOST = 0o005


def file_mode_in(folder_mode: int) -> int:
    """The mode of a file cachemgr creates in a folder of mode ``folder_mode``: group
    read/write whatever the umask; readable by others only when the folder gives others
    read (a ``2770`` root: ``0660``; a ``2775`` one: ``0664``) — never more than the folder
    (docs/shared-cache.md#outsiders-read-nothing)."""
    return (FILE_MODE & ~0o007) | (folder_mode & 0o004)


def dir_mode_in(parent_mode: int) -> int:
    """The mode of a folder cachemgr creates in a folder of mode ``parent_mode``: ``rwx``
    for owner and group, others' bits as the parent gives them (at most ``r-x``), setgid
    where the parent has it (new files keep the sharing group; docs/design.md#where-the-cache-lives,
    #sharing-and-locking)."""
    return 0o770 | (parent_mode & OTHERS_AT_MOST) | (parent_mode & stat.S_ISGID)


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


#: Names NFS clients give to removed files still open somewhere
#: (docs/design.md#sharing-and-locking): never ours to remove or report; they go when the last
#: descriptor closes.
NFS_SILLY_PREFIX = ".nfs"


def temp_path(dest: Path) -> Path:
    """Return a unique temp name beside ``dest``: ``<dest name>.<host>.<pid>.<random>.temp``.

    The host and pid make a leftover attributable; the random part makes concurrent writers
    in one process distinct.
    """
    token = os.urandom(4).hex()  # as secrets.token_hex(4), without importing secrets
    return dest.with_name(f"{dest.name}.{short_host()}.{os.getpid()}.{token}{TEMP_SUFFIX}")


def temp_writer(name: str) -> tuple[str, int] | None:
    """``(host, pid)`` of the process that made temp file ``name`` (see :func:`temp_path`), or
    None when the name is not of that shape (e.g. a CANN writer's own ``*.temp``)."""
    if not name.endswith(TEMP_SUFFIX):
        return None
    parts = name[: -len(TEMP_SUFFIX)].rsplit(".", 3)
    if len(parts) != 4 or not parts[2].isdigit() or len(parts[3]) != 8:
        return None
    return parts[1], int(parts[2])


def temp_writer_dead(name: str) -> bool:
    """True when temp file ``name`` was made by a process of *this* host that no longer runs:
    a write that can never finish (a ``kill -9`` mid-publish), reclaimable at once whatever
    its age. Temps of other hosts, of live pids, or of unknown shape give False
    (the one-hour rule of docs/design.md#size-limits-and-eviction applies to them)."""
    writer = temp_writer(name)
    if writer is None or writer[0] != short_host():
        return False
    return not pid_alive(writer[1])


def pid_alive(pid: int) -> bool:
    """True when a process ``pid`` exists on this host (``EPERM``: it exists, not ours)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def regular_files(folder: Path | int) -> Iterator[tuple[str, os.stat_result]]:
    """Name and ``lstat`` of each regular file directly in ``folder`` (a path, or a folder's
    open descriptor); links are not followed, and a file gone meanwhile is skipped.

    :raises OSError: the folder cannot be listed.
    """
    with os.scandir(folder) as it:
        for de in it:
            try:
                st = de.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield de.name, st


def at(path: Path, dir_fd: int | None) -> str | Path:
    """What to hand an ``*at()`` call: ``path``'s last name relative to ``dir_fd`` (the open
    folder of the cache it lies in, see :mod:`cachemgr.storage.safedir`), or ``path`` itself without
    one. ``path`` stays the full name for messages."""
    return path if dir_fd is None else path.name


def write_temp(
    dest: Path, data: bytes, mode: int | None = None, dir_fd: int | None = None, sync: bool = True
) -> Path:
    """Write ``data`` to a fresh temp file beside ``dest``, fsync it (unless ``sync`` is
    False), and return its path.

    :param mode: the file's mode whatever the umask; default the shared mode of its
        folder (:func:`file_mode_in`: ``0664``, or ``0660`` where others may not read it).

    The caller renames it into place (see :func:`publish_temp`). On any error the temp file
    is removed before the error propagates.

    :param dir_fd: the open folder of ``dest`` (every call is then relative to it).
    :param sync: fsync before returning. Cache entries pass False: every hit verifies their
        sha256, so a file a power loss left torn is a miss, never served
        (docs/compiling.md, "Durability").
    :raises OSError: on write failure (e.g. ``ENOSPC``); nothing is left behind.
    """
    tmp = temp_path(dest)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        if mode is None:
            mode = file_mode_in(_folder_mode(dest, dir_fd))
        fd = os.open(at(tmp, dir_fd), flags, mode, dir_fd=dir_fd)
    except OSError as exc:
        exc.filename = str(tmp)  # the full name for messages
        raise
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            # umask 002 style whatever the caller's umask (docs/design.md#sharing-and-locking)
            os.fchmod(fd, mode)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        safe_unlink(tmp, dir_fd=dir_fd)
        raise
    return tmp


def publish_temp(tmp: Path, dest: Path, dir_fd: int | None = None) -> None:
    """Atomically move a temp file written by :func:`write_temp` to ``dest``.

    :param dir_fd: the open folder of both (``renameat``).
    :raises OSError: if the rename fails; the temp file is removed first.
    """
    try:
        os.rename(at(tmp, dir_fd), at(dest, dir_fd), src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        safe_unlink(tmp, dir_fd=dir_fd)
        raise


def atomic_write_bytes(
    dest: Path, data: bytes, mode: int | None = None, dir_fd: int | None = None, sync: bool = True
) -> None:
    """Write ``data`` to ``dest`` atomically (temp file in the same folder, then rename).

    :param mode: see :func:`write_temp` (default: the folder's shared file mode).

    :param dir_fd: the open folder of ``dest`` (see :mod:`cachemgr.storage.safedir`).
    :param sync: fsync the data before the rename (see :func:`write_temp`).
    :raises OSError: on failure; ``dest`` is unchanged and no temp file is left.
    """
    publish_temp(write_temp(dest, data, mode, dir_fd, sync), dest, dir_fd)


def safe_unlink(path: Path, dir_fd: int | None = None) -> bool:
    """Remove ``path`` (a link itself, never its target); return True if this call removed
    it, False if it was already gone.

    ``ENOENT`` and ``ESTALE`` (another NFS host removed or holds it) are normal.

    :param dir_fd: the open folder of ``path`` (``unlinkat``).
    :raises OSError: for any other error (e.g. ``EACCES``).
    """
    try:
        os.unlink(at(path, dir_fd), dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in GONE_ERRNOS:
            return False
        exc.filename = str(path)  # the full name for messages
        raise
    return True


def real_path(path: str | os.PathLike[str]) -> str:
    """The absolute path, every link followed, of the existing file or folder ``path``, as
    the kernel resolves it: opened with ``O_PATH`` (nothing read, no access time, a FIFO
    not opened), then named through ``/proc/self/fd``. Unlike ``os.path.realpath`` and
    ``Path.resolve``, which recurse once per link in a chain (a member's chain of 1,200
    links ended them in ``RecursionError``), the kernel follows at most 40 links in a row.

    :raises OSError: ``path`` does not exist, cannot be reached, or has too many links
        (``ELOOP``).
    """
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def lstat_or_none(path: Path, dir_fd: int | None = None) -> os.stat_result | None:
    """``os.lstat`` (relative to ``dir_fd`` when given) that returns None when the file is
    gone (ENOENT/ESTALE)."""
    try:
        return os.stat(at(path, dir_fd), dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in GONE_ERRNOS:
            return None
        raise


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


def open_up_tree(path: Path) -> None:
    """Give the owner ``rwx`` on ``path`` and every folder below it that this user owns,
    never following a link: a process of this user (a compiler in its build folder) may have
    left folders it made unlistable (``000``) or whose files cannot be removed (``500``),
    and nothing else could empty them. Failures are skipped (the removal reports them).

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
            st = os.fstat(fd)
            if st.st_uid == uid and st.st_mode & 0o700 != 0o700:
                os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) | 0o700)
            rfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            try:
                for name in os.listdir(rfd):
                    sub = lstat_or_none(Path(name), rfd)
                    if sub is not None and stat.S_ISDIR(sub.st_mode):
                        stack.append(folder / name)
            finally:
                os.close(rfd)
        except OSError:
            continue
        finally:
            os.close(fd)


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


#: Files are read and hashed in chunks of this many bytes.
READ_CHUNK_BYTES = 1 << 20


class NotRegularFileError(OSError):
    """A FIFO, socket or device where a regular file is expected (never read: it may block
    or never end)."""


class HardLinkError(NotRegularFileError):
    """A file of the cache with more than one name (``st_nlink > 1``): it may be another
    file's content planted under a cache name, so it is never used (docs/security.md item 2)."""


class FileTooLargeError(OSError):
    """A file larger than the reader's cap (bytes): never read whole into memory."""


class AtimeWouldChange(PermissionError):
    """Inside :func:`reads_keep_atime`: reading the file would change its access time and
    this user could not put it back (not its owner, no ``CAP_FOWNER``)."""


_KEEP_ATIME: contextvars.ContextVar[bool] = contextvars.ContextVar("keep_atime", default=False)


@contextlib.contextmanager
def reads_keep_atime() -> Iterator[None]:
    """Reads that are not hits never reorder eviction (README: ``ls`` and
    ``verify`` never change access times): inside this block :func:`read_bytes_noatime`
    refuses, with :class:`AtimeWouldChange`, a read whose access-time update it could
    neither avoid (``O_NOATIME``) nor undo (``utime``: owner or ``CAP_FOWNER`` only)."""
    token = _KEEP_ATIME.set(True)
    try:
        yield
    finally:
        _KEEP_ATIME.reset(token)


#: relatime's rule (mount(8)): the access time is also updated once it is a day old.
RELATIME_MAX_AGE_S = 24 * 3600


def read_changes_atime(st: os.stat_result, now_s: float | None = None) -> bool:
    """Would reading a file with status ``st`` update its access time? By the options of
    its mount (``/proc/self/mountinfo``): ``noatime`` never; ``relatime`` (the default)
    when the access time is not after the modification or change time, or a day old;
    ``strictatime`` (neither shown) always."""
    opts = _mount_options(st.st_dev)
    if "noatime" in opts:
        return False
    if "relatime" not in opts:
        return True
    now_s = time.time() if now_s is None else now_s
    return (
        st.st_atime_ns <= st.st_mtime_ns
        or st.st_atime_ns <= st.st_ctime_ns
        or now_s - st.st_atime_ns / 1e9 >= RELATIME_MAX_AGE_S
    )


@functools.lru_cache(maxsize=64)
def _mount_options(dev: int) -> frozenset[str]:
    """The per-mount options (field 6 of ``mountinfo``) of the mount with device ``dev``;
    empty (so: strictatime, the cautious answer) when not found."""
    want = f"{os.major(dev)}:{os.minor(dev)}"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 5 and fields[2] == want:
                    return frozenset(fields[5].split(","))
    except OSError:
        pass
    return frozenset()


@contextmanager
def _open_noatime(
    path: Path,
    dir_fd: int | None = None,
    *,
    single_link: bool = False,
    max_bytes: int | None = None,
) -> Iterator[int]:
    """Open a regular file for reading without changing its access time; yield the fd.

    Uses ``O_NOATIME`` where the kernel allows it (owner or CAP_FOWNER); otherwise opens
    normally and puts the previous atime back when done. Symlinks are refused
    (docs/design.md#writing-and-reading-an-entry); the open never blocks (``O_NONBLOCK``) and the
    type is checked on the descriptor.

    :param dir_fd: the open folder of ``path`` (see :mod:`cachemgr.storage.safedir`).
    :param single_link: refuse a file with more than one name (cache entries, docs/security.md
        item 2).
    :param max_bytes: refuse a larger file (size in bytes).
    :raises OSError: ``ELOOP`` for a symlink, ``ENOENT`` when gone, ``EISDIR`` for a folder,
        :class:`NotRegularFileError` for a FIFO, socket or device, :class:`HardLinkError`,
        :class:`FileTooLargeError`.
    """
    # O_NONBLOCK: opening a FIFO planted in the cache must not hang (the type is checked next)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    noatime = getattr(os, "O_NOATIME", 0)
    restore: os.stat_result | None = None
    name = at(path, dir_fd)
    try:
        fd = os.open(name, flags | noatime, dir_fd=dir_fd)
    except PermissionError:
        fd = os.open(name, flags, dir_fd=dir_fd)
        restore = os.fstat(fd)
        if _KEEP_ATIME.get() and read_changes_atime(restore):
            os.close(fd)
            raise AtimeWouldChange(
                errno.EPERM,
                f"not read: reading it would change its access time (owner uid "
                f"{restore.st_uid}; only the owner or root may put it back)",
                str(path),
            ) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(errno.EINVAL, "not a regular file", str(path))
        if single_link and st.st_nlink > 1:
            raise HardLinkError(errno.EMLINK, f"has {st.st_nlink} names (hard link)", str(path))
        if max_bytes is not None and st.st_size > max_bytes:
            msg = f"is {st.st_size} bytes, more than {max_bytes}"
            raise FileTooLargeError(errno.EFBIG, msg, str(path))
        yield fd
        if restore is not None:
            # another user's file (docs/design.md#sharing-and-locking): only its owner may set
            # times; relatime changes the atime of a read rarely, and the entry is still read
            # correctly
            with contextlib.suppress(PermissionError):
                os.utime(fd, ns=(restore.st_atime_ns, restore.st_mtime_ns))
    finally:
        os.close(fd)


def read_bytes_noatime(
    path: Path,
    dir_fd: int | None = None,
    *,
    single_link: bool = False,
    max_bytes: int | None = None,
    owners: set[int] | None = None,
) -> bytes:
    """Read a regular file without changing its access time (atime drives eviction,
    docs/design.md#size-limits-and-eviction); never more than ``max_bytes`` (a file growing
    meanwhile included).

    :param owners: when given, the uid owning the file read is added to it (from the
        descriptor read: no race with a file swapped under the name).
    :raises OSError: as :func:`_open_noatime`.
    """
    opened = _open_noatime(path, dir_fd, single_link=single_link, max_bytes=max_bytes)
    with opened as fd:
        if owners is not None:
            owners.add(os.fstat(fd).st_uid)
        chunks = []
        left = None if max_bytes is None else max_bytes + 1
        while chunk := os.read(
            fd, READ_CHUNK_BYTES if left is None else min(READ_CHUNK_BYTES, left)
        ):
            chunks.append(chunk)
            if left is not None:
                left -= len(chunk)
                if left <= 0:
                    msg = f"is more than {max_bytes} bytes"
                    raise FileTooLargeError(errno.EFBIG, msg, str(path))
    return b"".join(chunks)


def sha256_noatime(
    path: Path,
    dir_fd: int | None = None,
    *,
    single_link: bool = False,
    max_bytes: int | None = None,
) -> tuple[str, int]:
    """Hex SHA-256 and size (bytes) of a regular file, read in chunks of
    :data:`READ_CHUNK_BYTES` — never whole into memory — without changing
    its access time; never more than ``max_bytes`` (a file growing meanwhile included).

    :raises OSError: as :func:`_open_noatime` (:class:`FileTooLargeError` over ``max_bytes``).
    """
    import hashlib  # here: OpenSSL's import is a hit's cost, not every command's

    digest, size = hashlib.sha256(), 0
    with _open_noatime(path, dir_fd, single_link=single_link, max_bytes=max_bytes) as fd:
        while chunk := os.read(fd, READ_CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
            if max_bytes is not None and size > max_bytes:
                msg = f"is more than {max_bytes} bytes"
                raise FileTooLargeError(errno.EFBIG, msg, str(path))
    return digest.hexdigest(), size


def touch_atime(path: Path, now_ns: int | None = None, dir_fd: int | None = None) -> None:
    """Set ``path``'s access time to now and keep its modification time
    (docs/design.md#writing-and-reading-an-entry, [GE]).

    Setting an explicit time needs ownership of the file. In a cache shared by a group
    (docs/design.md#sharing-and-locking) a hit on another user's entry must still count for
    eviction, so for a file we do not own but may write (group-writable, umask 002) both times are
    set to now — the one change the kernel allows a writer; the mtime of an entry's files is not
    used by anything.

    :param dir_fd: the open folder of ``path`` (``utimensat`` relative to it).
    :raises OSError: when the file is gone, or not writable by this user either.
    """
    name = at(path, dir_fd)
    if now_ns is None and _utimensat_atime_now(path, dir_fd):
        return  # the filesystem's own time (the NFS server's): one fast host's skew does
        # not spread through hits
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    now = time.time_ns() if now_ns is None else now_ns
    try:
        os.utime(name, ns=(now, st.st_mtime_ns), dir_fd=dir_fd, follow_symlinks=False)
    except PermissionError:
        if st.st_uid == os.geteuid():
            raise
        # UTIME_NOW for both: allowed to any user with write access
        os.utime(name, None, dir_fd=dir_fd, follow_symlinks=False)


_UTIME_NOW, _UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2
_AT_FDCWD, _AT_SYMLINK_NOFOLLOW = -100, 0x100


@functools.cache
def _libc() -> tuple[Any, Any]:
    """The C library (``ctypes``) and its ``struct timespec``, loaded on first use: ctypes
    is imported by the commands that set access times only."""
    import ctypes

    class Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

    return ctypes.CDLL(None, use_errno=True), Timespec


def _utimensat_atime_now(path: Path, dir_fd: int | None = None) -> bool:
    """``utimensat(path, {UTIME_NOW, UTIME_OMIT})``: the access time becomes the
    filesystem's now, the modification time stays. False when refused (not the owner, on
    kernels that ask for it) or unavailable: the caller falls back.

    :raises OSError: the file is gone (``ENOENT``/``ESTALE``) or the filesystem read-only.
    """
    libc, timespec = _libc()
    utimensat = getattr(libc, "utimensat", None)
    if utimensat is None:
        return False
    times = (timespec * 2)(timespec(0, _UTIME_NOW), timespec(0, _UTIME_OMIT))
    # relative to the open folder (docs/security.md item 1)
    where = _AT_FDCWD if dir_fd is None else dir_fd
    if utimensat(where, os.fsencode(at(path, dir_fd)), times, _AT_SYMLINK_NOFOLLOW) == 0:
        return True
    import ctypes  # loaded by _libc above

    err = ctypes.get_errno()
    if err in GONE_ERRNOS or err == errno.EROFS:
        raise OSError(err, os.strerror(err), str(path))
    return False


def ensure_dir(path: Path) -> Path:
    """Create ``path`` (and parents) group-shareable where missing; return it.

    New folders get :func:`dir_mode_in` their parent's mode: ``rwx`` for owner and group,
    others what the parent gives them (``2770`` under a ``2770`` root), the setgid bit when
    the parent has it (docs/design.md#where-the-cache-lives, #sharing-and-locking). Never
    world-writable.

    :raises OSError: e.g. ``EACCES`` or ``ENOTDIR`` (a file where a folder is expected).
    """
    missing = []
    cur = path
    while not cur.exists():
        missing.append(cur)
        if cur.parent == cur:
            break
        cur = cur.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o770)
        except FileExistsError:
            continue
        os.chmod(folder, dir_mode_in(os.stat(folder.parent).st_mode))
    if not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
    return path


def plain_file(st: os.stat_result) -> bool:
    """A regular file with one name: the only kind cachemgr opens for writing, locks or
    ``chmod``s in the cache (docs/security.md item 2)."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


#: How often :func:`open_lock_file` replaces a planted lock name before giving up.
_LOCK_OPEN_TRIES = 3


def open_lock_file(path: Path, dir_fd: int | None = None) -> int:
    """Open (creating it if needed) a lock file for reading and writing; return the descriptor.

    A lock file this user creates is made group read/write whatever the umask, so the
    other users of a shared cache can lock it too (docs/design.md#sharing-and-locking), and readable
    by others only where the folder is (:func:`file_mode_in`); a file of another user is left as it
    is. A link, FIFO, socket, device or hard-linked file planted under the lock's name is never
    opened, followed or ``chmod``ed: the name is in the cache's own namespace, so it is
    removed (the name only: ``unlinkat``) with one warning and a fresh lock file is made —
    a planted ``<kernel>.lock`` must not block its kernel forever (docs/security.md item 2).
    The open never blocks (``O_NONBLOCK``).

    :param dir_fd: the open folder of ``path`` (see :mod:`cachemgr.storage.safedir`).
    :raises OSError: e.g. ``EACCES`` for another user's lock file that is not group-writable,
        ``EISDIR`` for a folder of that name, :class:`NotRegularFileError` when the name keeps
        being replaced by something else.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    want = file_mode_in(_folder_mode(path, dir_fd))
    for _ in range(_LOCK_OPEN_TRIES):
        st = lstat_or_none(path, dir_fd)
        if st is not None and stat.S_ISDIR(st.st_mode):
            _drop_planted_folder(path, dir_fd)
        elif st is not None and not plain_file(st):
            _drop_planted(path, dir_fd, st)
        try:
            fd = os.open(at(path, dir_fd), flags, want, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO):  # a link or socket put there meanwhile
                continue
            exc.filename = str(path)  # the full name for messages, not the one relative to dir_fd
            raise
        try:
            st = os.fstat(fd)
            if not plain_file(st):
                os.close(fd)
                continue
            if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != want:
                os.fchmod(fd, want)
        except BaseException:
            os.close(fd)
            raise
        return fd
    raise NotRegularFileError(errno.EINVAL, "keeps being replaced by a non-regular file", str(path))


def _drop_planted_folder(path: Path, dir_fd: int | None) -> None:
    """Remove an *empty* folder planted under a lock file's name (``rmdir``: the name only;
    nothing of a member's is lost). A folder with something in it stays, and the open
    that follows fails with ``EISDIR`` naming it (callers handle that one item)."""
    try:
        os.rmdir(at(path, dir_fd), dir_fd=dir_fd)
    except OSError:
        return  # not empty, gone, or not ours to remove: EISDIR (or a fresh file) follows
    log.warning("removed %s: an empty folder where a lock file belongs", path)


def _drop_planted(path: Path, dir_fd: int | None, st: os.stat_result) -> None:
    """Remove a planted link/FIFO/socket/device/hard link under a lock file's name."""
    log.warning("removing %s: %s where a lock file belongs (never followed)", path, kind_of(st))
    safe_unlink(path, dir_fd)


def kind_of(st: os.stat_result) -> str:
    """What a file that is not a plain file is, for messages (``symbolic link``, ``FIFO``,
    ``hard link (3 names)``...)."""
    if stat.S_ISREG(st.st_mode):
        return f"hard link ({st.st_nlink} names)"
    mode = st.st_mode
    for test, name in (
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "special file"


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


def lock_access_hint(path: Path) -> str:
    """One line for a lock file cachemgr cannot use: the path, its owner and
    mode (or its folder's, when the folder is what blocks), and the fix."""
    folder_ok = os.access(path.parent, os.W_OK | os.X_OK)
    target = path if folder_ok and os.path.lexists(path) else path.parent
    return f"cannot lock {path}: " + access_hint(target)


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


class _Slot:
    """A path's in-process thread lock and how many ``FcntlLock`` acquisitions use it."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


class FcntlLock:
    """An exclusive POSIX record lock (``fcntl(F_SETLK)``) on a lock file.

    CANN takes the same kind of lock on ``<kernel>.lock`` and ``op_cache_file_del.lock``, so
    cachemgr and CANN processes exclude each other, on NFSv4 across hosts too
    (docs/design.md#writing-and-reading-an-entry, #sharing-and-locking).

    POSIX locks belong to a process, not a thread, and closing *any* descriptor of the file
    drops them; so this class also holds a per-path thread lock and keeps one descriptor per
    acquisition. A lock file that is unlinked while we wait (dead-lock reaping) is detected by
    comparing inodes after locking, and the acquisition retried on the new file.

    Usage::

        lock = FcntlLock(chip / "op_cache_file_del.lock")
        if lock.acquire(blocking=False):   # False means busy, not an error
            try: ...
            finally: lock.release()
    """

    _slots: ClassVar[dict[str, _Slot]] = {}
    _registry_lock = threading.Lock()

    def __init__(self, path: Path, dir_fd: int | None = None) -> None:
        """:param dir_fd: the open folder of ``path`` (see :mod:`cachemgr.storage.safedir`); every
        call is then relative to it, and it must stay open until :meth:`release`."""
        self.path = Path(path)
        self._dir_fd = dir_fd
        self._fd: int | None = None
        self._slot: _Slot | None = None
        self._read_only = False  # a lock file we may only read (GE's 0640): read lock
        self._companion: FcntlLock | None = None

    @property
    def held(self) -> bool:
        """True while this object holds the lock."""
        return self._fd is not None

    def _checkout(self) -> _Slot:
        """The path's thread lock, counted as in use (so the registry keeps only paths that
        someone holds or waits for: a long-running daemon does not grow with every path)."""
        with self._registry_lock:
            slot = self._slots.get(str(self.path))
            if slot is None:
                slot = self._slots[str(self.path)] = _Slot()
            slot.users += 1
            return slot

    def _checkin(self, slot: _Slot) -> None:
        with self._registry_lock:
            slot.users -= 1
            if slot.users == 0 and self._slots.get(str(self.path)) is slot:
                del self._slots[str(self.path)]

    def acquire(self, blocking: bool = True, timeout_s: float | None = None) -> bool:
        """Take the lock. Return False if busy and ``blocking`` is False.

        :param timeout_s: with ``blocking``, give up after this many seconds.
        :raises LockBusyError: when ``timeout_s`` passes without the lock.
        :raises OSError: when the lock file cannot be created or locked (e.g. ``ENOLCK`` on a
            filesystem without working locks).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        slot = self._checkout()
        try:
            taken = self._take_thread_lock(slot.lock, blocking, deadline)
        except BaseException:
            self._checkin(slot)
            raise
        if not taken:
            self._checkin(slot)
            return False
        try:
            while True:
                fd = self._open()
                try:
                    locked = self._lock_fd(fd, blocking, deadline)
                except BaseException:
                    os.close(fd)
                    raise
                if locked and self._same_file(fd):
                    self._fd, self._slot = fd, slot
                    return True
                self._drop_companion()
                os.close(fd)  # busy, or reaped while we waited (then lock the new file)
                if not locked:
                    break
        except BaseException:
            slot.lock.release()
            self._checkin(slot)
            raise
        slot.lock.release()
        self._checkin(slot)
        return False

    def _take_thread_lock(
        self, tlock: threading.Lock, blocking: bool, deadline: float | None
    ) -> bool:
        if not blocking:
            return tlock.acquire(blocking=False)
        if deadline is None:
            return tlock.acquire()
        if tlock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return True
        raise LockBusyError(f"timed out waiting for lock {self.path}")

    def _open(self) -> int:
        self._read_only = False
        try:
            return open_lock_file(self.path, self._dir_fd)
        except PermissionError:
            # CANN GE forces 0640 on the lock files it creates (te_cache_utils.cc
            # LockAndOpenCacheFile): a group member may read but not write such a file. It is
            # still respected: a read lock on it excludes GE's write lock.
            # Never blocking, never through a link, a plain file only (security.md item 2).
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
            try:
                fd = os.open(at(self.path, self._dir_fd), flags, dir_fd=self._dir_fd)
            except OSError:
                raise PermissionError(
                    errno.EACCES, "lock file not readable either", str(self.path)
                ) from None
            if not plain_file(os.fstat(fd)):
                os.close(fd)
                msg = "not a plain lock file"
                raise NotRegularFileError(errno.EINVAL, msg, str(self.path)) from None
            self._read_only = True
            return fd

    def companion_path(self) -> Path:
        """``<name>.cachemgr.lock`` beside a lock file cachemgr may only read: cachemgr
        processes exclude each other on it while all hold read locks on the original."""
        return self.path.with_name(self.path.name.removesuffix(".lock") + ".cachemgr.lock")

    def _lock_fd(self, fd: int, blocking: bool, deadline: float | None) -> bool:
        if self._read_only:
            return self._lock_read_only(fd, blocking, deadline)
        return self._lockf(fd, fcntl.LOCK_EX, blocking, deadline)

    def _lock_read_only(self, fd: int, blocking: bool, deadline: float | None) -> bool:
        """Companion lock exclusive first (other cachemgr processes), then a read lock on the
        read-only file itself (GE's writers)."""
        companion = FcntlLock(self.companion_path(), self._dir_fd)
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not companion.acquire(blocking, timeout_s=timeout if blocking else None):
            return False
        try:
            locked = self._lockf(fd, fcntl.LOCK_SH, blocking, deadline)
        except BaseException:
            companion.release()
            raise
        if not locked:
            companion.release()
            return False
        self._companion = companion
        return True

    def _lockf(self, fd: int, kind: int, blocking: bool, deadline: float | None) -> bool:
        delay = 0.001
        while True:
            try:
                fcntl.lockf(fd, kind | fcntl.LOCK_NB)
                return True
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
            if not blocking:
                return False
            if deadline is not None and time.monotonic() >= deadline:
                raise LockBusyError(f"timed out waiting for lock {self.path}")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _drop_companion(self) -> None:
        companion, self._companion = self._companion, None
        if companion is not None:
            companion.release()

    def _same_file(self, fd: int) -> bool:
        try:
            st = os.stat(at(self.path, self._dir_fd), dir_fd=self._dir_fd, follow_symlinks=False)
        except OSError:
            return False
        fst = os.fstat(fd)
        return (st.st_ino, st.st_dev) == (fst.st_ino, fst.st_dev)

    def release(self, unlink: bool = False) -> None:
        """Release the lock; with ``unlink`` remove the lock file first (while still held)."""
        if self._fd is None or self._slot is None:
            return
        fd, self._fd = self._fd, None
        slot, self._slot = self._slot, None
        try:
            if unlink and not self._read_only:
                safe_unlink(self.path, self._dir_fd)
            fcntl.lockf(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
            self._drop_companion()
            slot.lock.release()
            self._checkin(slot)

    def __enter__(self) -> FcntlLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextmanager
def try_lock(path: Path, dir_fd: int | None = None) -> Iterator[bool]:
    """Context manager: non-blocking :class:`FcntlLock`; yields True if taken, False if busy."""
    lock = FcntlLock(path, dir_fd)
    taken = lock.acquire(blocking=False)
    try:
        yield taken
    finally:
        if taken:
            lock.release()
