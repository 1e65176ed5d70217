"""The chip-folder lock that makes ``force`` safe (layer 6; docs/design.md#cache-modes).

``force`` clears a chip folder. Publishers (compiles that will add an entry) hold the chip lock
*shared* from before they compile until their entry is published; ``force`` takes it
*exclusive*: it waits for the in-flight compiles to finish, clears, then lets new work in.

Two bytes of one lock file, ``<kernel cache>/<soc_version>.chip.lock`` (outside the chip folder,
so eviction never mistakes it for an entry's lock):

* byte 0, the *turnstile*: a publisher takes it shared and drops it at once; ``force`` holds it
  exclusive, so no new publisher starts while ``force`` waits — POSIX locks do not queue an
  exclusive request ahead of new shared ones, this does;
* byte 1, the *chip*: publishers hold it shared; ``force`` takes it exclusive.

The locks are Linux open-file-description locks (``F_OFD_SETLK``): byte-range locks that
conflict between threads of one process as between processes (each acquisition opens its own
descriptor), and that NFSv4 carries across hosts like any POSIX lock
(docs/design.md#sharing-and-locking). Waiting polls with a short backoff so a deadline can be kept.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cachemgr.errors import LockBusyError
from cachemgr.storage import fsutil, groupmodes
from cachemgr.storage.safedir import SafeDir

_TURNSTILE, _CHIP = 0, 1
_BUSY = (errno.EACCES, errno.EAGAIN)


def chip_lock_path(kernel_cache_dir: Path, soc_version: str) -> Path:
    """``<kernel cache>/<soc_version>.chip.lock``."""
    return Path(kernel_cache_dir) / f"{soc_version}.chip.lock"


def _flock(kind: int, start: int) -> bytes:
    # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks)
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, start, 1, 0)


def _try(fd: int, kind: int, start: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _flock(kind, start))
    except OSError as exc:
        if exc.errno in _BUSY:
            return False
        raise
    return True


def _wait(fd: int, kind: int, start: int, deadline: float | None, path: Path) -> None:
    delay = 0.0005
    while not _try(fd, kind, start):
        if deadline is not None and time.monotonic() >= deadline:
            raise LockBusyError(f"timed out waiting for the chip lock {path}")
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


class ChipLock:
    """Shared (publishers) / exclusive (``force``) lock of one chip folder.

    :param path: the lock file, see :func:`chip_lock_path`; created on first use.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _open(self) -> int:
        # GE's 0750 kernel cache folder: given back to the group where we may, then once more
        return groupmodes.retry_denied(
            self._open_once, self.path.parent, [self.path.name], kernel_cache=True
        )

    def _open_once(self) -> int:
        # the kernel cache folder is reached without following a link (docs/security.md)
        with SafeDir.open_kernel_cache(self.path.parent, create=True) as folder:
            return fsutil.open_lock_file(self.path, folder.fd)  # group read/write

    def hold_shared(self, timeout_s: float | None = None) -> Hold:
        """Take the chip shared (a publisher) until :meth:`Hold.release` — which any thread
        may call. Waits while ``force`` holds or waits for it.

        :raises LockBusyError: when ``timeout_s`` passes first.
        :raises OSError: the lock file cannot be opened or the filesystem has no locks.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        fd = self._open()
        try:
            _wait(fd, fcntl.F_RDLCK, _TURNSTILE, deadline, self.path)
            _try(fd, fcntl.F_UNLCK, _TURNSTILE)
            _wait(fd, fcntl.F_RDLCK, _CHIP, deadline, self.path)
        except BaseException:
            os.close(fd)
            raise
        return Hold(fd)

    @contextmanager
    def shared(self, timeout_s: float | None = None) -> Iterator[None]:
        """:meth:`hold_shared` as a context manager."""
        hold = self.hold_shared(timeout_s)
        try:
            yield
        finally:
            hold.release()

    @contextmanager
    def exclusive(self, timeout_s: float | None = None) -> Iterator[None]:
        """Hold the chip exclusive (``force``): no new publisher starts, in-flight ones finish.

        :raises LockBusyError: when ``timeout_s`` passes first.
        :raises OSError: the lock file cannot be opened or the filesystem has no locks.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        fd = self._open()
        try:
            _wait(fd, fcntl.F_WRLCK, _TURNSTILE, deadline, self.path)
            _wait(fd, fcntl.F_WRLCK, _CHIP, deadline, self.path)
            yield
        finally:
            os.close(fd)


class Hold:
    """A shared hold of a chip lock; :meth:`release` drops it (idempotent, any thread)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        """Close the descriptor: drops its locks, and only them."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
