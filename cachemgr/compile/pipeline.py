"""One compile request, top to bottom: request → options → decision → compiler → inputs → key
→ lookup → run → publish.

Each step is a short function that takes the previous step's frozen value and returns the
next one; :func:`prepare` chains the first five and is what the queue and the client call.
Read this file from the top to follow a request to its published entry:

1. :func:`options` — the request's options with their origins
   (docs/design.md#options-and-their-origins) → :class:`Resolved`;
2. :func:`decide` — the ``.cfg`` read, then every rule: debug, jit, cache mode
   (docs/design.md#the-policy-table) → :class:`Decided`;
3. :func:`toolchain` — the compiler identified, its flags, the compile environment checked,
   the chip folder named → :class:`Toolchain`;
4. :func:`gather` — the inputs: the source hashed (or a sent snapshot checked), then the
   headers from the manifest found by the base key, or from a dependency listing
   (docs/design.md#keys-and-manifests) → :class:`Gathered`;
5. :func:`key` — the key over the source and every header, the kernel's name, the chip
   lock → :class:`~cachemgr.compile.build.Prepared`;
6. :func:`lookup` — a precompiled binary (docs/design.md#precompiled-binaries), then a
   verified hit (docs/design.md#writing-and-reading-an-entry); :func:`freeze` holds the bytes
   hashed before a miss is queued;
7. :func:`run` — the compile: debug or ``disable`` in :mod:`cachemgr.compile.build`, through
   the cache in :mod:`cachemgr.compile.publisher` → an outcome or a pending publish;
8. :func:`publish` — the pending entry published (json last), its locks released.

What a caller says once about the job (its timeout, ``replace``, a sent snapshot, a sent
compile environment) is a :class:`JobOptions`, given at the start."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cachemgr.compile import environment, inputs, keys, policy, precompiled, searched
from cachemgr.compile.build import BINARY, HIT, Prepared, RunContext, error_text
from cachemgr.compile.request import CompileRequest, RequestOptions, resolve_options
from cachemgr.compile.results import CompileOutcome, Policy, Status
from cachemgr.compilers import CompileJob, CompilerBackend, CompilerIdentity
from cachemgr.config.options import Settings
from cachemgr.errors import CacheMgrError, ConfigError, InvalidInputError
from cachemgr.storage import chiplock, manifest
from cachemgr.storage.tiers import chip_store

if TYPE_CHECKING:  # not imported on the hit path
    from cachemgr.compile.publisher import Pending

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobOptions:
    """What the caller of one compile says about it, once, at the start.

    :ivar timeout_s: the most seconds one compiler process (or dependency listing) may run.
    :ivar replace: recompile and replace this one entry (docs/design.md#cache-modes).
    :ivar given: the frozen snapshot a caller sent (the daemon); None: the request's files
        are read here.
    :ivar env: the compile environment a daemon's caller sent (``compile_env``); None: this
        process's own (:func:`cachemgr.compile.environment.from_caller`).
    """

    timeout_s: float = 60.0
    replace: bool = False
    given: inputs.Snapshot | None = None
    env: Mapping[str, str] | None = None


def prepare(
    request: CompileRequest, settings: Settings, compilers: keys.Compilers, job: JobOptions
) -> Prepared:
    """Steps 1–5: decide everything about ``request`` and compute its key and kernel name.

    :raises InvalidInputError: a bad ``.cfg``, a malformed define, an invalid soc_version,
        an unreadable source or header.
    :raises CompileError: the compiler is not installed (named), ``--version`` fails, or the
        dependency listing fails (a missing header: the compiler's message).
    :raises ConfigError: a bad ``[compilers]`` config (e.g. no ``cce_command``).
    """
    resolved = options(request, settings, job)
    decided = decide(resolved)
    tools = toolchain(decided, settings, compilers)
    gathered = gather(tools)
    return key(gathered)


# --- 1. options --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resolved:
    """A request with its options resolved (request, config file, environment, defaults)."""

    request: CompileRequest
    opts: RequestOptions
    job: JobOptions


def options(request: CompileRequest, settings: Settings, job: JobOptions) -> Resolved:
    """Step 1: the options of ``request`` (docs/design.md#options-and-their-origins).

    :raises InvalidInputError: an option of the request that is not valid (named).
    """
    return Resolved(request, resolve_options(request, settings), job)


# --- 2. decision -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decided:
    """The rules applied: :attr:`decision`, and the ``.cfg`` bytes it came from (None: none)."""

    resolved: Resolved
    decision: policy.Decision
    cfg_bytes: bytes | None


def decide(r: Resolved) -> Decided:
    """Step 2: read the ``.cfg`` (:func:`debug_config`), then every rule for the request —
    debug, jit, cache mode (:func:`cachemgr.compile.policy.decide`,
    docs/design.md#the-policy-table).

    :raises InvalidInputError: a bad or unreadable ``.cfg`` (named).
    """
    cfg, data = debug_config(r.request, r.opts, r.job.given)
    decision = policy.decide(
        mode=r.opts.op_compiler_cache_mode,
        jit_compile=r.opts.jit_compile,
        level=r.opts.op_debug_level,
        cfg=cfg,
        op_type=r.request.op_type,
        op_name=r.request.op_name,
        dynamic=r.request.dynamic,
        replace=r.job.replace,
        framework=r.request.framework,
    )
    return Decided(r, decision, data)


# --- 3. compiler -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Toolchain:
    """The compiler of a decided request: its backend and identity, the flags of this
    compile, what ``-march=native`` resolves to, the checked compile environment (``env``) and
    the part of it in the key (``envkey``), and the chip folder and kernel cache folder the
    entry belongs in."""

    decided: Decided
    backend: CompilerBackend
    identity: CompilerIdentity
    flags: tuple[str, ...]
    native: tuple[str, ...]
    env: Mapping[str, str]
    envkey: Mapping[str, str]
    chip_dir: Path
    kernel_cache_dir: Path

    @property
    def request(self) -> CompileRequest:
        """The request being compiled."""
        return self.decided.resolved.request

    @property
    def decision(self) -> policy.Decision:
        """The rules decided for it (step 2)."""
        return self.decided.decision

    @property
    def timeout_s(self) -> float:
        """The most seconds one compiler process may run (:attr:`JobOptions.timeout_s`)."""
        return self.decided.resolved.job.timeout_s


def toolchain(d: Decided, settings: Settings, compilers: keys.Compilers) -> Toolchain:
    """Step 3: identify the request's compiler, its flags (with the debug flags decided),
    check the compile environment (:func:`cachemgr.compile.environment.checked`: a daemon's
    caller sent it, else this process's own) and name the chip folder.

    :raises CompileError: the compiler is not installed, or ``--version`` fails.
    :raises ConfigError: a bad ``[compilers]`` config.
    :raises InvalidInputError: a bad environment value, or an invalid soc_version.
    """
    request, given_env = d.resolved.request, d.resolved.job.env
    identity = compilers.identity(request.language)
    backend = compilers.backend(request.language)
    flags = compilers.flags(request, identity, d.decision.debug.flags, d.decision.debug.emit)
    native = compilers.native(backend, flags, identity)
    caller: Mapping[str, str]
    if given_env is None:
        caller, daemon = environment.from_caller(os.environ, os.getcwd()), False
    else:
        caller, daemon = given_env, True
    cenv = environment.checked(caller, backend.env_names, request.origin, daemon)
    envkey = backend.key_env(cenv)
    try:
        chip_dir = settings.layout.chip_dir(request.soc_version)
    except ConfigError as exc:  # from validate_name: bad input here
        raise InvalidInputError(f"{request.origin}: {exc}") from None
    return Toolchain(
        d,
        backend,
        identity,
        flags,
        native,
        cenv,
        envkey,
        chip_dir,
        settings.layout.kernel_cache_dir,
    )


# --- 4. inputs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gathered:
    """The inputs of a compile: the snapshot with every header (``scanned``: they came from
    a dependency listing, no manifest variant matched) and the manifest that names them."""

    tools: Toolchain
    inputs: inputs.Snapshot
    scanned: bool
    manifest_path: Path


def gather(t: Toolchain) -> Gathered:
    """Step 4: the source hashed here (or, for a snapshot a caller sent, what its bytes say
    checked: docs/compiling.md), then the headers: from the manifest at the base key when
    every file it names still has its digest, else from the compiler's dependency listing
    (:func:`cachemgr.compile.inputs.scan_headers`, docs/design.md#keys-and-manifests).

    :raises InvalidInputError: an unreadable source or header.
    :raises CompileError: the system-header probe or the dependency listing failed.
    """
    snap = _source(t)
    where = manifest.path_of(t.chip_dir, t.request.op_type, base_key(t, snap))
    if snap.headers is not None:  # a sent snapshot names its headers itself
        # listed by its caller: a hit records them, as the caller's own hit would
        return Gathered(t, snap, snap.listed, where)
    snap, scanned = _find_headers(t, snap, where)
    return Gathered(t, snap, scanned, where)


def base_key(t: Toolchain, snap: inputs.Snapshot) -> str:
    """The key of ``snap`` without its headers: the name of its manifest."""
    return keys.base_key(_material(t, snap), t.request)


def _source(t: Toolchain) -> inputs.Snapshot:
    """The snapshot of the source: its digest read here, or the snapshot the caller sent
    with what its bytes say (places searched, embedded data) derived here."""
    given, request = t.decided.resolved.job.given, t.request
    if given is None:
        digest = inputs.file_digest(request.kernel_source, "kernel_source")
        return inputs.Snapshot(request.kernel_source, digest, None, t.decided.cfg_bytes)
    if not given.sent:
        return given
    job = _listing_job(t)
    return inputs.check_sent(
        given, request.include_dirs, lambda: inputs.system_prefixes(t.backend, t.identity, job)
    )


def _find_headers(t: Toolchain, snap: inputs.Snapshot, where: Path) -> tuple[inputs.Snapshot, bool]:
    """``snap`` with its headers: from the manifest ``where`` when every file it names still
    has its digest (a read of the cache: not for ``disable`` or debug), else from a
    dependency scan of the caller's files; True when it was scanned. A source that reads
    only system headers needs no scan, and its bytes, read and hashed here, are its
    frozen inputs (:func:`freeze`)."""
    if t.decision.cache.read and not t.decision.debug.on:
        found = manifest.match(where, inputs.current_digest, searched.still_absent)
        if found is not None:
            headers, absent = dict(found.files), found.absent
            return dataclasses.replace(snap, headers=headers, absent=absent), False
    request = t.request
    source = inputs.read_input(request.kernel_source, "kernel_source")
    digest = hashlib.sha256(source).hexdigest()
    dirs = request.include_dirs
    if digest == snap.source_sha256 and inputs.reads_only_system_headers(
        source, request.language, dirs, t.env, digest
    ):  # the bytes just hashed are all its inputs: frozen now, not read again by freeze
        data = {str(request.kernel_source): source}
        return dataclasses.replace(snap, headers={}, data=data), True
    got = inputs.scan_headers(t.backend, _listing_job(t), t.identity)
    return dataclasses.replace(
        snap, headers=got.headers, absent=got.absent, uncached=got.uncached
    ), True


def _listing_job(t: Toolchain) -> CompileJob:
    """The job whose dependency listing names the request's headers (its real files, with
    the caller's compile environment: nothing to translate)."""
    request = t.request
    return CompileJob(
        source=request.kernel_source,
        language=request.language,
        entry=request.kernel_entry,
        defines=request.defines,
        out_dir=Path("/"),
        out_name="deps",
        debug_flags=t.decision.debug.flags,
        timeout_s=t.timeout_s,
        include_dirs=request.include_dirs,
        extra_flags=request.extra_flags,
        env=t.env,
    )


# --- 5. key ------------------------------------------------------------------------------------


def key(g: Gathered) -> Prepared:
    """Step 5: the key over the source and every header (docs/design.md#keys-and-manifests),
    the kernel's name and its chip lock; a kernel whose inputs cannot be keyed
    (:attr:`cachemgr.compile.inputs.Snapshot.uncached`) is decided uncached."""
    t, snap = g.tools, g.inputs
    kernel_key = keys.compute_key(_material(t, snap))
    lock_path = chiplock.chip_lock_path(t.kernel_cache_dir, t.request.soc_version)
    return Prepared(
        request=t.request,
        opts=t.decided.resolved.opts,
        decision=_without_cache_if(t.decision, snap.uncached),
        backend=t.backend,
        identity=t.identity,
        key=kernel_key,
        kernel=keys.kernel_name(t.request.op_type, kernel_key),
        chip_dir=t.chip_dir,
        chip_lock=chiplock.ChipLock(lock_path),
        timeout_s=t.timeout_s,
        inputs=snap,
        manifest_path=g.manifest_path,
        scanned=g.scanned,
        note=snap.uncached,
        env=t.env,
    )


def _material(t: Toolchain, snap: inputs.Snapshot) -> dict[str, Any]:
    """What the key of ``snap`` compiled by ``t`` is computed from
    (:func:`cachemgr.compile.keys.key_material`)."""
    return keys.key_material(
        t.request, t.decided.resolved.opts, t.identity, t.flags, snap, t.envkey, t.native
    )


def _without_cache_if(decision: policy.Decision, why: str | None) -> policy.Decision:
    """``decision`` with the cache neither read nor written when ``why`` (the note of a
    kernel whose inputs cachemgr cannot key) is set: it is compiled as with ``disable`` and
    the answer says why."""
    if why is None or not decision.cache.write:
        return decision
    return dataclasses.replace(decision, cache=policy.CachePlan(read=False, write=False))


# --- 6. lookup ---------------------------------------------------------------------------------


def lookup(p: Prepared, binary_dirs: Sequence[Path]) -> CompileOutcome | None:
    """Step 6: the answer without a compile — a precompiled binary when the rules look for
    one first, then a verified hit when the cache is read — or None (a miss)."""
    if p.decision.binary_first:
        found = find_binary(p, binary_dirs)
        if found is not None:
            return found
    if p.decision.cache.read:
        return find_cached(p)
    return None


def find_binary(p: Prepared, roots: Sequence[Path]) -> CompileOutcome | None:
    """docs/design.md#precompiled-binaries: a verified precompiled binary for ``p``, or None."""
    found = precompiled.find(roots, p.request, p.key, p.opts.deterministic)
    if found is None:
        return None
    return CompileOutcome(p.kernel, BINARY, found.files, request=p.request.origin)


def find_cached(p: Prepared) -> CompileOutcome | None:
    """docs/design.md#writing-and-reading-an-entry: a verified hit (atime set to now), or None (a
    bad entry is removed)."""
    result = chip_store(p.chip_dir).lookup(p.kernel)
    if not result.hit:
        return None
    if p.scanned:  # found by listing the headers: remember them, so the next hit needs no scan
        try:
            manifest.record(p.manifest_path, p.kernel, p.inputs.headers or {}, p.inputs.absent)
        except OSError as exc:
            log.warning("%s: cannot write its header manifest: %s", p.kernel, exc)
    return CompileOutcome(p.kernel, HIT, result.files, request=p.request.origin)


def freeze(p: Prepared) -> Prepared | None:
    """``p`` holding the bytes of its inputs, or None when one changed since it was hashed
    (then prepare again: the bytes hashed must be the bytes compiled).

    :raises InvalidInputError: an input that cannot be read any more.
    """
    snap = inputs.freeze(p.inputs)
    return None if snap is None else dataclasses.replace(p, inputs=snap)


# --- 7. run ------------------------------------------------------------------------------------


def run(p: Prepared, ctx: RunContext) -> CompileOutcome | Pending:
    """Step 7: compile the frozen ``p`` — a debug or ``disable`` job into its outputs
    (:func:`cachemgr.compile.build.run`), any other through the cache
    (:func:`cachemgr.compile.publisher.compile_through_cache`: a hit published meanwhile,
    or a pending publish for :func:`publish`).

    :raises CompileError: the compile failed (nothing is cached).
    :raises LockBusyError: the chip lock was not obtained in time.
    """
    from cachemgr.compile import build, publisher  # a miss: not on the hit path

    if p.decision.debug.on or not p.decision.cache.write:
        return build.run(p, ctx)
    return publisher.compile_through_cache(p, ctx)


# --- 8. publish --------------------------------------------------------------------------------


def publish(pending: Pending, ctx: RunContext) -> CompileOutcome:
    """Step 8: publish a compiled kernel (json last) and release its locks; a cache that is
    read-only or full sends the kernel to ``ctx``'s output folder instead, uncached
    (:meth:`cachemgr.compile.publisher.Pending.finish`).

    :raises InvalidInputError, OSError: the publish failed; nothing partial is left.
    """
    return pending.finish(ctx.uncached_dir)


# --- a request that failed before it was prepared ---------------------------------------------


def failed_before_prepared(
    request: CompileRequest, settings: Settings, error: BaseException, job: JobOptions
) -> CompileOutcome:
    """A ``failed`` outcome for a request whose preparation failed (:func:`prepare` raised
    ``CompileError``: a compiler not installed, a header missing from the dependency
    listing). Its policy is the one decided for it when steps 1 and 2 can be had
    (``cached`` False: the compile failed); otherwise :meth:`Policy.unresolved` with the
    error (a policy on every result)."""
    text = error_text(error)
    try:
        d = decide(options(request, settings, job))
        opts = d.resolved.opts
        why = f"the request failed before its compile: {text}"
        binary_first = d.decision.binary_first
        pol = Policy(opts.jit_compile, binary_first, opts.op_compiler_cache_mode, False, why)
    except (CacheMgrError, OSError) as exc:
        pol = Policy.unresolved(error_text(exc))
    return CompileOutcome("", Status.FAILED, (), error=text, request=request.origin, policy=pol)


# --- the debug .cfg ----------------------------------------------------------------------------

#: The largest ``.cfg`` read (bytes); its format (docs/design.md#debug-compiles-and-kernel_meta) is
#: one line.
MAX_DEBUG_CONFIG_BYTES = 64 * 1024


def debug_config(
    request: CompileRequest, opts: RequestOptions, given: inputs.Snapshot | None
) -> tuple[policy.DebugConfig | None, bytes | None]:
    """The ``.cfg`` of a compile and its bytes: those the caller sent, else read here — by
    the caller's own process, or by the daemon for the ``.cfg`` of its own configuration
    (never a path a remote caller named: :func:`cachemgr.compile.inputs.from_wire`).

    :raises InvalidInputError: a bad or unreadable ``.cfg``, or one a daemon's caller named
        without sending its bytes.
    """
    path = opts.op_debug_config
    if given is not None and given.debug_config is not None:
        return parse_debug_config(given.debug_config, path or "(sent)"), given.debug_config
    if path is None:
        return None, None
    if given is not None and "op_debug_config" in request.options:
        raise InvalidInputError(
            f"{request.origin}: op_debug_config={path} was named but its bytes were not sent "
            "(the daemon reads no file on a caller's behalf)"
        )
    data = read_debug_config_bytes(path)
    return parse_debug_config(data, path), data


def read_debug_config(path: Path) -> policy.DebugConfig:
    """Read and parse an ``op_debug_config`` ``.cfg`` file
    (docs/design.md#debug-compiles-and-kernel_meta).

    :raises InvalidInputError: unreadable file (named), or any error of
        :func:`cachemgr.compile.policy.parse_debug_config`.
    """
    return parse_debug_config(read_debug_config_bytes(path), path)


def read_debug_config_bytes(path: Path) -> bytes:
    """The bytes of an ``op_debug_config`` file, read by the caller (non-blocking, a regular
    file of at most 64 KiB).

    :raises InvalidInputError: unreadable, not a regular file, too big (named).
    """
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_DEBUG_CONFIG_BYTES:
            what = "not a regular file" if not stat.S_ISREG(st.st_mode) else "over 64 KiB"
            raise InvalidInputError(f"op_debug_config {path}: {what} (a .cfg is one line)")
    except OSError as exc:
        raise InvalidInputError(f"op_debug_config {path}: cannot read ({exc.strerror})") from None
    return inputs.read_input(path, "op_debug_config", MAX_DEBUG_CONFIG_BYTES)


def parse_debug_config(data: bytes, path: Path | str) -> policy.DebugConfig:
    """Parse the bytes of a ``.cfg`` (docs/design.md#debug-compiles-and-kernel_meta).

    :raises InvalidInputError: not UTF-8, or any error of :func:`policy.parse_debug_config`.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInputError(f"op_debug_config {path}: cannot read (not UTF-8)") from None
    return policy.parse_debug_config(text, f"op_debug_config {path}")
