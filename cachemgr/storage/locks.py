"""Lock files and :class:`FcntlLock` (layer 0).

Locks are POSIX record locks (``fcntl(F_SETLK)``), the kind CANN's processes take and the
kind NFSv4 carries across hosts (docs/design.md#sharing-and-locking); "busy" is a ``False``
return, not an error. A lock file is never opened through a link or anything planted under
its name (:func:`open_lock_file`, docs/security.md item 2).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

from cachemgr.errors import LockBusyError
from cachemgr.storage.kinds import NotRegularFileError, at, kind_of, lstat_or_none, plain_file
from cachemgr.storage.modes import _folder_mode, access_hint, file_mode_in
from cachemgr.storage.remove import safe_unlink

# the logger's name is the one these warnings always had (console.LOG_FORMAT shows it)
log = logging.getLogger("cachemgr.storage.fsutil")


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


def lock_access_hint(path: Path) -> str:
    """One line for a lock file cachemgr cannot use: the path, its owner and
    mode (or its folder's, when the folder is what blocks), and the fix."""
    folder_ok = os.access(path.parent, os.W_OK | os.X_OK)
    target = path if folder_ok and os.path.lexists(path) else path.parent
    return f"cannot lock {path}: " + access_hint(target)


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

    @property
    def dir_fd(self) -> int | None:
        """The open folder the lock file is reached through while it is held (None: none,
        or not held)."""
        return self._dir_fd if self._fd is not None else None

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
