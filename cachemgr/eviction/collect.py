"""``gc`` of one chip folder: plan, then act, under CANN's eviction lock
(docs/design.md#size-limits-and-eviction, [GE]).

Steps, as ccache's cleanup and GE's ``CacheSpaceInitialize`` do them:

1. take ``<chip>/op_cache_file_del.lock`` without waiting — held means another evictor (a
   cachemgr or a CANN process, on this host or another) is at work: skip, not an error;
2. scan the folder by name (one ``scandir`` + one ``lstat`` per file, no json opened) into a
   bounded-memory snapshot (:mod:`cachemgr.eviction.compact`, docs/eviction.md#memory),
   reclaim leftovers (:mod:`cachemgr.eviction.reclaim`);
3. plan (:func:`~cachemgr.eviction.order.plan_compact`: the entries and order of
   :func:`~cachemgr.eviction.plan.plan_eviction`, which plans the full scan);
4. for each candidate, least recently accessed first: take its ``.lock`` if it has one
   (busy → skip), re-check the main json's access time (changed → a concurrent hit saved it),
   remove the files json first. Candidates saved or gone are replaced from the plan's reserve
   so the target is still met. Removals run on several threads: ``unlink`` waits on the
   filesystem and dominates the run's cost;
5. measure what is left with one name listing (sizes of known names from the scan, an
   ``lstat`` only for names it did not see): one ``lstat`` per file in the whole run.

Cost (``scripts/bench --only eviction``): the scan groups while it lists,
so a gc is one ``scandir`` + ``lstat`` pass, the plan, and the unlinks.

Entries are removed here by name rather than through ``Store.remove``, which parses the json
and waits for the entry lock (creating a lock file): on 20,000 evictions that alone costs more
than the whole name scan.
"""

from __future__ import annotations

import errno
import gc
import logging
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from cachemgr.config import layout
from cachemgr.errors import CachePermissionError
from cachemgr.eviction.compact import CompactEntries, HashCollision, scan_compact
from cachemgr.eviction.fatalscan import PlainJudge
from cachemgr.eviction.files import (
    DENIED_ERRNOS,
    denied_line,
    open_dir,
    release_removed,
    remove_group,
)
from cachemgr.eviction.judged import JudgedRecord
from cachemgr.eviction.order import CompactPlan, plan_compact
from cachemgr.eviction.plan import EvictionPlan, check_limits, plan_eviction
from cachemgr.eviction.reclaim import (
    ReclaimResult,
    after_eviction,
    after_planned_eviction,
    reclaim,
)
from cachemgr.memo import OnceSet
from cachemgr.storage import entry, fsutil, groupmodes
from cachemgr.storage.chipcount import counted_file
from cachemgr.storage.entry import ChipScan, EntryGroup

log = logging.getLogger(__name__)

#: GE's ``MIN_CACHE_AGING_TIME`` in seconds [GE].
DEFAULT_MIN_AGE_S = 1800.0
#: Access times up to this far in the future (seconds) are trusted: clocks differ a little.
DEFAULT_CLOCK_SKEW_S = 300.0
#: Threads that remove files. ``unlink`` in a large folder waits on the filesystem journal
#: (ext4) or the server (NFS), not the CPU: measured on ext4 with 2 cores, 8 threads remove
#: files ~1.9x faster than one, 2 threads ~1.3x.
DELETE_WORKERS = 8
#: Entries one removal task takes, and tasks handed out at once: only those entries are
#: held as groups (~1 KiB each) until removed, so 200,000 candidates never are at once
#: (docs/eviction.md#memory), and the threads never wait for each other.
TASK = 32
IN_FLIGHT = 4 * DELETE_WORKERS

SKIP_BUSY = "busy"
SKIP_MISSING = "missing"
#: ``op_cache_file_del.lock`` is a folder a member planted (not empty: not removed): that
#: chip folder cannot be evicted safely; the others are (docs/security.md item 2).
SKIP_BLOCKED = "blocked"
#: this user cannot list or lock the chip folder (a member's ``0700``/``0755`` folder):
#: ``denied`` names its owner and mode; the other chip folders are collected
#: (docs/security.md item 3).
SKIP_DENIED = "denied"
#: the whole gc run's deadline passed (``deadline``): the counts say what was done before it,
#: ``denied`` says so; the rest waits for the next run (attack review item 3)
SKIP_DEADLINE = "deadline"

