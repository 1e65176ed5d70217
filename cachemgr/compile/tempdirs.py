"""Private temp folders whose owner's liveness is provable, and the reclaiming of dead ones.

A worker's build folder (``cachemgr-build-*`` in the temp folder) is removed by its
:class:`~cachemgr.compile.build.RunContext` on close; a process killed with SIGKILL (or one that
crashes) never closes it, and its folder (a mirror of a compile's sources) stayed forever. As
ccache and sccache do with their temp files, the owner holds a ``flock`` on :data:`LIVE_LOCK`
inside the folder for the folder's lifetime; the kernel drops it when the process dies, however
it dies. A new owner sweeps the same-prefix folders of its own uid whose lock it can take.

``flock`` (not ``fcntl``): it belongs to the open file description, so a second queue of the
*same* process cannot take the first queue's lock and remove a folder that is in use.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cachemgr.storage import fsutil

log = logging.getLogger(__name__)

#: The lock file inside a live folder; its ``flock`` is held by the owner for its lifetime.
LIVE_LOCK = ".cachemgr-live.lock"
#: A folder with no lock file (made by a version before the lock, or by a process killed
#: between ``mkdtemp`` and the lock) is reclaimed only once untouched this long (seconds).
LOCKLESS_GRACE_S = 24 * 3600.0

_NEW_LOCK = LIVE_LOCK + ".new"
_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass
class LiveDir:
    """A private folder and the descriptor that holds its :data:`LIVE_LOCK` (keep it open)."""

    path: Path
    lock_fd: int

    def close(self) -> None:
        """Remove the folder (never following a link; folders its compilers made read-only
        or unlistable are opened up first), then drop the lock."""
        try:
            fsutil.open_up_tree(self.path)
            fsutil.remove_tree(self.path)
        finally:
            with contextlib.suppress(OSError):
                os.close(self.lock_fd)


def make(prefix: str) -> LiveDir:
    """A new private (0700) folder ``<prefix>XXXX`` in the temp folder with its liveness lock
    held by this process.

    :raises OSError: the folder or its lock file cannot be made.
    """
    path = Path(tempfile.mkdtemp(prefix=prefix))
    fd = -1
    try:
        # Locked under another name, then renamed: a sweep that opened LIVE_LOCK between
        # its create and its flock held the lock for a moment, so the flock failed with
        # EAGAIN and the sweep took the folder as a dead owner's (CI, the demo). Until the
        # rename the folder is lock-less and fresh, which a sweep leaves for a day.
        fd = os.open(path / _NEW_LOCK, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody opens this name: never busy
        os.rename(path / _NEW_LOCK, path / LIVE_LOCK)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        fsutil.remove_tree(path)
        raise
    return LiveDir(path, fd)


def sweep(prefix: str, parent: Path | None = None) -> int:
    """Remove the folders ``parent/<prefix>*`` (default: the temp folder) of dead owners: this
    uid's real folders (never a link, never another user's) whose :data:`LIVE_LOCK` this call
    can take, or that have none and are older than :data:`LOCKLESS_GRACE_S`. A folder whose
    lock is held stays. Logs one line when something was removed; returns the bytes freed.

    Nothing is swept in a folder other users may rename in (group- or world-writable and not
    sticky): one of them could rename a folder of ours under the prefix (attack review). The
    system temp folder is sticky.
    """
    parent = Path(parent or tempfile.gettempdir())
    try:
        dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return 0
    if _others_may_rename(os.fstat(dfd)):
        os.close(dfd)
        log.debug("not sweeping %s for %s* leftovers: others may rename in it", parent, prefix)
        return 0
    count = freed = 0
    try:
        for name in os.listdir(dfd):
            if not name.startswith(prefix):
                continue
            size = _reclaim(dfd, name, parent)
            if size is not None:
                count += 1
                freed += size
    except OSError as exc:
        log.warning("cannot sweep %s for %s* leftovers: %s", parent, prefix, exc)
    finally:
        os.close(dfd)
    if count:
        log.info(
            "removed %d %s* folders of dead processes from %s (%d bytes)",
            count,
            prefix,
            parent,
            freed,
        )
    return freed


def _reclaim(dfd: int, name: str, parent: Path) -> int | None:
    """Remove ``name`` (relative to ``dfd``, the open ``parent``) if it is a dead owner's
    folder; its bytes, or None when it stays."""
    st = fsutil.lstat_or_none(Path(name), dfd)
    if st is None or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return None  # a link, a file, gone, or another user's: never ours to touch
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    try:
        if (os.fstat(fd).st_ino, os.fstat(fd).st_dev) != (st.st_ino, st.st_dev):
            return None  # swapped meanwhile
        dead, lock = _take_lock(fd, st)
        if not dead:
            return None
        try:
            fsutil.open_up_tree(parent / name)  # what a dead owner's compilers locked up
            size = _size(fd)
            if not fsutil.remove_tree_at(dfd, name, parent):
                return None
            return size
        finally:
            if lock is not None:
                os.close(lock)
    finally:
        os.close(fd)


def _take_lock(fd: int, st: os.stat_result) -> tuple[bool, int | None]:
    """Whether the folder's owner is dead, and the descriptor now holding its lock (None for
    a lock-less folder, which counts as dead past :data:`LOCKLESS_GRACE_S`). Not dead: the
    lock is held (its owner lives), the folder is too young, or something other than a
    plain file has the lock's name (not a folder we made)."""
    try:
        lock = os.open(LIVE_LOCK, _OPEN_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        return time.time() - st.st_mtime > LOCKLESS_GRACE_S, None
    except OSError:
        return False, None
    try:
        if not fsutil.plain_file(os.fstat(lock)):
            raise BlockingIOError
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock)
        return False, None
    return True, lock


def _others_may_rename(st: os.stat_result) -> bool:
    """True for a folder where other users may rename entries: writable by its group or by
    all, without the sticky bit (which lets only an entry's owner rename it)."""
    return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)) and not st.st_mode & stat.S_ISVTX


def _size(fd: int) -> int:
    """Bytes of the plain files under the open folder ``fd`` (no link followed, any depth:
    no recursion, and one descriptor open at a time below ``fd``)."""
    total = 0
    stack = [""]  # paths relative to fd
    while stack:
        rel = stack.pop()
        try:
            sub = os.open(rel or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        except OSError:
            continue  # unreadable, gone, or too long a path: not counted
        try:
            with os.scandir(sub) as entries:
                for item in entries:
                    st = item.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(f"{rel}/{item.name}" if rel else item.name)
                    elif stat.S_ISREG(st.st_mode):
                        total += st.st_size
        except OSError:
            pass
        finally:
            os.close(sub)
    return total
