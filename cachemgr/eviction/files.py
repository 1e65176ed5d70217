"""Removing files of a chip folder the way docs/design.md#size-limits-and-eviction asks: whole
entries, json first; files that are already gone are normal; a file we may not remove is reported
and the run goes on."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from cachemgr.storage import fsutil, store
from cachemgr.storage.entry import EntryGroup
from cachemgr.storage.safedir import SafeDir

log = logging.getLogger(__name__)

#: errno values meaning "not ours to remove now" (the store's: one removal routine).
DENIED_ERRNOS = store.DENIED_ERRNOS
#: Names NFS clients give to removed files still open somewhere; they go by themselves.
NFS_SILLY_PREFIX = ".nfs"
#: What one removal did (:class:`cachemgr.storage.store.Removal`).
Removal = store.Removal


def deletion_order(group: EntryGroup) -> list[str]:
    """An entry's file names in the deletion order of docs/design.md#size-limits-and-eviction
    (:func:`cachemgr.storage.store.removal_order`, the one definition of it)."""
    return store.removal_order(group.files, group.json_name)


def denied_line(name: str, exc: OSError) -> str:
    """``"<name>: <strerror>"`` for a file that could not be removed."""
    return f"{name}: {exc.strerror or exc}"


def unlink_quiet(chip_fd: int, name: str) -> bool:
    """Remove ``name`` relative to the chip folder's descriptor; False when already gone.

    :raises OSError: anything but ENOENT/ESTALE (e.g. ``EPERM`` for an immutable file,
        ``EISDIR`` for a folder).
    """
    try:
        os.unlink(name, dir_fd=chip_fd)
    except OSError as exc:
        if exc.errno in fsutil.GONE_ERRNOS:
            return False
        raise
    return True


def remove_group(chip_fd: int, group: EntryGroup) -> Removal:
    """Remove an entry's files json first — :func:`cachemgr.storage.store.remove_entry_files`, the
    one removal routine: a refused json stops the entry (nothing else is removed, so the
    entry stays whole); a refused part is reported and the rest goes on.

    The caller holds the entry's lock if it has one and re-checked the access time.
    """
    sizes = {name: st.size for name, st in group.files.items()}
    return store.remove_entry_files(Path("."), chip_fd, group.files, group.json_name, sizes)


#: A ``<kernel>.lock`` is unlinked only when its ctime is at least this old (seconds) and no
#: one but its owner may write it (:func:`lock_reapable`). GE's
#: ``TeCacheUtils::LockAndOpenCacheFile`` (``cache/te_cache_utils.cc``) runs ``fopen(a+)``,
#: then ``chmod(0640)`` — which sets the ctime when it succeeds; a failed one is only logged —
#: then ``F_SETLK``, and never re-checks the inode after locking: a lock file unlinked while a
#: GE process has it open lets two writers into one entry. A ctime older than an hour, read
#: while we hold the lock, means no GE process that could ``chmod`` the file is between its
#: open and its lock.
LOCK_REAP_AGE_S = 3600


def reap_lock(
    path: Path,
    entry_json: Path | None = None,
    min_age_s: float | None = None,
    *,
    chip_fd: int | None = None,
) -> bool:
    """Remove a dead entry lock file (docs/design.md#size-limits-and-eviction): never while its
    entry lives, never while anyone holds it, never when it was touched in the last ``min_age_s``
    seconds, never when a user other than its owner may open it for writing
    (:func:`lock_reapable`).

    Takes the lock without waiting, then — holding it — checks that ``entry_json`` (the
    entry's main json) is absent and that the file is still reapable (``lstat``), and only
    then unlinks it (``FcntlLock.release(unlink=True)``; cachemgr's waiters on the old inode
    retry on a new file).

    :param min_age_s: seconds; default :data:`LOCK_REAP_AGE_S` (read at call time).
    :param chip_fd: the open chip folder of ``path`` and ``entry_json``: every call is
        relative to it (docs/security.md item 1); a link or special file planted under the
        lock's name is replaced, never opened (``fsutil.open_lock_file``).
    :returns: True if removed; False when held, young, group/other-writable, or its entry
        exists.
    :raises OSError: when the lock file cannot be opened (e.g. ``EACCES``).
    """
    min_age_s = LOCK_REAP_AGE_S if min_age_s is None else min_age_s
    st = fsutil.lstat_or_none(path, chip_fd)
    if st is None or not lock_reapable(st, min_age_s):
        return False
    lock = fsutil.FcntlLock(path, chip_fd)
    if not lock.acquire(blocking=False):
        return False
    try:
        if entry_json is not None and fsutil.lstat_or_none(entry_json, chip_fd) is not None:
            return False
        again = fsutil.lstat_or_none(path, chip_fd)
        if again is None or not lock_reapable(again, min_age_s):
            return False
        lock.release(unlink=True)
        return True
    finally:
        lock.release()


def release_removed(lock: fsutil.FcntlLock, json_name: str, chip_fd: int) -> None:
    """Release the held entry lock ``lock`` of an entry just removed under it (evicted, bad,
    GE-fatal), unlinking its file first when :func:`reap_lock`'s rule holds now — so an
    evicted entry does not leave its ``<kernel>.lock`` behind for an hour more: the lock is
    held (no GE process holds it), the entry's main json ``json_name`` is absent, and
    :func:`lock_reapable` holds for the lock file. A younger lock file stays for the reclaim
    pass, which unlinks it once it is old enough (docs/design.md#size-limits-and-eviction); so
    does one this process may only read (GE's ``0640``: only a read lock is held,
    :class:`~cachemgr.storage.locks.FcntlLock`); a group- or other-writable one (cachemgr's
    ``0660`` in a shared cache) stays for good, as GE leaves every lock file.

    One ``lstat`` more per removed entry; two more and the ``unlink`` when the lock file goes.
    A lock file this process may not unlink (another user's in a sticky folder) stays.

    :param chip_fd: the open chip folder of the lock file and the json.
    :raises OSError: an ``lstat`` failed for another reason than the file being gone.
    """
    st = fsutil.lstat_or_none(lock.path, chip_fd)
    due = (
        st is not None
        and lock_reapable(st, LOCK_REAP_AGE_S)
        and fsutil.lstat_or_none(Path(json_name), chip_fd) is None
    )
    try:
        lock.release(unlink=due)
    except OSError as exc:  # the lock is released all the same (its descriptor closed)
        if exc.errno not in DENIED_ERRNOS:
            raise
        # e.g. another user's lock file in a sticky folder: it stays, as before this rule


def lock_reapable(st: os.stat_result, min_age_s: float | None = None) -> bool:
    """True when no GE process can be between its ``fopen`` and its ``F_SETLK`` of the lock
    file ``st`` describes, so unlinking it cannot let a second writer into the entry
    (docs/design.md#size-limits-and-eviction): its ctime is at least ``min_age_s`` seconds
    old (default :data:`LOCK_REAP_AGE_S`) and neither its group nor others may write it.

    GE's ``TeCacheUtils::LockAndOpenCacheFile`` (``cache/te_cache_utils.cc``) opens the file
    ``a+`` (write access needed), then ``chmod``s it — refreshing the ctime — and ignores a
    failed ``chmod``: a group member who does not own the file gets ``EPERM`` and leaves the
    ctime as it was, so an old ctime says nothing about it. With ``st_mode & 0o022 == 0`` (for
    a file with an ACL the group bits are its mask, which bounds every named entry) only the
    owner — whose ``chmod`` succeeds — and a process that overrides file permissions can open
    it for writing; and any ``chmod`` that made it so set the ctime too. GE itself never
    deletes a ``.lock`` file (``te_cache_space_manager.cc`` ``AgingCacheFileByAccessTime``),
    so leaving one is what GE does.
    """
    min_age_s = LOCK_REAP_AGE_S if min_age_s is None else min_age_s
    return st.st_mode & 0o022 == 0 and not _young(st, min_age_s)


def _young(st: os.stat_result, min_age_s: float) -> bool:
    """True when the file's ctime is less than ``min_age_s`` seconds old."""
    return min_age_s > 0 and time.time() - st.st_ctime < min_age_s


def open_dir(chip_dir: Path) -> int:
    """A read-only descriptor of a chip folder, for ``*at()`` calls, reached from the cache
    root without following a link at any step (docs/security.md item 1); the caller closes it.

    :raises UnsafePathError: ``kernel_cache`` or the chip folder is a symbolic link.
    :raises OSError: ``ENOENT`` when missing, ``EACCES``.
    """
    return SafeDir.open_chip(chip_dir).fd  # the caller owns (and closes) the descriptor
