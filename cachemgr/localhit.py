"""A hit served again in the caller's process: what :func:`cachemgr.compile.pipeline.prepare`
read, re-checked instead of recomputed (layer 7¾, under :mod:`cachemgr.client`).

A framework asks for the same kernels again and again. The first hit of a request prepares
it in full (options, rules, compiler, environment, key: docs/design.md#keys-and-manifests)
and, once the verified lookup answered, :meth:`HitPlans.remember` keeps the prepared job
with everything that preparation depended on. The next time the same request comes,
:meth:`HitPlans.again` re-checks each of those instead of recomputing the key:

* the request: the same data (its exact types and values: ``True`` is not ``1``) and the
  same base folder (resolved again, links followed by the kernel, unless every path the
  request names is absolute);
* the daemon's settings and ``[compilers]`` table: the same objects (refreshed after
  :data:`cachemgr.client.LOCAL_CONFIG_TTL_S`, which then prepares once in full);
* the compiler: the identity :meth:`cachemgr.compile.keys.Compilers.identity` gives now
  (one ``stat`` of its file, ``PATH`` searched again after a while);
* the caller's environment: the variables its compiler reads, and the current folder when
  one of them is a folder list (:func:`cachemgr.compile.environment.from_caller`);
* the source: its SHA-256 now (:func:`cachemgr.compile.inputs.file_digest`: remembered per
  file identity, hashed again when it changed or is "racy");
* the headers: the header manifest's first variant whose every file has today's digest and
  whose places searched in vain are still absent (:func:`cachemgr.storage.manifest.match`,
  the same call a preparation makes) must be the one the key was computed from;
* the entry: the same verified lookup as every hit (:meth:`cachemgr.storage.store.Store.lookup`:
  json parsed, SHA-256 of every binary, atimes set; a bad entry removed), the second time
  and after with what the one before found (:func:`cachemgr.storage.rehit.again`: the same
  checks in fewer steps; any difference and it is :meth:`~cachemgr.storage.store.Store.lookup`
  again).

Any difference — or any error — gives None and the request takes the full path. Requests
whose preparation reads more (an ``op_debug_config`` file, headers found by a dependency
listing rather than the manifest) are never remembered.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from cachemgr.compile import build, environment, inputs, searched
from cachemgr.compile.keys import Compilers
from cachemgr.compile.request import parse_request
from cachemgr.compile.results import CompileOutcome
from cachemgr.compilers import CompilerIdentity, envvars
from cachemgr.config.options import Settings
from cachemgr.errors import CacheMgrError
from cachemgr.storage import fsutil, heldchip, manifest, rehit
from cachemgr.storage.tiers import chip_store

#: Requests remembered (entries; each holds one prepared job, a few KB).
MAX_PLANS = 1024


class Context(NamedTuple):
    """What a request's preparation depends on in this process, taken just before it."""

    #: :func:`_key` of the request (None: its data cannot be told apart exactly)
    key: tuple[bytes, str | None] | None
    #: the request's data, as it was
    data: Mapping[str, Any]
    settings: Settings
    compilers: Compilers
    environ: dict[Any, Any] | None
    caller_env: dict[str, str]
    cwd: str | None
    #: the compiler of the request's ``language`` (None: not known before it is parsed)
    identity: CompilerIdentity | None


class _Plan(NamedTuple):
    context: Context
    #: the resolved base folder; None when the request names no relative path (then it is
    #: not resolved again)
    base: str | None
    identity: CompilerIdentity
    prepared: build.Prepared
    variant: manifest.Variant
    first: CompileOutcome
    seen: _Seen


