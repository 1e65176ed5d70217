"""Continuous governance of the cache (docs/design.md#size-limits-and-eviction,
#debug-compiles-and-kernel_meta, #sharing-and-locking).

* a watchdog observer on the kernel cache keeps :class:`UsageIndex` current from this host's
  writes; crossing a chip folder's limit schedules eviction (debounced, in the scheduler's
  thread — never on a caller's compile path);
* APScheduler runs the periodic, jittered reconciliation scan (other hosts' writes, drift),
  the reaper (temp files, dead locks, orphans, ``kernel_meta`` folders of dead processes) and
  the saving of counters.

Governance degrades loudly and recovers by itself (docs/troubleshooting.md#degraded-states):

* the first full scan (reclaim, then the usage index) runs in the background: the daemon
  serves at once, and :attr:`Governance.scan` shows the progress in ``status`` and ``stats``;
* every job has a deliberate misfire policy: a job that starts late (the process was paused,
  the machine overloaded) still runs, once (``misfire_grace_time=None``, ``coalesce=True``);
* eviction is debounced with a bound: however many file events arrive, an eviction due runs
  within ``evict_max_delay_s`` of the first one;
* :class:`~cachemgr.daemon.watch.Watcher` keeps the inotify watches true to the folders
  (re-armed after ``rm -rf``, polling where the kernel's limits or the budget refuse a watch),
  checked every ``watch_check_interval_s``, which is also the governance heartbeat;
* one summary line per eviction (folder, entries, bytes, before → after, seconds); the names
  only at debug level (a journal line holds 48 KiB).

Bounded memory (1,000,000 entries in ≤ 100 MB; docs/daemon.md#bounded-memory): the daemon holds the
usage index (an SQLite table, :mod:`cachemgr.daemon.usage`) and never a scan of a chip folder. The
reclaim pass, the evictions it schedules and ``/gc`` run :func:`~cachemgr.eviction.gc_chip` in a
child process (:mod:`cachemgr.daemon.gcchild`, which says why and what stays the same); the delete
events of the daemon's own eviction are dropped for the rescan that follows it (:meth:`evicting`);
restoring group-sharing modes lists a folder as a stream.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import datetime as dt
import gc
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger
from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)

from cachemgr import eviction
from cachemgr.compile import kernel_meta
from cachemgr.compile.results import ScanState
from cachemgr.config import options
from cachemgr.config.options import Settings
from cachemgr.constants import MIB
from cachemgr.daemon import gcchild
from cachemgr.daemon.config import DaemonConfig
from cachemgr.daemon.usage import UsageIndex
from cachemgr.daemon.watch import Watcher
from cachemgr.errors import CacheMgrError, LockBusyError
from cachemgr.eviction import fatal
from cachemgr.eviction import gc as cache_gc
from cachemgr.eviction.collect import skew_warned
from cachemgr.storage import entry, fsprobe, fsutil, groupmodes
from cachemgr.storage.counters import CounterBook
from cachemgr.storage.events import Events, NoSpaceEvent
from cachemgr.storage.safedir import SafeDir

log = logging.getLogger(__name__)

#: Every this many reclaim passes (hourly at the default ``reap_interval_s``), one reads every
#: json again for the shapes that make GE abort, whatever its times: the others read only the
#: jsons changed since the pass before, and a writer may change a json's bytes under times
#: already passed — through a shared mapping (``mmap``: a store to a page already dirty
#: stamps no time and sends no inotify event) or a ``write`` it stalls after its stamp
#: (docs/eviction.md#jsons-judged-before).
FULL_FATAL_EVERY = 6
#: Seconds before a json that aborts GE is tried again when its entry's lock was held.
FATAL_RETRY_S = 0.5
#: The inotify events that change usage. Opens, reads and atime updates (every hit makes
#: several) are not subscribed at all, so hits cost the daemon no event work.
WATCHED_EVENTS = [
    FileCreatedEvent,
    FileClosedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
]


def release_memory() -> None:
    """Give the heap that a full scan used back to the system (glibc ``malloc_trim``).

    A scan of 100,000 entries briefly holds ~30 MB of per-file objects; without this the
    daemon's resident size keeps that peak for its whole life (RSS ≤ 80 MB).
    """
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim  # noqa: B018 (glibc only; musl has none)
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _load_libc()


class _Events(FileSystemEventHandler):
    """The watcher's events (watchdog's full events: a file moved in from a folder that is
    not watched has an empty ``src_path``, one moved out an empty ``dest_path``). What was
    moved in is accounted but its modes are never given back
    (docs/security.md#3b-outsiders-read-nothing-ges-modes-are-given-back-on-sight):
    a member may move another user's file into the cache and back. Only a write put in
    place — a temp file renamed within its folder, as GE's ``CopyFileToCacheDir``
    and cachemgr's publish do — is given back."""

    def __init__(self, gov: Governance) -> None:
        self.gov = gov

    def on_any_event(self, event: FileSystemEvent) -> None:
        src, dest = str(event.src_path), str(event.dest_path or "")
        if event.is_directory:
            if event.event_type == "created":  # a chip folder GE just made
                self.gov.folder_appeared(Path(src))
            elif event.event_type == "moved" and dest:  # moved in: watched, not given back
                self.gov.folder_appeared(Path(dest), give_back=False)
            return
        if event.event_type == "deleted" and self.gov.evicting(src):
            return
        if event.event_type in ("created", "modified", "closed"):
            self.gov.file_event(Path(src), removed=False)
        elif event.event_type == "deleted":
            self.gov.file_event(Path(src), removed=True)
        elif event.event_type == "moved":
            if src:
                self.gov.file_event(Path(src), removed=True)
            if dest:
                self.gov.file_event(Path(dest), removed=False, give_back=_put_in_place(src, dest))


def _put_in_place(src: str, dest: str) -> bool:
    """True for a write put in place: a temp file renamed within its own folder."""
    return (
        bool(src)
        and src.endswith(fsutil.TEMP_SUFFIX)
        and os.path.dirname(src) == os.path.dirname(dest)
    )


class ScanProgress:
    """Progress of the first full scan: shown by ``status`` and ``stats``.

    ``state``: ``pending`` → ``reclaiming`` → ``indexing`` → ``done`` (or ``failed``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.state = ScanState.PENDING
        self.chips_total = 0
        self.chips_done = 0
        self.files = 0
        self.started = time.monotonic()
        self.seconds: float | None = None
        self.error = ""

    def update(self, **fields: object) -> None:
        with self._lock:
            for name, value in fields.items():
                setattr(self, name, value)

    @property
    def done(self) -> bool:
        return self.state in (ScanState.DONE, ScanState.FAILED)

    def to_json(self) -> dict[str, object]:
        with self._lock:
            elapsed = self.seconds if self.seconds is not None else time.monotonic() - self.started
            return {
                "state": self.state,
                "chip_folders_done": self.chips_done,
                "chip_folders_total": self.chips_total,
                "files": self.files,
                "seconds": round(elapsed, 3),
                **({"error": self.error} if self.error else {}),
            }


class Governance:
    """Owns the watcher, the scheduler and the usage index of one kernel cache.

    :param get_settings: returns the current settings (they change on reload).
    :param counters: where eviction results are counted.
    :param beat: called on every governance heartbeat (the watch check, every
        ``watch_check_interval_s``): the systemd watchdog's proof that this thread works.
    :param follow_ini: re-reads ``op_cache.ini`` when CANN edited it.
    :param run_as: ``(uid, gid)`` of the owner of a cache root this daemon governs for
        another user (docs/daemon.md#governing-every-cache-on-a-build-host): its reclaim
        and evictions run in a gc child with that user's rights only, and nothing else is
        changed there — no modes given back, no counters file, no toolkit check, no
        ``kernel_meta``; a chip folder that user may not change is reported once and skipped.
    """

    def __init__(
        self,
        get_settings: Callable[[], Settings],
        config: DaemonConfig,
        counters: CounterBook,
        beat: Callable[[], None] = lambda: None,
        follow_ini: Callable[[], None] | None = None,
        events: Events | None = None,
        on_entry: Callable[[str, str], None] | None = None,
        run_as: tuple[int, int] | None = None,
    ) -> None:
        self._settings = get_settings
        self.run_as = run_as
        #: chip folder → why its owner may not change it, reported once (a governed root)
        self.denied: dict[str, str] = {}
        #: told ``(soc_version, kernel)`` of each entry seen appearing in the kernel cache —
        #: by an inotify event, or at a reconciliation when its main json is newer than the
        #: last pass (other hosts' writes: docs/design.md#sharing-and-locking) — e.g. to upload it
        self.on_entry = on_entry
        self._entries_since = time.time() - config.reconcile_interval_s
        #: the sink the compile path tells of a full filesystem
        self.events = events if events is not None else Events()
        self._follow_ini = follow_ini
        #: per kernel cache folder: the toolkit check last logged (logged again on a change)
        self._toolkit_said: dict[str, str] = {}
        self.config = config
        self.counters = counters
        self._beat = beat
        self.index = UsageIndex(get_settings().layout.kernel_cache_dir)
        # Every job runs however late it starts (a paused process, an overloaded host) and
        # a job missed several times runs once: APScheduler's default grace (1 s) would drop
        # a late eviction silently.
        self.scheduler = BackgroundScheduler(
            daemon=True,
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
            logging.getLogger("apscheduler").setLevel(logging.WARNING)  # "Added job" lines
        self.watcher: Watcher | None = None
        self._lock = threading.Lock()
        self._due: dict[str, tuple[float, int | None, int | None]] = {}
        self.last_gc: dict[str, dict[str, object]] = {}
        self.scan = ScanProgress()
        #: why the cache root cannot be written now (read-only, vanished), or "";
        #: checked with the watches, eviction and reaping wait while it is set
        self.root_problem = ""
        #: per chip folder: kernel → when an entry with a future access time was first
        #: seen (ns); its eviction order
        self._first_seen: dict[str, dict[str, int]] = {}
        #: per chip folder (path as text): held while a gc child runs there, so ``/gc``
        #: requests and the daemon's evictions start at most one child per chip folder, the
        #: later waiting; a held one is a chip folder being evicted now (:meth:`evicting`)
        self._chip_runs: dict[str, threading.Lock] = {}
        self._chip_runs_lock = threading.Lock()
        #: the socs evicted now or rescanned after it: no new eviction is scheduled for them
        #: (their index lags the removals until that rescan)
        self._settling: set[str] = set()
        #: chip folders seen appearing and not yet watched (:meth:`folder_appeared`)
        self._fresh: set[str] = set()
        #: the reclaim pass checks the entries whose jsons changed since this time (ns) for
        #: shapes that make GE abort: 0 (all) for the first, then the previous pass's start
        #: less the allowed clock skew (the watcher sees this host's new jsons at once)
        self._fatal_since_ns = 0
        #: reclaim passes since one read every json (:data:`FULL_FATAL_EVERY`)
        self._passes_since_full = 0

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start watching and the periodic jobs at once; the first full scan — reclaim what
        crashed processes left (temp files, dead locks, bad entries:
        docs/design.md#sharing-and-locking), then index the cache — runs in the background (serving
        never waits for it). A publish that hits a full filesystem schedules eviction."""
        if self.run_as is None:  # another user's kernel cache exists: it is how it was found
            fsutil.ensure_dir(self.index.kernel_cache_dir)
        self.events.subscribe(NoSpaceEvent, self._on_no_space)
        self._start_watcher()
        cfg = self.config
        self.scheduler.add_job(
            self.reconcile,
            IntervalTrigger(seconds=cfg.reconcile_interval_s, jitter=cfg.reconcile_jitter_s),
            id="reconcile",
        )
        self.scheduler.add_job(self.reap, IntervalTrigger(seconds=cfg.reap_interval_s), id="reap")
        self.scheduler.add_job(
            self._save_counters,
            IntervalTrigger(seconds=cfg.counters_save_interval_s),
            id="save-counters",
        )
        self.scheduler.add_job(
            self.watch_check, IntervalTrigger(seconds=cfg.watch_check_interval_s), id="watch"
        )
        self.scheduler.add_job(self.poll, IntervalTrigger(seconds=cfg.poll_interval_s), id="poll")
        self.scheduler.start()
        threading.Thread(target=self._first_scan, name="cachemgr-first-scan", daemon=True).start()

    def _save_counters(self) -> None:
        if not self.root_problem and self.run_as is None:
            self.counters.save()

    def _first_scan(self) -> None:
        scan = self.scan
        try:
            scan.update(state="reclaiming", started=time.monotonic())
            if self.run_as is None:
                self.follow_cann()  # ini edits, toolkit upgrades, modes, other kernel caches
            self.reap()
            scan.update(state=ScanState.INDEXING)

            def progress(done: int, total: int, files: int) -> None:
                scan.update(chips_done=done, chips_total=total, files=files)

            self.index.reconcile(progress)
            release_memory()
            scan.update(state=ScanState.DONE, seconds=time.monotonic() - scan.started)
            log.info(
                "first scan of %s done in %.1f s: %d chip folders, %d files",
                self.index.kernel_cache_dir,
                scan.seconds or 0.0,
                scan.chips_total,
                scan.files,
            )
        except (OSError, CacheMgrError) as exc:
            scan.update(
                state=ScanState.FAILED, error=str(exc), seconds=time.monotonic() - scan.started
            )
            log.warning("first scan of %s failed: %s", self.index.kernel_cache_dir, exc)
            return
        for soc in self.index.chips():
            self._check_limit(soc)

    def stop(self) -> None:
        """Stop the watcher and the scheduler (waits for a running job to finish)."""
        self.events.unsubscribe(NoSpaceEvent, self._on_no_space)
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)

    def retarget(self) -> None:
        """After a reload: follow a kernel cache that moved, re-check limits."""
        new_dir = self._settings().layout.kernel_cache_dir
        if new_dir != self.index.kernel_cache_dir:
            log.info("kernel cache moved to %s", new_dir)
            if self.watcher is not None:
                self.watcher.stop()
            self.index = UsageIndex(new_dir)
            fsutil.ensure_dir(new_dir)
            self.index.reconcile()
            self._start_watcher()
        for soc in self.index.chips():
            self._check_limit(soc)

    def _start_watcher(self) -> None:
        self.watcher = Watcher(
            self.index.kernel_cache_dir, _Events(self), WATCHED_EVENTS, self.config.inotify_watches
        )
        self.watcher.start()

    def status(self) -> dict[str, Any]:
        """The first scan's progress and each chip folder's watch mode, for ``stats``,
        ``/health`` and ``/metrics``."""
        watcher = self.watcher
        return {
            "scan": self.scan.to_json(),
            "watch": {
                "kernel_cache": watcher.cache_mode() if watcher else "off",
                "chip_folders": watcher.modes() if watcher else {},
                "polled_because": watcher.reasons() if watcher else {},
            },
        }

    # --- events and jobs ------------------------------------------------------------------

    def file_event(self, path: Path, removed: bool, give_back: bool = True) -> None:
        """Account one file event; schedule eviction when a chip folder crosses its limit. A
        file that appears without ``g+rw`` (GE's ``0640``) is given back to the group at once
        where this daemon may (docs/shared-cache.md#ges-modes-given-back-on-sight) — unless
        ``give_back`` is False (a file moved in:
        docs/security.md#3b-outsiders-read-nothing-ges-modes-are-given-back-on-sight)."""
        if not removed and give_back and self.run_as is None:
            self._give_back_file(path)
        soc = self.index.file_removed(path) if removed else self.index.file_changed(path)
        if soc is not None and not removed:
            self._check_limit(soc)
        if not removed and path.name.endswith(".json"):
            if self._check_fatal(path.parent, path.name[: -len(".json")]):
                return
            if self.on_entry is not None:
                self._entry_seen(path.parent, path.name[: -len(".json")])

    def _check_fatal(self, chip: Path, stem: str) -> bool:
        """Remove at once the entry of a json that appeared if its shape makes GE abort
        (docs/interop.md#entries-that-abort-ge): one or two small reads per new json; a held
        entry lock (a writer) is tried again in :data:`FATAL_RETRY_S`. True when removed."""
        if chip.parent != self.index.kernel_cache_dir or self.root_problem:
            return False
        kernel = _kernel_of_json(chip, stem)
        if kernel is None:
            return False
        try:
            done = fatal.remove_if_fatal(chip, kernel)
        except LockBusyError:
            self._retry_fatal(chip, kernel)
            return False
        except (OSError, CacheMgrError) as exc:
            log.debug("%s/%s: not checked for shapes that abort GE: %s", chip, kernel, exc)
            return False
        if not done.removed:
            return False
        self.counters.add("ge_fatal_removed", 1, chip)
        return True

    def _retry_fatal(self, chip: Path, kernel: str) -> None:
        if not self.scheduler.running:
            return
        when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=FATAL_RETRY_S)
        self.scheduler.add_job(
            self._check_fatal,
            "date",
            run_date=when,
            args=[chip, kernel],
            id=f"fatal:{chip}/{kernel}",
            replace_existing=True,
        )

    def _give_back_file(self, path: Path) -> None:
        """``g+rw`` back on one file of the kernel cache or a chip folder that lacks it (one
        ``lstat`` for a file that has it: the daemon's own, every publish's)."""
        if path.name.endswith(fsutil.TEMP_SUFFIX):  # a write in progress: its writer sets it
            return
        st = fsutil.lstat_or_none(path)
        if st is None or not fsutil.plain_file(st) or st.st_mode & 0o060 == 0o060:
            return
        if st.st_uid == os.geteuid():  # this daemon's own: made group-sharing as it is made
            return
        kc = self.index.kernel_cache_dir
        if path.parent == kc:
            groupmodes.give_back_names(kc, [path.name], kernel_cache=True)
        elif path.parent.parent == kc:
            groupmodes.give_back_names(path.parent, [path.name])

    def folder_appeared(self, path: Path, give_back: bool = True) -> None:
        """A folder appeared in the kernel cache (GE's ``mkdir`` of a chip folder, ``0750``):
        its modes and those of the files already in it are given back to the group now,
        where this daemon may — not at the next reconciliation, minutes later (every
        compile into it was uncached meanwhile). Its watch is armed at once by a watch check
        run now in the scheduler's thread (never here: the watcher's lock is taken there
        before the observer's), which gives back the files written before the watch. A
        folder moved in (``give_back`` False) is watched, its modes left as they are
        (docs/security.md#3b-outsiders-read-nothing-ges-modes-are-given-back-on-sight)."""
        if path.parent != self.index.kernel_cache_dir or self.root_problem:
            return
        watcher = self.watcher
        if watcher is not None and path.name not in watcher.modes() and give_back:
            with self._lock:
                self._fresh.add(path.name)
        if self.run_as is None and give_back:
            self._give_back_chip(path)
        if self.scheduler.running:
            with contextlib.suppress(JobLookupError):  # stopping
                self.scheduler.modify_job("watch", next_run_time=dt.datetime.now(dt.UTC))

    def _give_back_chip(self, chip: Path) -> None:
        try:
            changed = groupmodes.give_back_folder(chip)
        except (OSError, CacheMgrError) as exc:  # gone, a link, a member's private folder
            log.debug("%s: modes not given back: %s", chip, exc)
            return
        if changed:
            log.info(
                "%s: group-sharing modes given back on %d file%s",
                chip, changed, "" if changed == 1 else "s",
            )  # fmt: skip

    def evicting(self, path: str) -> bool:
        """True when ``path`` lies in a chip folder that this daemon is evicting now.

        The removals' delete events are then dropped unhandled: the rescan after the
        eviction accounts them at once. Handling each (index update, limit check) is slower
        than the removals, and watchdog's queue of waiting events grew the daemon by ~250
        bytes per removed file (measured: 7.5 MB for 30,000). Created files
        are still handled as they come.
        """
        run = self._chip_runs.get(os.path.dirname(path))
        return run is not None and run.locked()

    def _entry_seen(self, chip: Path, stem: str) -> None:
        """Tell :attr:`on_entry` of a main json that appeared (a sub-part's json is not an
        entry: ``<kernel>_mix_aic.json`` beside ``<kernel>.json``,
        docs/design.md#files-of-an-entry)."""
        if chip.parent != self.index.kernel_cache_dir or self.on_entry is None:
            return
        for suffix in entry.PART_STEM_SUFFIXES:
            base = stem[: -len(suffix)]
            if stem.endswith(suffix) and fsutil.lstat_or_none(chip / f"{base}.json"):
                return
        try:
            self.on_entry(chip.name, stem)
        except Exception:  # a listener must not stop governance
            log.exception("handling the new entry %s/%s failed", chip.name, stem)

    def entries_sweep(self, socs: set[str] | None = None) -> int:
        """Reconciliation's share of what inotify cannot see (other hosts' writes,
        docs/design.md#sharing-and-locking): every main json whose mtime is newer than the previous
        sweep (less the allowed clock skew) is told to :attr:`on_entry`, and every json changed
        since then (mtime or ctime) is checked for shapes that make GE abort (:meth:`_check_fatal`).
        With
        ``socs`` only those chip folders (armed anew: their files were written before their
        watch) and the next sweep's start stays. Returns how many were told."""
        started = time.time()
        since = self._entries_since - float(self._settings().value("clock_skew_s"))
        seen = 0
        try:
            chips = self._settings().layout.chip_dirs()
        except CacheMgrError as exc:  # a linked kernel_cache: nothing below it is read
            log.debug("not sweeping for new entries: %s", exc)
            return 0
        if socs is not None:
            chips = [c for c in chips if c.name in socs]
        for chip in chips:
            try:
                changed = _changed_jsons(chip, since)
            except (OSError, CacheMgrError) as exc:
                log.debug("sweeping %s for new entries failed: %s", chip, exc)
                continue
            for stem, new in changed:
                if self._check_fatal(chip, stem) or not new or self.on_entry is None:
                    continue
                self._entry_seen(chip, stem)
                seen += 1
        if socs is None:
            self._entries_since = started
        return seen

    def _check_limit(self, soc: str) -> None:
        if soc in self._settling:
            return  # its eviction runs; its index is stale until the rescan after it
        max_mb = int(self._settings().value("max_op_cache_size"))
        if max_mb == -1 or self.index.used_bytes(soc) < max_mb * MIB:
            return
        if self.run_as is not None and not self._owner_may_change(soc):
            return
        self.schedule_eviction(soc)

    def _owner_may_change(self, soc: str) -> bool:
        """For a governed root: may its owner remove files in chip folder ``soc`` (write and
        search on the folder, by its mode bits)? A folder they may not — another user's
        private ``0700`` one, a root-run job's — is reported once (one warning line) and
        skipped; the next reconciliation looks again."""
        assert self.run_as is not None
        chip = self.index.kernel_cache_dir / soc
        why = owner_denied(chip, *self.run_as)
        if why is None:
            if self.denied.pop(soc, None) is not None:
                log.info("%s: its owner may change it again; governed", chip)
            return True
        if self.denied.get(soc) != why:
            log.warning("%s: skipped: %s", chip, why)
        self.denied[soc] = why
        return False

    def schedule_eviction(
        self, soc: str, ratio_pct: int | None = None, target_bytes: int | None = None
    ) -> None:
        """Run eviction of ``soc`` after the debounce delay (one pending run per chip); with
        ``ratio_pct`` down to that percent of the limit, with ``target_bytes`` down to that
        many bytes, even below the trigger.

        Each new call moves the run ``evict_debounce_s`` later, but never later than
        ``evict_max_delay_s`` after the first call: a steady stream of file events cannot
        starve eviction. Targets of calls merged into one run: the lowest.
        """
        if not self.scheduler.running:
            return
        now = time.monotonic()
        cfg = self.config
        with self._lock:
            first, ratio, target = self._due.get(soc, (now, None, None))
            new = soc not in self._due
            ratio = _lowest(ratio, ratio_pct)
            target = _lowest(target, target_bytes)
            self._due[soc] = (first, ratio, target)
        delay = max(0.0, min(cfg.evict_debounce_s, first + cfg.evict_max_delay_s - now))
        if new:
            log.info(
                "%s: %d bytes used, over its limit: eviction due in %.1f s",
                soc,
                self.index.used_bytes(soc),
                delay,
            )
        when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=delay)
        self.scheduler.add_job(
            self._evict_due,
            "date",
            run_date=when,
            args=[soc],
            id=f"evict:{soc}",
            replace_existing=True,
        )

    def _evict_due(self, soc: str) -> None:
        with self._lock:
            _, ratio, target = self._due.pop(soc, (0.0, None, None))
        self.evict(soc, ratio, target)

    def _on_no_space(self, event: NoSpaceEvent) -> None:
        """A publish hit a full filesystem (``ENOSPC``): the disk, not the limit, is full, so
        the chip folder's current usage acts as its limit — evict down to ``ratio`` % of
        ``min(limit, used)`` bytes now, in the scheduler's thread (a target in bytes,
        never rounded to "0 % of the limit"). ``max_op_cache_size=-1`` (never evict)
        is honoured: only the error is reported."""
        chip_dir, bytes_needed = event.chip_dir, event.bytes_needed
        if chip_dir.parent != self.index.kernel_cache_dir:
            return
        settings = self._settings()
        self.counters.add("no_space", chip_dir=chip_dir)
        max_mb = int(settings.value("max_op_cache_size"))
        if max_mb == eviction.NEVER_EVICT:
            log.warning("no space left in %s; eviction is off (max_op_cache_size=-1)", chip_dir)
            return
        ratio = int(settings.value("remain_cache_size_ratio"))
        used = self.index.reconcile_chip(chip_dir.name)
        target = min(max_mb * MIB, used) * ratio // 100
        log.warning(
            "no space left in %s for %d bytes: evicting %s from %d to %d bytes",
            chip_dir,
            bytes_needed,
            chip_dir.name,
            used,
            target,
        )
        self.schedule_eviction(chip_dir.name, target_bytes=target)

    def evict(
        self, soc: str, ratio_pct: int | None = None, target_bytes: int | None = None
    ) -> dict[str, object]:
        """Evict one chip folder now (the limits of the current settings; ``ratio_pct`` or
        ``target_bytes`` force a run down to that target). Not while the root cannot be
        written (it is re-checked when it can)."""
        if self.root_problem:
            log.info("eviction of %s waits: %s", soc, self.root_problem)
            return {"skipped": "root not writable", "chip_dir": "", "detail": self.root_problem}
        settings = self._settings()
        chip = settings.layout.chip_dir(soc)
        job = gcchild.GcJob(
            chip,
            int(settings.value("max_op_cache_size")),
            int(ratio_pct if ratio_pct is not None else settings.value("remain_cache_size_ratio")),
            float(settings.value("min_age_s")),
            force_ratio=ratio_pct is not None,
            target_bytes=target_bytes,
            clock_skew_s=float(settings.value("clock_skew_s")),
            first_seen=self._first_seen.setdefault(soc, {}),
            ge_fatal_since_ns=self._fatal_since_ns,
        )
        self._settling.add(soc)
        try:
            with self._gc_child_of(chip):
                (outcome,) = _run_gc(
                    [job],
                    names=_names_log.isEnabledFor(logging.DEBUG),
                    deadline_s=self.config.gc_deadline_s,
                    run_as=self.run_as,
                )
            # a rescan instead of the removals' events (also after a failure: part of it may
            # have run); files added meanwhile were accounted by their own events
            self.index.reconcile_chip(soc)
        finally:
            self._settling.discard(soc)
        if outcome.report is None:
            if not outcome.died:  # a death was logged already, once
                log.warning("evicting %s failed: %s", chip, outcome.error)
            return {"skipped": "gc error", "chip_dir": str(chip), "detail": outcome.error}
        data = outcome.report
        self.count_eviction(data)
        # kept for stats and /metrics (stuck over the limit, future access times): not
        # the name lists, which a large eviction makes long
        self.last_gc[soc] = {k: v for k, v in data.items() if k not in gcchild.NAME_LISTS}
        release_memory()
        log_eviction(soc, data)
        return data

    def gc_chip_json(
        self,
        chip: Path,
        max_mb: int,
        ratio_pct: int,
        min_age_s: float,
        *,
        force_ratio: bool = False,
        dry_run: eviction.DryRun = eviction.DryRun.NO,
        clock_skew_s: float | None = eviction.DEFAULT_CLOCK_SKEW_S,
        progress: object = None,
    ) -> dict[str, Any]:
        """``gc.collect``'s ``run_chip`` for ``/gc``: :func:`~cachemgr.eviction.gc_chip` in a
        child process (:mod:`~cachemgr.daemon.gcchild`), its report as JSON with the names.

        :raises GcChildError: the chip folder's gc failed (its one line), or the child died.
        """
        job = gcchild.GcJob(
            chip,
            max_mb,
            ratio_pct,
            min_age_s,
            force_ratio=force_ratio,
            clock_skew_s=clock_skew_s,
            dry_run=dry_run is eviction.DryRun.YES,
        )
        with self._gc_child_of(chip):
            (outcome,) = _run_gc(
                [job], names=True, deadline_s=self.config.gc_deadline_s, run_as=self.run_as
            )
        if outcome.report is None:
            raise gcchild.GcChildError(f"gc of {chip}: {outcome.error}")
        return outcome.report

    @contextmanager
    def _gc_child_of(self, chip: Path) -> Iterator[None]:
        """Wait until no other gc child of this daemon runs on ``chip``, then hold its run
        lock (which marks it evicted) while the caller runs one (attack review: every
        ``/gc`` started its own child, 40 requests ~34 interpreters; and a ``/gc`` ending
        cleared the mark of a daemon eviction still running there)."""
        with self._chip_runs_lock:
            run = self._chip_runs.setdefault(str(chip), threading.Lock())
        with run:
            yield

    def count_eviction(self, data: Mapping[str, object]) -> None:
        """Add one chip folder's gc report (``GcReport.to_json()``) to the eviction counters;
        a dry run removed nothing and counts nothing."""
        if data.get("dry_run"):
            return
        chip = data.get("chip_dir")
        for key in ("evicted_entries", "evicted_bytes"):
            value = data.get(key)
            if isinstance(value, int):
                self.counters.add(key, value, Path(str(chip)) if chip else None)
        reclaimed = data.get("reclaimed")
        fatal_removed = reclaimed.get("ge_fatal") if isinstance(reclaimed, Mapping) else None
        if isinstance(fatal_removed, int):
            self.counters.add("ge_fatal_removed", fatal_removed, Path(str(chip)) if chip else None)

    def reconcile(self) -> dict[str, int]:
        """The periodic rescan; re-checks every chip folder's limit. Other hosts' writes and
        deletes show up here (inotify does not see them, docs/design.md#sharing-and-locking); a
        rescan that fails (an NFS hiccup) is logged and the next one tries again."""
        if self.run_as is None:
            self.follow_cann()
        try:
            used = self.index.reconcile()
        except OSError as exc:
            log.warning("reconciling %s failed: %s", self.index.kernel_cache_dir, exc)
            return {}
        finally:
            release_memory()
        for soc in used:
            self._check_limit(soc)
        log.debug("reconciled usage: %s", used)
        self.entries_sweep()
        return used

    def watch_check(self) -> set[str]:
        """The governance heartbeat: keep the watches true to the folders (re-arm after a
        removal, arm new chip folders, rescan after lost events); rescan what changed."""
        self._beat()
        self._check_root()
        watcher = self.watcher
        if watcher is None:
            return set()
        try:
            rescan = watcher.check()
        except OSError as exc:
            log.warning("checking the watches of %s failed: %s", self.index.kernel_cache_dir, exc)
            return set()
        present = set(watcher.modes())
        for soc in set(self.index.chips()) - present:
            self.index.forget(soc)
        # also while the first scan runs: it may have passed it; and the folders that could
        # not be scanned (a member's private folder), until they can: warned about once
        with self._lock:
            fresh, self._fresh = self._fresh & rescan, self._fresh - rescan
        # new and armed now: what was written before its watch (never in a governed root)
        for soc in sorted(fresh) if self.run_as is None else ():
            self._give_back_chip(self.index.kernel_cache_dir / soc)
        for soc in sorted(rescan | (set(self.index.problems) & present)):
            self._rescan(soc)
        if rescan:
            self.entries_sweep(rescan)
        return rescan

    def _check_root(self) -> None:
        """Notice the root turning read-only (or vanishing) and coming back: log each change
        once; on recovery re-check every limit and save the counters kept meanwhile."""
        problem = fsprobe.root_problem(self.index.kernel_cache_dir)
        if problem == self.root_problem:
            return
        self.root_problem = problem
        if problem:
            log.warning(
                "%s: hits are served, compiles return their kernel outside the cache, "
                "eviction waits until it is writable again",
                problem,
            )
            return
        log.warning("the cache root of %s is writable again", self.index.kernel_cache_dir)
        if self.run_as is None:
            self.counters.save()
        for soc in self.index.chips():
            self._check_limit(soc)

    def poll(self) -> None:
        """Rescan the chip folders that have no inotify watch."""
        watcher = self.watcher
        if watcher is None:
            return
        for soc in watcher.polled():
            self._rescan(soc)

    def _rescan(self, soc: str) -> None:
        if self.index.rescan_isolated(soc):  # a failure is warned about once, not each time
            self._check_limit(soc)

    def follow_cann(self) -> None:
        """What CANN processes change behind the daemon's back, at
        start and on every reconciliation: an edited ``op_cache.ini`` (limits, stamps) is
        re-read; a toolkit upgrade is handled with GE's rule (``gc.sync_toolkit``); GE's
        ``0640``/``0750`` modes are given back to the group where this daemon may
        (``fsutil.share_modes``: its own files, or all with ``CAP_FOWNER``); the other
        kernel cache folders under ``${ASCEND_CACHE_PATH}`` get their reclaim and eviction.
        The toolkit check is logged at start and then only when it changes (every 5 min the
        same "toolkit version unknown" line filled a host's journal). Failures are logged;
        the next reconciliation tries again."""
        if self._follow_ini is not None:
            self._follow_ini()
        if self.root_problem:  # nothing can be changed there now
            return
        settings = self._settings()
        caches = [settings]
        for kc in settings.other_kernel_caches():
            try:
                caches.append(options.settings_for(settings, kc, os.environ))
            except CacheMgrError as exc:
                log.warning("%s: %s", kc, exc)
        for i, one in enumerate(caches):
            try:
                check = cache_gc.sync_toolkit(one, dry_run=False)
                said = str(one.layout.kernel_cache_dir)
                if check.purged:
                    log.warning("%s", check.detail)
                elif self._toolkit_said.get(said) != check.detail:  # not every reconciliation
                    log.info("%s", check.detail)
                self._toolkit_said[said] = check.detail
                for folder in [one.layout.kernel_cache_dir, *one.layout.chip_dirs()]:
                    try:
                        top = folder == one.layout.kernel_cache_dir
                        changed = groupmodes.give_back_folder(folder, kernel_cache=top)
                    except PermissionError as exc:  # a member's private chip folder: the
                        log.debug("%s: modes not restored: %s", folder, exc)  # index warns
                        continue
                    if changed:
                        log.info(
                            "%s: group-sharing modes restored on %d %s",
                            folder,
                            changed,
                            "file" if changed == 1 else "files",
                        )
                if i > 0:  # the main cache is evicted through the usage index
                    cache_gc.collect(one, include_others=False)
            except (OSError, CacheMgrError) as exc:
                log.warning("following %s failed: %s", one.layout.kernel_cache_dir, exc)

    def reap(self) -> None:
        """Reclaim what crashed or foreign processes left: temp files, dead locks, orphans
        (through eviction's reclaim) and ``kernel_meta`` folders of dead processes."""
        if self.root_problem:
            return
        settings = self._settings()
        ratio = int(settings.value("remain_cache_size_ratio"))
        try:
            chips = settings.layout.chip_dirs()
        except CacheMgrError as exc:  # a linked kernel_cache: nothing below it is touched
            log.error("not reaping: %s", exc)
            chips = []
        # max -1: no size eviction, only the reclaim pass; every chip folder in one child
        age = float(settings.value("min_age_s"))
        since = self._fatal_since_ns if self._passes_since_full < FULL_FATAL_EVERY - 1 else 0
        started_ns = time.time_ns() - int(float(settings.value("clock_skew_s")) * 1e9)
        if self.run_as is not None:  # only what its owner may change (reported once)
            chips = [c for c in chips if self._owner_may_change(c.name)]
        jobs = [
            gcchild.GcJob(chip, eviction.NEVER_EVICT, ratio, age, ge_fatal_since_ns=since)
            for chip in chips
        ]
        failed = False
        # not under the folders' run locks, and without size eviction it counts no future
        # access times: it never warns about them (and never marks a folder warned)
        done = _run_gc(
            jobs, deadline_s=self.config.gc_deadline_s, run_as=self.run_as, warn_skew=False
        )
        for job, outcome in zip(jobs, done, strict=True):
            if outcome.error and not outcome.died:  # a death was logged already, once
                log.warning("reaping %s failed: %s", job.chip_dir, outcome.error)
            skipped = (outcome.report or {}).get("skipped", "gc error")
            failed = failed or skipped not in ("", "missing")
            if outcome.report is not None:
                self.count_eviction(outcome.report)
        if not failed:  # a folder not reclaimed (busy, deadline) is read whole again
            self._fatal_since_ns = max(0, started_ns)
            self._passes_since_full = 0 if since == 0 else self._passes_since_full + 1
        log.debug(
            "reclaim pass over: GE-fatal shapes looked for in %s",
            "every json" if since == 0 else f"the jsons changed since {since} ns",
        )
        if self.run_as is not None:  # kernel_meta is the daemon's own folder, not theirs
            return
        try:
            reaped = kernel_meta.reap_orphans(
                Path(settings.value("kernel_meta_dir")), self.config.kernel_meta_retention_s
            )
        except OSError as exc:
            log.warning("reaping kernel_meta failed: %s", exc)
            return
        if reaped:
            log.info("reaped %d kernel_meta leftovers of dead processes", len(reaped))


