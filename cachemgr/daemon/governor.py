"""One service for every kernel cache on a build host: the ``[daemon] govern`` globs
(docs/daemon.md#governing-every-cache-on-a-build-host).

Each glob names cache roots (``/home/*/atc_data``, ``/data/*/cache``): the folders that hold
``kernel_cache`` and ``kernel_cache_<host>`` folders, each with its own ``op_cache.ini``. At
every reconciliation (``[daemon] reconcile_interval_s``, and at start) the globs are matched
again: a new root (a user created since) is governed from then on, a vanished one is
dropped. Every kernel cache folder found gets its own :class:`~cachemgr.daemon.governance.
Governance` — the daemon's own watch (inotify), usage index, debounced eviction, reaper and
periodic rescan — with its own limits, and with the rights of the root's owner only: its gc
child runs as that user (``run_as``), so nothing the owner could not change is changed.

Skipped, each reported once (one warning line) and again only when the reason changes: a
match reached through a symbolic link below the glob's fixed folders (a linked home: nothing
is followed through a link); a root that is not a folder; a root owned by root (the governor
acts as a root's owner, never as root); a kernel cache folder, or a chip folder, its owner
may not change. No file outside a matched root is touched: the globs are matched by name,
every folder below them is checked with ``lstat``, and the governances reach their files
through the directory-descriptor walk (:mod:`cachemgr.storage.safedir`).
"""

from __future__ import annotations

import datetime as dt
import glob
import logging
import os
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from cachemgr.config import layout, options
from cachemgr.config.options import Settings
from cachemgr.daemon.config import DaemonConfig
from cachemgr.daemon.governance import Governance, owner_denied
from cachemgr.errors import CacheMgrError, ConfigError
from cachemgr.peer import user_name
from cachemgr.storage.counters import CounterBook

log = logging.getLogger(__name__)
#: A ``/metrics`` gauge: name, help, labels, value (as :mod:`cachemgr.daemon.metrics`).
Gauge = tuple[str, str, dict[str, str], float]
_WILD = frozenset("*?[")


def check_globs(globs: Iterable[str], where: str = "[daemon] govern") -> tuple[str, ...]:
    """The ``govern`` globs, each an absolute path with at least one wildcard-free first
    folder (``/home/*/atc_data``, not ``*/x`` or ``/*``).

    :raises ConfigError: naming the glob, where it came from and what is accepted.
    """
    out = []
    for pattern in globs:
        parts = Path(pattern).parts
        if not pattern.startswith("/") or len(parts) < 2 or _WILD & set(parts[1]):
            raise ConfigError(
                f"{where}: {pattern!r} is not accepted: a glob of cache roots is an absolute "
                "path whose first folder has no wildcard, like '/home/*/atc_data'"
            )
        out.append(os.path.normpath(pattern))
    return tuple(out)


def _fixed_depth(pattern: str) -> int:
    """How many leading components of ``pattern`` have no wildcard (``/`` counts as one)."""
    parts = Path(pattern).parts
    for i, part in enumerate(parts):
        if _WILD & set(part):
            return i
    return len(parts)


def _why_not_a_root(path: Path, fixed: int) -> str | None:
    """Why ``path`` (a glob's match) is skipped, or None: each of its components below the
    glob's ``fixed`` ones must be a real folder, not a symbolic link (``lstat``)."""
    parts = path.parts
    for depth in range(max(fixed, 1), len(parts) + 1):
        here = Path(*parts[:depth])
        try:
            st = os.lstat(here)
        except OSError as exc:
            return f"{here}: {exc.strerror}"
        if stat.S_ISLNK(st.st_mode):
            return f"{here} is a symbolic link: nothing is followed through a link"
        if not stat.S_ISDIR(st.st_mode):
            return f"{here} is not a folder"
    owner = os.lstat(path).st_uid
    if owner == 0:
        return (
            f"{path} is owned by root: the governor acts with the rights of a root's owner "
            "and never as root"
        )
    if owner != os.geteuid() and not _can_become_others():
        return (
            f"{path} is another user's ({user_name(owner)}): acting as its owner needs "
            "CAP_SETUID and CAP_SETGID (serve --govern-only under "
            "systemd/cachemgr-governor.service)"
        )
    return None


#: ``linux/capability.h``: CAP_SETGID, CAP_SETUID.
_SETID_CAPS = (1 << 6) | (1 << 7)


