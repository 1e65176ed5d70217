"""What a prepared compile is and how a job that leaves the cache alone runs (below
:mod:`cachemgr.compile.pipeline`, which prepares it and calls :func:`run`).

A :class:`Prepared` job has every decision made: options resolved, rules applied, compiler
identified, key computed (:func:`cachemgr.compile.pipeline.prepare`). :func:`run` is the slow
path of a job that does not use the cache:

* **disable**: compile, then move the kernel into ``output_dir`` (json last); no cache access.
* **debug**: compile with the debug flags in the worker's private build folder and keep the
  level's artefacts in ``kernel_meta/<host>_<pid>/``, written relative to that folder's
  opened descriptor (docs/compiling.md, "Where outputs go"); no cache access.

Compiles through the cache (``enable``/``force``) are :mod:`cachemgr.compile.publisher`'s."""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cachemgr.compile import environment, inputs, kernel_meta, policy, tempdirs
from cachemgr.compile.request import CompileRequest, RequestOptions
from cachemgr.compile.results import CompileOutcome, Policy, Status
from cachemgr.compilers import CompileJob, CompilerBackend, CompilerIdentity
from cachemgr.storage import chiplock, fsutil, madeahead, partcopy
from cachemgr.storage.safedir import SafeDir

if TYPE_CHECKING:  # not imported on the hit path
    from cachemgr.remote.tierset import RemoteTiers
    from cachemgr.storage.events import Events

log = logging.getLogger(__name__)

#: The statuses of :class:`cachemgr.compile.results.Status`, by their old names.
HIT, COMPILED, BINARY, DEBUG, FAILED = (
    Status.HIT,
    Status.COMPILED,
    Status.BINARY,
    Status.DEBUG,
    Status.FAILED,
)


@dataclass(frozen=True)
class Prepared:
    """A request with every decision made: what :func:`run` needs."""

    request: CompileRequest
    opts: RequestOptions
    decision: policy.Decision
    backend: CompilerBackend
    #: the compiler's identity the key was computed with (``backend.identity()`` then)
    identity: CompilerIdentity
    key: str
    kernel: str
    chip_dir: Path
    chip_lock: chiplock.ChipLock
    timeout_s: float
    inputs: inputs.Snapshot
    manifest_path: Path
    #: the headers came from a dependency listing (no manifest variant matched)
    scanned: bool = False
    #: set when the outputs (debug artefacts, ``disable`` kernels) are handed back to a caller
    #: who writes them itself: they go to a private folder of this job
    deliver: str | None = None
    #: :attr:`CompileOutcome.note` of the answer
    note: str | None = None
    #: the caller's values of the variables its compiler reads (checked:
    #: :func:`cachemgr.compile.environment.checked`); the compile runs with exactly these
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def variant(self) -> str:
        """Single-flight class: identical requests of one variant share one compile (a job
        whose outputs are handed back is its caller's alone)."""
        if self.deliver:
            return f"deliver-{self.deliver}"
        if self.decision.debug.on:
            return Status.DEBUG
        if self.decision.cache.replace:
            return "replace"
        return "cache" if self.decision.cache.write else "nocache"


