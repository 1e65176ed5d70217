"""Reclaim what CANN leaves behind in a chip folder (docs/design.md#size-limits-and-eviction),
before eviction is planned.

* **entries whose json makes GE abort** (:mod:`cachemgr.eviction.fatal`, the shapes of
  :mod:`cachemgr.storage.gefatal`): every entry's jsons are read (without changing access
  times), or only those changed since ``fatal_since_ns`` (the daemon, which sees new ones
  as they appear); such an entry goes at once, whole, under its lock;
* **entries that fail verification** — gc verifies by name: an entry whose json names no
  binary present beside it is opened (the only jsons gc opens), and removed under its lock if
  ``entry.check_entry`` confirms it is bad (unparsable json, missing binary or sub-part). Full
  sha256 checks of every entry are ``cachemgr verify --repair``'s job;
* **binaries with no json** older than :data:`ORPHAN_MIN_AGE_S` (a publish renames the binary
  before the json), through ``Store.remove_orphan`` (under the kernel's lock, without waiting);
* **headers GE's eviction left** (``<kernel>.h`` without ``<kernel>.json``: GE deletes the
  json and the binaries and never the header, ``TeCacheSpaceManager::GetFilesAccessTime``
  lists only those) once older than the aging guard (``min_age_s``; its modification and
  access times) and while no ``<kernel>.json…temp`` of a live writer is beside it (GE copies
  the header before the json: ``TeCacheManager::CopyCompileRetIntoCacheDir``) — counted
  with the orphans;
* **``*.temp``** files older than :data:`TEMP_MAX_AGE_S` (one hour,
  docs/design.md#size-limits-and-eviction), and at once those whose name says a process of this host
  made them that no longer runs (a ``kill -9`` mid-publish;
  :func:`cachemgr.storage.fsutil.temp_writer_dead`);
* **``.lock`` files of entries that no longer exist**, older than an hour: taken without
  waiting, checked again while held, then unlinked (``files.reap_lock``; a lock file that a
  GE process may have open is never unlinked).

Every step updates the snapshot (files and ``used_bytes``) so the plan sees the folder as it
will be. With a dry run the same counts are made and nothing is removed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from cachemgr.errors import LockBusyError
from cachemgr.eviction import fatal, files
from cachemgr.eviction.compact import CompactEntries
from cachemgr.eviction.fatalscan import FatalCandidates
from cachemgr.eviction.files import (
    DENIED_ERRNOS,
    NFS_SILLY_PREFIX,
    denied_line,
    reap_lock,
    release_removed,
    remove_group,
    unlink_quiet,
)
from cachemgr.storage import entry, fsutil, manifest
from cachemgr.storage.entry import ChipScan, EntryGroup
from cachemgr.storage.store import Store
from cachemgr.storage.tiers import chip_store

log = logging.getLogger(__name__)

#: ``*.temp`` files older than this are leftovers of dead writers (seconds;
#: docs/design.md#size-limits-and-eviction).
TEMP_MAX_AGE_S = 3600
#: A binary without json younger than this may be a publish between its renames (seconds).
ORPHAN_MIN_AGE_S = 600
#: How long removing a bad entry waits for its lock (seconds); a writer holds it briefly.
BAD_ENTRY_LOCK_WAIT_S = 5.0
#: GE's aging guard (``cache/te_cache_space_manager.cc`` ``MIN_CACHE_AGING_TIME``, seconds).
GE_MIN_AGING_S = 1800.0
#: The header GE copies beside a binary (``headerFileSuffix``; ``.h`` in every CANN entry).
HEADER_SUFFIX = ".h"


@dataclass
class ReclaimResult:
    """Counts of one reclaim pass (with a dry run: what would be reclaimed).

    :ivar bytes: apparent bytes reclaimed (or reclaimable) in total.
    :ivar bad: ``"<kernel>: <problem>"`` for each bad entry removed.
    :ivar denied: ``"<name>: <reason>"`` for each file we were not allowed to remove.
    :ivar busy: names skipped because their lock was held.
    """

    bad_entries: int = 0
    #: entries removed because their json makes GE abort (:mod:`cachemgr.eviction.fatal`)
    ge_fatal: int = 0
    orphans: int = 0
    temps: int = 0
    locks: int = 0
    manifests: int = 0
    bytes: int = 0
    bad: list[str] = field(default_factory=list)
    #: ``"<kernel>: <file>: <field> ..."`` for each GE-fatal entry removed
    fatal: list[str] = field(default_factory=list)
    denied: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    #: the run's deadline passed before every bad entry was checked (the rest waits)
    stopped: bool = False


def reclaim(
    scan: ChipScan,
    chip_fd: int,
    now_ns: int,
    dry_run: bool,
    deadline: float | None = None,
    *,
    min_age_s: float = GE_MIN_AGING_S,
    fatal_since_ns: int | None = 0,
) -> ReclaimResult:
    """Reclaim GE-fatal and bad entries, old orphans, old temps and dead locks of one chip
    folder.

    The caller holds the eviction lock. ``scan`` is updated in place.

    :param now_ns: the clock in ns since the epoch (ages are mtime-based).
    :param min_age_s: the aging guard (seconds): a header GE's eviction left is kept
        younger than this.
    :param fatal_since_ns: check the entries whose jsons changed at or after this time (ns
        since the epoch) for GE-fatal shapes; 0 = every entry, None = none.
    :param deadline: ``time.monotonic()`` after which no further bad entry is waited for
        (each waits up to :data:`BAD_ENTRY_LOCK_WAIT_S` for its lock, which a member may
        hold): ``stopped`` is set and the caller releases the eviction lock (attack review).
    :raises OSError: for unexpected errors (permission problems are reported, not raised).
    """
    out = ReclaimResult()
    store = chip_store(scan.chip_dir, BAD_ENTRY_LOCK_WAIT_S, dir_fd=chip_fd)
    if fatal_since_ns is not None:
        candidates = _fatal_candidates(scan, chip_fd, fatal_since_ns, deadline)
        for group in candidates:
            if deadline is not None and time.monotonic() >= deadline:
                out.stopped = True
                return out
            if not fatal_since_ns or fatal.changed_since(chip_fd, group, fatal_since_ns):
                _reclaim_fatal(store, scan, chip_fd, group, dry_run, out)
        if isinstance(candidates, FatalCandidates) and candidates.stopped:
            out.stopped = True
            return out
    for group in _suspects(scan):
        if deadline is not None and time.monotonic() >= deadline:
            out.stopped = True
            return out
        _reclaim_bad(store, scan, chip_fd, group, dry_run, out)
    writing = _jsons_being_written(scan, now_ns)
    for name in sorted(scan.orphans):
        if name.startswith(NFS_SILLY_PREFIX):  # open on another host; not ours to reap
            continue
        if name.endswith(HEADER_SUFFIX) and not _header_due(scan, name, now_ns, min_age_s, writing):
            continue
        _reclaim_orphan(store, scan, name, now_ns, dry_run, out)
    for name in sorted(scan.temps):
        _reclaim_temp(scan, chip_fd, name, now_ns, dry_run, out)
    for name in sorted(scan.locks):
        _reclaim_lock(scan, chip_fd, name, now_ns / 1e9, dry_run, out)
    for name in sorted(scan.manifests):
        _reclaim_manifest(scan, chip_fd, name, dry_run, out)
    return out


def after_eviction(scan: ChipScan, chip_fd: int, out: ReclaimResult) -> None:
    """Remove the header manifests whose last entry eviction has just removed."""
    for name in sorted(scan.manifests):
        _reclaim_manifest(scan, chip_fd, name, False, out, _json_present)


def after_planned_eviction(
    scan: ChipScan, chip_fd: int, kernels: Iterable[str], out: ReclaimResult
) -> None:
    """A dry run's :func:`after_eviction`: count (and take out of ``scan``) the header
    manifests that would go with their last entry once ``kernels`` are evicted, so that the
    prediction equals the run (docs/eviction.md). Removes nothing."""
    gone = set(kernels)

    def present(scan: ChipScan, chip_fd: int, kernel: str) -> bool:
        return kernel not in gone and kernel in scan.entries

    for name in sorted(scan.manifests):
        _reclaim_manifest(scan, chip_fd, name, True, out, present)


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
    already), False when permission was refused (a line in ``out.denied``,
    docs/design.md#sharing-and-locking).

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


def _reclaim_fatal(
    store: Store, scan: ChipScan, chip_fd: int, group: EntryGroup, dry_run: bool, out: ReclaimResult
) -> None:
    """Remove ``group`` if its json makes GE abort (counted in ``ge_fatal``, not ``bad``)."""
    try:
        done = fatal.remove_fatal_group(store, chip_fd, group, dry_run, BAD_ENTRY_LOCK_WAIT_S)
    except LockBusyError:
        out.busy.append(group.kernel)
        return
    except OSError as exc:
        if exc.errno not in DENIED_ERRNOS:
            raise
        out.denied.append(denied_line(group.kernel + ".lock", exc))
        return
    if done.removal is not None:
        out.denied += done.removal.denied
    if done.fatal is None or not done.removed:
        return
    out.ge_fatal += 1
    out.bytes += group.size
    out.fatal.append(f"{group.kernel}: {done.fatal.line()}")
    _forget_group(scan, group)


def _jsons_being_written(scan: ChipScan, now_ns: int) -> set[str]:
    """Kernels with a ``<kernel>.json…temp`` of a writer that may still run (young, and not
    a dead process of this host: the rule of :func:`_reclaim_temp`)."""
    out = set()
    for name, fst in scan.temps.items():
        kernel, dot_json, _ = name.partition(".json")
        young = now_ns - fst.mtime_ns < TEMP_MAX_AGE_S * 1_000_000_000
        if dot_json and young and not fsutil.temp_writer_dead(name):
            out.add(kernel)
    return out


def _header_due(
    scan: ChipScan, name: str, now_ns: int, min_age_s: float, writing: set[str]
) -> bool:
    """May the header ``name`` (no json of its own) be reclaimed: older than the aging guard
    (both its times) and no json of its kernel being written?"""
    kernel = name[: -len(HEADER_SUFFIX)]
    fst = scan.orphans[name]
    newest = max(fst.mtime_ns, fst.atime_ns)
    return kernel not in writing and now_ns - newest >= min_age_s * 1_000_000_000


def _fatal_candidates(
    scan: ChipScan, chip_fd: int, since_ns: int, deadline: float | None
) -> Iterable[EntryGroup]:
    """The entries to check in full for GE-fatal shapes, safe while entries are removed:
    every entry of a full scan; of the bounded-memory snapshot, one group at a time, only
    those a plain read of their main json does not clear
    (:class:`cachemgr.eviction.fatalscan.FatalCandidates`)."""
    if isinstance(scan.entries, CompactEntries):
        return FatalCandidates(scan.entries, chip_fd, since_ns, deadline)
    return list(scan.entries.values())


def _unresolved(scan: ChipScan) -> list[EntryGroup]:
    if isinstance(scan.entries, CompactEntries):
        return scan.entries.unresolved_groups()
    return [g for g in scan.entries.values() if not g.resolved]


def _suspects(scan: ChipScan) -> list[EntryGroup]:
    """Entries that name grouping could not tie to a binary: open their json (only theirs)."""
    found = []
    for group in _unresolved(scan):
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
            release_removed(lock, group.json_name, chip_fd)  # its lock file, once old enough
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
        return  # a live entry's lock: never unlinked
    path = scan.chip_dir / name
    st = fsutil.lstat_or_none(path, chip_fd)
    if st is None or (files.LOCK_REAP_AGE_S > 0 and now_s - st.st_ctime < files.LOCK_REAP_AGE_S):
        return  # gone, or touched lately: a GE process may be about to lock it
    if not files.lock_reapable(st, 0):
        return  # group/other-writable: a member's GE may be about to lock it (chmod EPERM)
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
