"""One compile request, from decision to artefacts (layer 7½, below the queue; issue 4).

:func:`prepare` turns a request into a :class:`Prepared` job: options resolved (SPEC §1), the
``.cfg`` read, the rules applied (:func:`cachemgr.policy.decide`), the compiler identified and
the key computed (SPEC §3.2). The fast paths — :func:`find_binary` (SPEC §6) and
:func:`find_cached` (a verified hit, SPEC §3.3) — run in the caller's thread. :func:`run` is the
slow path of a job that leaves the cache alone:

* **disable**: compile, then move the kernel into ``output_dir`` (json last); no cache access.
* **debug** (SPEC §7): compile with the debug flags in ``kernel_meta/<host>_<pid>/`` and keep
  the artefacts of SPEC §7's table there; no cache access.

Compiles through the cache (``enable``/``force``) are :mod:`cachemgr.publisher`'s."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachemgr import chiplock, fsutil, kernel_meta, keys, policy, precompiled
from cachemgr.compilers import CompileJob, CompilerBackend
from cachemgr.errors import ConfigError, InvalidInputError
from cachemgr.options import Settings
from cachemgr.request import CompileRequest, RequestOptions, resolve_options
from cachemgr.store import Store

log = logging.getLogger(__name__)

HIT, COMPILED, BINARY, DEBUG, FAILED = "hit", "compiled", "binary", "debug", "failed"


@dataclass(frozen=True)
class CompileOutcome:
    """The answer to one request.

    :ivar status: ``hit`` | ``compiled`` | ``binary`` (precompiled) | ``debug`` | ``failed``.
    :ivar files: the kernel's files (json and binary; in kernel_meta: every artefact kept).
    :ivar seconds: wall time from submit to answer.
    :ivar error: one line (the compiler's message) when ``failed``.
    """

    kernel_name: str
    status: str
    files: tuple[Path, ...] = ()
    seconds: float = 0.0
    error: str | None = None
    request: str = ""
    #: for ``compiled``: True when the kernel was stored in the cache, False when it was
    #: compiled outside it (a read-only or full root, a lock never released: issue 10 item 12)
    cached: bool | None = None
    #: one line for the caller: why a compiled kernel was not cached
    warning: str | None = None

    @property
    def ok(self) -> bool:
        """False only for ``failed``."""
        return self.status != FAILED

    def to_json(self) -> dict[str, Any]:
        """``{kernel_name, status, files, seconds[, error]}`` as the CLI prints it."""
        doc: dict[str, Any] = {
            "request": self.request,
            "kernel_name": self.kernel_name,
            "status": self.status,
            "files": [str(f) for f in self.files],
            "seconds": round(self.seconds, 6),
        }
        if self.error is not None:
            doc["error"] = self.error
        if self.cached is not None:
            doc["cached"] = self.cached
        if self.warning is not None:
            doc["warning"] = self.warning
        return doc


@dataclass(frozen=True)
class Prepared:
    """A request with every decision made: what :func:`run` needs."""

    request: CompileRequest
    opts: RequestOptions
    decision: policy.Decision
    backend: CompilerBackend
    key: str
    kernel: str
    chip_dir: Path
    chip_lock: chiplock.ChipLock
    timeout_s: float

    @property
    def variant(self) -> str:
        """Single-flight class: identical requests of one variant share one compile."""
        if self.decision.debug.on:
            return "debug"
        if self.decision.cache.replace:
            return "replace"
        return "cache" if self.decision.cache.write else "nocache"


#: The largest ``.cfg`` read (bytes); SPEC §7's format is one line.
MAX_DEBUG_CONFIG_BYTES = 64 * 1024


def read_debug_config(path: Path) -> policy.DebugConfig:
    """Read and parse an ``op_debug_config`` ``.cfg`` file (SPEC §7).

    :raises InvalidInputError: unreadable file (named), or any error of
        :func:`cachemgr.policy.parse_debug_config`.
    """
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_DEBUG_CONFIG_BYTES:
            what = "not a regular file" if not stat.S_ISREG(st.st_mode) else "over 64 KiB"
            raise InvalidInputError(f"op_debug_config {path}: {what} (a .cfg is one line)")
        text = fsutil.read_bytes_noatime(Path(path)).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
        raise InvalidInputError(f"op_debug_config {path}: cannot read ({why})") from None
    return policy.parse_debug_config(text, f"op_debug_config {path}")


def prepare(
    request: CompileRequest,
    settings: Settings,
    compilers: keys.Compilers,
    timeout_s: float,
    replace: bool = False,
) -> Prepared:
    """Decide everything about ``request`` and compute its key and kernel name.

    :raises InvalidInputError: a bad ``.cfg``, a malformed define, an invalid soc_version.
    :raises CompileError: the compiler is not installed (named) or ``--version`` fails.
    :raises ConfigError: a bad ``[compilers]`` config (e.g. no ``cce_command``).
    """
    opts = resolve_options(request, settings)
    cfg = read_debug_config(opts.op_debug_config) if opts.op_debug_config else None
    decision = policy.decide(
        mode=opts.op_compiler_cache_mode,
        jit_compile=opts.jit_compile,
        level=opts.op_debug_level,
        cfg=cfg,
        op_type=request.op_type,
        op_name=request.op_name,
        dynamic=request.dynamic,
        replace=replace,
    )
    identity = compilers.identity(request.language)
    backend = compilers.backend(request.language)
    flags = compilers.flags(request, identity, decision.debug.flags, decision.debug.emit)
    material = keys.key_material(
        request, opts, identity, flags, keys.source_sha256(request.kernel_source)
    )
    key = keys.compute_key(material)
    kcache = settings.layout.kernel_cache_dir
    try:
        chip_dir = settings.layout.chip_dir(request.soc_version)
    except ConfigError as exc:  # from validate_name: bad input here
        raise InvalidInputError(f"{request.origin}: {exc}") from None
    lock = chiplock.ChipLock(chiplock.chip_lock_path(kcache, request.soc_version))
    kernel = keys.kernel_name(request.op_type, key)
    return Prepared(request, opts, decision, backend, key, kernel, chip_dir, lock, timeout_s)


def find_binary(p: Prepared, roots: Sequence[Path]) -> CompileOutcome | None:
    """SPEC §6: a verified precompiled binary for ``p``, or None."""
    found = precompiled.find(roots, p.request, p.key, p.opts.deterministic)
    if found is None:
        return None
    return CompileOutcome(p.kernel, BINARY, found.files, request=p.request.origin)


def find_cached(p: Prepared) -> CompileOutcome | None:
    """SPEC §3.3: a verified hit (atime set to now), or None (a bad entry is removed)."""
    result = Store(p.chip_dir).lookup(p.kernel)
    if not result.hit:
        return None
    return CompileOutcome(p.kernel, HIT, result.files, request=p.request.origin)


@dataclass
class RunContext:
    """What :func:`run` needs from the queue: where uncached kernels go, lock wait limits, and
    one private build folder per worker thread (reused: made once, emptied after each job)."""

    output_dir: Path | None
    lock_timeout_s: float
    local: threading.local = field(default_factory=threading.local)
    build_dirs: list[Path] = field(default_factory=list)
    #: the config file's tables (its ``[toolkit]`` stamps a new ``op_cache.ini``)
    config_sections: dict[str, Any] = field(default_factory=dict)

    def build_dir(self) -> Path:
        """This thread's private, empty build folder (outside any cache folder)."""
        path: Path | None = getattr(self.local, "build", None)
        if path is None or not path.is_dir():
            path = Path(tempfile.mkdtemp(prefix="cachemgr-build-"))
            self.local.build = path
            self.build_dirs.append(path)
        return path

    def uncached_dir(self) -> Path:
        """``output_dir``; when None, a private temp folder made on first use and kept (the
        caller owns the kernels in it)."""
        if self.output_dir is None:
            self.output_dir = Path(tempfile.mkdtemp(prefix="cachemgr-out-"))
        return self.output_dir

    def after_job(self) -> None:
        """Empty this thread's build folder (after the callers have their answer)."""
        path: Path | None = getattr(self.local, "build", None)
        if path is not None and path.is_dir():
            _empty(path)

    def close(self) -> None:
        """Remove every build folder."""
        for path in self.build_dirs:
            shutil.rmtree(path, ignore_errors=True)
        self.build_dirs.clear()


def _empty(folder: Path) -> None:
    for name in os.listdir(folder):
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            fsutil.safe_unlink(path)


def run(p: Prepared, ctx: RunContext) -> CompileOutcome:
    """The slow path of a job that does not touch the cache: debug (into kernel_meta) or
    ``disable`` (into ``output_dir``). Compiles through the cache are
    :func:`cachemgr.publisher.compile_through_cache`.

    :raises CompileError: the compile failed (the queue makes it a ``failed`` outcome).
    :raises ValueError: for a job that would use the cache.
    """
    if p.decision.debug.on:
        return _run_debug(p)
    if not p.decision.cache.write:
        return _run_uncached(p, ctx.uncached_dir())
    raise ValueError(f"{p.kernel}: a cached compile is publisher.compile_through_cache's job")


def compile_job(p: Prepared, out_dir: Path) -> CompileJob:
    """The backend job of ``p``: its source, defines and debug flags into ``out_dir``, named
    by the kernel, limited to ``p.timeout_s`` seconds."""
    return CompileJob(
        source=p.request.kernel_source,
        language=p.request.language,
        entry=p.request.kernel_entry,
        defines=p.request.defines,
        out_dir=out_dir,
        out_name=p.kernel,
        debug_flags=p.decision.debug.flags,
        emit=p.decision.debug.emit,
        timeout_s=p.timeout_s,
    )


def _run_debug(p: Prepared) -> CompileOutcome:
    folder = kernel_meta.process_dir(p.opts.kernel_meta_dir)
    build = kernel_meta.build_dir(folder, p.kernel)
    try:
        result = p.backend.compile(compile_job(p, build))
        kept = kernel_meta.keep_artefacts(
            result, p.kernel, p.decision.debug.keep, folder, p.request
        )
    finally:
        kernel_meta.remove_build_dir(build)
    return CompileOutcome(p.kernel, DEBUG, kept, request=p.request.origin)


def _run_uncached(p: Prepared, output_dir: Path) -> CompileOutcome:
    fsutil.ensure_dir(output_dir)
    build = Path(tempfile.mkdtemp(prefix=".cachemgr-build-", dir=output_dir))
    try:
        result = p.backend.compile(compile_job(p, build))
        binary = output_dir / result.binary.name
        doc = output_dir / result.json_path.name
        os.replace(result.binary, binary)
        os.replace(result.json_path, doc)  # json last: a visible json means a whole kernel
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return CompileOutcome(p.kernel, COMPILED, (doc, binary), request=p.request.origin)


def failed(kernel: str, error: BaseException | str, origin: str = "") -> CompileOutcome:
    """A ``failed`` outcome with the error's one-line message."""
    text = str(error) if str(error) else type(error).__name__
    return CompileOutcome(kernel, FAILED, (), error=text, request=origin)


def elapsed(outcome: CompileOutcome, start: float) -> CompileOutcome:
    """``outcome`` with ``seconds`` measured from ``start`` (``time.monotonic()``)."""
    return dataclasses.replace(outcome, seconds=time.monotonic() - start)