@dataclass
class RunContext:
    """What :func:`run` needs from the queue: where uncached kernels go, lock wait limits, and
    one private build folder per worker thread (reused: made once, emptied after each job)."""

    output_dir: Path | None
    lock_timeout_s: float
    local: threading.local = field(default_factory=threading.local)
    #: the workers' build folders with their liveness locks (:mod:`cachemgr.compile.tempdirs`),
    #: held until :meth:`close`
    live_dirs: list[tempdirs.LiveDir] = field(default_factory=list)
    #: the config file's tables (its ``[toolkit]`` stamps a new ``op_cache.ini``)
    config_sections: dict[str, Any] = field(default_factory=dict)
    #: where tier events go (a publish on a full disk: the daemon evicts)
    events: Events | None = None
    #: the remote tiers (``cachemgr.remote.tierset.RemoteTiers``), None without remotes
    remotes: RemoteTiers | None = None
    _pending: tempdirs.LiveDir | None = None
    _pending_lock: threading.Lock = field(default_factory=threading.Lock)
    #: every worker's :class:`Spares`, closed by :meth:`close`
    _spares: list[Spares] = field(default_factory=list)

    def build_dir(self) -> Path:
        """This thread's private, empty build folder (outside any cache folder), locked as
        live for this process's lifetime; the first one first reclaims the build folders of
        dead processes (a SIGKILLed queue never closes its own: :func:`tempdirs.sweep`)."""
        path: Path | None = getattr(self.local, "build", None)
        if path is None or not path.is_dir():
            if not self.live_dirs:  # our own live folders stay: their flock is held
                tempdirs.sweep(BUILD_PREFIX)
            live = tempdirs.make(BUILD_PREFIX)
            path = live.path
            self.local.build = path
            self.live_dirs.append(live)
        return path

    def spares(self) -> Spares:
        """This thread's files made ahead for the mirror of its next job (:class:`Spares`)."""
        found: Spares | None = getattr(self.local, "spares", None)
        if found is None:
            found = self.local.spares = Spares()
            with self._pending_lock:
                self._spares.append(found)
        return found

    def pending_dir(self) -> Path:
        """This process's private folder of compiled binaries waiting to be published
        (``cachemgr-pending-*``, locked as live like the build folders): a binary moves
        there out of its build folder, which the worker empties for its next job, and is
        copied from there into the chip folder in chunks (docs/daemon.md, "Bounded
        memory"). Made on first use; removed by :meth:`close`.

        :raises OSError: the folder cannot be made.
        """
        with self._pending_lock:
            if self._pending is None:
                tempdirs.sweep(PENDING_PREFIX)
                self._pending = tempdirs.make(PENDING_PREFIX)
                self.live_dirs.append(self._pending)
            return self._pending.path

    def uncached_dir(self) -> Path:
        """``output_dir``; when None, a private temp folder made on first use and kept (the
        caller owns the kernels in it, so no sweep reclaims a ``cachemgr-out-*`` folder: its
        kernels may be a result its caller still reads)."""
        if self.output_dir is None:
            self.output_dir = Path(tempfile.mkdtemp(prefix="cachemgr-out-"))
        return self.output_dir

    def after_job(self) -> None:
        """Empty this thread's build folder (after the callers have their answer). Never
        raises: a folder that cannot be emptied (what a subverted compiler or a caller's
        path left, attack review) is one warning and is removed now — the next job gets a
        new one — instead of ending the worker thread that called this, or staying in the
        temp folder until the queue closes (docs/security.md, section 10)."""
        path: Path | None = getattr(self.local, "build", None)
        if path is None or not path.is_dir():
            return
        try:
            _empty(path)
        except Exception as exc:  # a worker must outlive any leftover
            log.warning("cannot empty build folder %s (%s); removing it", path, exc)
            self.local.build = None
            self._give_up(path)
            return
        spares = self.spares()
        with self._pending_lock:  # one worker at a time: the budget is the process's
            held = sum(len(s.fds) for s in self._spares)
            spares.refill(path, spare_budget() - held)  # made now, while no caller waits

    def _give_up(self, path: Path) -> None:
        """Remove the build folder ``path`` (any depth, never following a link) and drop its
        liveness lock; a part that cannot be removed is one warning, and a later sweep
        reclaims it (its lock is no longer held)."""
        for live in [d for d in self.live_dirs if d.path == path]:
            self.live_dirs.remove(live)
            try:
                live.close()
            except Exception as exc:  # never end the worker
                log.warning("cannot remove build folder %s: %s", path, exc)

    def close(self) -> None:
        """Remove every build folder (then drop its liveness lock)."""
        with self._pending_lock:
            spares, self._spares = self._spares, []
        for spare in spares:
            spare.close()
        for live in self.live_dirs:
            live.close()
        self.live_dirs.clear()
        self._pending = None


#: The most files a worker makes ahead for the mirror of its next job (:class:`Spares`).
MAX_SPARES = 16
#: The share of the process's descriptor limit that all workers' :class:`Spares` may hold
#: together between jobs (one in this many): 24 workers of 16 each held 247 of a limit of
#: 256 for good, and every compile after failed with ``EMFILE`` (a daemon of 64 workers
#: under systemd's default soft limit of 1,024 alike).
SPARES_SHARE = 8


def spare_budget() -> int:
    """How many files all workers may hold made ahead between jobs: the soft
    ``RLIMIT_NOFILE`` divided by :data:`SPARES_SHARE` (an unlimited one counts as Linux's
    default ``fs.nr_open``, 1,048,576)."""
    import resource  # here: only the workers' refill asks

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return soft // SPARES_SHARE


