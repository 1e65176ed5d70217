"""The environment variables a compiler reads that change what it builds, per backend.

Each list is taken from the compiler's own documentation:

* gcc — "Environment Variables Affecting GCC" of the GCC manual
  (https://gcc.gnu.org/onlinedocs/gcc/Environment-Variables.html) and "Environment
  Variables" of the CPP manual (https://gcc.gnu.org/onlinedocs/cpp/Environment-Variables.html);
* clang — the ENVIRONMENT section of clang(1)
  (https://clang.llvm.org/docs/CommandGuide/clang.html#environment), "Configuration files"
  of the Clang User's Manual (``CLANG_NO_DEFAULT_CONFIG``), ``SOURCE_DATE_EPOCH`` in the
  Clang 16 release notes, and the driver's own ``CCC_OVERRIDE_OPTIONS`` and
  ``COMPILER_PATH`` (clang/tools/driver/driver.cpp, clang/lib/Driver/Driver.cpp);
* nvcc — "NVCC Environment Variables" of the CUDA Compiler Driver NVCC guide
  (https://docs.nvidia.com/cuda/cuda-compiler-driver-nvcc/#nvcc-environment-variables); nvcc
  preprocesses device code with its host compiler (``nvcc -dryrun`` shows ``gcc -E``), so
  gcc's variables count for it too;
* the CANN template backend (``ccec``/``bisheng``, both clang-based): clang's list.

Not in any list, on purpose: ``LIBRARY_PATH`` (gcc: linking only; every backend compiles
with ``-c``/``-cubin``), ``TMPDIR`` (where temporary files go), ``LC_MESSAGES``,
``GCC_COLORS``, ``GCC_URLS`` and ``GCC_EXTRA_DIAGNOSTIC_OUTPUT`` (messages only),
``MACOSX_DEPLOYMENT_TARGET`` (Darwin only), and ``LANG``/``LC_CTYPE``/``LC_ALL``: the GCC
manual says ``LC_CTYPE`` finds character boundaries in multibyte strings, but libcpp's
default input character set is UTF-8 whatever the locale (``_cpp_default_encoding`` in
libcpp/charset.cc has its locale lookup compiled out) — keying them would only split the
cache between users' locales. :data:`DROPPED` are never handed to a compiler:
``DEPENDENCIES_OUTPUT`` and ``SUNPRO_DEPENDENCIES`` make gcc write a dependency file to a
path they name, a side effect a cache hit could not repeat.

How each kind travels (docs/compiling.md#the-environment):

* :data:`INCLUDE_PATHS` are folder lists searched for headers: the headers found there are
  hashed like any other, and a compile from the build mirror searches the mirror's copy;
* :data:`PROGRAMS` name programs the compiler runs: the daemon refuses them (it runs only
  its own compilers);
* :data:`FLAGS` add compiler arguments: through the daemon each word must pass the
  ``extra_flags`` allow-list;
* the rest are plain values.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

#: Folder lists searched for headers (gcc's CPP manual, clang(1) ENVIRONMENT).
INCLUDE_PATHS = frozenset(
    {"CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH", "OBJCPLUS_INCLUDE_PATH"}
)
#: Variables naming programs or program folders the compiler runs.
PROGRAMS = frozenset({"GCC_EXEC_PREFIX", "COMPILER_PATH", "NVCC_CCBIN"})
#: Variables holding compiler arguments.
FLAGS = frozenset({"NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "CCC_OVERRIDE_OPTIONS"})
#: Variables removed from every compiler's environment (see the module docstring).
DROPPED = frozenset({"DEPENDENCIES_OUTPUT", "SUNPRO_DEPENDENCIES"})

#: gcc: GCC manual "Environment Variables Affecting GCC" and CPP manual "Environment Variables".
GCC = frozenset(
    {
        "CPATH",
        "C_INCLUDE_PATH",
        "CPLUS_INCLUDE_PATH",
        "OBJC_INCLUDE_PATH",
        "GCC_EXEC_PREFIX",
        "COMPILER_PATH",
        "SOURCE_DATE_EPOCH",
        "GCC_COMPARE_DEBUG",
    }
)
#: clang: clang(1) ENVIRONMENT, the User's Manual, the driver's sources (module docstring).
CLANG = frozenset(
    {
        "CPATH",
        "C_INCLUDE_PATH",
        "CPLUS_INCLUDE_PATH",
        "OBJC_INCLUDE_PATH",
        "OBJCPLUS_INCLUDE_PATH",
        "COMPILER_PATH",
        "SOURCE_DATE_EPOCH",
        "CCC_OVERRIDE_OPTIONS",
        "CLANG_NO_DEFAULT_CONFIG",
    }
)
#: nvcc: its guide's "NVCC Environment Variables", plus its host compiler's (gcc).
NVCC = frozenset({"NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN"}) | GCC
#: Every variable some backend reads: what a caller hands to the daemon.
KEYED = GCC | CLANG | NVCC


#: :data:`KEYED`, sorted once (:func:`picked` runs on every request).
_KEYED_SORTED = tuple(sorted(KEYED))


def picked(environ: Mapping[str, str], names: Iterable[str] = KEYED) -> dict[str, str]:
    """The variables of ``names`` set in ``environ`` (set to "" counts: unset and empty are
    not the same to a compiler)."""
    order = _KEYED_SORTED if names is KEYED else sorted(names)
    return {n: environ[n] for n in order if n in environ}


def key_values(names: frozenset[str], env: Mapping[str, str]) -> dict[str, str]:
    """What of ``env`` goes into the key of a compiler reading ``names``: each of them set,
    name → value (unset is absent, distinct from "")."""
    return {n: env[n] for n in sorted(names) if n in env}


def process_env(job_env: Mapping[str, str] | None) -> dict[str, str] | None:
    """The environment of a compiler process: this process's, without :data:`DROPPED` and,
    when the job names its own (``job_env``, the caller's values), without any variable of
    :data:`KEYED` but those — the compiler sees exactly the caller's values, never this
    process's (a daemon's). None when nothing changes (the process's own is inherited)."""
    if job_env is None and not DROPPED.intersection(os.environ):
        return None
    removed = DROPPED if job_env is None else DROPPED | KEYED
    env = {k: v for k, v in os.environ.items() if k not in removed}
    env.update(job_env or {})
    return env