def _can_become_others() -> bool:
    """True when this process holds ``CAP_SETUID`` and ``CAP_SETGID`` (effective)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16) & _SETID_CAPS == _SETID_CAPS
    return False


def match_roots(globs: Iterable[str]) -> tuple[list[Path], dict[Path, str]]:
    """The cache roots the globs match now, and those skipped with the reason (one phrase).

    A match is taken by name (``glob``); it is governed only when no component below the
    glob's wildcard-free folders is a link (:func:`_why_not_a_root`)."""
    found: dict[Path, None] = {}
    skipped: dict[Path, str] = {}
    for pattern in globs:
        fixed = _fixed_depth(pattern)
        for hit in sorted(glob.glob(pattern)):
            path = Path(os.path.normpath(hit))
            why = _why_not_a_root(path, fixed)
            if why is None:
                found.setdefault(path)
            else:
                skipped[path] = why
    return list(found), skipped


@dataclass
class GovernedCache:
    """One kernel cache folder of a governed root: its settings (its own ``op_cache.ini``
    limits, re-read at each reconciliation) and its governance."""

    kernel_cache_dir: Path
    settings: Settings
    governance: Governance
    #: the settings' problems already warned about (each once)
    told: set[str] = field(default_factory=set)

    def to_json(self) -> dict[str, Any]:
        """Per chip folder: used bytes, entries, the limit and target (bytes), the last
        eviction's figures; the scan, the watch modes and what was skipped."""
        gov, limits = self.governance, self.settings.limits
        chips = {}
        for soc in gov.index.chips():
            last = gov.last_gc.get(soc, {})
            chips[soc] = {
                "used_bytes": gov.index.used_bytes(soc),
                "entries": gov.index.entries(soc),
                "max_bytes": limits.max_bytes,
                "target_bytes": limits.target_bytes,
                "evicted_entries": last.get("evicted_entries", 0),
                "skipped": gov.denied.get(soc, ""),
            }
        return {
            "limits": limits.to_json(),
            "limits_from": self.settings["max_op_cache_size"].source or "default",
            "chip_folders": chips,
            "evicted_entries": gov.counters.snapshot().get("evicted_entries", 0),
            **gov.status(),
        }


@dataclass
class GovernedRoot:
    """A matched cache root, the owner whose rights govern it, and its kernel caches."""

    root: Path
    uid: int
    gid: int
    caches: dict[Path, GovernedCache] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "owner": user_name(self.uid),
            "uid": self.uid,
            "kernel_caches": {str(k): c.to_json() for k, c in sorted(self.caches.items())},
        }


