"""Kernels whose binary changes with the time of the compile: never cached.

``__TIME__`` and ``__DATE__`` expand to the time of the compile and ``__TIMESTAMP__`` to the
source's modification time; a cached kernel using one would hand every later caller the
first compile's values. Like ccache (which checks the preprocessed source for them unless
``sloppiness = time_macros``), a source or header of the compile that holds one of these
words is compiled and returned uncached, with one line saying why
(docs/compiling.md#what-makes-a-kernel-uncached). The check is a byte scan of the bytes
already read to hash them; a word in a comment counts too (the scan does not preprocess).

``SOURCE_DATE_EPOCH`` (https://reproducible-builds.org/specs/source-date-epoch/) fixes
``__DATE__`` and ``__TIME__`` for gcc ≥ 7 and clang ≥ 16; when it is set (it is then part
of the key) and the compiler really honours it — probed once per compiler by preprocessing
``__DATE__`` with ``SOURCE_DATE_EPOCH=0`` — such a kernel is cached. ``__TIMESTAMP__`` is
never fixed by it in gcc (its manual: only ``__DATE__`` and ``__TIME__``) and stays uncached.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path

from cachemgr.compile import bytescan
from cachemgr.compile.inputs import Snapshot
from cachemgr.compilers import CompileJob, CompilerBackend, CompilerIdentity, envvars, process
from cachemgr.errors import CacheMgrError
from cachemgr.memo import Memo

log = logging.getLogger(__name__)

#: What ``__DATE__`` is with ``SOURCE_DATE_EPOCH=0``.
_EPOCH_DATE = b'"Jan  1 1970"'
_PROBE_TIMEOUT_S = 60.0

#: Does a compiler honour SOURCE_DATE_EPOCH, by identity.
_honours: Memo[CompilerIdentity, bool] = Memo("SOURCE_DATE_EPOCH support", 64)


def time_macros(snap: Snapshot) -> dict[str, str]:
    """Each time macro used in the frozen inputs of ``snap`` → the first file using it
    (the source first, then the headers), from the one pass of :mod:`.bytescan` over each."""
    data = snap.data or {}
    digests = {str(snap.source): snap.source_sha256, **(snap.headers or {})}
    order = [str(snap.source), *sorted(p for p in data if p != str(snap.source))]
    found: dict[str, str] = {}
    for path in order:
        if path not in data:
            continue
        for macro in bytescan.facts(data[path], digests.get(path)).time_macros:
            found.setdefault(macro, path)
    return found


def why_uncached(
    snap: Snapshot,
    env: Mapping[str, str],
    backend: CompilerBackend,
    identity: CompilerIdentity,
) -> str | None:
    """Why a compile of ``snap`` with compile environment ``env`` must not be cached (one
    line), or None when its binary does not depend on the time of the compile.

    :param backend: the compiler (probed for ``SOURCE_DATE_EPOCH`` when that matters).
    """
    used = time_macros(snap)
    if not used:
        return None
    if "__TIMESTAMP__" in used:
        return (
            f"{used['__TIMESTAMP__']} uses __TIMESTAMP__ (the source's modification time, "
            "which SOURCE_DATE_EPOCH does not fix)"
        )
    macro, path = next(iter(sorted(used.items())))
    if "SOURCE_DATE_EPOCH" not in env:
        return (
            f"{path} uses {macro} (the time of the compile); set SOURCE_DATE_EPOCH to fix "
            "it and cache the kernel"
        )
    if not honours_source_date_epoch(backend, identity):
        return (
            f"{path} uses {macro} and {identity.path} ignores SOURCE_DATE_EPOCH "
            f"({identity.version})"
        )
    return None


def honours_source_date_epoch(backend: CompilerBackend, identity: CompilerIdentity) -> bool:
    """True when the compiler expands ``__DATE__`` to 1 January 1970 with
    ``SOURCE_DATE_EPOCH=0`` (probed once per compiler identity; False when it cannot
    preprocess)."""
    known = _honours.get(identity)
    if known is not None:
        return known
    language = sorted(backend.languages)[0]
    with tempfile.TemporaryDirectory(prefix="cachemgr-sde-") as tmp:
        source = Path(tmp) / "sde"
        source.write_bytes(b"const char *d = __DATE__;\n")
        job = CompileJob(source, language, "d", {}, Path(tmp), "sde")
        output = Path(tmp) / "out"
        try:
            argv = backend.preprocess_command(job, output)
            env = envvars.process_env({"SOURCE_DATE_EPOCH": "0"})
            out = process.run_in_group(argv, _PROBE_TIMEOUT_S, Path(tmp), "probing dates", env)
            answer = out.returncode == 0 and _EPOCH_DATE in output.read_bytes()
        except (CacheMgrError, OSError) as exc:
            log.info("cannot tell if %s honours SOURCE_DATE_EPOCH: %s", identity.path, exc)
            answer = False
    _honours.put(identity, answer)
    return answer