EVICTED = "evicted"
SAVED = "saved_by_hit"
GONE = "gone"
BUSY = "busy"
DENIED = "denied"

#: A plan of either snapshot: ``entry.scan_chip``'s, or the bounded-memory one.
AnyPlan = EvictionPlan | CompactPlan

#: ``progress(done, total)``: entries handled so far out of those planned.
Progress = Callable[[int, int], None]


class DryRun(Enum):
    """Whether ``gc``/reclaim act (``NO``) or only report what they would do (``YES``)."""

    NO = "no"
    YES = "yes"


@dataclass
class GcReport:
    """What ``gc`` did to one chip folder (with a dry run: what it would do).

    Bytes are apparent sizes. ``skipped`` is ``""`` when the run happened, ``"busy"`` when
    another evictor held ``op_cache_file_del.lock``, ``"missing"`` when there is no folder.
    ``max_bytes``/``target_bytes`` are None when eviction is off (``max_op_cache_size=-1``).
    """

    chip_dir: Path
    dry_run: bool = False
    skipped: str = ""
    max_bytes: int | None = None
    target_bytes: int | None = None
    entries_before: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    triggered: bool = False
    evicted: list[str] = field(default_factory=list)
    evicted_bytes: int = 0
    kept_by_age: list[str] = field(default_factory=list)
    saved_by_hit: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    #: bytes, as the scan saw them, of the candidates' files someone else removed meanwhile
    #: (those of the ``gone`` entries, and of evicted ones whose part went before the run's
    #: unlink); a file left behind is not in it
    gone_bytes: int = 0
    busy: list[str] = field(default_factory=list)
    denied: list[str] = field(default_factory=list)
    reclaimed: ReclaimResult = field(default_factory=ReclaimResult)
    odd: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    #: entries whose access time lies beyond the clock-skew tolerance in the future, and
    #: the largest such skew (seconds), at this run's scan, before eviction
    future_atimes: int = 0
    max_skew_s: float = 0.0

    @property
    def soc_version(self) -> str:
        """The chip folder's name, e.g. ``Ascend910B1``."""
        return self.chip_dir.name

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (counts, bytes, names); stable keys for ``gc --json``."""
        rec = self.reclaimed
        return {
            "chip_dir": str(self.chip_dir),
            "dry_run": self.dry_run,
            "skipped": self.skipped,
            "max_bytes": self.max_bytes,
            "target_bytes": self.target_bytes,
            "triggered": self.triggered,
            "entries_before": self.entries_before,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "evicted_entries": len(self.evicted),
            "evicted_bytes": self.evicted_bytes,
            "evicted": self.evicted,
            "kept_by_aging_guard": len(self.kept_by_age),
            "kept": self.kept_by_age,
            "saved_by_hit": self.saved_by_hit,
            "gone": self.gone,
            "busy": sorted(set(self.busy + rec.busy)),  # a bad entry is busy once
            "denied": sorted(self.denied + rec.denied),
            "reclaimed": {
                "orphans": rec.orphans,
                "temps": rec.temps,
                "locks": rec.locks,
                "manifests": rec.manifests,
                "bad_entries": rec.bad_entries,
                "ge_fatal": rec.ge_fatal,
                "bytes": rec.bytes,
                "bad": rec.bad,
                "fatal": rec.fatal,
            },
            "not_files": self.odd,
            "seconds": round(self.seconds, 3),
            "future_atimes": self.future_atimes,
            "max_skew_s": round(self.max_skew_s, 3),
            "stuck_over_limit": self.stuck_over_limit,
        }

    @property
    def stuck_over_limit(self) -> bool:
        """Still at or over the limit after the run because the aging guard kept what was
        left ("everything is young", also after clock skew): reported, not hidden."""
        return (
            not self.dry_run
            and not self.skipped
            and self.max_bytes is not None
            and self.bytes_after >= self.max_bytes
            and bool(self.kept_by_age)
        )


def gc_chip(
    chip_dir: Path,
    max_mb: int,
    ratio_pct: int,
    min_age_s: float = DEFAULT_MIN_AGE_S,
    *,
    force_ratio: bool = False,
    dry_run: DryRun = DryRun.NO,
    progress: Progress | None = None,
    on_planned: Callable[[AnyPlan], None] | None = None,
    target_bytes: int | None = None,
    clock_skew_s: float | None = DEFAULT_CLOCK_SKEW_S,
    first_seen: dict[str, int] | None = None,
    deadline: float | None = None,
    ge_fatal_since_ns: int | None = 0,
) -> GcReport:
    """Reclaim leftovers and evict least recently accessed entries of one chip folder.

    :param chip_dir: ``<kernel cache>/<soc_version>``; a missing folder is reported as
        ``skipped="missing"`` (nothing to do, and no lock file is created).
    :param max_mb: limit in MB (MiB); -1 = no size eviction (reclaim still runs).
    :param ratio_pct: percent of the limit kept (target = max × ratio / 100).
    :param min_age_s: aging guard in seconds (GE: 1800).
    :param force_ratio: evict down to the target even below the trigger (``gc --ratio``).
    :param dry_run: ``DryRun.YES`` removes nothing and reports what would go.
    :param progress: called as ``progress(done, total)`` while entries are evicted.
    :param on_planned: called with the plan before anything is evicted (tests use it to
        play a concurrent hit or a concurrent removal).
    :param target_bytes: evict down to this many bytes when that is below the ratio's
        target (the daemon after ``ENOSPC``).
    :param clock_skew_s: access times more than this many seconds in the future are
        suspect: warned about once per folder (skew, owner) and ordered by when cachemgr
        first saw them (``first_seen``, kernel → ns, updated here; the daemon keeps it
        between runs).
    :param deadline: ``time.monotonic()`` by which the run stops: not started after it, and
        no bad entry is waited for after it (then nothing is evicted; the lock is released
        and the report says ``skipped="deadline"``, with what was done).
    :param ge_fatal_since_ns: the entries checked for json shapes that make GE abort (and
        removed at once: docs/interop.md#entries-that-abort-ge): those whose jsons changed at
        or after this time (ns since the epoch); 0 = all (each json is read once), None =
        none.
    :raises InvalidInputError: for bad limits (nothing is touched).
    :raises OSError: when the folder cannot be listed or locked (e.g. ``ENOLCK``).
    """
    check_limits(max_mb, ratio_pct, min_age_s)
    chip_dir = Path(chip_dir)
    report = GcReport(chip_dir, dry_run=dry_run is DryRun.YES)
    started = time.monotonic()
    if deadline is not None and started >= deadline:
        return _past_deadline(report)
    try:
        chip_fd = open_dir(chip_dir)
    except PermissionError:
        return _denied(report, fsutil.access_hint(chip_dir, "readable"))
    except OSError as exc:
        if not isinstance(exc, NotADirectoryError) and exc.errno not in fsutil.GONE_ERRNOS:
            raise
        # also ESTALE: another NFS host removed it (docs/design.md#sharing-and-locking)
        report.skipped = SKIP_MISSING
        return report
    lock = fsutil.FcntlLock(chip_dir / layout.EVICT_LOCK_NAME, chip_fd)
    try:
        try:
            taken = _take_evict_lock(lock)
        except (IsADirectoryError, fsutil.NotRegularFileError) as exc:
            what = "is a folder" if isinstance(exc, IsADirectoryError) else "keeps changing"
            report.skipped = SKIP_BLOCKED
            report.denied.append(
                f"{layout.EVICT_LOCK_NAME}: {what} where GE's eviction lock belongs; remove it"
            )
            log.info("%s: eviction skipped: %s", chip_dir, report.denied[-1])  # reported
            return report
        except CachePermissionError as exc:
            return _denied(report, str(exc))
        except OSError as exc:
            if exc.errno != errno.EROFS or not report.dry_run:
                raise
            # a dry run on a read-only root: nothing can change under us, and nothing is
            # removed; the plan is still worth showing (it failed on the lock file before)
            taken = True
        if not taken:
            log.info("%s: another evictor holds %s; skipped", chip_dir, layout.EVICT_LOCK_NAME)
            report.skipped = SKIP_BUSY
            return report
        try:
            with _no_cyclic_gc():
                _run(
                    chip_fd,
                    report,
                    (max_mb, ratio_pct, min_age_s, force_ratio, target_bytes),
                    (clock_skew_s, {} if first_seen is None else first_seen),
                    progress,
                    on_planned,
                    deadline,
                    ge_fatal_since_ns,
                )
        finally:
            lock.release()
    finally:
        os.close(chip_fd)
    report.seconds = time.monotonic() - started
    return report


def _denied(report: GcReport, why: str) -> GcReport:
    """Skip a chip folder this user cannot list or lock (one warning line: its owner and
    mode); the caller goes on with the other chip folders (docs/security.md item 3)."""
    report.skipped = SKIP_DENIED
    report.denied.append(why)
    log.info("%s: gc skipped: %s", report.chip_dir, why)  # the caller reports it
    return report


def _past_deadline(report: GcReport) -> GcReport:
    """Mark a run stopped by its deadline (logged once per chip folder and run)."""
    report.skipped = SKIP_DEADLINE
    report.denied.append("stopped at the gc run's deadline; the rest waits for the next run")
    log.warning("%s: gc %s", report.chip_dir, report.denied[-1])
    return report


def _take_evict_lock(lock: fsutil.FcntlLock) -> bool:
    """Take ``op_cache_file_del.lock`` without waiting (False: busy). Refused for lack of
    permission (GE's ``0750`` folder, its ``0640`` lock), it is tried once more after the modes
    were given back to the group where this process may (:mod:`cachemgr.storage.groupmodes`).

    :raises CachePermissionError: neither a write lock nor a read lock with cachemgr's
        companion lock is possible (one line: path, owner, mode, fix).
    """
    try:  # GE's 0750 folder or 0640 lock: given back to the group where we may, then again
        return groupmodes.retry_denied(
            lambda: lock.acquire(blocking=False), lock.path.parent, [lock.path.name]
        )
    except PermissionError as exc:
        raise CachePermissionError(fsutil.lock_access_hint(lock.path)) from exc


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector during a run.

    A scan of 100,000 entries allocates ~500,000 objects without cycles; the collector's
    full passes over that growing heap cost as much as the scan itself (profiled). Reference
    counting still frees everything; the collector is re-enabled if it was on.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _run(
    chip_fd: int,
    report: GcReport,
    limits: tuple[int, int, float, bool, int | None],
    clock: tuple[float | None, dict[str, int]],
    progress: Progress | None,
    on_planned: Callable[[AnyPlan], None] | None,
    deadline: float | None = None,
    ge_fatal_since_ns: int | None = 0,
) -> None:
    max_mb, ratio_pct, min_age_s, force_ratio, target_bytes = limits
    scan = _scan(report.chip_dir, chip_fd, ge_fatal_since_ns, deadline)
    report.entries_before = len(scan.entries)
    report.bytes_before = scan.used_bytes
    report.odd = dict(scan.odd)
    report.reclaimed = reclaim(
        scan,
        chip_fd,
        time.time_ns(),
        report.dry_run,
        deadline,
        min_age_s=min_age_s,
        fatal_since_ns=ge_fatal_since_ns,
    )
    if report.reclaimed.stopped:
        _past_deadline(report)
        report.bytes_after = scan.used_bytes
        return
    now_ns = time.time_ns()
    clock_skew_s, first_seen = clock
    planner = plan_compact if isinstance(scan.entries, CompactEntries) else plan_eviction
    plan = planner(
        scan,
        max_mb,
        ratio_pct,
        min_age_s,
        now_ns,
        force_ratio,
        target_bytes,
        clock_skew_s,
        first_seen,
    )
    if plan.suspect:
        _note_skew(report, plan.suspect, now_ns, first_seen)
    report.max_bytes, report.target_bytes = plan.max_bytes, plan.target_bytes
    report.triggered = plan.triggered
    report.kept_by_age = list(plan.kept_kernels)
    if on_planned is not None:
        on_planned(plan)
    if report.dry_run:
        report.evicted = list(plan.kernels)
        report.evicted_bytes = plan.evict_bytes
        if report.evicted:  # the manifests that would go with them, as the run removes
            after_planned_eviction(scan, chip_fd, report.evicted, report.reclaimed)
    else:
        _evict(chip_fd, scan, plan, report, progress)
        if plan.kernels:
            after_eviction(scan, chip_fd, report.reclaimed)
    report.bytes_after = _left(chip_fd, scan, report)
    log.debug(
        "%s: %d -> %d bytes; evicted %d entries (%d bytes); reclaimed %d bytes",
        report.chip_dir,
        report.bytes_before,
        report.bytes_after,
        len(report.evicted),
        report.evicted_bytes,
        report.reclaimed.bytes,
    )


def _scan(
    chip_dir: Path, chip_fd: int, fatal_since_ns: int | None = None, deadline: float | None = None
) -> ChipScan:
    """The chip folder's snapshot in bounded memory (:mod:`cachemgr.eviction.compact`),
    its main jsons changed since ``fatal_since_ns`` judged for GE-fatal shapes as listed
    (None: not judged; docs/eviction.md#cost) until ``deadline`` (``time.monotonic()``; the
    rest is left to the full check, which stops at it); the full one of ``entry.scan_chip``
    when two names met under one hash key. When every main json is judged
    (``fatal_since_ns`` 0), those a previous gc judged and nobody else can have changed are
    not read again (:mod:`cachemgr.eviction.judged`), and the record is written for the next."""
    record = JudgedRecord.open(chip_dir, chip_fd) if fatal_since_ns == 0 else None
    judge = (
        None if fatal_since_ns is None else PlainJudge(chip_fd, fatal_since_ns, deadline, record)
    )
    try:
        scan = scan_compact(chip_dir, chip_fd, judge)
    except HashCollision as exc:
        log.warning("%s: two names share a hash key (%s); scanned in full", chip_dir, exc)
        return entry.scan_chip(chip_dir, chip_fd)
    if record is not None:
        record.save()
    return scan


#: Chip folders already warned about for future access times (once per folder; bounded:
#: a folder pushed out by 4096 others may be warned about once more). Public: the daemon
#: keeps "once" across its gc children (``governance``, ``gcchild``).
skew_warned: OnceSet[Path] = OnceSet("future access times warned", 4096)


def _note_skew(
    report: GcReport, suspect: tuple[EntryGroup, ...], now_ns: int, first_seen: dict[str, int]
) -> None:
    """Record suspect (future) access times; warn once per folder naming the largest skew
    and the owner of that entry (whose host's clock runs ahead)."""
    for group in suspect:
        first_seen.setdefault(group.kernel, now_ns)
    worst = max(suspect, key=lambda g: g.atime_ns)
    report.future_atimes = len(suspect)
    report.max_skew_s = (worst.atime_ns - now_ns) / 1e9
    if not skew_warned.first(report.chip_dir):
        return
    st = fsutil.lstat_or_none(report.chip_dir / worst.json_name)
    owner = fsutil.user_name(st.st_uid) if st is not None else "?"
    log.warning(
        "%s: %d entries have access times in the future, up to %.0f s ahead (e.g. %s, owner "
        "%s: a host whose clock runs ahead?); they are ordered by when cachemgr first saw them",
        report.chip_dir,
        len(suspect),
        report.max_skew_s,
        worst.kernel,
        owner,
    )


def _left(chip_fd: int, scan: ChipScan, report: GcReport) -> int:
    """``bytes_after`` (docs/eviction.md#what-a-gc-leaves): the scan's bytes after reclaim,
    less what the run removed and the candidates' files it found gone, as ccache's cleanup
    counts what it leaves; measured by a listing (:func:`_bytes_after`) only when that figure is
    still at or over the limit, so "still over its limit" is said of what is there now."""
    left = scan.used_bytes - report.evicted_bytes - report.gone_bytes
    if report.dry_run or report.max_bytes is None or left < report.max_bytes:
        return left
    return _bytes_after(chip_fd, scan)


def _bytes_after(chip_fd: int, scan: ChipScan) -> int:
    """Apparent bytes of the regular files in the folder open as ``chip_fd`` now
    (docs/eviction.md#what-a-gc-leaves), measured by listing it again: a name the scan knew is
    counted with the size the scan saw while the listing still shows a regular file there (a
    FIFO, link or folder renamed over it counts nothing), a name it did not know is
    ``lstat``-ed (regular files only), a name no longer listed is not counted.

    One listing instead of a second ``lstat`` of every file (that pass cost
    as much as the scan's own ``stat`` calls), streamed (no list of every name: gc's peak
    memory stays the scan's). Entry files are published by ``rename`` and never rewritten in
    place, so a name keeps its size while it is listed; the daemon's periodic reconciliation
    ``lstat``-s everything anyway (docs/design.md#sharing-and-locking).
    """
    entries = scan.entries
    compact = entries if isinstance(entries, CompactEntries) else None
    tables = (scan.orphans, scan.temps, scan.locks, scan.silly, scan.manifests)
    total = 0
    with os.scandir(chip_fd) as it:
        for de in it:
            name = de.name
            if compact is not None:
                known = compact.size_of(name)
                if known >= 0:  # while still a regular file: a FIFO, link or folder renamed
                    total += known if de.is_file(follow_symlinks=False) else 0  # over it: 0
                    continue
                fst = None
            else:
                group = entries.get(name.rpartition(".")[0])
                fst = None if group is None else group.files.get(name)
            if fst is None:
                fst = _known(tables, name)
            if fst is not None:  # while still a regular file (d_type: no stat)
                total += fst[0] if de.is_file(follow_symlinks=False) else 0
                continue
            try:
                st = de.stat(follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile
            if counted_file(name, st):  # a hard link counts for nothing, as in the scan
                total += st.st_size
    return total


def _known(tables: tuple[dict[str, entry.FileStat], ...], name: str) -> entry.FileStat | None:
    """The scan's record of a file that is not an entry's by its stem (parts, leftovers)."""
    for table in tables:
        fst = table.get(name)
        if fst is not None:
            return fst
    return None


def _evict(
    chip_fd: int, scan: ChipScan, plan: AnyPlan, report: GcReport, progress: Progress | None
) -> None:
    """Remove the candidates, then as much of the reserve as the shortfall needs, on
    :data:`DELETE_WORKERS` threads: tasks of :data:`TASK` entries, at most
    :data:`IN_FLIGHT` of them handed out at once (only their entries are made into groups),
    each recorded in plan order once done. An entry is handed out only while the bytes
    freed and those in flight fall short of the plan's need, so a hit that saves a candidate
    brings in the next entry of the reserve, and the reserve is not walked otherwise.

    Tasks are handed out as threads free up, not in batches that wait for their slowest
    thread: the ``unlink`` of a file in a large folder sleeps (ext4's journal), and only
    threads kept busy overlap those sleeps (``scripts/bench --only eviction``: the threaded
    floor).
    """
    counter = _Counter(len(plan.kernels), progress)
    pending = plan.pending()
    need = plan.need_bytes
    flying: deque[tuple[Future[list[Outcome]], int]] = deque()
    planned = 0  # bytes of the entries handed out and not yet recorded
    with ThreadPoolExecutor(DELETE_WORKERS, thread_name_prefix="cachemgr-evict") as pool:
        while True:
            task: list[EntryGroup] = []
            size = 0
            while len(task) < TASK and report.evicted_bytes + planned + size < need:
                group = next(pending, None)
                if group is None:
                    break
                task.append(group)
                size += group.size
            if task:
                counter.total = max(counter.total, counter.handed + len(task))
                counter.handed += len(task)
                flying.append((pool.submit(_evict_slice, chip_fd, scan, task, counter), size))
                planned += size
                if len(flying) < IN_FLIGHT:
                    continue
            if not flying:
                return
            job, size = flying.popleft()
            planned -= size
            for outcome, group, freed, gone, denied in job.result():
                _record(report, outcome, group, freed, gone, denied)


class _Counter:
    """Entries handled so far, shared by the removal threads; reports every 256."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total = total
        self.done = 0
        self.handed = 0  # entries handed to the threads (the main thread's count)
        self._progress = progress
        self._lock = threading.Lock()

    def tick(self, n: int) -> None:
        with self._lock:
            self.done += n
            if self._progress is not None:
                self._progress(self.done, self.total)


#: (outcome, the entry, bytes this run removed, bytes of its files found already gone,
#: denied lines)
Outcome = tuple[str, EntryGroup, int, int, list[str]]


def _evict_slice(
    chip_fd: int, scan: ChipScan, groups: list[EntryGroup], counter: _Counter
) -> list[Outcome]:
    out = []
    for i, group in enumerate(groups, 1):
        out.append(_evict_one(chip_fd, scan, group))
        if i % 256 == 0:
            counter.tick(256)
    counter.tick(len(groups) % 256)
    return out


def _evict_one(chip_fd: int, scan: ChipScan, group: EntryGroup) -> Outcome:
    """Re-check and remove one entry; returns an :data:`Outcome`."""
    lock = None
    lock_name = group.kernel + ".lock"
    try:
        if lock_name in scan.locks:
            lock = fsutil.FcntlLock(scan.chip_dir / lock_name, chip_fd)
            if not lock.acquire(blocking=False):
                return BUSY, group, 0, 0, []
        st = _lstat_at(chip_fd, group.json_name)
        if st is None or not stat.S_ISREG(st.st_mode):  # a FIFO/link renamed over it: no entry
            return GONE, group, 0, _absent_bytes(chip_fd, group, ()), []
        if st.st_atime_ns != group.atime_ns:
            return SAVED, group, 0, 0, []  # a hit touched it after the scan: the hit wins
        removal = remove_group(chip_fd, group)
        if lock is not None and removal.json_gone:  # its lock file too, once old enough
            release_removed(lock, group.json_name, chip_fd)
    except OSError as exc:
        if exc.errno not in DENIED_ERRNOS:
            raise
        return DENIED, group, 0, 0, [denied_line(lock_name, exc)]
    finally:
        if lock is not None and lock.held:
            lock.release()  # the lock file stays: a GE process may hold it (files.reap_lock)
    outcome = EVICTED if removal.json_gone else DENIED
    gone = _absent_bytes(chip_fd, group, removal.removed) if removal.json_gone else 0
    return outcome, group, removal.bytes, gone, removal.denied


def _absent_bytes(chip_fd: int, group: EntryGroup, removed: Sequence[str]) -> int:
    """Bytes (as the scan saw them) of the files of ``group`` that are not there now and
    that this run did not remove: another remover's (docs/eviction.md#what-a-gc-leaves).
    Only the json's absence (or a FIFO, link or folder under its name) says an entry is
    gone; its other files are each looked at (an ``lstat`` for each file the run did not
    remove: none after a whole removal), so a binary left behind still counts as left."""
    total = 0
    for name, fst in group.files.items():
        if name in removed:
            continue
        try:
            st = _lstat_at(chip_fd, name)
            absent = st is None or not stat.S_ISREG(st.st_mode)  # a FIFO/link put there counts 0
        except OSError:  # cannot tell (an NFS hiccup): counted as left, which is measured
            absent = False
        if absent:
            total += fst[0]
    return total


def _lstat_at(chip_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.lstat(name, dir_fd=chip_fd)
    except OSError as exc:
        if exc.errno in fsutil.GONE_ERRNOS:
            return None
        raise


def _record(
    report: GcReport, outcome: str, group: EntryGroup, freed: int, gone: int, denied: list[str]
) -> None:
    report.denied += denied
    report.gone_bytes += gone
    if outcome == EVICTED:
        report.evicted.append(group.kernel)
        report.evicted_bytes += freed
    elif outcome == SAVED:
        report.saved_by_hit.append(group.kernel)
    elif outcome == GONE:
        report.gone.append(group.kernel)
    elif outcome == BUSY:
        report.busy.append(group.kernel)