def _changed_jsons(chip: Path, since: float) -> list[tuple[str, bool]]:
    """``(stem, new)`` of each ``*.json`` of ``chip`` changed at or after ``since`` (seconds
    since the epoch): ``new`` when its mtime is (a new entry), else only its ctime (renamed
    in with an old mtime, rewritten in place)."""
    out = []
    with SafeDir.open_chip(chip) as folder, os.scandir(folder.fd) as it:
        for d in it:
            if not d.name.endswith(".json") or not d.is_file(follow_symlinks=False):
                continue
            st = d.stat(follow_symlinks=False)
            if max(st.st_mtime, st.st_ctime) >= since:
                out.append((d.name[: -len(".json")], st.st_mtime >= since))
    return out


def _kernel_of_json(chip: Path, stem: str) -> str | None:
    """The entry a json ``<stem>.json`` of ``chip`` belongs to: a part's
    (``<kernel>_mix_aic``, ``_loc``...) is its kernel's when that main json exists; a
    ``_mix_aic``/``_mix_aiv`` json without it is read by GE only through a main json's
    ``jsonList`` (None: judged when that main json appears)."""
    for suffix in entry.PART_STEM_SUFFIXES:
        if stem.endswith(suffix):
            base = stem[: -len(suffix)]
            if fsutil.lstat_or_none(chip / f"{base}.json") is not None:
                return base
            return None if suffix in ("_mix_aic", "_mix_aiv") else stem
    return stem