class _Seen:
    """What the last hits of a plan found, so the next one checks it in fewer steps (each
    the rule of the step it shortens; any difference and that step is made in full)."""

    __slots__ = ("files", "known", "manifest")

    def __init__(self) -> None:
        #: per input file (source, headers): the status (device, inode, size, mtime, ctime)
        #: at which :func:`cachemgr.compile.inputs.file_digest` remembered its digest as
        #: the plan's — a file of the same status has that digest by that function's rule
        self.files: dict[str, tuple[int, ...]] = {}
        #: the header manifest's status when its first variant was the plan's: a manifest
        #: of that status has the same variants (:func:`cachemgr.storage.manifest.read`)
        self.manifest: tuple[int, ...] | None = None
        #: what the last verified lookup of the entry found (:mod:`cachemgr.storage.rehit`)
        self.known: rehit.Known | None = None

    def all_known(self, paths: Iterable[str]) -> bool:
        """Whether each of ``paths`` has the status at which its digest was remembered as
        the plan's (one ``stat`` each): then each has that digest."""
        files = self.files
        for path in paths:
            try:
                st = os.stat(path)
            except OSError:
                return False
            if files.get(path) != (
                st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns
            ):  # fmt: skip
                return False
        return True

    def digest_is(self, path: str, what: str, expected: str) -> bool:
        """Whether ``path``'s SHA-256 now is ``expected``, as
        :func:`cachemgr.compile.inputs.file_digest` tells; its status is kept when that
        function remembers the digest (then :meth:`all_known` is enough next time).

        :raises InvalidInputError: ``path`` cannot be read (``what`` names it).
        """
        try:
            st: os.stat_result | None = os.stat(path)
        except OSError:
            st = None
        if inputs.file_digest(path, what) != expected:
            return False
        if st is not None and inputs.remembered_digest(path, st) == expected:
            self.files[path] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        return True

    def header_is(self, path: str, expected: str) -> bool:
        """:meth:`digest_is` of a header: False when it cannot be read (as a manifest match)."""
        try:
            return self.digest_is(path, "header", expected)
        except CacheMgrError:
            return False


def _variant_matches(plan: _Plan, fd: int) -> bool:
    """Whether the header manifest's match (:func:`cachemgr.storage.manifest.match`, as a
    preparation makes it, ``fd`` its chip folder) is the plan's variant. When the manifest
    has the status it had when that variant was its first, only that variant is checked:
    the match is it exactly when its files and places searched in vain check."""
    p, seen, variant = plan.prepared, plan.seen, plan.variant
    status = manifest.status(p.manifest_path, fd)
    if status is not None and status == seen.manifest:
        files = variant.files
        if not seen.all_known(files) and not all(seen.header_is(f, files[f]) for f in files):
            return False
        return searched.still_absent(variant.absent)
    found = manifest.match(p.manifest_path, inputs.current_digest, searched.still_absent, dir_fd=fd)
    if found is None or found.files != variant.files or found.absent != variant.absent:
        return False
    first = manifest.remembered(status)
    seen.manifest = status if first and _same_variant(first[0], variant) else None
    return True


def _same_variant(one: manifest.Variant, other: manifest.Variant) -> bool:
    """The same headers and places searched in vain (what a match compares)."""
    return one.files == other.files and one.absent == other.absent


def _environ_data() -> dict[Any, Any] | None:
    """``os.environ``'s own mapping (CPython keeps it as ``_data``): compared in one step, so
    an unchanged environment costs no look-up of each variable; None where it is not there
    (then the variables are picked again on every hit)."""
    data = getattr(os.environ, "_data", None)
    return data if isinstance(data, dict) else None


def _key(data: Mapping[str, Any], base_dir: Path | str | None) -> tuple[bytes, str | None] | None:
    """A request's data and base folder as they are now, exactly: the data's
    :func:`marshal.dumps` (its exact types and values: ``True`` is not ``1``, a tuple not a
    list; version 2, which never depends on how objects are shared) and the base as given.
    None for data marshal cannot write (objects other than plain JSON values): never
    remembered."""
    try:
        exact = marshal.dumps(data, 2)  # type: ignore[arg-type]  # a ValueError if not
        return exact, None if base_dir is None else os.fspath(base_dir)
    except ValueError:
        return None


def _same_environment(ctx: Context) -> bool:
    """True when this process's environment (and, where a folder list is set, its current
    folder) is exactly what it was when ``ctx`` was taken."""
    env = _environ_data()
    if env is None or env != ctx.environ:
        return False
    return ctx.cwd is None or os.getcwd() == ctx.cwd


def resolved_base(base_dir: Path | str | None) -> str:
    """The folder relative paths of a request are relative to: ``base_dir`` (default: the
    current folder), absolute with every link followed — as ``Path.resolve`` gives it, in
    one look-up by the kernel (``O_PATH``) rather than one per component."""
    if base_dir is None:
        return os.getcwd()  # already absolute and free of links
    try:
        return fsutil.real_path(base_dir)
    except (OSError, ValueError):
        return str(Path(base_dir).resolve())  # a missing folder: as before


def _base_free(data: Mapping[str, Any]) -> bool:
    """True when ``data`` parses to the same request against any base folder: every path it
    names is absolute (parsed against two different folders, nothing differs)."""
    try:
        one = parse_request(dict(data), Path("/"), check_exists=False)
        other = parse_request(dict(data), Path("/nonexistent/base"), check_exists=False)
    except (CacheMgrError, OSError, KeyError, TypeError, ValueError):
        return False
    return one == other


