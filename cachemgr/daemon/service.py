"""The daemon's service object: settings (swappable on reload), counters, the compile queue,
governance, and the operations the API exposes. No HTTP here (see ``api``/``server``)."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from apscheduler.triggers.interval import IntervalTrigger

from cachemgr import eviction
from cachemgr.compile import build, environment, inputs, request
from cachemgr.compile.queue import CompileOutcome, CompileQueue
from cachemgr.compile.results import (
    ChipStats,
    GcResult,
    JobState,
    ScanState,
    StatsResult,
    Status,
)
from cachemgr.compilers import process
from cachemgr.config import ini, options
from cachemgr.constants import VERSION
from cachemgr.daemon import peer
from cachemgr.daemon.config import DaemonConfig
from cachemgr.daemon.governance import Governance, release_memory
from cachemgr.daemon.governor import Governor, check_globs
from cachemgr.daemon.heartbeat import GOVERNANCE, POOL, Heartbeats
from cachemgr.daemon.hitbudget import HitBudget
from cachemgr.daemon.metrics import Gauge, Metrics
from cachemgr.daemon.state import remotes_state_dir
from cachemgr.errors import CacheMgrError, InvalidInputError
from cachemgr.eviction import gc
from cachemgr.peer import user_name
from cachemgr.remote import config as remote_config
from cachemgr.remote import warm
from cachemgr.remote.tierset import RemoteTiers
from cachemgr.storage import exposure, fsutil
from cachemgr.storage.counters import COUNTER_NAMES, CounterBook, summed
from cachemgr.storage.events import Events
from cachemgr.storage.tiers import chip_store

log = logging.getLogger(__name__)
#: How long finished async jobs stay pollable (seconds).
JOB_TTL_S = 3600.0
#: Parsed compile requests remembered (entries; each a few KB).
PARSED_CACHE_SIZE = 4096


class GovernOnly(CacheMgrError):
    """A request that only a compile service answers, sent to ``serve --govern-only``."""

    exit_code = 2
    http_status = 403


class Service:
    """Everything the daemon does, behind the API.

    :param resolve: builds fresh settings (called at start and on every reload); raises
        :class:`ConfigError` for a bad configuration.
    :param state_path: unused (counters live in the kernel cache: :mod:`cachemgr.storage.counters`);
        kept for callers that still pass the old per-user file.
    :param govern_only: ``serve --govern-only`` (docs/daemon.md#the-privileges-it-needs):
        the ``[daemon] govern`` roots only — no compile, lookup, hits or ``/gc`` (403), and
        the configured cache of its own is not governed.
    :raises ConfigError: a bad ``[daemon] govern`` glob.
    """

    def __init__(
        self,
        resolve: Callable[[], options.Settings],
        config: DaemonConfig,
        state_path: Path,
        remote_cli: Sequence[str] = (),
        govern_only: bool = False,
    ) -> None:
        self.govern_only = govern_only
        self._resolve = resolve
        self._settings = resolve()
        self.daemon_config = config
        self.started = time.monotonic()
        self.accepting = True
        self.tcp_address: tuple[str, int] | None = None
        self.counters = CounterBook(lambda: self._settings.layout.kernel_cache_dir)
        self.events = Events()  # tier events: a full disk on publish → eviction
        #: the remote tiers of ``--remote`` / ``CACHEMGR_REMOTE_STORAGE`` / ``[remote]
        #: storage``
        self._remote_cli = list(remote_cli)
        self.remote_config = remote_config.from_settings(self._settings, self._remote_cli)
        self.remotes = RemoteTiers.from_config(
            self.remote_config, remotes_state_dir(), strict_key=True
        )
        self.queue = CompileQueue(
            self._settings,
            workers=config.workers or os.cpu_count() or 1,
            lock_timeout_s=config.lock_wait_s or None,
            tally=self.counters.tally,
            max_queued_per_caller=config.max_queued_per_caller or None,
            reserve_workers=config.reserve_workers,
            events=self.events,
            remotes=self.remotes,
        )
        self.heartbeats = Heartbeats(
            config.heartbeat_timeout_s, {POOL: lambda: self.queue.stalled_s() > self._stall_s}
        )
        self._stall_s = self.queue.timeout_s + config.heartbeat_timeout_s
        self._ini_seen: bytes | None = self._ini_bytes()
        self.governance = Governance(
            lambda: self._settings,
            config,
            self.counters,
            lambda: self.heartbeats.beat(GOVERNANCE),
            follow_ini=self._follow_ini,
            events=self.events,
            on_entry=self._entry_seen if self.remotes and self.remotes.writable else None,
        )
        self._metrics = Metrics(
            self.counters,
            lambda: self.governance.index,
            self._limit_bytes,
            self.queue.depth,
            self._gauges,
            self.queue.figures,
            self.remote_stats,
            lambda: self.remotes.upload_refused if self.remotes is not None else 0,
        )
        #: every cache root the ``[daemon] govern`` globs match (docs/daemon.md)
        self.governor = (
            Governor(
                check_globs(config.govern),
                config,
                lambda: self._settings,
                lambda: self.heartbeats.beat(GOVERNANCE),
            )
            if config.govern
            else None
        )
        self.hit_budget = HitBudget(config.max_reported_hits_per_s)
        self._jobs: dict[str, dict[str, Any]] = {}
        self._jobs_lock = threading.Lock()
        self._reload_lock = threading.Lock()
        #: the last reload's result for ``/health`` (``status``): None before the first
        self.last_reload: dict[str, Any] | None = None
        self._parsed = request.ParsedRequests(PARSED_CACHE_SIZE)
        #: the compilers' sandbox (``cachemgr.compilers.sandbox``), set by ``serve``; without
        #: an isolating one, compiles for other users are refused
        self.sandbox: Any = None

    @property
    def settings(self) -> options.Settings:
        return self._settings

    def _limit_bytes(self) -> int | None:
        """The limit in bytes, None = never evict (one reading: ``Settings.limits``)."""
        return self._settings.limits.max_bytes

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Index the cache and start governance (and ``[remote] prefetch``: at once, then
        at every reconciliation interval); the ``[daemon] govern`` roots."""
        if self.governor is not None:
            self.governor.start()
        if self.govern_only:
            return
        self.governance.start()
        if self.remotes is not None and self.remote_config.prefetch > 0:
            self.governance.scheduler.add_job(
                self.prefetch,
                IntervalTrigger(seconds=self.daemon_config.reconcile_interval_s),
                id="prefetch",
                next_run_time=dt.datetime.now(dt.UTC),
            )

    def _entry_seen(self, soc_version: str, kernel: str) -> None:
        """An entry appeared in the kernel cache (a CANN process's write, another host's,
        or our own publish): queue it for upload; the uploader reads it only if it is
        complete and verified, and skips it when the remote has it."""
        if self.remotes is not None:
            kcd = self._settings.layout.kernel_cache_dir
            self.remotes.upload_later(kcd, soc_version, kernel, seen=True)

    def prefetch_socs(self) -> list[str]:
        """This host's chips for ``[remote] prefetch``: ``prefetch_socs``, else the chip
        folders present and ``soc_version``."""
        if self.remote_config.prefetch_socs:
            return list(self.remote_config.prefetch_socs)
        socs = [c.name for c in self._settings.layout.chip_dirs()]
        own = self._settings.value("soc_version")
        return sorted({*socs, *([own] if own else [])})

    def prefetch(self) -> list[dict[str, Any]]:
        """``[remote] prefetch``: warm each of this host's chip folders with the entries most
        recently used anywhere (:mod:`cachemgr.remote.warm`)."""
        if self.remotes is None or self.governance.root_problem:
            return []
        settings = self._settings
        reports = []
        for soc in self.prefetch_socs():
            try:
                report = warm.warm_chip(
                    self.remotes,
                    settings.layout.kernel_cache_dir,
                    soc,
                    None,
                    self.remote_config.prefetch,
                    settings.limits.target_bytes,
                    settings.sections,
                )
            except CacheMgrError as exc:
                log.warning("prefetch of %s: %s", soc, exc)
                continue
            reports.append(report.to_json())
        return reports

    def stop(self, timeout_s: float) -> None:
        """Stop taking work, let running compiles finish (up to ``timeout_s``), save state."""
        self.accepting = False
        self.queue.close(timeout_s=timeout_s)
        if self.remotes is not None:
            self.remotes.close()
        if self.governor is not None:
            self.governor.stop()
        self.governance.stop()
        self.counters.save()

    def reload(self) -> dict[str, Any]:
        """Re-resolve settings (config file, env, op_cache.ini); keep the old ones on error.

        Running and queued jobs are not dropped: they finish under the settings they began
        with; new work uses the new ones.
        """
        with self._reload_lock:
            try:
                new = self._resolve()
                DaemonConfig.from_table(new.sections.get("daemon"))  # same checks as at start
                remotes = remote_config.from_settings(new, self._remote_cli)  # password files too
                tiers = self.remotes
                if remotes != self.remote_config:  # keys: the same checks as at start
                    tiers = RemoteTiers.from_config(remotes, remotes_state_dir(), strict_key=True)
            except CacheMgrError as exc:
                log.error("reload refused, keeping the old configuration: %s", exc)
                self.last_reload = _reload_result(False, str(exc))
                return {"reloaded": False, "error": str(exc)}
            self._settings = new
            if remotes != self.remote_config:
                self._replace_remotes(remotes, tiers)
            elif self.remotes is not None:  # fixed on the server's side: try again
                self.remotes.enable_all()
            self.queue.update_settings(new)
            self.governance.retarget()
        for problem in new.problems:
            log.warning("%s", problem)
        self.last_reload = _reload_result(True, None)
        log.info("configuration reloaded")
        return {"reloaded": True, "problems": list(new.problems)}

    def _replace_remotes(
        self, config: remote_config.RemoteConfig, tiers: RemoteTiers | None
    ) -> None:
        """Use the remotes of ``config`` (a reload changed ``[remote]``, a password file or
        ``CACHEMGR_REMOTE_STORAGE``'s reading): new tiers, enabled, for new compiles and
        for entries the watcher sees; the old ones finish their queued uploads and close in
        the background. A remote disabled for refused credentials comes back this way once
        its credentials are fixed."""
        old = self.remotes
        self.remote_config = config
        self.remotes = tiers
        self.queue.set_remotes(self.remotes)
        writable = self.remotes is not None and self.remotes.writable
        self.governance.on_entry = self._entry_seen if writable else None
        names = ", ".join(t.name for t in self.remotes.tiers) if self.remotes else "none"
        log.info("remotes reloaded: %s", names)
        if old is not None:
            threading.Thread(target=old.close, name="cachemgr-remote-close", daemon=True).start()

    def _ini_bytes(self) -> bytes | None:
        """The ini's bytes (no symlink followed, no FIFO opened, atime kept), or None."""
        try:
            return fsutil.read_bytes_noatime(
                self._settings.layout.ini_path, max_bytes=ini.MAX_INI_BYTES
            )
        except OSError:
            return None

    def _follow_ini(self) -> None:
        """Re-read the settings when ``op_cache.ini`` changed on disk: an
        edited limit or stamp takes effect within one reconciliation, without a reload."""
        now = self._ini_bytes()
        if now == self._ini_seen:
            return
        self._ini_seen = now
        log.info("%s changed; re-reading the limits", self._settings.layout.ini_path)
        self.reload()

    # --- read-only operations -------------------------------------------------------------

    def remote_stats(self) -> dict[str, dict[str, Any]]:
        """Per remote: hits, misses, errors, rejected, bytes in/out, uploads, present,
        state (ok / failing / disabled), its URL (redacted) — ``stats``, ``/metrics`` and
        ``status`` show the same figures."""
        return self.remotes.stats() if self.remotes is not None else {}

    def _rejected_by_reason(self) -> dict[str, int]:
        """Rejected blobs by reason, summed over the remotes."""
        total: dict[str, int] = {}
        for row in self.remote_stats().values():
            for reason, n in row.get("rejected_by_reason", {}).items():
                total[reason] = total.get(reason, 0) + n
        return dict(sorted(total.items()))

    def health(self) -> dict[str, Any]:
        degraded = self.degraded()
        status = "degraded" if degraded else "ok"
        return {
            "status": status if self.accepting else "stopping",
            "degraded": degraded,
            "service": "cachemgr",
            "pid": os.getpid(),
            "version": VERSION,
            "uptime_s": round(time.monotonic() - self.started, 3),
            "tcp": list(self.tcp_address) if self.tcp_address else None,
            "kernel_cache_dir": str(self._settings.layout.kernel_cache_dir),
            "scan": self.governance.scan.to_json(),
            "stuck": self.heartbeats.stale(),
            "remotes": self.remote_stats(),
            "warnings": self.warnings(),
            "last_reload": self.last_reload,
            **({"governed": self.governor.to_json()} if self.governor is not None else {}),
            **({"govern_only": True} if self.govern_only else {}),
        }

    def warnings(self) -> list[str]:
        """What the operator should fix though the daemon works, one ``warning: …`` line
        each: a kernel cache every local user can read
        (docs/shared-cache.md#outsiders-read-nothing); what weakens or limits the remote tier
        (``trust_unsigned``, uploads off: docs/remote.md#keys)."""
        exposed = exposure.outsiders_warning(self._settings.layout.kernel_cache_dir)
        remote = [f"warning: {w}" for w in remote_config.trust_warnings(self.remote_config)]
        return ([exposed] if exposed else []) + remote

    def degraded(self) -> list[str]:
        """The degraded states now, one line each (docs/troubleshooting.md): a root that
        cannot be written, chip folders polled instead of watched, parts without progress."""
        out = []
        if self.governance.root_problem:
            out.append(self.governance.root_problem)
        watcher = self.governance.watcher
        if watcher is not None and watcher.polled():
            out.append(f"chip folders polled (no inotify watch): {', '.join(watcher.polled())}")
        for soc, last in sorted(self.governance.last_gc.items()):
            if last.get("stuck_over_limit"):
                future = last.get("future_atimes") or 0
                out.append(
                    f"{soc} over its limit: everything left was accessed too recently"
                    + (f" ({future} access times in the future: clock skew)" if future else "")
                )
        stuck = self.heartbeats.stale()
        if stuck:
            out.append(f"no progress in: {', '.join(stuck)}")
        for name, row in sorted(self.remote_stats().items()):
            if row["state"] != "ok":  # compiles go on locally
                out.append(f"remote {name} {row['state']}: compiles go on without it")
        return out

    def _gauges(self) -> list[Gauge]:
        """The degraded states as gauges (docs/troubleshooting.md)."""
        status = self.governance.status()
        scan, watch = status["scan"], status["watch"]
        out: list[Gauge] = [
            (
                "cachemgr_first_scan_done",
                "1 once the first full scan of the cache finished",
                {},
                1.0 if scan["state"] == ScanState.DONE else 0.0,
            ),
            (
                "cachemgr_root_not_writable",
                "1 while the cache root is read-only or has vanished (hits served, no caching)",
                {},
                1.0 if self.governance.root_problem else 0.0,
            ),
            (
                "cachemgr_stuck_parts",
                "parts of the daemon without progress (WATCHDOG=1 is withheld while > 0)",
                {},
                float(len(self.heartbeats.stale())),
            ),
        ]
        for soc, last in self.governance.last_gc.items():
            labels = {"soc_version": soc}
            out.append(
                (
                    "cachemgr_chip_stuck_over_limit",
                    "1 when the last eviction left the chip folder over its limit because "
                    "everything left was accessed too recently (or in the future)",
                    labels,
                    1.0 if last.get("stuck_over_limit") else 0.0,
                )
            )
            out.append(
                (
                    "cachemgr_chip_future_atimes",
                    "entries whose access time lies in the future (clock skew), last eviction",
                    labels,
                    float(last.get("future_atimes") or 0),  # type: ignore[arg-type]
                )
            )
        for soc, mode in watch["chip_folders"].items():
            out.append(
                (
                    "cachemgr_chip_polled",
                    "1 when a chip folder has no inotify watch and is polled instead",
                    {"soc_version": soc},
                    1.0 if mode == "polling" else 0.0,
                )
            )
        if self.governor is not None:  # a label per governed root (docs/daemon.md)
            out += self.governor.gauges()
        return out

    def metrics(self) -> bytes:
        return self._metrics.render()

    def _refuse_if_govern_only(self, what: str) -> None:
        """:raises GovernOnly: this daemon is ``serve --govern-only``."""
        if self.govern_only:
            raise GovernOnly(
                f"{what}: this daemon only governs cache roots (serve --govern-only); "
                "compiles, lookups and hits go to the compile service's socket"
            )

    def config(self, sections: bool = False) -> dict[str, Any]:
        """Settings with origins; with ``sections`` also the config file's tables, which a
        client needs to compute the same keys (see ``Client`` local hits)."""
        if not sections:
            return self._settings.to_json()
        return {"settings": self._settings.to_json(), "sections": dict(self._settings.sections)}

    def report_hits(self, hits: int) -> dict[str, Any]:
        """Count hits that clients served from the cache themselves: from a caller other than
        the daemon's user or root, at most what its budget holds (:mod:`.hitbudget`).
        Answers ``{"counted": hits}`` (the cache's totals are ``stats``'s).

        :raises HitsRefused: not all of ``hits`` fitted in the caller's budget (those that
            did are counted).
        :raises GovernOnly: ``serve --govern-only``.
        """
        self._refuse_if_govern_only("/hits")
        caller = peer.current()
        if caller is None or (caller.uid is not None and caller.uid in (os.geteuid(), 0)):
            self.counters.add("hits", hits)
        else:
            who = _caller_key(caller)
            granted = self.hit_budget.take(who, hits)
            self.counters.add("hits", granted)
            if granted < hits:
                raise self.hit_budget.refuse(who, hits, granted)
        # what this report added: every client reports once a second, and the cache's total
        # (``stats``) reads every chip folder's counters file
        return {"counted": hits}

    def zero_stats(self) -> dict[str, Any]:
        """``stats --zero``: reset the counters of the kernel cache served (every chip folder).

        :raises OSError: the cache cannot be written (e.g. a read-only root).
        """
        self.counters.cache().zero()
        return {"zeroed": str(self._settings.layout.kernel_cache_dir)}

    def stats(self, soc: str | None = None) -> StatsResult:
        """Counters (``hits``, ``misses``, ``compiles``…), per chip folder figures (entries,
        bytes, limit, ratio, fill %, its counters, its last eviction's state) and the
        daemon's own figures (queue, remotes, first scan, watch modes)."""
        settings = self._settings
        chips = [settings.layout.chip_dir(soc)] if soc else settings.layout.chip_dirs()
        per_chip = self.counters.cache().per_chip()
        rows = {}
        for chip in chips:
            last = self.governance.last_gc.get(chip.name, {})
            rows[chip.name] = dataclasses.replace(
                ChipStats.from_json(eviction.chip_row(chip, settings)),
                counters=per_chip.get(chip.name, dict.fromkeys(COUNTER_NAMES, 0)),
                stuck_over_limit=bool(last.get("stuck_over_limit")),
                future_atimes=int(last.get("future_atimes", 0)),  # type: ignore[call-overload]
            )
        figures: dict[str, Any] = {
            "queue_jobs": self.queue.depth(),
            "queue": self.queue.figures(),
            # per remote: hits, misses, errors, rejected, bytes in/out, state
            "remotes": self.remote_stats(),
            "remote_uploads_dropped": self.remotes.dropped if self.remotes is not None else 0,
            # entries kept on this site: a file of them is not an upload_writers user's
            "remote_upload_refused": self.remotes.upload_refused if self.remotes else 0,
            # blobs rejected, by reason, all remotes together (per remote: remotes.<name>)
            "remote_rejected": self._rejected_by_reason(),
            **self.governance.status(),
            **({"governed": self.governor.to_json()} if self.governor is not None else {}),
        }
        release_memory()  # the folder scans above held a per-file object each
        return StatsResult(summed(per_chip), rows, figures)  # each file read once

    def lookup(self, soc_version: str, kernel_name: str) -> dict[str, Any]:
        """A verified lookup (docs/design.md#writing-and-reading-an-entry) counted as a hit or a
        miss.

        :raises GovernOnly: ``serve --govern-only``."""
        self._refuse_if_govern_only("/lookup")
        chip = self._settings.layout.chip_dir(soc_version)
        result = chip_store(chip).lookup(kernel_name)
        self.counters.add("hits" if result.hit else "misses", chip_dir=chip)
        return {
            "status": result.status,
            "kernel_name": kernel_name,
            "reason": result.reason,
            "files": [str(p) for p in result.files],
            "removed_bad_entry": result.removed,
        }

    def gc(self, params: Mapping[str, Any]) -> GcResult:
        """``/gc``: the same run and report as ``cachemgr gc`` (toolkit check, then each
        chip folder); ``ratio`` forces a run to that target, ``min_age_s`` replaces the aging
        guard, ``dry_run`` removes nothing, ``soc`` limits it to one chip folder.

        :raises GovernOnly: ``serve --govern-only``."""
        self._refuse_if_govern_only("/gc")
        ratio, min_age, soc = params.get("ratio"), params.get("min_age_s"), params.get("soc")
        if ratio is not None and (
            isinstance(ratio, bool) or not isinstance(ratio, int) or not 0 <= ratio <= 100
        ):
            raise InvalidInputError(f"/gc ratio={ratio!r} must be an integer 0..100")
        if min_age is not None and (
            isinstance(min_age, bool) or not isinstance(min_age, int | float) or min_age < 0
        ):
            raise InvalidInputError(f"/gc min_age_s={min_age!r} must be a number ≥ 0")
        if soc is not None and not isinstance(soc, str):
            raise InvalidInputError(f"/gc soc={soc!r} must be a string")
        if not isinstance(params.get("dry_run", False), bool):
            raise InvalidInputError(f"/gc dry_run={params['dry_run']!r} must be true or false")
        dry = eviction.DryRun.YES if params.get("dry_run") else eviction.DryRun.NO
        report = gc.collect(
            self._settings,
            force_ratio=ratio,
            min_age_s=min_age,
            dry_run=dry,
            soc=soc,
            run_chip=self.governance.gc_chip_json,  # the scan never in the daemon's heap
        )
        for folder in report.chip_folders.values():
            self.governance.count_eviction(folder.to_json())
        self.governance.index.reconcile()
        return report

    # --- compile --------------------------------------------------------------------------

    def compile(
        self, body: Mapping[str, Any], alive: Callable[[], bool]
    ) -> tuple[int, dict[str, Any]]:
        """Compile (or hit) one request. ``wait`` false → 202 and a job id to poll.

        While waiting, a caller that hangs up stops waiting; the queue drops the job once
        no one waits for it.

        :raises GovernOnly: ``serve --govern-only``.
        """
        self._refuse_if_govern_only("/compile")
        base = body.get("base_dir")
        if not isinstance(base, str) or not base.startswith("/") or "\x00" in base:
            raise InvalidInputError(
                f"/compile base_dir={base!r} must be an absolute path (the folder that relative "
                "paths in the request are relative to)"
            )
        priority = _check_params(body)
        req, snap = self._compile_request(body, base)
        # the caller's compile environment: compiled with exactly it, never the daemon's own
        env = environment.from_wire(body.get("compile_env"), "/compile request")
        session = body.get("session")
        if session is not None and not isinstance(session, str):
            raise InvalidInputError(f"/compile session={session!r} must be a string")
        caller = peer.current()
        own = caller is not None and caller.is_daemon_user
        # the daemon's own user: its compiles need the limits, not the view
        with process.for_own_user(own):
            future = self.queue.submit(
                req,
                priority=self._capped(priority, caller),
                replace=bool(body.get("replace")),
                session=session or uuid.uuid4().hex,  # default: each call is its own session
                inputs=snap,
                # anyone else's outputs are handed back: never written where a caller points
                deliver=body.get("deliver") is True or not own,
                caller=_caller_key(caller),
                env=env,
            )
        future.add_done_callback(lambda f: _log_compile(f, req.op_type, req.soc_version, caller))
        future.add_done_callback(self._observe)
        if body.get("wait", True) is False:
            job_id = uuid.uuid4().hex
            with self._jobs_lock:
                self._prune_jobs()
                self._jobs[job_id] = {"future": future, "created": time.monotonic()}
            future.add_done_callback(self._count)
            return 202, {"job_id": job_id, "state": JobState.QUEUED}
        while not future.done():
            try:
                future.result(timeout=0.05)
            except TimeoutError:
                if not alive():
                    self.queue.abandon(future)
                    return 499, {"error": "client went away"}
            except Exception:  # the outcome is reported below
                break
        self._count(future)
        return _outcome(future)

    def _capped(self, priority: int, caller: peer.Peer | None) -> int:
        """``priority``, capped at ``[daemon] max_caller_priority`` unless the caller is the
        daemon's own user or root; TCP callers are capped too."""
        if caller is not None and caller.uid is not None and caller.uid in (os.geteuid(), 0):
            return priority
        return min(priority, self.daemon_config.max_caller_priority)

    def _compile_request(
        self, body: Mapping[str, Any], base: str
    ) -> tuple[request.CompileRequest, inputs.Snapshot | None]:
        """The request and the snapshot of its files it carries (the daemon
        opens no path a caller names). A request without ``inputs`` is the daemon user's own
        (read here); from anyone else it is refused.

        :raises InvalidInputError: a bad request or snapshot, or paths from another user.
        """
        who = peer.current() or peer.Peer(os.getpid(), os.getuid(), os.getgid())
        if not who.is_daemon_user and not getattr(self.sandbox, "isolated", False):
            why = getattr(self.sandbox, "why_not", "no sandbox configured")
            raise InvalidInputError(
                f"/compile from {who.describe()}: this daemon compiles only for its own user: "
                f"compiles for others need a sandbox (bubblewrap's allow-list view), and {why}"
            )
        raw = body.get("inputs")
        if raw is None:
            if not who.is_daemon_user:
                raise InvalidInputError(
                    f"/compile from {who.describe()}: the request carries no inputs; the "
                    "daemon reads no file on a caller's behalf (cachemgr.Client and "
                    "`cachemgr compile` send the source, headers and .cfg)"
                )
            req = self._parsed.get(body["request"], base, origin="/compile request")
            log.info("compile %s for %s (files read by the daemon)", req.op_type, who.describe())
            return req, None
        snap = inputs.from_wire(raw, "/compile request")
        req = self._parsed.get(body["request"], base, "/compile request", check_exists=False)
        sent = len(snap.data or {})
        log.info(
            "compile %s for %s (%d %s sent)",
            req.op_type,
            who.describe(),
            sent,
            "file" if sent == 1 else "files",
        )
        return dataclasses.replace(req, kernel_source=snap.source), snap

    def _observe(self, future: Future[CompileOutcome]) -> None:
        """Compile duration and hit latency into the ``/metrics`` histograms."""
        if not future.cancelled() and future.exception() is None:
            out = future.result()
            self._metrics.observe(out.status, out.seconds, out.coalesced)

    def _count(self, future: Future[CompileOutcome]) -> None:
        """Outcomes are counted by the queue (per request and per compiler run, in the
        cache's counters); here only requests that ended without one."""
        if future.cancelled() or future.exception() is not None:
            self.counters.add("failures")

    def job(self, job_id: str) -> dict[str, Any] | None:
        with self._jobs_lock:
            record = self._jobs.get(job_id)
        if record is None:
            return None
        future: Future[CompileOutcome] = record["future"]
        if not future.done():
            return {
                "job_id": job_id,
                "state": JobState.RUNNING if future.running() else JobState.QUEUED,
            }
        with self._jobs_lock:  # hand-back outputs are read (and their folder removed) once
            answer = record.get("answer")
            if answer is None:
                answer = record["answer"] = _outcome(future)
        status, data = answer
        state = JobState.DONE if status == 200 else JobState.FAILED
        return {"job_id": job_id, "state": state, **data}

    def _prune_jobs(self) -> None:
        now = time.monotonic()
        for job_id in [
            j
            for j, r in self._jobs.items()
            if r["future"].done() and now - r["created"] > JOB_TTL_S
        ]:
            del self._jobs[job_id]


def _caller_key(caller: peer.Peer | None) -> str:
    """The queue's name for a caller: ``uid 1001 (alice)``, or ``tcp`` for the TCP listener."""
    if caller is None or caller.uid is None:
        return "tcp"
    return f"uid {caller.uid} ({user_name(caller.uid)})"


#: ``/compile`` priorities are within ±this.
MAX_PRIORITY = 1_000_000


def _check_params(body: Mapping[str, Any]) -> int:
    """Check ``/compile``'s fields other than the request; return the priority.

    :raises InvalidInputError: one line naming the field and the value (→ 400).
    """
    priority = body.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidInputError(f"/compile priority={priority!r} must be an integer")
    if abs(priority) > MAX_PRIORITY:
        raise InvalidInputError(
            f"/compile priority={priority} is out of range -{MAX_PRIORITY}..{MAX_PRIORITY}"
        )
    for name in ("wait", "replace"):
        if name in body and not isinstance(body[name], bool):
            raise InvalidInputError(f"/compile {name}={body[name]!r} must be true or false")
    return priority


def _log_compile(
    future: Future[CompileOutcome], op_type: str, soc: str, caller: peer.Peer | None
) -> None:
    """One line per finished compile request: the kernel, its outcome and who asked
    (SO_PEERCRED pid, uid, gid; "tcp" for the token-guarded TCP listener)."""
    who = caller.describe() if caller is not None else "tcp (no credentials)"
    if caller is not None and caller.uid is not None:
        who += f" ({user_name(caller.uid)})"
    if future.cancelled():
        log.info("compile %s/%s for %s: cancelled", soc, op_type, who)
        return
    exc = future.exception()
    if exc is not None:
        log.info("compile %s/%s for %s: error: %s", soc, op_type, who, exc)
        return
    out = future.result()
    log.info(
        "compile %s %s/%s for %s: %s in %.3f s (%s)",
        out.kernel_name,
        soc,
        op_type,
        who,
        out.status,
        out.seconds,
        out.policy.describe() if out.policy is not None else "policy unknown",
    )


def _outcome(future: Future[CompileOutcome]) -> tuple[int, dict[str, Any]]:
    if future.cancelled():
        return 500, {"error": "compile was cancelled"}
    exc = future.exception()
    if exc is not None:
        code = 400 if isinstance(exc, CacheMgrError) and exc.exit_code == 2 else 500
        return code, {"error": str(exc)}
    return 200, _handed_back(future.result().to_json())


#: The most bytes of outputs handed back in one answer. They travel base64 in the JSON
#: answer, built in the daemon's memory (~6 times their size at the peak): the cap keeps
#: that under 100 MB. Debug artefacts and ``disable`` kernels are KiB to a few MiB; a larger
#: one is compiled in the caller's own process (``--local``; docs/daemon.md, "Bounded
#: memory").
MAX_OUTPUT_BYTES = 16 << 20


def _handed_back(data: dict[str, Any]) -> dict[str, Any]:
    """An outcome whose files are in a private hand-back folder (``build.deliver_dir``): their
    bytes go into ``outputs`` (``[{"name", "data"}]``, base64) for the caller to write as
    itself where it wants them, and the folder is removed. Other outcomes
    are returned as they are."""
    files = [Path(f) for f in data.get("files", [])]
    folders = {f.parent for f in files}
    if len(folders) != 1:
        return data
    (folder,) = folders
    if not folder.name.startswith(build.DELIVER_PREFIX) or folder.parent != Path(
        tempfile.gettempdir()
    ):
        return data
    outputs, total = [], 0
    try:
        _check_output_sizes(files)
        for path in files:
            blob = inputs.read_input(path, "output", MAX_OUTPUT_BYTES - total)
            total += len(blob)
            outputs.append({"name": path.name, "data": base64.b64encode(blob).decode("ascii")})
            del blob
    except InvalidInputError as exc:
        error = f"handing back outputs: {exc}"
        return {**data, "status": Status.FAILED, "files": [], "error": error}
    finally:  # by descriptor, any depth: what a compiler left there is the caller's making
        fsutil.open_up_tree(folder)
        fsutil.remove_tree(folder)
    return {**data, "files": [], "outputs": outputs}


def _check_output_sizes(files: list[Path]) -> None:
    """Refuse, before a byte is read, outputs over :data:`MAX_OUTPUT_BYTES` together.

    :raises InvalidInputError: one line naming the bytes, the cap and what to do.
    """
    total = 0
    for path in files:
        with contextlib.suppress(OSError):
            total += os.lstat(path).st_size
    if total > MAX_OUTPUT_BYTES:
        raise InvalidInputError(
            f"the outputs are {total} bytes, over the {MAX_OUTPUT_BYTES}-byte cap of what "
            "the daemon hands back (MAX_OUTPUT_BYTES); compile this kernel in your own "
            "process (cachemgr compile --local)"
        )


def _reload_result(ok: bool, error: str | None) -> dict[str, Any]:
    """``{"at": ISO 8601 UTC, "ok", "error"}``: a reload's result as ``/health`` reports it
    (SIGHUP, ``POST /reload`` and an edited ``op_cache.ini`` reload alike); ``error`` is the
    refusal's one line, None after a reload that took effect."""
    at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return {"at": at, "ok": ok, "error": error}