def owner_denied(folder: Path, uid: int, gid: int) -> str | None:
    """Why the user ``uid`` (primary group ``gid``) may not remove files in ``folder``
    (write and search on it, by its owner, group and mode; the folder itself is not followed
    if it is a link), or None when they may.

    :returns: one phrase naming the folder's owner and mode, or None.
    """
    st = fsutil.lstat_or_none(folder)
    if st is None:
        return None  # gone: nothing to change (the index forgets it)
    if not stat.S_ISDIR(st.st_mode):
        return "not a folder (a link or a file): never followed"
    mode = st.st_mode
    if st.st_uid == uid:
        bits = mode >> 6
    elif st.st_gid == gid or st.st_gid in _groups_of(uid, gid):
        bits = mode >> 3
    else:
        bits = mode
    if bits & 0o3 == 0o3:
        return None
    return (
        f"its owner's user (uid {uid}) may not change it (owner uid {st.st_uid}, group gid "
        f"{st.st_gid}, mode {stat.S_IMODE(mode):04o}): the governor acts with the rights of "
        "the root's owner only"
    )


def _groups_of(uid: int, gid: int) -> list[int]:
    """The groups of user ``uid`` (their ``/etc/group`` memberships and ``gid``)."""
    import pwd

    try:
        return os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except (KeyError, OSError):
        return [gid]


