"""What makes a kernel unique: the cache key and the kernel name (layer 6;
docs/design.md#keys-and-manifests).

The key is the SHA-256 of a canonical serialisation (JSON, sorted keys, no whitespace,
UTF-8) of everything that changes the binary:

* the operator: ``op_type``, every input/output ``shape``/``dtype``/``format`` (dtype aliases
  folded: ``float`` = ``float32``), ``attrs``, ``soc_version``;
* the kernel: ``language``, ``kernel_entry``, ``defines``, ``include_dirs``, ``extra_flags``,
  the source's path and SHA-256 and the path and SHA-256 of every header the compiler reads
  (:mod:`cachemgr.compile.inputs`; system headers are represented by the compiler's identity);
* the options: ``deterministic``, ``precision_mode``, ``op_debug_level`` and the other
  compile options a request may carry (``aicore_num``, ``deterministic_level``, ...);
* the compiler: its name, version line, the file really run (links followed) with its
  stamp (size and mtime, or its SHA-256: ``[compilers] compiler_check``; a wrapper script's
  programs too, :mod:`cachemgr.compilers.stamp`), the exact flags of the command it runs
  (every word of the argv but the executable path and the source/output paths) and what
  ``-march=native``-style flags resolve to on this host (:mod:`cachemgr.compilers.native`);
* the environment: each variable this compiler reads that changes its output, as the
  caller set it (:mod:`cachemgr.compile.environment`; unset is not the same as empty).

Faults seen in the field came from keys that missed one of these (``deterministic_level`` in
GE, a model hash in vLLM-Ascend); :data:`KEY_FIELDS` lists them and the tests change each one.
The *base key* is the key of everything but the headers: it names the header manifest
(:mod:`cachemgr.storage.manifest`) telling, without running the preprocessor, which headers to hash.

The kernel name is ``te_<op_type lower-cased>_<key>`` (GE's shape of name,
docs/design.md#files-of-an-entry).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cachemgr.compile import inputs as inputs_mod
from cachemgr.compile import pathkey
from cachemgr.compile.inputs import Snapshot
from cachemgr.compile.request import CompileRequest, RequestOptions
from cachemgr.compilers import CompileJob, CompilerBackend, CompilerIdentity, envvars, get_backend
from cachemgr.compilers import native as native_mod
from cachemgr.compilers import stamp as stamp_mod
from cachemgr.config.options import Settings
from cachemgr.errors import CompileError, ConfigError, InvalidInputError

#: Bump when the key material changes shape, so old and new keys never collide.
KEY_VERSION = 3
#: Top-level fields of the key material (documentation and tests).
KEY_FIELDS = (
    "op_type",
    "soc_version",
    "inputs",
    "outputs",
    "attrs",
    "language",
    "kernel_entry",
    "defines",
    "include_dirs",
    "extra_flags",
    "source_sha256",
    "headers",
    "options",
    "compiler",
    "environment",
)
log = logging.getLogger(__name__)

#: Placeholders for the paths in a command, so the key does not depend on where it ran.
SOURCE_PLACEHOLDER = "/SOURCE"
OUT_PLACEHOLDER = "/OUT"
NAME_PLACEHOLDER = "KERNEL"
#: How long a compiler found on PATH is trusted before PATH is searched again (seconds); the
#: files it runs are still checked on every use (:func:`cachemgr.compilers.stamp.unchanged`:
#: the wrapper, every link to each program it names, the compiler behind a ccache link), as
#: ccache's ``compiler_check = mtime``.
COMPILER_REFRESH_S = 2.0
#: A source modified this recently is hashed again on every use (its mtime may not have
#: ticked since a change: git's "racy" rule).
RACY_S = 2.0


def canonical(material: Mapping[str, Any]) -> bytes:
    """The canonical serialisation: JSON with sorted keys, no whitespace, UTF-8
    (docs/design.md#keys-and-manifests).

    :raises InvalidInputError: for a value that is not plain JSON (NaN, infinity, objects).
    """
    try:
        text = json.dumps(
            material, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"cannot serialise the key material: {exc}") from None
    return text.encode("utf-8")


def source_sha256(path: Path) -> str:
    """Hex SHA-256 of the file ``path`` (see :func:`cachemgr.compile.inputs.file_digest`).

    The file is opened non-blocking without following a link and must be a regular file of
    at most ``max_bytes`` (a source swapped for a FIFO behind the
    parsed-request cache must not block a thread).

    :raises InvalidInputError: when the source cannot be read or is not a regular file of at
        most ``max_bytes`` (names the path and why).
    """
    return inputs_mod.file_digest(path, "kernel_source")


def command_flags(
    backend: CompilerBackend,
    request: CompileRequest,
    debug_flags: frozenset[str] = frozenset(),
    emit: frozenset[str] = frozenset(),
) -> tuple[str, ...]:
    """The exact compiler argv for ``request``, minus the executable, with placeholder paths.

    :raises CompileError: when the compiler is not installed (names it).
    :raises InvalidInputError: for a malformed define.
    """
    job = CompileJob(
        source=Path(SOURCE_PLACEHOLDER),
        language=request.language,
        entry=request.kernel_entry,
        defines=request.defines,
        out_dir=Path(OUT_PLACEHOLDER),
        out_name=NAME_PLACEHOLDER,
        debug_flags=debug_flags,
        emit=emit,
        extra_flags=request.extra_flags,
    )
    return tuple(backend.command(job)[1:])


def key_material(
    request: CompileRequest,
    opts: RequestOptions,
    identity: CompilerIdentity,
    flags: Sequence[str],
    inputs: Snapshot | str,
    environment: Mapping[str, str] | None = None,
    native: Sequence[str] = (),
) -> dict[str, Any]:
    """Everything that changes the binary, as plain JSON values (docs/design.md#keys-and-manifests).

    :param inputs: the snapshot of the source and headers (a bare source digest gives the
        material without paths and headers: the tests' shorthand).
    :param environment: the compile environment's part of the key
        (:meth:`CompilerBackend.key_env`).
    :param native: what the ``-march=native``-style flags among ``flags`` resolve to.
    """
    snap = inputs if isinstance(inputs, Snapshot) else None
    files = snap.key_fields() if snap else {"source_sha256": inputs}
    options = {
        "deterministic": opts.deterministic,
        "precision_mode": opts.precision_mode,
        "op_debug_level": opts.op_debug_level,
        **{k: v for k, v in opts.extra.items()},
    }
    return {
        "key_version": KEY_VERSION,
        "op_type": request.op_type,
        "soc_version": request.soc_version,
        "inputs": [t.to_json() for t in request.inputs],
        "outputs": [t.to_json() for t in request.outputs],
        "attrs": dict(request.attrs),
        "language": request.language,
        "kernel_entry": request.kernel_entry,
        "defines": dict(request.defines),
        "include_dirs": [snap.relative(d) if snap else str(d) for d in request.include_dirs],
        "extra_flags": list(request.extra_flags),
        "headers": [],
        **files,
        "options": options,
        "compiler": {
            "name": identity.name,
            "version": identity.version,
            "path": identity.real_path,
            "stamp": identity.stamp,
            "flags": list(flags),
            "native": list(native),
        },
        "environment": _relative_folders(environment or {}, snap),
        **paths_in_binary(snap, flags),
    }


def _relative_folders(env: Mapping[str, str], snap: Snapshot | None) -> dict[str, str]:
    """``env`` with each absolute element of a folder list (``CPATH``…) relative to the
    source's folder, as ``include_dirs`` are keyed: a copied project keys the same."""
    out = dict(env)
    for name in envvars.INCLUDE_PATHS & out.keys():
        parts = out[name].split(os.pathsep)
        out[name] = os.pathsep.join(
            snap.relative(p) if snap and os.path.isabs(p) else p for p in parts
        )
    return out


def paths_in_binary(snap: Snapshot | None, flags: Sequence[str]) -> dict[str, str]:
    """``{"folder_in_binary": <the source's folder>}`` when the binary holds the caller's
    paths (``__FILE__``, ``assert``, debug information: :mod:`cachemgr.compile.pathkey`,
    docs/compiling.md#paths-in-the-binary), else nothing — so the keys of other compiles
    stay as they were."""
    if snap is None:
        return {}
    folder = pathkey.folder_in_binary(
        str(snap.source), snap.source_sha256, snap.headers or {}, flags, snap.data
    )
    return {} if folder is None else {"folder_in_binary": folder}


def compute_key(material: Mapping[str, Any]) -> str:
    """Hex SHA-256 (64 chars) of :func:`canonical` ``(material)``."""
    return hashlib.sha256(canonical(material)).hexdigest()


def base_key(material: Mapping[str, Any], request: CompileRequest) -> str:
    """The key of ``material`` without its headers but with the absolute paths of the
    source and include folders: names the header manifest (the same source in two folders
    may read different headers, so each folder has its own manifest)."""
    where = {
        "source_path": str(request.kernel_source),
        "include_dirs": [str(d) for d in request.include_dirs],
    }
    # the folder is in "where" already; without it, a header's __FILE__ (known only once
    # the headers are) cannot give the caller and the daemon two manifests
    rest = {k: v for k, v in material.items() if k != "folder_in_binary"}
    return compute_key({**rest, "headers": None, "where": where})


def kernel_name(op_type: str, key: str) -> str:
    """``te_<op_type lower-cased>_<key>`` (docs/design.md#files-of-an-entry,
    #keys-and-manifests)."""
    return f"te_{op_type.lower()}_{key}"


#: Config key that names each backend's compiler executable: a backend is re-made with it set
#: to the path found on PATH, so its own look-ups during a compile are one ``stat``, not a
#: search of every PATH folder (the template backend names its compiler in its template).
_PIN_KEYS = {"host": "cc", "cuda": "nvcc"}


#: A compiler found: its identity, the files it runs by the names a run goes through
#: (:func:`cachemgr.compilers.stamp.watch`), when it was looked up, the pinned backend.
_Known = tuple[CompilerIdentity, stamp_mod.Watched, float, CompilerBackend]


def _path_now() -> str | bytes:
    """This process's ``PATH`` now, as a memo key: ``os.environ``'s own value where CPython
    keeps one (its ``_data``: one dict look-up instead of ``os.environ``'s encode and decode
    per call — every remembered hit asks), else ``os.environ.get``."""
    data = getattr(os.environ, "_data", None)
    if isinstance(data, dict):
        value: bytes = data.get(b"PATH", b"")
        return value
    return os.environ.get("PATH", "")


class Compilers:
    """The backends of one ``[compilers]`` config table, with the compiler part of the key
    remembered: each backend's identity (re-validated by one ``stat`` per use, PATH searched
    again after :data:`COMPILER_REFRESH_S`) and the flags of each distinct job.

    :param config: the ``[compilers]`` table (``cc``, ``nvcc``, ``cuda_arch``, ``cce_command``…).
    :param config_file: the config file that table was read from (None: there was none), named
        in a bad or missing compiler setting's message so the operator knows what to edit.
    """

    def __init__(self, config: Mapping[str, object], config_file: Path | None = None) -> None:
        self.config = dict(config)
        self._where = (
            f"config file {config_file}"
            if config_file
            else "no config file: set CACHEMGR_CONFIG or --config"
        )
        self._lock = threading.Lock()
        self._searching: dict[str, CompilerBackend] = {}
        self._idents: dict[tuple[str, str | bytes], _Known] = {}
        self._flags: dict[tuple[Any, ...], tuple[str, ...]] = {}
        self._native: dict[tuple[CompilerIdentity, tuple[str, ...]], tuple[str, ...]] = {}

    @classmethod
    def of(cls, settings: Settings) -> Compilers:
        """The backends of ``settings``' ``[compilers]`` table, read from its config file."""
        return cls(settings.sections.get("compilers", {}), settings.config.path)

    def _searching_backend(self, language: str) -> CompilerBackend:
        with self._lock:
            found = self._searching.get(language)
            if found is None:
                found = self._searching[language] = self._backend(language, self.config)
            return found

    def _backend(self, language: str, config: Mapping[str, object]) -> CompilerBackend:
        """:func:`get_backend`, a configuration error naming the config file it came from.

        :raises InvalidInputError: unknown language. :raises ConfigError: bad config.
        """
        try:
            return get_backend(language, config)
        except ConfigError as exc:
            raise ConfigError(f"{exc} ({self._where})") from exc

    def backend(self, language: str) -> CompilerBackend:
        """The backend for ``language``, pinned to the compiler :meth:`identity` found.

        :raises InvalidInputError: unknown language. :raises ConfigError: bad config.
        :raises CompileError: the compiler is not installed (named).
        """
        return self._known(language)[3]

    def identity(self, language: str) -> CompilerIdentity:
        """The compiler's name, path, version and stamp (docs/compiling.md#the-compiler).

        :raises InvalidInputError: unknown language. :raises ConfigError: bad config.
        :raises CompileError: the compiler is not installed (named) or ``--version`` fails.
        """
        return self._known(language)[0]

    def _known(self, language: str) -> _Known:
        """The compiler found for ``language`` on this process's ``PATH`` now (another
        ``PATH`` may find another compiler), looked up again after
        :data:`COMPILER_REFRESH_S` or when a file it runs changed (a link on the way to it
        too: :func:`cachemgr.compilers.stamp.unchanged`)."""
        memo = (language, _path_now())
        with self._lock:
            known = self._idents.get(memo)
        if known is not None:
            ident, watched, at, _ = known
            if time.monotonic() - at < COMPILER_REFRESH_S and stamp_mod.unchanged(watched):
                return known
        searching = self._searching_backend(language)
        ident = searching.identity()
        pinned = searching
        if searching.name in _PIN_KEYS:
            pinned = self._backend(language, {**self.config, _PIN_KEYS[searching.name]: ident.path})
        watched = self._watch(ident)
        if known is not None and known[0] != ident:
            log.info("compiler %s changed: identified again as %r", ident.path, ident.version)
        known = (ident, watched, time.monotonic(), pinned)
        with self._lock:
            self._idents[memo] = known
        return known

    def _watch(self, ident: CompilerIdentity) -> stamp_mod.Watched:
        """What ``ident`` is re-checked by (:func:`cachemgr.compilers.stamp.watch`); () —
        identified again on the next use — when its files changed since it was stamped or
        cannot be read."""
        try:
            watched, now = stamp_mod.watch(ident.path, stamp_mod.check_mode(self.config))
        except (CompileError, ConfigError):
            return ()
        return watched if now == ident.stamp else ()

    def flags(
        self,
        request: CompileRequest,
        identity: CompilerIdentity,
        debug_flags: frozenset[str],
        emit: frozenset[str],
    ) -> tuple[str, ...]:
        """:func:`command_flags` for ``request``, remembered per distinct job and compiler.

        :raises CompileError, InvalidInputError: as :func:`command_flags`.
        """
        memo = (
            request.language,
            identity,
            request.kernel_entry,
            tuple(sorted((k, repr(v)) for k, v in request.defines.items())),
            debug_flags,
            emit,
            request.extra_flags,
        )
        with self._lock:
            found = self._flags.get(memo)
        if found is None:
            found = command_flags(self.backend(request.language), request, debug_flags, emit)
            with self._lock:
                if len(self._flags) > 4096:
                    self._flags.clear()
                self._flags[memo] = found
        return found

    def native(
        self, backend: CompilerBackend, flags: Sequence[str], identity: CompilerIdentity
    ) -> tuple[str, ...]:
        """What the ``-march=native``-style words among ``flags`` resolve to for
        ``backend``'s compiler ``identity`` on this host (() when there is none;
        remembered here and by :func:`cachemgr.compilers.native.resolve`).

        :raises InvalidInputError: the backend cannot resolve them (one line).
        :raises CompileError: the compiler cannot tell.
        """
        words = native_mod.native_words(flags)
        if not words:
            return ()
        memo = (identity, words)  # (:meth:`identity`: re-validated by one stat per use)
        with self._lock:
            found = self._native.get(memo)
        if found is None:
            found = backend.resolve_native(words)
            with self._lock:
                if len(self._native) > 256:
                    self._native.clear()
                self._native[memo] = found
        return found
