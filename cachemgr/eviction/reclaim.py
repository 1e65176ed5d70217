"""Reclaim what CANN leaves behind in a chip folder (SPEC §5), before eviction is planned.

* **entries that fail verification** — gc verifies by name: an entry whose json names no
  binary present beside it is opened (the only jsons gc opens), and removed under its lock if
  ``entry.check_entry`` confirms it is bad (unparsable json, missing binary or sub-part). Full
  sha256 checks of every entry are ``cachemgr verify --repair``'s job;
* **binaries with no json** older than :data:`ORPHAN_MIN_AGE_S` (a publish renames the binary
  before the json), through ``Store.remove_orphan`` (under the kernel's lock, without waiting);
* **``*.temp``** files older than :data:`TEMP_MAX_AGE_S` (one hour, SPEC §5), and at once
  those whose name says a process of this host made them that no longer runs (a ``kill -9``
  mid-publish; :func:`cachemgr.storage.fsutil.temp_writer_dead`);
* **``.lock`` files of entries that no longer exist**, older than an hour: taken without
  waiting, checked again while held, then unlinked (``files.reap_lock``; a lock file that a
  GE process may have open is never unlinked).

Every step updates the snapshot (files and ``used_bytes``) so the plan sees the folder as it
will be. With a dry run the same counts are made and nothing is removed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cachemgr.errors import LockBusyError
from cachemgr.eviction import files
from cachemgr.eviction.files import (
    DENIED_ERRNOS,
    NFS_SILLY_PREFIX,
    denied_line,
    reap_lock,
    remove_group,
    unlink_quiet,
)
from cachemgr.storage import entry, fsutil, manifest
from cachemgr.storage.entry import ChipScan, EntryGroup
from cachemgr.storage.store import Store
from cachemgr.storage.tiers import chip_store

log = logging.getLogger(__name__)

#: ``*.temp`` files older than this are leftovers of dead writers (seconds; SPEC §5).
TEMP_MAX_AGE_S = 3600
#: A binary without json younger than this may be a publish between its renames (seconds).
ORPHAN_MIN_AGE_S = 600
#: How long removing a bad entry waits for its lock (seconds); a writer holds it briefly.
BAD_ENTRY_LOCK_WAIT_S = 5.0


@dataclass
class ReclaimResult:
    """Counts of one reclaim pass (with a dry run: what would be reclaimed).

    :ivar bytes: apparent bytes reclaimed (or reclaimable) in total.
    :ivar bad: ``"<kernel>: <problem>"`` for each bad entry removed.
    :ivar denied: ``"<name>: <reason>"`` for each file we were not allowed to remove.
    :ivar busy: names skipped because their lock was held.
    """

    bad_entries: int = 0
    orphans: int = 0
    temps: int = 0
    locks: int = 0
    manifests: int = 0
    bytes: int = 0
    bad: list[str] = field(default_factory=list)
    denied: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    #: the run's deadline passed before every bad entry was checked (the rest waits)
    stopped: bool = False


def reclaim(
    scan: ChipScan, chip_fd: int, now_ns: int, dry_run: bool, deadline: float | None = None
) -> ReclaimResult:
    """Reclaim bad entries, old orphans, old temps and dead locks of one chip folder.

    The caller holds the eviction lock. ``scan`` is updated in place.

    :param now_ns: the clock in ns since the epoch (ages are mtime-based).
    :param deadline: ``time.monotonic()`` after which no further bad entry is waited for
        (each waits up to :data:`BAD_ENTRY_LOCK_WAIT_S` for its lock, which a member may
        hold): ``stopped`` is set and the caller releases the eviction lock (attack review).
    :raises OSError: for unexpected errors (permission problems are reported, not raised).
    """
    out = ReclaimResult()
    store = chip_store(scan.chip_dir, BAD_ENTRY_LOCK_WAIT_S, dir_fd=chip_fd)
    for group in _suspects(scan):
        if deadline is not None and time.monotonic() >= deadline:
            out.stopped = True
            return out
        _reclaim_bad(store, scan, chip_fd, group, dry_run, out)
    for name in sorted(scan.orphans):
        if not name.startswith(NFS_SILLY_PREFIX):  # open on another host; not ours to reap
            _reclaim_orphan(store, scan, name, now_ns, dry_run, out)
    for name in sorted(scan.temps):
        _reclaim_temp(scan, chip_fd, name, now_ns, dry_run, out)
    for name in sorted(scan.locks):
        _reclaim_lock(scan, chip_fd, name, now_ns / 1e9, dry_run, out)
    for name in sorted(scan.manifests):
        _reclaim_manifest(scan, chip_fd, name, dry_run, out)
    return out


def after_eviction(scan: ChipScan, chip_fd: int, out: ReclaimResult) -> None:
    """Remove the header manifests whose last entry eviction has just removed (issue 11)."""
    for name in sorted(scan.manifests):
        _reclaim_manifest(scan, chip_fd, name, False, out, _json_present)


def _json_present(scan: ChipScan, chip_fd: int, kernel: str) -> bool:
    return manifest.entry_present(chip_fd, kernel)


def _in_scan(scan: ChipScan, chip_fd: int, kernel: str) -> bool:
    return kernel in scan.entries


def _reclaim_manifest(
    scan: ChipScan,
    chip_fd: int,
    name: str,
    dry_run: bool,
    out: ReclaimResult,
    present: Callable[[ChipScan, int, str], bool] = _in_scan,
) -> None:
    """A header manifest goes with the last entry it names, or when it is bad."""
    if not manifest.stale(scan.chip_dir / name, chip_fd, lambda k: present(scan, chip_fd, k)):
        return
    if not dry_run and not _unlink_or_deny(chip_fd, name, out):
        return
    out.manifests += 1
    out.bytes += _forget(scan, scan.manifests, name)


def _unlink_or_deny(chip_fd: int, name: str, out: ReclaimResult) -> bool:
    """Remove ``name`` from the chip folder open as ``chip_fd``: True when it is gone (now or
    already), False when permission was refused (a line in ``out.denied``, SPEC §9).

    :raises OSError: anything but a permission problem (``DENIED_ERRNOS``).
    """
    try:
        unlink_quiet(chip_fd, name)
    except OSError as exc:
        if exc.errno not in DENIED_ERRNOS:
            raise
        out.denied.append(denied_line(name, exc))
        return False
    return True


def _suspects(scan: ChipScan) -> list[EntryGroup]:
    """Entries that name grouping could not tie to a binary: open their json (only theirs)."""
    found = []
    for group in [g for g in scan.entries.values() if not g.resolved]:
        entry.resolve_group(scan, group)  # claims the orphans its json names
        if not group.resolved or all(n.endswith((".json", ".h")) for n in group.files):
            found.append(group)
    return found


def _forget(scan: ChipScan, table: dict[str, entry.FileStat], name: str) -> int:
    fst = table.pop(name)
    scan.used_bytes -= fst.size
    return fst.size


def _forget_group(scan: ChipScan, group: EntryGroup) -> None:
    scan.entries.pop(group.kernel, None)
    scan.used_bytes -= group.size


def _reclaim_bad(
    store: Store, scan: ChipScan, chip_fd: int, group: EntryGroup, dry_run: bool, out: ReclaimResult
) -> None:
    kernel = group.kernel
    lock = store.entry_lock(kernel)
    try:
        if not dry_run:
            lock.acquire(timeout_s=BAD_ENTRY_LOCK_WAIT_S)
        try:
            _, problems = entry.check_entry(scan.chip_dir, kernel, chip_fd)
        except FileNotFoundError:
            _forget_group(scan, group)  # removed by someone else meanwhile: normal
            return
        if not problems:
            return
        if not dry_run:
            removal = remove_group(chip_fd, group)
            out.denied += removal.denied
            if not removal.json_gone:
                return
        out.bad_entries += 1
        out.bytes += group.size
        out.bad.append(f"{kernel}: {problems[0].kind}")
        _forget_group(scan, group)
        scan.locks.pop(kernel + ".lock", None)
    except LockBusyError:
        out.busy.append(kernel)
    except OSError as exc:
        if exc.errno not in DENIED_ERRNOS:
            raise
        out.denied.append(denied_line(kernel + ".lock", exc))
    finally:
        if lock.held:
            lock.release()  # the lock file stays: a GE process may hold it (files.reap_lock)


def orphan_kernel(name: str) -> str:
    """The kernel whose lock guards a loose file, as ``Store.remove_orphan`` computes it."""
    stem = name.split(".", 1)[0]
    for suffix in entry.PART_STEM_SUFFIXES:
        if stem.endswith(suffix):
            return stem[: -len(suffix)]
    return stem


def _reclaim_orphan(
    store: Store, scan: ChipScan, name: str, now_ns: int, dry_run: bool, out: ReclaimResult
) -> None:
    fst = scan.orphans[name]
    if now_ns - fst.mtime_ns < ORPHAN_MIN_AGE_S * 1_000_000_000:
        return
    if not dry_run:
        try:
            removed = store.remove_orphan(name)
        except OSError as exc:
            if exc.errno not in DENIED_ERRNOS:
                raise
            out.denied.append(denied_line(name, exc))
            return
        if not removed:
            return
    out.orphans += 1
    out.bytes += _forget(scan, scan.orphans, name)


def _reclaim_temp(
    scan: ChipScan, chip_fd: int, name: str, now_ns: int, dry_run: bool, out: ReclaimResult
) -> None:
    young = now_ns - scan.temps[name].mtime_ns < TEMP_MAX_AGE_S * 1_000_000_000
    if young and not fsutil.temp_writer_dead(name):
        return  # a write in progress (a dead writer of this host's temp goes at once)
    if not dry_run and not _unlink_or_deny(chip_fd, name, out):
        return
    out.temps += 1
    out.bytes += _forget(scan, scan.temps, name)


def _reclaim_lock(
    scan: ChipScan, chip_fd: int, name: str, now_s: float, dry_run: bool, out: ReclaimResult
) -> None:
    kernel = name[: -len(".lock")]
    if kernel in scan.entries:
        return  # a live entry's lock: never unlinked (issue 9 item 8)
    path = scan.chip_dir / name
    st = fsutil.lstat_or_none(path, chip_fd)
    if st is None or (files.LOCK_REAP_AGE_S > 0 and now_s - st.st_ctime < files.LOCK_REAP_AGE_S):
        return  # gone, or touched lately: a GE process may be about to lock it
    if not dry_run:
        try:
            if not reap_lock(path, scan.chip_dir / (kernel + ".json"), chip_fd=chip_fd):
                out.busy.append(name)  # held, or in use again since the scan
                return
        except OSError as exc:
            if exc.errno not in DENIED_ERRNOS:
                raise
            out.denied.append(denied_line(name, exc))
            return
    out.locks += 1
    out.bytes += _forget(scan, scan.locks, name)