def _run_gc(
    jobs: list[gcchild.GcJob],
    names: bool = False,
    deadline_s: float = 0.0,
    run_as: tuple[int, int] | None = None,
    *,
    warn_skew: bool = True,
) -> list[gcchild.Outcome]:
    """Run gc jobs in a child process (:mod:`cachemgr.daemon.gcchild`: the scan of a large
    chip folder never enters the daemon's heap), keeping "warn once per folder" about
    future access times here, across children. ``deadline_s`` > 0: the whole child run
    stops (at the next entry) that many seconds from now (``[daemon] gc_deadline_s``).

    With ``warn_skew`` (only for a run under its chip folder's run lock,
    ``Governance._gc_child_of``) the child may give the warning: the folder is marked warned
    for the whole run and unmarked after it when the run saw no future access times. That
    mark must not be taken by a run beside it: the reclaim pass (``reap``, no size eviction,
    so it counts no future access times) once held it while an eviction ran, which was told
    "already warned" and never warned (docs/troubleshooting.md, access times in the future).
    Without it the children never warn and the marks are left alone."""
    if deadline_s > 0:
        for job in jobs:
            job.deadline = time.monotonic() + deadline_s
    told = [warn_skew and skew_warned.first(job.chip_dir) for job in jobs]
    for job, first in zip(jobs, told, strict=True):
        job.skew_warned = not first
    outcomes = gcchild.run_jobs(jobs, names, run_as=run_as)
    for job, first, outcome in zip(jobs, told, outcomes, strict=True):
        if first and not (outcome.report or {}).get("future_atimes"):
            skew_warned.forget(job.chip_dir)  # not warned about after all
    return outcomes


def _lowest(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def log_eviction(soc: str, data: Mapping[str, Any]) -> None:
    """One summary line per eviction run (folder, entries, bytes, before → after,
    seconds); the evicted names only at debug level, in a line of their own."""
    if data.get("skipped"):
        log.info("eviction of %s skipped: %s", soc, data["skipped"])
        return
    log.info(
        "eviction of %s (%s): %d entries, %d bytes; %d -> %d bytes (target %s); "
        "kept by aging guard %d; %.3f s",
        soc,
        data.get("chip_dir"),
        data.get("evicted_entries", 0),
        data.get("evicted_bytes", 0),
        data.get("bytes_before", 0),
        data.get("bytes_after", 0),
        data.get("target_bytes"),
        data.get("kept_by_aging_guard", 0),
        data.get("seconds", 0.0),
    )
    if _names_log.isEnabledFor(logging.DEBUG) and data.get("evicted"):
        _names_log.debug("evicted from %s: %s", soc, " ".join(data["evicted"]))


#: The evicted kernels' names, at debug level (``-vv``, or ``[daemon] debug_loggers``).
_names_log = logging.getLogger("cachemgr.evicted")
