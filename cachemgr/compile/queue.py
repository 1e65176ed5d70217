"""The compile queue: a worker pool with priorities, timeouts, single-flight, cancel and a safe
``force`` (layer 7; docs/design.md#cache-modes, #precompiled-binaries,
#debug-compiles-and-kernel_meta).

``submit(request)`` decides everything up front (:func:`cachemgr.compile.pipeline.prepare`),
answers in the caller's thread when it can — a precompiled binary
(docs/design.md#precompiled-binaries) or a verified cache hit
(docs/design.md#writing-and-reading-an-entry) — and otherwise hands a job to the pool. It returns a
:class:`concurrent.futures.Future` that resolves to a :class:`CompileOutcome`:

* **priorities**: a higher ``priority`` runs sooner; equal priorities run in submit order;
* **fairness**: within one priority, callers (``submit(caller=…)``, the
  daemon passes the caller's uid) take turns — each new job of a caller is stamped one turn
  after that caller's previous one (start-time fair queueing), so a caller with 10,000 queued
  jobs delays another caller's job by about one compile per busy caller, not 10,000; and a
  caller may have at most ``max_queued_per_caller`` jobs queued or running
  (:class:`QueueFull` beyond, which the daemon answers ``429``);
* **reserve workers** (docs/daemon.md#fair-workers): turns order the queue, but one caller's
  slow jobs could still hold every worker, and another caller's 0.03 s compile waited for
  one of them to end (84.9 s). With ``reserve_workers`` R, while all ``workers`` compile,
  up to R more jobs may start on R reserve threads, each the first waiting job (in turn
  order) of a caller none of whose jobs is compiling: another caller's job starts at once,
  not after a stranger's compile. At most ``workers + R`` compilers run; a single caller
  never uses a reserve slot (it always has a job compiling when the workers are busy), so
  its throughput is that of ``workers``;
* **timeout**: each compiler process gets ``timeout_s`` seconds; on timeout its whole process
  group is killed (:mod:`cachemgr.compilers.process`) and the outcome is ``failed``;
* **single-flight**: identical requests (same kernel name, same variant) in flight share one
  job — N callers, one compile, N answers. Across processes the entry's fcntl lock does the
  same: a worker takes it, looks up again, and only then compiles;
* **cancel**: ``future.cancel()`` removes that caller; a job whose callers have all gone before
  it started is dropped (a started compile finishes and is cached — nothing is wasted);
* **force** (docs/design.md#cache-modes): the first ``force`` request of a *session* for a chip
  clears it — a session is one ``cachemgr compile`` run (all its requests), one daemon
  ``/compile`` call unless the caller names a session, one queue when none is given. It
  notes the entries present, takes the chip folder's exclusive lock
  (:mod:`cachemgr.storage.chiplock`): new work for that chip waits, in-flight compiles (which hold
  the lock shared) finish and publish, then only the entries noted are removed — a kernel an
  in-flight compile has just published and reported is kept — then work resumes.
  ``replace=True`` is the per-request "recompile and replace this one entry".
* **snapshots**: a job holds the bytes of its source and headers taken
  when submitted (:func:`cachemgr.compile.pipeline.freeze`); the compile reads those bytes, so an
  edit made while the job waits changes nothing it builds or the key it is stored under.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cachemgr import constants
from cachemgr.compile import build, inplace, kernel_meta, keys, pipeline, precompiled
from cachemgr.compile.build import Prepared
from cachemgr.compile.inputs import Snapshot
from cachemgr.compile.request import CompileRequest
from cachemgr.compile.results import CompileOutcome
from cachemgr.compilers import process
from cachemgr.config.options import Settings
from cachemgr.errors import CacheMgrError, CompileError, InvalidInputError, OutputFolderError
from cachemgr.words import plural

if TYPE_CHECKING:  # publishing is a miss's work: not imported on the hit path
    from cachemgr.compile import publisher
    from cachemgr.remote.tierset import RemoteTiers
    from cachemgr.storage.events import Events

log = logging.getLogger(__name__)

__all__ = ["CompileOutcome", "CompileQueue", "QueueFull"]

#: Default wall-time limit of one compiler process (seconds).
DEFAULT_TIMEOUT_S = constants.COMPILE_TIMEOUT_S

_PENDING, _RUNNING, _DONE, _DROPPED = "pending", "running", "done", "dropped"


class QueueFull(CacheMgrError):
    """A caller already has its maximum of jobs queued or running (``http_status`` 429)."""

    exit_code = 1
    http_status = 429


@dataclass(eq=False)
class _Job:
    prepared: Prepared
    priority: int
    waiters: list[tuple[Future[CompileOutcome], float]] = field(default_factory=list)
    state: str = _PENDING
    turn: int = 0  # its caller's turn (fairness; see the module docstring)
    caller: object = None  # who submitted it first (the reserve workers' rule)
    #: every caller so far is the daemon's own user (no namespaces; process.for_own_user)
    own_user: bool = False

    @property
    def flight(self) -> tuple[str, str]:
        """Single-flight identity: (variant, kernel name)."""
        return (self.prepared.variant, self.prepared.kernel)


class CompileQueue:
    """An in-process compile queue over one cache configuration.

    :param settings: the resolved configuration (cache location, default options, the
        ``[compilers]`` and ``[precompiled]`` tables of the config file).
    :param workers: compile threads (default: CPU count); each runs one compiler process.
    :param timeout_s: limit per compiler process, seconds.
    :param output_dir: where kernels compiled without the cache (``disable``) are written;
        default a private temp folder made on first use (:attr:`output_dir`), left for the
        caller.
    :param binary_dirs: precompiled package roots (docs/design.md#precompiled-binaries) before those
        of the config file (``[precompiled] paths``) and ``$ASCEND_OPP_PATH``'s built-in one.
    :param lock_timeout_s: how long to wait for an entry or chip lock, seconds (default:
        twice ``timeout_s`` plus a minute: another process may be compiling that entry).
    :param max_queued_per_caller: jobs one caller may have queued or running (None: no
        bound); more → :class:`QueueFull`.
    :param reserve_workers: compile slots beyond ``workers``, each only for the job of a
        caller none of whose jobs compiles while all ``workers`` do (module docstring,
        *reserve workers*); 0 = none.
    """

    def __init__(
        self,
        settings: Settings,
        workers: int | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        output_dir: Path | None = None,
        binary_dirs: Sequence[Path] = (),
        lock_timeout_s: float | None = None,
        tally: Tally | None = None,
        max_queued_per_caller: int | None = None,
        events: Events | None = None,
        remotes: RemoteTiers | None = None,
        reserve_workers: int = 0,
    ) -> None:
        self.settings = settings
        self.reserve_workers = max(0, reserve_workers)
        self._compiling: Counter[object] = Counter()  # per caller: jobs a worker compiles
        self._workers_busy = 0  # of the ``workers`` (not the reserve) compiling now
        self.max_queued_per_caller = max_queued_per_caller
        self._turns: dict[object, int] = {}  # each caller's last turn
        self._clock = 0  # the turn of the last job started
        self._outstanding: Counter[object] = Counter()  # per caller: futures not resolved
        self.timeout_s = float(timeout_s)
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._given_roots = [Path(p) for p in binary_dirs]
        self.binary_dirs = self._given_roots + _config_roots(settings)
        self.counters: Counter[str] = Counter()
        self._tally = tally
        self._ctx = build.RunContext(
            Path(output_dir).absolute() if output_dir else None,
            lock_timeout_s if lock_timeout_s else constants.automatic_lock_wait_s(self.timeout_s),
            config_sections=dict(settings.sections),
            events=events,
            remotes=remotes,
        )
        self._compilers = keys.Compilers.of(settings)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._heap: list[tuple[int, int, int, _Job]] = []
        self._seq = itertools.count()
        self._flights: dict[tuple[str, str], _Job] = {}
        self._open_gates: dict[Path, threading.Event] = {}
        self._forced: set[tuple[Path, str | None]] = set()
        self._force_lock = threading.Lock()
        self._closing = False
        self._progress_at = time.monotonic()  # a job last started or finished
        self._finishers = ThreadPoolExecutor(self.workers, thread_name_prefix="cachemgr-publish")
        self._threads = [
            threading.Thread(target=self._work, name=f"cachemgr-compile-{i}", daemon=True)
            for i in range(self.workers)
        ] + [
            threading.Thread(
                target=self._work, args=(True,), name=f"cachemgr-reserve-{i}", daemon=True
            )
            for i in range(self.reserve_workers)
        ]
        for thread in self._threads:
            thread.start()

    # --- submitting ---------------------------------------------------------------------------

    def submit(
        self,
        request: CompileRequest,
        priority: int = 0,
        *,
        replace: bool = False,
        session: str | None = None,
        inputs: Snapshot | None = None,
        deliver: bool = False,
        caller: object = None,
        env: Mapping[str, str] | None = None,
    ) -> Future[CompileOutcome]:
        """Ask for the kernel of ``request``; the future resolves to its :class:`CompileOutcome`
        (``failed`` with the compiler's message on a compile error, never an exception).

        :param priority: higher runs sooner.
        :param replace: recompile and replace this one entry (docs/design.md#cache-modes).
        :param session: ``force`` clears a chip once per session (default: once per queue).
        :param inputs: the frozen snapshot a caller sent (the daemon); default: the request's
            files are read here.
        :param deliver: debug artefacts and ``disable`` kernels go to a private folder of the
            job, for the caller to write where it wants (the daemon); else
            to ``kernel_meta`` and the output folder, checked writable first.
        :raises InvalidInputError: a bad ``.cfg``, option or define, an unreadable source or
            header, a source that keeps changing while it is read (nothing is done).
        :param caller: who asks (the daemon: the caller's uid), for fairness and the bound.
        :param env: the compile environment the caller sent (the daemon's ``compile_env``:
            compiled with exactly these values); default: this process's environment.
        :raises QueueFull: ``caller`` has ``max_queued_per_caller`` jobs queued or running.
        :raises ConfigError: a bad ``[compilers]`` configuration.
        :raises RuntimeError: the queue is closed.
        """
        start = time.monotonic()
        if self._closing:
            raise RuntimeError("the compile queue is closed")
        with self._lock:
            settings, compilers = self.settings, self._compilers
        job = pipeline.JobOptions(self.timeout_s, replace, inputs, env)
        try:
            prepared = pipeline.prepare(request, settings, compilers, job)
            if prepared.decision.cache.clear_first:
                removed = self._force_once(prepared, session)
                note = self._force_note(prepared, removed)
                if note is not None:
                    prepared = dataclasses.replace(prepared, note=note)
            outputs = prepared.decision.debug.on or not prepared.decision.cache.write
            if deliver and outputs:
                import uuid  # here: it imports platform

                prepared = dataclasses.replace(prepared, deliver=uuid.uuid4().hex)
            elif prepared.decision.debug.on:
                kernel_meta.check_base(prepared.opts.kernel_meta_dir)
            for _ in range(3):
                quick = self._fast_path(prepared)
                if quick is not None:
                    quick = build.with_policy(quick, prepared)
                    return self._answered(quick, start, prepared.chip_dir)
                self._check_output_dir(prepared)
                frozen = pipeline.freeze(prepared)
                if frozen is not None:
                    return self._enqueue(frozen, priority, start, caller)
                log.info("%s changed while it was read; hashing it again", request.kernel_source)
                fresh = dataclasses.replace(job, given=None)
                again = pipeline.prepare(request, settings, compilers, fresh)
                prepared = dataclasses.replace(again, deliver=prepared.deliver)
        except CompileError as exc:  # before the policy was decided (a missing header...)
            early = pipeline.failed_before_prepared(request, settings, exc, job)
            return self._answered(early, start)
        raise InvalidInputError(
            f"{request.origin}: {request.kernel_source} (or a header) kept changing while it "
            "was read; try again once it is saved"
        )

    def compile(self, request: CompileRequest, priority: int = 0, **kw: object) -> CompileOutcome:
        """``submit(request, priority, **kw).result()``."""
        return self.submit(request, priority, **kw).result()  # type: ignore[arg-type]

    def _answered(
        self, outcome: CompileOutcome, start: float, chip_dir: Path | None = None
    ) -> Future[CompileOutcome]:
        self._count(outcome.status)
        self._tally_outcome(chip_dir, outcome, 1)
        fut: Future[CompileOutcome] = Future()
        fut.set_running_or_notify_cancel()
        fut.set_result(build.elapsed(outcome, start))
        return fut

    def _fast_path(self, p: Prepared) -> CompileOutcome | None:
        self._gate(p.chip_dir).wait()
        return pipeline.lookup(p, self.binary_dirs)

    def _enqueue(
        self, p: Prepared, priority: int, start: float, caller: object = None
    ) -> Future[CompileOutcome]:
        fut: Future[CompileOutcome] = Future()
        with self._cond:
            if self._closing:  # closed while this request was being prepared
                raise RuntimeError("the compile queue is closed")
            self._count_caller(caller)
            job = self._flights.get((p.variant, p.kernel))
            own = process.own_user()  # the submitting thread's (the daemon's handler)
            if job is not None and job.state in (_PENDING, _RUNNING):
                job.waiters.append((fut, start))
                job.own_user = job.own_user and own
                self.counters["joined"] += 1
                if job.state == _PENDING and priority > job.priority:
                    job.priority = priority
                    heapq.heappush(self._heap, (-priority, job.turn, next(self._seq), job))
            else:
                turn = max(self._clock, self._turns.get(caller, 0)) + 1
                self._turns[caller] = turn
                job = _Job(p, priority, [(fut, start)], turn=turn, caller=caller, own_user=own)
                self._flights[job.flight] = job
                heapq.heappush(self._heap, (-priority, turn, next(self._seq), job))
                self._cond.notify_all()  # a worker, or else a reserve worker, takes it
        fut.add_done_callback(functools.partial(self._left, job))
        fut.add_done_callback(lambda f: self._uncount_caller(caller))
        return fut

    def _count_caller(self, caller: object) -> None:
        """One more outstanding job for ``caller`` (under ``self._lock``).

        :raises QueueFull: over ``max_queued_per_caller``.
        """
        bound = self.max_queued_per_caller
        if bound is not None and self._outstanding[caller] >= bound:
            raise QueueFull(
                f"caller {caller} already has {self._outstanding[caller]} compile jobs queued "
                f"or running, the most one caller may have ([daemon] max_queued_per_caller = "
                f"{bound}); wait for some to finish"
            )
        self._outstanding[caller] += 1

    def _uncount_caller(self, caller: object) -> None:
        with self._lock:
            self._outstanding[caller] -= 1
            if self._outstanding[caller] <= 0:
                del self._outstanding[caller]
                if self._turns.get(caller, 0) <= self._clock:
                    self._turns.pop(caller, None)  # nothing of it waits: forget its turn

    def _left(self, job: _Job, fut: Future[CompileOutcome]) -> None:
        """A waiter's future finished; if it was cancelled, drop the job when nobody waits."""
        if not fut.cancelled():
            return
        with self._cond:
            job.waiters = [w for w in job.waiters if w[0] is not fut]
            if job.state == _PENDING and not job.waiters:
                job.state = _DROPPED
                self._flights.pop(job.flight, None)
                self.counters["dropped"] += 1
                log.info("dropped %s: every caller has gone", job.prepared.kernel)

    # --- force --------------------------------------------------------------------------------

    def _gate(self, chip_dir: Path) -> threading.Event:
        with self._lock:
            gate = self._open_gates.get(chip_dir)
            if gate is None:
                gate = self._open_gates[chip_dir] = threading.Event()
                gate.set()
            return gate

    def _force_note(self, p: Prepared, removed: int | None) -> str | None:
        """The note of a ``force`` that cleared ``p``'s chip folder (``removed`` entries; None:
        cleared before in this session), joined to ``p``'s own: clearing other kernels'
        entries is said at default verbosity, as ``cachemgr: note:``
        (docs/design.md#cache-modes). None when there is nothing to say."""
        if removed is None or (removed == 0 and self._ctx.remotes is None):
            return None
        if self._ctx.remotes is None:
            note = f"force cleared {plural(removed, 'entry', 'entries')} of {p.chip_dir}"
        else:
            note = (
                f"force cleared {plural(removed, 'entry', 'entries')} of the local chip folder "
                f"{p.chip_dir}; remote tiers untouched"
            )
        return f"{p.note}; {note}" if p.note else note

    def _force_once(self, p: Prepared, session: str | None) -> int | None:
        """Clear ``p``'s chip folder once per session; the entries removed, or None when
        this session had cleared it already."""
        with self._force_lock:
            if (p.chip_dir, session) in self._forced:
                return None
            return self.force_clear(p, session)

    def force_clear(self, p: Prepared, session: str | None = None) -> int:
        """The safe ``force`` (docs/design.md#cache-modes) for ``p``'s chip: close the gate for new
        work, take the chip lock exclusive (in-flight compiles finish first), clear, reopen.

        :returns: entries removed.
        :raises LockBusyError: the chip lock was not obtained within the lock timeout.
        """
        from cachemgr.compile import publisher

        gate = self._gate(p.chip_dir)
        gate.clear()
        try:
            noted = publisher.note_entries(p.chip_dir)
            with p.chip_lock.exclusive(timeout_s=self._ctx.lock_timeout_s):
                removed = publisher.clear_chip(p.chip_dir, self._ctx.lock_timeout_s, noted)
            with self._lock:
                self._forced.add((p.chip_dir, session))
                self.counters["force_cleared"] += removed
            if self._ctx.remotes is not None:
                names = ", ".join(t.name for t in self._ctx.remotes.tiers)
                log.info(
                    "force cleared %s here only; remote tiers untouched (%s)", p.chip_dir, names
                )
            return removed
        finally:
            gate.set()

    # --- workers ------------------------------------------------------------------------------

    def _next_job(self, reserve: bool) -> _Job | None:
        """The next job this worker (a ``reserve`` one or not) compiles — it counts as
        compiling until :meth:`_release` — or None once the queue is closed and nothing
        waits."""
        with self._cond:
            while True:
                job = self._pick(reserve)
                if job is not None:
                    job.state = _RUNNING
                    self._compiling[job.caller] += 1
                    self._workers_busy += not reserve
                    self._progress_at = time.monotonic()
                    self._clock = max(self._clock, job.turn)
                    if not reserve and self._workers_busy >= self.workers:
                        # a reserve worker woken while this worker was still free went
                        # back to waiting: the last worker taken, it looks again
                        self._cond.notify_all()
                    return job
                if self._closing and not any(j.state == _PENDING for *_, j in self._heap):
                    return None
                self._cond.wait()

    def _pick(self, reserve: bool) -> _Job | None:
        """Under ``self._lock``: for a worker, the first waiting job (priority, then turn);
        for a reserve worker, while every worker compiles, the first waiting job of a caller
        none of whose jobs compiles; else None."""
        heap = self._heap
        while heap and not _waiting(heap[0]):
            heapq.heappop(heap)  # started by a reserve worker, dropped, or re-prioritised
        if not heap:
            return None
        if not reserve:
            return heapq.heappop(heap)[3]
        if self._workers_busy < self.workers:
            return None  # a worker is free: it takes the job
        idle = [e for e in heap if _waiting(e) and not self._compiling[e[3].caller]]
        if not idle:
            return None
        job = min(idle)[3]  # its heap entry stays, skipped as no longer waiting
        log.info(
            "%s of %s starts on a reserve worker: the %d workers compile other callers' jobs",
            job.prepared.kernel,
            job.caller,
            self.workers,
        )
        self.counters["reserve_starts"] += 1
        return job

    def _release(self, job: _Job, reserve: bool) -> None:
        """``job``'s compile is over (its publish may go on): its slot is free."""
        with self._cond:
            self._compiling[job.caller] -= 1
            if self._compiling[job.caller] <= 0:
                del self._compiling[job.caller]
            self._workers_busy -= not reserve
            self._cond.notify_all()  # a free worker, or a caller with nothing compiling

    def _work(self, reserve: bool = False) -> None:
        """A compile slot: run jobs; while other jobs wait, hand each publish to a finisher
        thread so the next compile starts at once (as many compilers run at a time as there
        are workers, plus the busy reserve ones); otherwise publish here, sparing the caller
        a thread hop. The build folder is emptied after every job, whatever happened."""
        while True:
            job = self._next_job(reserve)
            if job is None:
                return
            try:
                try:
                    with process.for_own_user(job.own_user):
                        result = self._run(job.prepared)
                finally:
                    self._release(job, reserve)
                self._answer(job, result)
            finally:
                self._ctx.after_job()  # the caller has its answer: not on a miss's path

    def _answer(self, job: _Job, result: CompileOutcome | publisher.Pending) -> None:
        """Publish ``result`` (in a finisher thread while other jobs wait) and answer."""
        from cachemgr.compile import publisher  # a job ran: a miss (not on the hit path)

        if isinstance(result, publisher.Pending) and self._work_waiting():
            try:
                self._finishers.submit(self._finish, job, result)
                return  # the pending publish holds its bytes in memory
            except RuntimeError:  # finishers shut down (close timed out): finish here
                pass
        if isinstance(result, publisher.Pending):
            self._finish(job, result)  # nothing else waits: no thread hop
        else:
            self._done(job, result)

    def _work_waiting(self) -> bool:
        with self._lock:
            return any(job.state == _PENDING for _, _, _, job in self._heap)

    def _run(self, p: Prepared) -> CompileOutcome | publisher.Pending:
        try:
            self._gate(p.chip_dir).wait()
            return pipeline.run(p, self._ctx)
        except Exception as exc:  # the compile failed: the message is the answer
            if not isinstance(exc, CompileError | OutputFolderError):
                log.warning("compile of %s failed: %s", p.kernel, exc)
                log.debug("compile of %s failed", p.kernel, exc_info=True)
            why = inplace.explain(p.inputs, p.request.origin, str(exc))
            if isinstance(exc, CompileError) and why is not None:  # a sent absolute #include
                exc = CompileError(why)
            return build.failed(p.kernel, exc, p.request.origin)

    def _finish(self, job: _Job, pending: publisher.Pending) -> None:
        try:
            outcome = pipeline.publish(pending, self._ctx)
        except Exception as exc:
            if not isinstance(exc, OutputFolderError):  # its one line is the answer
                log.warning("publishing %s failed: %s", job.prepared.kernel, exc)
                log.debug("publishing %s failed", job.prepared.kernel, exc_info=True)
            outcome = build.failed(job.prepared.kernel, exc, job.prepared.request.origin)
        self._done(job, outcome)

    def _done(self, job: _Job, outcome: CompileOutcome) -> None:
        outcome = build.with_policy(outcome, job.prepared)
        with self._cond:
            job.state = _DONE
            self._progress_at = time.monotonic()
            if self._flights.get(job.flight) is job:
                del self._flights[job.flight]
            waiters = list(job.waiters)
        self._count(outcome.status)
        self._tally_outcome(job.prepared.chip_dir, outcome, len(waiters), ran=True)
        _resolve(waiters, outcome)

    def _tally_outcome(
        self, chip_dir: Path | None, outcome: CompileOutcome, requests: int, ran: bool = False
    ) -> None:
        """Count an outcome in the cache's counters (docs/commands.md#what-stats-counts): per
        request ``hits`` (``hits_from_remote`` too for an entry a remote tier sent), ``misses``,
        ``binaries``, ``debug_compiles``, ``failures``; per compiler run
        ``compiles`` (and ``uncached`` when its kernel was not stored in the chip folder);
        requests that shared another's compile are ``coalesced``."""
        if self._tally is None:
            return
        if outcome.coalesced:  # another daemon's (or host's) compile answered it
            self._tally(chip_dir, "misses", requests)
            self._tally(chip_dir, "coalesced", requests)
            return
        status = outcome.status
        per_request_names: dict[str, str] = {
            build.HIT: "hits",
            build.BINARY: "binaries",
            build.DEBUG: "debug_compiles",
            build.FAILED: "failures",
        }
        per_request = per_request_names.get(status)
        if per_request:
            self._tally(chip_dir, per_request, requests)
        if status == build.HIT and (outcome.tier or "").startswith("remote:"):
            self._tally(chip_dir, "hits_from_remote", requests)
        if status in (build.COMPILED, build.BINARY):
            self._tally(chip_dir, "misses", requests)
        if status == build.COMPILED and ran:
            self._tally(chip_dir, "compiles", 1)
            if requests > 1:
                self._tally(chip_dir, "coalesced", requests - 1)
            if chip_dir is None or not any(f.parent == chip_dir for f in outcome.files):
                self._tally(chip_dir, "uncached", 1)

    def _count(self, status: str) -> None:
        with self._lock:
            self.counters[status] += 1

    # --- lifecycle ----------------------------------------------------------------------------

    @property
    def output_dir(self) -> Path | None:
        """Where uncached (``disable``) kernels go; None until the default one is needed."""
        return self._ctx.output_dir

    def depth(self) -> int:
        """Jobs queued or running."""
        with self._lock:
            return len(self._flights)

    def figures(self) -> dict[str, int]:
        """The queue's own figures: ``queued`` jobs waiting for a worker,
        ``running`` jobs a worker is compiling, and ``waited``: requests so far that joined a
        job already queued or running for the same kernel instead of starting their own."""
        with self._lock:
            states = [job.state for job in self._flights.values()]
            waited = self.counters["joined"]
        return {
            "queued": states.count(_PENDING),
            "running": states.count(_RUNNING),
            "waited": waited,
        }

    def stalled_s(self) -> float:
        """Seconds since a job last started or finished, while jobs wait for a worker (0
        when none waits): the daemon's watchdog counts a pool stalled this long as stuck."""
        with self._lock:
            if not any(job.state == _PENDING for *_, job in self._heap):
                return 0.0
            return time.monotonic() - self._progress_at

    def abandon(self, future: Future[CompileOutcome]) -> bool:
        """The caller behind ``future`` has gone: ``future.cancel()`` (see class docstring)."""
        return future.cancel()

    def update_settings(self, settings: Settings) -> None:
        """Use ``settings`` for new work (a reload); queued and running jobs keep theirs."""
        compilers = keys.Compilers.of(settings)
        roots = self._given_roots + _config_roots(settings)
        with self._lock:
            self.settings, self._compilers, self.binary_dirs = settings, compilers, roots

    def _check_output_dir(self, prepared: Prepared) -> None:
        """Before a compile whose kernel goes to the output folder — ``disable``, or a chip
        folder this user cannot write (compiled outside the cache) — refuse an output folder
        this user cannot write, as ``kernel_meta`` is checked for debug compiles; a hit never
        needs it (checked after the fast path).

        :raises InvalidInputError: one line naming the folder and where it came from.
        """
        out = self._ctx.output_dir
        if out is None or prepared.deliver or prepared.decision.debug.on:
            return
        if not prepared.decision.cache.write or kernel_meta.goes_outside_the_cache(
            prepared.chip_dir
        ):
            kernel_meta.check_output_dir(out)

    def set_remotes(self, remotes: RemoteTiers | None) -> None:
        """Use ``remotes`` for new work (a reload changed ``[remote]``); jobs already past
        their remote lookup keep the tiers they used."""
        with self._lock:
            self._ctx.remotes = remotes

    def close(self, cancel_pending: bool = False, timeout_s: float | None = None) -> None:
        """Stop accepting work; finish (or, with ``cancel_pending``, fail) pending jobs; wait for
        the workers (at most ``timeout_s`` each)."""
        with self._cond:
            self._closing = True
            dropped = []
            if cancel_pending:
                for job in self._flights.values():
                    if job.state == _PENDING:
                        job.state = _DROPPED
                        dropped.append(job)
                for job in dropped:
                    self._flights.pop(job.flight, None)
            self._cond.notify_all()
        for job in dropped:
            closed = build.failed(job.prepared.kernel, "the compile queue was closed")
            _resolve(job.waiters, closed)
        for thread in self._threads:
            thread.join(timeout_s)
        alive = any(t.is_alive() for t in self._threads)
        self._finishers.shutdown(wait=not alive)
        if not alive:
            self._ctx.close()

    def shutdown(
        self, wait: bool = True, timeout_s: float | None = None, cancel_pending: bool = False
    ) -> None:
        """Like :meth:`close`; with ``wait`` False the workers are not joined."""
        self.close(cancel_pending, timeout_s if wait else 0.0)

    def __enter__(self) -> CompileQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: ``tally(chip_dir, counter, amount)``: the cache counters' hook (docs/design.md#counters).
Tally = Callable[[Path | None, str, int], None]


def _waiting(entry: tuple[int, int, int, _Job]) -> bool:
    """A heap entry that still stands for a waiting job (not started, dropped or pushed
    again at a higher priority)."""
    job = entry[3]
    return job.state == _PENDING and -entry[0] == job.priority


def _resolve(
    waiters: Iterable[tuple[Future[CompileOutcome], float]], outcome: CompileOutcome
) -> None:
    for fut, start in waiters:
        if fut.set_running_or_notify_cancel():
            fut.set_result(build.elapsed(outcome, start))


def _config_roots(settings: Settings) -> list[Path]:
    table: Mapping[str, object] = settings.sections.get("precompiled", {})
    paths = table.get("paths", [])
    listed = [Path(str(p)) for p in paths] if isinstance(paths, list) else []
    return listed + precompiled.default_roots()