@dataclass
class Spares:
    """Files a worker makes in its build folder after a job, unnamed
    (:func:`cachemgr.storage.madeahead.make`), for the mirror of its next job
    (:func:`cachemgr.compile.inputs.materialise` names them): the file a mirror writes is
    then not created while a caller waits (a create took 280-370 µs on the reference
    host's ext4, docs/performance.md). As many as the last job's inputs, at most
    :data:`MAX_SPARES`; made after the build folder was emptied, so no process of an
    earlier compile holds one. Where none can be made, the mirror creates its files."""

    fds: list[int] = field(default_factory=list)
    #: files the last job's mirror held
    wanted: int = 1

    def refill(self, folder: Path, room: int) -> None:
        """Make files in ``folder`` (the emptied build folder) up to :attr:`wanted`, at most
        ``room`` more (what the process's budget leaves: :func:`spare_budget`). Never
        raises."""
        if room <= 0 or len(self.fds) >= min(self.wanted, MAX_SPARES):
            return
        try:
            dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            while len(self.fds) < min(self.wanted, MAX_SPARES) and room > 0:
                fd = madeahead.make(dir_fd)
                if fd is None:
                    return
                self.fds.append(fd)
                room -= 1
        finally:
            os.close(dir_fd)

    def close(self) -> None:
        """Close every file not used (idempotent): the kernel frees them."""
        fds, self.fds = self.fds, []
        for fd in fds:
            madeahead.discard(fd)


#: Prefix of the workers' private build folders in the temp folder (:meth:`RunContext.build_dir`).
BUILD_PREFIX = "cachemgr-build-"
#: Prefix of the folder of binaries waiting to be published (:meth:`RunContext.pending_dir`).
PENDING_PREFIX = "cachemgr-pending-"


def _empty(folder: Path) -> None:
    """Remove everything in a worker's build folder but its liveness lock and the sources'
    mirror's folders; folders a compiler made unlistable or read-only are opened up first.

    :raises OSError: something could not be listed or removed.
    """
    fsutil.open_up_tree(folder, skip=(SOURCES_DIR,))  # the mirror opens up as it is emptied
    for name in os.listdir(folder):
        path = folder / name
        if name == tempdirs.LIVE_LOCK:
            continue  # the folder's liveness lock: held until RunContext.close
        if name == SOURCES_DIR and path.is_dir() and not path.is_symlink():
            inputs.empty_mirror(path)  # its folders serve the worker's next job
            continue
        if path.is_dir() and not path.is_symlink():
            fsutil.remove_tree(path)  # any depth; a part left is one warning
        else:
            fsutil.safe_unlink(path)


def run(p: Prepared, ctx: RunContext) -> CompileOutcome:
    """The slow path of a job that does not touch the cache: debug (into kernel_meta) or
    ``disable`` (into ``output_dir``). Compiles through the cache are
    :func:`cachemgr.compile.publisher.compile_through_cache`.

    :raises CompileError: the compile failed (the queue makes it a ``failed`` outcome).
    :raises ValueError: for a job that would use the cache.
    """
    if p.decision.debug.on:
        return _run_debug(p, ctx, deliver_dir() if p.deliver else None)
    if not p.decision.cache.write:
        out = deliver_dir() if p.deliver else ctx.uncached_dir()
        return _run_uncached(p, out, ctx.build_dir())
    raise ValueError(f"{p.kernel}: a cached compile is publisher.compile_through_cache's job")


#: The mirror tree of a compile's inputs inside its build folder (:func:`compile_job`).
SOURCES_DIR = ".src"


def compile_job(p: Prepared, out_dir: Path, spares: Spares | None = None) -> CompileJob:
    """The backend job of ``p``: its frozen inputs written into ``out_dir/.src`` (a mirror
    of their absolute paths, :func:`cachemgr.compile.inputs.materialise`; through the
    worker's ``spares`` where it has some), compiled from there with its defines, flags and
    include folders into ``out_dir``, named by the kernel, limited to ``p.timeout_s``
    seconds. The compiler reads exactly the bytes that were hashed.

    :raises ValueError: ``p`` was not frozen (:func:`cachemgr.compile.pipeline.freeze`).
    """
    root = out_dir / SOURCES_DIR
    fds = None
    if spares is not None:
        spares.wanted = len(p.inputs.data or ())
        fds = spares.fds
    source = inputs.materialise(p.inputs, root, p.request.include_dirs, fds)
    inputs.place_embedded(p.inputs, out_dir)  # the compiler runs in out_dir
    return CompileJob(
        source=source,
        language=p.request.language,
        entry=p.request.kernel_entry,
        defines=p.request.defines,
        out_dir=out_dir,
        out_name=p.kernel,
        debug_flags=p.decision.debug.flags,
        emit=p.decision.debug.emit,
        timeout_s=p.timeout_s,
        include_dirs=tuple(inputs.mirror(root, d) for d in p.request.include_dirs),
        extra_flags=p.request.extra_flags,
        mirror_root=root,
        env=environment.for_mirror(p.env, root, p.inputs),
    )


