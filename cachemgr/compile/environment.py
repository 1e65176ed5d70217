"""The caller's compile environment: picked, checked, keyed, carried and given to the compiler.

The variables a compiler reads that change its output (:mod:`cachemgr.compilers.envvars`,
per backend, from each compiler's documentation) are part of the key and reach the
compiler with the caller's values on every route (docs/compiling.md#the-environment):

* in-process the caller's own environment is used (:func:`from_caller`);
* through the daemon the client sends them as the request's ``compile_env``
  (:func:`from_wire`), and the daemon compiles with exactly those, never its own.

Folder lists (``CPATH``…) are made absolute against the caller's current folder (an empty
element means it, as gcc's CPP manual says), and a compile from the build mirror searches
the mirror's copy of each folder it found a header in (:func:`for_mirror`) — the headers
were hashed like any other. Through the daemon a variable naming a program
(``GCC_EXEC_PREFIX``, ``COMPILER_PATH``, ``NVCC_CCBIN``), rewriting the command
(``CCC_OVERRIDE_OPTIONS``, a ``GCC_COMPARE_DEBUG`` starting with ``-``) or a relative folder
is refused in one line, ``SOURCE_DATE_EPOCH`` must be digits, and each word of
``NVCC_PREPEND_FLAGS``/``NVCC_APPEND_FLAGS`` must pass the ``extra_flags`` allow-list
without naming a folder. nvcc's ``-arch=native`` is refused on every route
(docs/compiling.md#native).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cachemgr.compile import extraflags, inputs
from cachemgr.compilers import envvars
from cachemgr.errors import InvalidInputError

#: The most bytes of one request's ``compile_env`` (names and values).
MAX_ENV_BYTES = 64 * 1024
#: nvcc's spellings of an architecture flag, whose value ``native`` means this host's GPU.
_ARCH_FLAGS = ("-arch", "--gpu-architecture")


def from_caller(environ: Mapping[str, str], cwd: str) -> dict[str, str]:
    """The compile environment of a caller whose environment is ``environ`` and current
    folder ``cwd``: every variable of :data:`envvars.KEYED` it sets, folder lists with each
    element made absolute (an empty element: ``cwd``)."""
    env = envvars.picked(environ)
    for name in envvars.INCLUDE_PATHS & env.keys():
        parts = env[name].split(os.pathsep)
        env[name] = os.pathsep.join(os.path.normpath(os.path.join(cwd, p)) for p in parts)
    return env


def from_wire(doc: Any, origin: str) -> dict[str, str]:
    """The ``compile_env`` a request carried: ``{NAME: VALUE}`` of variables of
    :data:`envvars.KEYED` (absent: none set).

    :raises InvalidInputError: not an object of strings, an unknown name, a NUL, or over
        :data:`MAX_ENV_BYTES` (one line naming it).
    """
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise InvalidInputError(f"{origin}: compile_env must be an object {{NAME: VALUE}}")
    size = 0
    for name, value in doc.items():
        if name not in envvars.KEYED:
            raise InvalidInputError(
                f"{origin}: compile_env names {str(name)[:80]!r}, which no compiler backend "
                f"reads (known: {', '.join(sorted(envvars.KEYED))})"
            )
        if not isinstance(value, str) or "\0" in value:
            raise InvalidInputError(f"{origin}: compile_env {name} must be a string without NUL")
        size += len(name) + len(value.encode("utf-8", "surrogateescape"))
    if size > MAX_ENV_BYTES:
        raise InvalidInputError(f"{origin}: compile_env is {size} bytes (at most {MAX_ENV_BYTES})")
    return dict(doc)


def checked(
    env: Mapping[str, str], names: frozenset[str], origin: str, daemon: bool
) -> dict[str, str]:
    """The part of ``env`` a compiler reading ``names`` gets, checked: nvcc flags never ask
    for ``-arch=native``; through the daemon (``daemon``) no variable names a program or
    rewrites the command (nor adds gcc switches: :func:`_check_values`), every folder is
    absolute and nvcc's flags pass the allow-list. In-process the caller's values are kept
    as they are: the compiler runs as the caller.

    :raises InvalidInputError: one line naming ``origin``, the variable and why.
    """
    out = {n: v for n, v in env.items() if n in names}
    for name in sorted(out.keys() & {"NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS"}):
        _check_nvcc_flags(name, out[name], origin, daemon)
    if not daemon:
        return out
    for name in sorted(out.keys() & (envvars.PROGRAMS | {"CCC_OVERRIDE_OPTIONS"})):
        raise InvalidInputError(
            f"{origin}: {name}={out[name]!r} is set; through the daemon it is refused (it "
            "makes the compiler run other programs or rewrites its command, and the daemon "
            "runs only its own compilers): unset it, or compile in-process"
        )
    _check_values(out, origin)
    for name in sorted(out.keys() & envvars.INCLUDE_PATHS):
        for part in out[name].split(os.pathsep):
            if not os.path.isabs(part):
                raise InvalidInputError(
                    f"{origin}: {name} element {part!r} is not an absolute folder (an empty "
                    "one means the current folder); the daemon cannot tell which folder "
                    "that is: send absolute folders (cachemgr.Client does)"
                )
    return out


def _check_values(env: Mapping[str, str], origin: str) -> None:
    """Through the daemon: ``GCC_COMPARE_DEBUG`` never starts with ``-`` and
    ``SOURCE_DATE_EPOCH`` is digits (or empty).

    The GCC manual (``-fcompare-debug``): "If GCC_COMPARE_DEBUG is defined to a string
    starting with a dash, then it is used for opts" — gcc splits it into switches of its
    second compile, so ``-wrapper /bin/sh,-c,…`` ran any program as the daemon's user
    (attack review); any other value only turns on the default ``-gtoggle`` comparison.
    A ``SOURCE_DATE_EPOCH`` that is not a number of seconds only makes gcc fail: refused
    before a compiler runs (docs/compiling.md#the-environment).

    :raises InvalidInputError: one line naming ``origin``, the variable and why.
    """
    value = env.get("GCC_COMPARE_DEBUG")
    if value is not None and value.startswith("-"):
        raise InvalidInputError(
            f"{origin}: GCC_COMPARE_DEBUG={value[:80]!r} starts with '-'; through the "
            "daemon it is refused (gcc takes it as switches, which can run other programs): "
            "set it to 1 for the default comparison, unset it, or compile in-process"
        )
    epoch = env.get("SOURCE_DATE_EPOCH")
    if epoch and not (epoch.isascii() and epoch.isdigit()):  # empty: gcc ignores it
        raise InvalidInputError(
            f"{origin}: SOURCE_DATE_EPOCH={epoch[:80]!r} is not a number of seconds since "
            "1970 (digits only)"
        )


def _check_nvcc_flags(name: str, value: str, origin: str, daemon: bool) -> None:
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise InvalidInputError(f"{origin}: {name}={value!r} cannot be split: {exc}") from None
    for i, word in enumerate(words):
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if any(word in (f"{a}=native", a) and (word != a or nxt == "native") for a in _ARCH_FLAGS):
            raise InvalidInputError(
                f"{origin}: {name}={value!r} asks for -arch=native: the GPU of the host that "
                "compiles, which the key cannot name (and without a GPU nvcc silently builds "
                "its default arch instead): name the arch, e.g. -arch=sm_90"
            )
    if daemon:
        where = f"{origin}: {name}"
        flags = extraflags.check(words, where)
        for flag in flags:
            if flag.startswith("-I"):
                raise InvalidInputError(
                    f"{where}: {flag!r} names a folder the daemon does not see: put it in "
                    "the request's include_dirs instead"
                )


def for_mirror(env: Mapping[str, str], root: Path, snap: inputs.Snapshot) -> dict[str, str]:
    """``env`` for a compile from the mirror tree ``root`` of ``snap``: each element of a
    folder list under which a header of ``snap`` lies becomes its mirror folder (the
    compiler reads the bytes hashed); the others (system folders, folders no header came
    from) stay as they are."""
    headers = [str(h) for h in (snap.headers or {})]
    out = dict(env)
    for name in envvars.INCLUDE_PATHS & env.keys():
        parts = []
        for part in env[name].split(os.pathsep):
            folder = os.path.normpath(part).rstrip("/") + "/"
            used = os.path.isabs(part) and any(h.startswith(folder) for h in headers)
            parts.append(str(inputs.mirror(root, Path(folder))) if used else part)
        out[name] = os.pathsep.join(parts)
    return out
