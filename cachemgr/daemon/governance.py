"""Continuous governance of the cache (SPEC §5, §7, §9; issue 5 item 3).

* a watchdog observer on the kernel cache keeps :class:`UsageIndex` current from this host's
  writes; crossing a chip folder's limit schedules eviction (debounced, in the scheduler's
  thread — never on a caller's compile path);
* APScheduler runs the periodic, jittered reconciliation scan (other hosts' writes, drift),
  the reaper (temp files, dead locks, orphans, ``kernel_meta`` folders of dead processes) and
  the saving of counters.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import datetime as dt
import gc
import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

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
from watchdog.observers import Observer

from cachemgr import eviction, fsutil, kernel_meta, options, store
from cachemgr import gc as cache_gc
from cachemgr.daemon.config import DaemonConfig
from cachemgr.daemon.state import Counters
from cachemgr.daemon.usage import UsageIndex
from cachemgr.errors import CacheMgrError
from cachemgr.options import Settings

log = logging.getLogger(__name__)
MIB = 1 << 20
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
    daemon's resident size keeps that peak for its whole life (issue 5: RSS ≤ 80 MB).
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
    def __init__(self, gov: Governance) -> None:
        self.gov = gov

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory:
            return
        src = Path(str(event.src_path))
        if event.event_type in ("created", "modified", "closed"):
            self.gov.file_event(src, removed=False)
        elif event.event_type == "deleted":
            self.gov.file_event(src, removed=True)
        elif event.event_type == "moved":
            self.gov.file_event(src, removed=True)
            self.gov.file_event(Path(str(event.dest_path)), removed=False)


class Governance:
    """Owns the observer, the scheduler and the usage index of one kernel cache.

    :param get_settings: returns the current settings (they change on reload).
    :param counters: where eviction results are counted.
    """

    def __init__(
        self,
        get_settings: Callable[[], Settings],
        config: DaemonConfig,
        counters: Counters,
        follow_ini: Callable[[], None] | None = None,
    ) -> None:
        self._settings = get_settings
        self._follow_ini = follow_ini
        self.config = config
        self.counters = counters
        self.index = UsageIndex(get_settings().layout.kernel_cache_dir)
        self.scheduler = BackgroundScheduler(
            daemon=True, job_defaults={"coalesce": True, "max_instances": 1}
        )
        self._observer: Observer | None = None
        self._lock = threading.Lock()
        self.last_gc: dict[str, dict[str, object]] = {}

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Reclaim what crashed processes left (temp files, dead locks, bad entries — SPEC §9:
        a ``kill -9`` leaves nothing for long), index the cache, start watching it and start
        the periodic jobs. A publish that hits a full filesystem schedules eviction."""
        fsutil.ensure_dir(self.index.kernel_cache_dir)
        self.follow_cann()
        self.reap()
        store.add_no_space_listener(self._on_no_space)
        self.index.reconcile()
        release_memory()
        self._start_observer()
        cfg = self.config
        self.scheduler.add_job(
            self.reconcile,
            IntervalTrigger(seconds=cfg.reconcile_interval_s, jitter=cfg.reconcile_jitter_s),
            id="reconcile",
        )
        self.scheduler.add_job(
            self.reap,
            IntervalTrigger(seconds=cfg.reap_interval_s),
            id="reap",
        )
        self.scheduler.add_job(
            self.counters.save,
            IntervalTrigger(seconds=cfg.counters_save_interval_s),
            id="save-counters",
        )
        self.scheduler.start()
        for soc in self.index.chips():
            self._check_limit(soc)

    def stop(self) -> None:
        """Stop the observer and the scheduler (waits for a running job to finish)."""
        store.remove_no_space_listener(self._on_no_space)
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=10)
            self._observer = None
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)

    def retarget(self) -> None:
        """After a reload: follow a kernel cache that moved, re-check limits."""
        new_dir = self._settings().layout.kernel_cache_dir
        if new_dir != self.index.kernel_cache_dir:
            log.info("kernel cache moved to %s", new_dir)
            if self._observer is not None:
                self._observer.stop()
                self._observer.join(timeout=10)
            self.index = UsageIndex(new_dir)
            fsutil.ensure_dir(new_dir)
            self.index.reconcile()
            self._start_observer()
        for soc in self.index.chips():
            self._check_limit(soc)

    def _start_observer(self) -> None:
        observer = Observer()
        observer.schedule(
            _Events(self),
            str(self.index.kernel_cache_dir),
            recursive=True,
            event_filter=WATCHED_EVENTS,
        )
        observer.daemon = True
        observer.start()
        self._observer = observer

    # --- events and jobs ------------------------------------------------------------------

    def file_event(self, path: Path, removed: bool) -> None:
        """Account one file event; schedule eviction when a chip folder crosses its limit."""
        soc = self.index.file_removed(path) if removed else self.index.file_changed(path)
        if soc is not None and not removed:
            self._check_limit(soc)

    def _check_limit(self, soc: str) -> None:
        max_mb = int(self._settings().value("max_op_cache_size"))
        if max_mb == -1 or self.index.used_bytes(soc) < max_mb * MIB:
            return
        self.schedule_eviction(soc)

    def schedule_eviction(self, soc: str, ratio_pct: int | None = None) -> None:
        """Run eviction of ``soc`` after the debounce delay (one pending run per chip);
        with ``ratio_pct`` down to that percent of the limit even below the trigger."""
        if not self.scheduler.running:
            return
        when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=self.config.evict_debounce_s)
        self.scheduler.add_job(
            self.evict,
            "date",
            run_date=when,
            args=[soc, ratio_pct],
            id=f"evict:{soc}",
            replace_existing=True,
        )

    def _on_no_space(self, chip_dir: Path, bytes_needed: int) -> None:
        """A publish hit a full filesystem (``ENOSPC``): the disk, not the limit, is full, so
        the chip folder's current usage acts as its limit — evict down to ``ratio`` % of
        ``min(limit, used)`` now, in the scheduler's thread. ``max_op_cache_size=-1`` (never
        evict) is honoured: only the error is reported."""
        if chip_dir.parent != self.index.kernel_cache_dir:
            return
        settings = self._settings()
        self.counters.add("no_space")
        max_mb = int(settings.value("max_op_cache_size"))
        if max_mb == eviction.NEVER_EVICT:
            log.warning("no space left in %s; eviction is off (max_op_cache_size=-1)", chip_dir)
            return
        ratio = int(settings.value("remain_cache_size_ratio"))
        used = self.index.reconcile_chip(chip_dir.name)
        effective = min(ratio, used * ratio // (max_mb * MIB))
        log.warning(
            "no space left in %s for %d bytes: evicting %s to %d %% of its limit",
            chip_dir,
            bytes_needed,
            chip_dir.name,
            effective,
        )
        self.schedule_eviction(chip_dir.name, effective)

    def evict(self, soc: str, ratio_pct: int | None = None) -> dict[str, object]:
        """Evict one chip folder now (the limits of the current settings)."""
        settings = self._settings()
        chip = settings.layout.chip_dir(soc)
        report = eviction.gc_chip(
            chip,
            int(settings.value("max_op_cache_size")),
            int(ratio_pct if ratio_pct is not None else settings.value("remain_cache_size_ratio")),
            float(settings.value("min_age_s")),
            force_ratio=ratio_pct is not None,
        )
        data = report.to_json()
        self.count_eviction(data)
        self.last_gc[soc] = data
        self.index.reconcile_chip(soc)
        release_memory()
        log.info("eviction of %s: %s", soc, data)
        return data

    def count_eviction(self, data: Mapping[str, object]) -> None:
        """Add one chip folder's gc report (``GcReport.to_json()``) to the eviction counters;
        a dry run removed nothing and counts nothing."""
        if data.get("dry_run"):
            return
        for key in ("evicted_entries", "evicted_bytes"):
            value = data.get(key)
            if isinstance(value, int):
                self.counters.add(key, value)

    def reconcile(self) -> dict[str, int]:
        """The periodic rescan; re-checks every chip folder's limit. Other hosts' writes and
        deletes show up here (inotify does not see them, SPEC §9); a rescan that fails (an
        NFS hiccup) is logged and the next one tries again."""
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
        return used

    def follow_cann(self) -> None:
        """What CANN processes change behind the daemon's back (issue 9 items 6b, 7, 9), at
        start and on every reconciliation: an edited ``op_cache.ini`` (limits, stamps) is
        re-read; a toolkit upgrade is handled with GE's rule (``gc.sync_toolkit``); GE's
        ``0640``/``0750`` modes are given back to the group where this daemon may
        (``fsutil.share_modes``: its own files, or all with ``CAP_FOWNER``); the other
        kernel cache folders under ``${ASCEND_CACHE_PATH}`` get their reclaim and eviction.
        Failures are logged; the next reconciliation tries again."""
        if self._follow_ini is not None:
            self._follow_ini()
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
                if check.purged:
                    log.warning("%s", check.detail)
                for folder in [one.layout.kernel_cache_dir, *one.layout.chip_dirs()]:
                    if changed := fsutil.share_modes(folder):
                        log.info(
                            "%s: group-sharing modes restored on %d file(s)", folder, len(changed)
                        )
                if i > 0:  # the main cache is evicted through the usage index
                    cache_gc.collect(one, include_others=False)
            except (OSError, CacheMgrError) as exc:
                log.warning("following %s failed: %s", one.layout.kernel_cache_dir, exc)

    def reap(self) -> None:
        """Reclaim what crashed or foreign processes left: temp files, dead locks, orphans
        (through eviction's reclaim) and ``kernel_meta`` folders of dead processes."""
        settings = self._settings()
        ratio = int(settings.value("remain_cache_size_ratio"))
        for chip in settings.layout.chip_dirs():
            try:  # max -1: no size eviction, only the reclaim pass
                eviction.gc_chip(
                    chip, eviction.NEVER_EVICT, ratio, float(settings.value("min_age_s"))
                )
            except (OSError, CacheMgrError) as exc:
                log.warning("reaping %s failed: %s", chip, exc)
        release_memory()
        try:
            reaped = kernel_meta.reap_orphans(
                Path(settings.value("kernel_meta_dir")), self.config.kernel_meta_retention_s
            )
        except OSError as exc:
            log.warning("reaping kernel_meta failed: %s", exc)
            return
        if reaped:
            log.info("reaped %d kernel_meta leftovers of dead processes", len(reaped))
