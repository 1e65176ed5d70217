"""Access times (layer 0): atime drives eviction (docs/design.md#size-limits-and-eviction), so
files are read and hashed without changing it (:func:`read_bytes_noatime`,
:func:`sha256_noatime`), a hit sets it (:func:`touch_atime`), and reads that are not hits may
be made to refuse a read that would change it (:func:`reads_keep_atime`).
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import functools
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cachemgr.storage.kinds import GONE_ERRNOS, HardLinkError, NotRegularFileError, at

#: Files are read and hashed in chunks of this many bytes.
READ_CHUNK_BYTES = 1 << 20
#: Who may have written a file its group or others may write (:func:`read_bytes_noatime`'s
#: ``writers``): any of them, whoever owns it — no uid is ever -1.
SHARED_WRITER = -1


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


def _put_back(fd: int, restore: os.stat_result | None) -> None:
    """Give the file open as ``fd`` back the times of ``restore`` (None: nothing to do)."""
    if restore is not None:
        # another user's file (docs/design.md#sharing-and-locking): only its owner may set
        # times; relatime changes the atime of a read rarely, and the entry is still read
        # correctly
        with contextlib.suppress(PermissionError):
            os.utime(fd, ns=(restore.st_atime_ns, restore.st_mtime_ns))


# O_NONBLOCK: opening a FIFO planted in the cache must not hang (the type is checked next)
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_NOATIME = getattr(os, "O_NOATIME", 0)


def _opened_noatime(
    path: Path,
    dir_fd: int | None,
    single_link: bool,
    max_bytes: int | None,
) -> tuple[int, os.stat_result | None, int]:
    """Open a regular file for reading without changing its access time: the fd (the
    caller closes it), when the access time could not be kept the status whose times
    :func:`_put_back` gives back after the read, and its size (bytes, from the descriptor).

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
    restore: os.stat_result | None = None
    name = at(path, dir_fd)
    try:
        fd = os.open(name, _READ_FLAGS | _NOATIME, dir_fd=dir_fd)
    except PermissionError:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
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
    except BaseException:
        os.close(fd)
        raise
    return fd, restore, st.st_size


def _next_ask(ask: int, asked: int, got: int) -> int:
    """How many bytes the next read of a regular file asks for; 0 when it is read to its
    end. The first ask is its size + 1: a read of a regular file returns fewer bytes than
    asked only at its end, so a file that did not grow since its ``fstat`` is read whole
    without a last read of 0 bytes, and one that grew is read on to its new end."""
    if got < asked:
        return 0
    return ask - got if ask > got else READ_CHUNK_BYTES


def _chunks(fd: int, path: Path, size: int, max_bytes: int | None) -> Iterator[bytes]:
    """The bytes of the open regular file ``fd`` (``size`` bytes at its ``fstat``) to its end,
    in chunks of at most :data:`READ_CHUNK_BYTES`, never reading more than ``max_bytes`` + 1
    (a file growing meanwhile included).

    :raises FileTooLargeError: the file holds more than ``max_bytes`` (``path`` named).
    """
    left = None if max_bytes is None else max_bytes + 1
    ask = size + 1  # see _next_ask
    while ask:
        want = min(READ_CHUNK_BYTES, ask) if left is None else min(READ_CHUNK_BYTES, ask, left)
        chunk = os.read(fd, want)
        if chunk:
            yield chunk
        if left is not None:
            left -= len(chunk)
            if left <= 0:
                msg = f"is more than {max_bytes} bytes"
                raise FileTooLargeError(errno.EFBIG, msg, str(path))
        ask = _next_ask(ask, want, len(chunk))


def read_bytes_noatime(
    path: Path,
    dir_fd: int | None = None,
    *,
    single_link: bool = False,
    max_bytes: int | None = None,
    writers: set[int] | None = None,
) -> bytes:
    """Read a regular file without changing its access time (atime drives eviction,
    docs/design.md#size-limits-and-eviction); never more than ``max_bytes`` (a file growing
    meanwhile included).

    :param writers: when given, who may have written the bytes read is added to it, from the
        descriptor read (no race with a file swapped under the name): the uid owning the
        file, and :data:`SHARED_WRITER` when its group or others may write it too (a member
        rewrites a group-writable file in place without changing its owner).
    :raises OSError: as :func:`_opened_noatime`.
    """
    fd, restore, size = _opened_noatime(path, dir_fd, single_link, max_bytes)
    try:
        if writers is not None:
            st = os.fstat(fd)
            writers.add(st.st_uid)
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                writers.add(SHARED_WRITER)
        chunks = list(_chunks(fd, path, size, max_bytes))
        _put_back(fd, restore)
    finally:
        os.close(fd)
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

    :raises OSError: as :func:`_opened_noatime` (:class:`FileTooLargeError` over ``max_bytes``).
    """
    import hashlib  # here: OpenSSL's import is a hit's cost, not every command's

    digest, size = hashlib.sha256(), 0
    fd, restore, known = _opened_noatime(path, dir_fd, single_link, max_bytes)
    try:
        for chunk in _chunks(fd, path, known, max_bytes):
            digest.update(chunk)
            size += len(chunk)
        _put_back(fd, restore)
    finally:
        os.close(fd)
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


@functools.cache
def _utimensat() -> tuple[Any, Any]:
    """libc's ``utimensat`` (None where there is none) and the constant times argument
    ``{UTIME_NOW, UTIME_OMIT}``, made once."""
    libc, timespec = _libc()
    times = (timespec * 2)(timespec(0, _UTIME_NOW), timespec(0, _UTIME_OMIT))
    return getattr(libc, "utimensat", None), times


def _utimensat_atime_now(path: Path, dir_fd: int | None = None) -> bool:
    """``utimensat(path, {UTIME_NOW, UTIME_OMIT})``: the access time becomes the
    filesystem's now, the modification time stays. False when refused (not the owner, on
    kernels that ask for it) or unavailable: the caller falls back.

    :raises OSError: the file is gone (``ENOENT``/``ESTALE``) or the filesystem read-only.
    """
    utimensat, times = _utimensat()
    if utimensat is None:
        return False
    # relative to the open folder (docs/security.md item 1)
    where = _AT_FDCWD if dir_fd is None else dir_fd
    if utimensat(where, os.fsencode(at(path, dir_fd)), times, _AT_SYMLINK_NOFOLLOW) == 0:
        return True
    import ctypes  # loaded by _libc above

    err = ctypes.get_errno()
    if err in GONE_ERRNOS or err == errno.EROFS:
        raise OSError(err, os.strerror(err), str(path))
    return False