class HitPlans:
    """The remembered requests of one :class:`cachemgr.Client` (thread-safe; at most
    ``size``, the one remembered first dropped first)."""

    def __init__(self, size: int = MAX_PLANS) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._plans: OrderedDict[tuple[bytes, str | None], _Plan] = OrderedDict()
        self._folders = heldchip.ChipFolders()

    @staticmethod
    def context(
        data: Mapping[str, Any],
        base_dir: Path | str | None,
        settings: Settings,
        compilers: Compilers,
    ) -> Context:
        """What the preparation about to run with ``settings`` and ``compilers`` depends on
        in this process (taken before it: a change meanwhile makes the plan fail its first
        re-check, never pass it wrongly)."""
        env = _environ_data()
        caller = environment.from_caller(os.environ, os.getcwd())
        cwd = os.getcwd() if envvars.INCLUDE_PATHS & caller.keys() else None
        key = _key(data, base_dir)
        copied = None if env is None else dict(env)
        language, identity = data.get("language"), None
        if isinstance(language, str):
            with contextlib.suppress(CacheMgrError):  # the preparation says why
                identity = compilers.identity(language)
        return Context(key, data, settings, compilers, copied, caller, cwd, identity)

    def remember(
        self, context: Context, base: str, prepared: build.Prepared, first: CompileOutcome
    ) -> None:
        """Keep ``prepared`` (whose verified lookup answered ``first``) for :meth:`again`,
        when its preparation read nothing the re-checks do not cover."""
        if context.key is None or prepared.scanned or prepared.opts.op_debug_config is not None:
            return
        if prepared.inputs.headers is None:
            return
        variant = manifest.Variant(
            prepared.kernel, dict(prepared.inputs.headers), tuple(prepared.inputs.absent)
        )
        identity = context.identity
        if identity is None:  # the request's language, as parsed verbatim
            return
        kept = None if _base_free(context.data) else base
        plan = _Plan(context, kept, identity, prepared, variant, first, _Seen())
        with self._lock:
            self._plans[context.key] = plan
            self._plans.move_to_end(context.key)
            while len(self._plans) > self.size:
                self._plans.popitem(last=False)

    def again(
        self,
        data: Mapping[str, Any],
        base_dir: Path | str | None,
        settings: Settings,
        compilers: Compilers,
        start: float,
    ) -> CompileOutcome | None:
        """The verified hit of a remembered request whose every input re-checks (module
        docstring), or None (then prepare it in full). ``start``: ``time.perf_counter()``
        when the call began (the answer's ``seconds``)."""
        key = _key(data, base_dir)
        plan = self._plans.get(key) if key is not None else None
        if plan is None:
            return None
        try:
            if not self._still(plan, base_dir, settings, compilers):
                return None
            files = self._lookup(plan)
        except (CacheMgrError, OSError, KeyError, TypeError, ValueError):
            return None
        if files is None:
            return None
        return plan.first.answered_again(files, time.perf_counter() - start)

    @staticmethod
    def _still(
        plan: _Plan, base_dir: Path | str | None, settings: Settings, compilers: Compilers
    ) -> bool:
        """Whether the request, settings, compiler, environment and source are those
        ``plan`` was prepared with."""
        ctx, p = plan.context, plan.prepared
        if settings is not ctx.settings or compilers is not ctx.compilers:
            return False
        if plan.base is not None and resolved_base(base_dir) != plan.base:
            return False
        identity = compilers.identity(p.request.language)
        if identity is not plan.identity and identity != plan.identity:
            return False
        if not _same_environment(ctx) and (
            environment.from_caller(os.environ, os.getcwd()) != ctx.caller_env
        ):
            return False
        source = str(p.request.kernel_source)
        return plan.seen.all_known((source,)) or plan.seen.digest_is(
            source, "kernel_source", p.inputs.source_sha256
        )

    def _lookup(self, plan: _Plan) -> tuple[Path, ...] | None:
        """The header manifest matched as a preparation matches it, then the verified lookup,
        both through the chip folder, opened once and kept open
        (:mod:`cachemgr.storage.heldchip`): the hit's files, or None."""
        p, seen = plan.prepared, plan.seen
        held = self._folders.acquire(p.chip_dir)
        try:
            fd = held.fd
            if not _variant_matches(plan, fd):
                return None
            if seen.known is not None:
                files = rehit.again(seen.known, fd)
                if files is not None:
                    return files
            result = chip_store(p.chip_dir, dir_fd=fd).lookup(p.kernel)
            seen.known = rehit.known(result, fd)
        finally:
            self._folders.release(held)
        return result.files if result.hit else None

    def close(self) -> None:
        """Close the chip folders kept open (the plans stay: the next hit opens again)."""
        self._folders.close()
