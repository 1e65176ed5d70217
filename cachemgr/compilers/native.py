"""What ``-march=native`` means here: the flags gcc or clang expands it to on this host.

``-march=native``, ``-mtune=native`` and ``-mcpu=native`` make the compiler pick this CPU's
instruction set: the object holds, say, AVX-512 code. Keyed by the literal flag, a shared
cache would hand it to a CPU without those instructions. The key holds what the flag
resolves to instead (docs/compiling.md#native), as the compiler itself reports it:

* gcc: ``gcc <flags> -E -v -`` prints the ``cc1`` command with the expansion (``-march=
  cooperlake -mavx512f … --param l1-cache-size=48 … -mtune=generic``);
* clang: the same command prints the ``-cc1`` command with ``-target-cpu`` and every
  ``-target-feature``.

A resolution is remembered per compiler identity, flags and CPU (:func:`cpu_signature`, the
first processor's entry of ``/proc/cpuinfo``) in this process and in
``$XDG_CACHE_HOME/cachemgr/native.json``, so a hit costs no compiler process once it is
known. nvcc's ``-arch=native`` is refused instead (:mod:`cachemgr.compile.environment`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path

from cachemgr.compilers.base import CompilerIdentity, identity_cache_file
from cachemgr.compilers.process import Outcome
from cachemgr.errors import CompileError
from cachemgr.memo import Memo
from cachemgr.storage import secretfile

log = logging.getLogger(__name__)

#: A flag whose value is this host's CPU.
NATIVE = re.compile(r"^-m(?:arch|tune|cpu)=native$")
#: Lines of a ``/proc/cpuinfo`` entry that change while the CPU does not.
_VARYING = ("cpu MHz", "bogomips", "BogoMIPS", "processor", "core id", "apicid", "initial apicid")
#: Resolutions kept on disk (entries).
_FILE_ENTRIES = 64
#: gcc's expanded target flags on its ``cc1`` line.
_GCC_WORD = re.compile(r"^-m[a-z0-9]")
#: The most bytes of ``-E -v`` stderr parsed for the expansion (1 MiB; a few KiB is usual:
#: the commands and the header search folders). The whole of it is searched for the
#: compiler proper's line, so past the cap the resolution is refused rather than read from
#: a part (docs/security.md#10-streaming-limits-fairness).
MAX_VERBOSE_BYTES = 1024 * 1024

_resolved: Memo[tuple[object, ...], tuple[str, ...]] = Memo("native flags", 256)


def native_words(flags: Sequence[str]) -> tuple[str, ...]:
    """The ``-m…=native`` flags among ``flags``, in order."""
    return tuple(f for f in flags if NATIVE.match(f))


@functools.cache
def cpu_signature() -> str:
    """SHA-256 (16 hex digits) of the first processor's entry of ``/proc/cpuinfo`` without
    its clock and numbering lines — the same for every host with this CPU model and
    features; read once per process ("" where there is no ``/proc/cpuinfo``)."""
    try:
        with open("/proc/cpuinfo", "rb") as fh:
            head = fh.read(65536).decode("utf-8", "replace")
    except OSError:
        return ""
    first = head.split("\n\n", 1)[0].splitlines()
    kept = [ln for ln in first if not ln.startswith(_VARYING)]
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()[:16]


def resolve(
    identity: CompilerIdentity,
    words: tuple[str, ...],
    run: Callable[[list[str]], Outcome],
    language_flag: str,
) -> tuple[str, ...]:
    """The flags ``words`` (``-march=native``…) resolve to for the compiler ``identity`` on
    this host, remembered (module docstring); ``run`` runs an argv, keeping up to
    :data:`MAX_VERBOSE_BYTES` of its stderr.

    :raises CompileError: the compiler failed, printed more than :data:`MAX_VERBOSE_BYTES`
        or no expansion (its output named).
    """
    memo = (identity, words, cpu_signature())
    known = _resolved.get(memo)
    if known is not None:
        return known
    disk = json.dumps([identity.real_path, identity.stamp, list(words), memo[2]])
    found = _read_file().get(disk)
    if isinstance(found, list) and all(isinstance(w, str) for w in found):
        known = tuple(found)
    else:
        argv = [identity.path, "-x", language_flag, *words, "-E", "-v", "-o", "/dev/null", "-"]
        out = run(argv)
        if out.stderr_dropped:
            raise CompileError(
                f"{identity.path} {' '.join(words)}: its -v output is over "
                f"{MAX_VERBOSE_BYTES} bytes; cannot tell what it resolves to"
            )
        text = out.stderr.decode("utf-8", "replace")
        known = parse_expansion(text)
        if out.returncode != 0 or not known:
            raise CompileError(
                f"{identity.path} {' '.join(words)}: cannot tell what it resolves to "
                f"(exit {out.returncode}): {out.message()}"
            )
        _write_file(disk, known)
        log.info("%s %s resolves to %s", identity.name, " ".join(words), " ".join(known))
    _resolved.put(memo, known)
    return known


def parse_expansion(verbose: str) -> tuple[str, ...]:
    """The target flags of the compiler proper's command in ``-v`` output: gcc's ``cc1``
    line (``-m…`` words and ``--param`` pairs) or clang's ``-cc1`` line (``-target-cpu``,
    ``-tune-cpu`` and ``-target-feature`` pairs); () when neither is there."""
    for line in verbose.splitlines():
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        if "-cc1" in words[1:2]:
            return _pairs(words, ("-target-cpu", "-tune-cpu", "-target-feature"))
        if words and Path(words[0]).name in ("cc1", "cc1plus"):
            out = [w for w in words if _GCC_WORD.match(w)]
            return tuple(out) + _pairs(words, ("--param",))
    return ()


def _pairs(words: list[str], names: tuple[str, ...]) -> tuple[str, ...]:
    out: list[str] = []
    for i, word in enumerate(words[:-1]):
        if word in names:
            out += [word, words[i + 1]]
    return tuple(out)


def _file() -> Path:
    return identity_cache_file().with_name("native.json")


#: The largest resolutions file read (bytes).
MAX_FILE_BYTES = 1 << 20


def _read_file() -> dict[str, object]:
    """The remembered resolutions ({} when missing, not private or bad:
    docs/design.md#the-users-own-files)."""
    return secretfile.read_own_json(_file(), MAX_FILE_BYTES, log)


def _write_file(key: str, words: tuple[str, ...]) -> None:
    """Add a resolution to the file (best effort: a failure costs one compiler run later)."""
    data = _read_file()
    data[key] = list(words)
    kept = dict(list(data.items())[-_FILE_ENTRIES:])
    try:
        secretfile.write_own(_file(), json.dumps(kept).encode())
    except OSError as exc:
        log.debug("cannot remember a -march=native resolution: %s", exc)