class Governor:
    """Keeps every cache root the ``govern`` globs match within its own limits.

    :param globs: checked globs (:func:`check_globs`).
    :param base: the daemon's settings (everything but the folder and its limits).
    :param beat: the governance heartbeat, called by each governance's watch check.
    """

    def __init__(
        self,
        globs: tuple[str, ...],
        config: DaemonConfig,
        base: Callable[[], Settings],
        beat: Callable[[], None] = lambda: None,
    ) -> None:
        self.globs = globs
        self.config = config
        self._base = base
        self._beat = beat
        self._lock = threading.Lock()
        self.roots: dict[Path, GovernedRoot] = {}
        #: what was skipped and why (path → one phrase), as of the last reconciliation
        self.skipped: dict[Path, str] = {}
        self.reconciled = 0
        self.scheduler = BackgroundScheduler(
            daemon=True,
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )

    def start(self) -> None:
        """Match the globs now and at every reconciliation interval."""
        self.scheduler.add_job(
            self.reconcile,
            IntervalTrigger(
                seconds=self.config.reconcile_interval_s, jitter=self.config.reconcile_jitter_s
            ),
            id="govern",
            next_run_time=dt.datetime.now(dt.UTC),
        )
        self.scheduler.start()

    def stop(self) -> None:
        """Stop matching and every governance."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        with self._lock:
            roots, self.roots = list(self.roots.values()), {}
        for root in roots:
            for cache in root.caches.values():
                cache.governance.stop()

    def reconcile(self) -> None:
        """Match the globs again: govern new roots and new kernel cache folders, drop what
        vanished, re-read each folder's limits; report each new skip once."""
        found, skipped = match_roots(self.globs)
        live: dict[Path, GovernedRoot] = {}
        for path in found:
            root = self.roots.get(path) or self._root(path)
            if root is None:
                continue
            why = self._update(root)
            if why:
                skipped[path] = why
            live[path] = root
        for path, why in sorted(skipped.items()):
            if self.skipped.get(path) != why:
                log.warning("govern: %s skipped: %s", path, why)
        with self._lock:
            gone = [r for p, r in self.roots.items() if p not in live]
            self.roots = live
            self.skipped = skipped
            self.reconciled += 1
        for root in gone:
            log.info("govern: %s is no longer matched; not governed", root.root)
            for cache in root.caches.values():
                cache.governance.stop()

    def _root(self, path: Path) -> GovernedRoot | None:
        try:
            st = os.lstat(path)
        except OSError:
            return None
        log.info("govern: %s (owner %s) governed", path, user_name(st.st_uid))
        return GovernedRoot(path, st.st_uid, st.st_gid)

    def _update(self, root: GovernedRoot) -> str:
        """Follow ``root``'s kernel cache folders (new, vanished, limits); what is skipped
        there, as one phrase ("" for nothing)."""
        present = layout.kernel_caches_under(root.root)
        for kc in [k for k in root.caches if k not in present]:
            log.info("govern: %s vanished; not governed", kc)
            root.caches.pop(kc).governance.stop()
        skipped = []
        for kc in present:
            why = owner_denied(kc, root.uid, root.gid)
            if why is not None:
                skipped.append(f"{kc.name}: {why}")
                continue
            try:
                settings = options.settings_for(self._base(), kc, os.environ)
                cache = root.caches.get(kc)
                if cache is None:
                    cache = root.caches[kc] = self._govern(root, kc, settings)
                cache.settings = settings
            except (OSError, CacheMgrError) as exc:
                skipped.append(f"{kc.name}: {exc}")
                continue
            for problem in sorted(set(settings.problems) - cache.told):
                log.warning("govern: %s", problem)
            cache.told = set(settings.problems)
        return "; ".join(skipped)

    def _govern(self, root: GovernedRoot, kc: Path, settings: Settings) -> GovernedCache:
        holder: list[GovernedCache] = []
        counters = CounterBook(lambda: kc)  # in memory: no file of ours in their cache
        gov = Governance(
            lambda: holder[0].settings if holder else settings,
            self.config,
            counters,
            self._beat,
            run_as=(root.uid, root.gid),
        )
        cache = GovernedCache(kc, settings, gov)
        holder.append(cache)
        gov.start()
        limits = settings.limits
        log.info(
            "govern: %s: limit %s, target %s (from %s)",
            kc,
            "never evict" if limits.never_evict else f"{limits.max_op_cache_size} MB",
            limits.target_bytes,
            settings["max_op_cache_size"].source or "default",
        )
        return cache

    def caches(self) -> list[tuple[GovernedRoot, GovernedCache]]:
        """Every governed kernel cache with its root, sorted."""
        with self._lock:
            roots = sorted(self.roots.values(), key=lambda r: r.root)
        return [(r, c) for r in roots for _, c in sorted(r.caches.items())]

    def to_json(self) -> dict[str, Any]:
        """``stats --all`` and ``/health``: every governed root with its kernel caches, what
        was skipped and why, the globs and how many reconciliations ran."""
        with self._lock:
            roots = dict(self.roots)
            skipped = dict(self.skipped)
            reconciled = self.reconciled
        return {
            "globs": list(self.globs),
            "reconciliations": reconciled,
            "roots": {str(p): r.to_json() for p, r in sorted(roots.items())},
            "skipped": {str(p): why for p, why in sorted(skipped.items())},
        }

    def gauges(self) -> list[Gauge]:
        """``/metrics``: per governed root, kernel cache and chip folder, the used bytes and
        the limit (labels ``root``, ``kernel_cache``, ``soc_version``); per root whether it
        is governed (1) or skipped (0)."""
        out: list[Gauge] = []
        for root, cache in self.caches():
            gov, limits = cache.governance, cache.settings.limits
            for soc in gov.index.chips():
                labels = {"root": str(root.root), "kernel_cache": cache.kernel_cache_dir.name}
                labels["soc_version"] = soc
                out.append(
                    (
                        "cachemgr_governed_used_bytes",
                        "bytes used in a chip folder of a governed cache root",
                        labels,
                        float(gov.index.used_bytes(soc)),
                    )
                )
                if limits.max_bytes is not None:
                    out.append(
                        (
                            "cachemgr_governed_limit_bytes",
                            "the limit of a chip folder of a governed cache root (its own "
                            "op_cache.ini or the defaults)",
                            labels,
                            float(limits.max_bytes),
                        )
                    )
        with self._lock:
            roots, skipped = list(self.roots), dict(self.skipped)
        for path in roots:
            out.append(_root_gauge(path, 1.0))
        for path in skipped:
            if path not in roots:
                out.append(_root_gauge(path, 0.0))
        return out


def _root_gauge(path: Path, value: float) -> Gauge:
    return (
        "cachemgr_governed_root",
        "1 for a cache root the govern globs match and this daemon governs, 0 for one skipped",
        {"root": str(path)},
        value,
    )