#: Prefix of the private folders of outputs handed back to their caller.
DELIVER_PREFIX = "cachemgr-deliver-"


def deliver_dir() -> Path:
    """A private (0700) folder for the outputs of one job that its caller writes itself."""
    return Path(tempfile.mkdtemp(prefix=DELIVER_PREFIX))


def _run_debug(p: Prepared, ctx: RunContext, into: Path | None = None) -> CompileOutcome:
    """Compile ``p`` with its debug flags in the worker's private build folder, then keep its
    level's artefacts in ``into`` (a private hand-back folder) or this process's
    ``kernel_meta`` folder — opened once before compiling and written relative to its
    descriptor only (:func:`cachemgr.compile.kernel_meta.open_process_dir`): nothing is built
    in ``kernel_meta``, which other members may rename in.

    :raises CompileError: the compile failed.
    :raises UnsafePathError: the ``kernel_meta`` folder is another user's link or folder.
    :raises OSError: the folder cannot be created, opened or written.
    """
    with _debug_folder(p, into) as folder:
        result = p.backend.compile(compile_job(p, ctx.build_dir()))
        kept = kernel_meta.keep_artefacts(
            result, p.kernel, p.decision.debug.keep, folder, p.request
        )
    return CompileOutcome(p.kernel, DEBUG, kept, request=p.request.origin)


def _debug_folder(p: Prepared, into: Path | None) -> SafeDir:
    """The open folder a debug compile's artefacts go to (see :func:`_run_debug`)."""
    if into is not None:
        return SafeDir.open(into)  # made private by deliver_dir: opened as it is
    return kernel_meta.open_process_dir(p.opts.kernel_meta_dir)


def _run_uncached(p: Prepared, output_dir: Path, build: Path) -> CompileOutcome:
    """Compile in the worker's private ``build`` folder (in the temp folder), then copy the
    kernel into ``output_dir``: the binary, then the json (a visible json means a whole
    kernel). Nothing is built, left or swept in the output folder: it may be one other
    members can rename in, who could swap a folder of the caller's under a build folder's
    name and have it removed (attack review)."""
    fsutil.ensure_dir(output_dir)
    result = p.backend.compile(compile_job(p, build))
    binary = output_dir / result.binary.name
    doc = output_dir / result.json_path.name
    for made, dest in ((result.binary, binary), (result.json_path, doc)):
        # in chunks, never read whole (docs/daemon.md, "Bounded memory"); not a cache entry
        fsutil.publish_temp(partcopy.copy_temp(dest, made).tmp, dest)
    return CompileOutcome(p.kernel, COMPILED, (doc, binary), request=p.request.origin)


def failed(kernel: str, error: BaseException | str, origin: str = "") -> CompileOutcome:
    """A ``failed`` outcome with the error's one-line message."""
    return CompileOutcome(kernel, FAILED, (), error=error_text(error), request=origin)


def error_text(error: BaseException | str) -> str:
    """The one-line message of ``error`` (its type's name when it has none)."""
    return str(error) if str(error) else type(error).__name__


def with_policy(outcome: CompileOutcome, p: Prepared) -> CompileOutcome:
    """``outcome`` with the policy that produced it recorded: the jit mode
    and cache mode applied, whether the kernel is in the cache and, if not, why."""
    d, opts = p.decision, p.opts
    why: str | None = None
    if outcome.status == FAILED:
        why = "the compile failed"
    elif outcome.status == DEBUG:
        why = (
            f"op_debug_config={opts.op_debug_config} bypasses the cache"
            if opts.op_debug_config and not opts.op_debug_level
            else f"op_debug_level={opts.op_debug_level} bypasses the cache"
        )
    elif outcome.status == BINARY:
        why = f"a precompiled binary answered (jit_compile={opts.jit_compile})"
    elif outcome.status == COMPILED and p.inputs.uncached:
        why = p.inputs.uncached
    elif outcome.status == COMPILED and not d.cache.write:
        why = f"op_compiler_cache_mode={opts.op_compiler_cache_mode}"
    elif outcome.cached is False:
        why = outcome.warning or "not stored in the cache"
    policy = Policy(opts.jit_compile, d.binary_first, opts.op_compiler_cache_mode, why is None, why)
    note = outcome.note or p.note
    return dataclasses.replace(outcome, policy=policy, note=note)


def elapsed(outcome: CompileOutcome, start: float) -> CompileOutcome:
    """``outcome`` with ``seconds`` measured from ``start`` (``time.monotonic()``)."""
    return dataclasses.replace(outcome, seconds=time.monotonic() - start)
