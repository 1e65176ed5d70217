"""The ``extra_flags`` a compile request may carry: an allow-list (layer 6).

A request's ``extra_flags`` go to the compiler as they are, after cachemgr's own flags, and
are part of the key (docs/compiling.md#extra-flags-the-allow-list). Only flags that change
code generation and nothing else are accepted, each judged as a whole argument — so a flag
whose value is *another* flag, a file or a program cannot be judged by its name and is
refused whatever it carries:

* **families** (:data:`FAMILIES`): flags that carry flags for a second compile
  (``-fcompare-debug=``) or for another program (``-Wa,``/``-Wl,``/``-Wp,``, ``-X…``,
  ``-mllvm``, nvcc's ``-Xcompiler``/``--compiler-options``), read arguments from a file
  (``@file``, ``--options-file``), load code (``-fplugin*``, ``-fpass-plugin=``,
  ``-iplugindir=``), change where the compiler finds its programs (``-B``, ``-ccbin``,
  ``-specs=``, ``-wrapper``, ``-fuse-ld=``), read or write profile data (``-fprofile-*``),
  write files of their own (``-fdump-*``, ``-fopt-info*``, ``-save-temps*``, ``-M*``,
  ``-aux-info``, ``-fstack-usage``, ``-o``…), rewrite paths (``-f*-prefix-map=``), or read a
  file they name (``-include``, ``-i*``, ``-fsanitize-*list=``…);
* **a value that is a flag**: any other ``-f``/``-m``/``-W``/``-g`` flag whose value (after
  ``=`` or ``,``) begins with ``-`` or ``@``, e.g. ``-fsanitize=-fplugin=x``.

Everything else must match :data:`_ALLOWED` (gcc/clang/nvcc/ccec spellings): ``-D…``,
``-U…``, ``-I…`` (also ``-I DIR`` as two words), ``-O…``, ``-f…``, ``-m…``, ``-std=…``,
``-W…``, ``-g…``, ``-w``, ``-pedantic``, ``--use_fast_math``, ``-arch=…``/``-arch …``,
``-gencode=…``/``-gencode …``, ``--ftz=``, ``--prec-div=``, ``--prec-sqrt=``, ``--fmad=``,
``-maxrregcount=…``, ``--expt-relaxed-constexpr``, ``--expt-extended-lambda``, ``-lineinfo``,
``-Xptxas=-O0``…``-O3`` (the one carrier accepted: its whole value is fixed). A refusal is
one line naming the argument and why (exit 2).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from cachemgr.errors import InvalidInputError

#: The longest flag accepted (characters) and the most flags in one request.
MAX_FLAG_CHARS = 1024
MAX_FLAGS = 256

_ALLOWED = re.compile(
    r"^(?:-[DU][A-Za-z_][A-Za-z0-9_]*(?:=[^\n\0]*)?"
    r"|-I[^\n\0]+"
    r"|-O[0-3sgz]?|-Ofast"
    r"|-f[a-z0-9][a-z0-9+_=,.\-]*"
    r"|-m[a-z0-9][a-z0-9+_=,.\-]*"
    r"|-std=[a-z0-9+]+"
    r"|-W[a-z0-9][a-z0-9+_=\-]*|-w|-pedantic(?:-errors)?"
    r"|-g[a-z0-9]*"
    r"|--use_fast_math|-use_fast_math|-lineinfo|--expt-relaxed-constexpr|--expt-extended-lambda"
    r"|--(?:ftz|prec-div|prec-sqrt|fmad)=(?:true|false)"
    r"|-maxrregcount=[0-9]+"
    r"|-arch=(?:sm|compute)_[0-9]+[af]?"
    r"|-gencode=arch=compute_[0-9]+[af]?,code=(?:sm|compute)_[0-9]+[af]?)$"
)
#: Carriers whose whole value is fixed, so they are judged whole after all.
_EXACT = re.compile(r"^-Xptxas=-O[0-3]$")

#: The families refused whatever their value: (what the flag does, its spellings). The
#: first that matches names the refusal (docs/compiling.md#extra-flags-the-allow-list).
FAMILIES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (why, re.compile(spellings))
    for why, spellings in (
        ("reads more arguments from a file", r"^(?:@|--options-file|-optf$)"),
        ("runs a second compile with the flags it carries", r"^-fcompare-debug"),
        ("loads a plugin into the compiler", r"^(?:-fplugin|-fpass-plugin|-iplugindir|-load$)"),
        (
            "passes flags to another program (assembler, linker, preprocessor, host "
            "compiler, LLVM)",
            r"^(?:-W[alp],|-X|-mllvm$|--compiler-options|--linker-options|--ptxas-options"
            r"|--nvlink-options|--archive-options|--assembler-options)",
        ),
        (
            "changes where the compiler finds its own programs, or runs another",
            r"^(?:-B|-ccbin|--compiler-bindir|-wrapper|--?specs|--?sysroot|--gcc-toolchain"
            r"|-fuse-ld|--ld-path|-no-canonical-prefixes|--dryrun)",
        ),
        (
            "reads or writes profile data",
            r"^-f(?:no-)?(?:profile|auto-profile|cs-profile|memory-profile|coverage)",
        ),
        (
            "writes files of its own (dumps, reports, outputs)",
            r"^(?:-fdump-|-fopt-info|-fsave-|-foptimization-record|-frecord-|-fstack-usage"
            r"|-fcallgraph-info|-ftest-coverage|-ftime-trace|-fproc-stat-report"
            r"|-fcrash-diagnostics"
            r"|-fdiagnostics-(?:add|set)-output|-fmodules|-fimplicit-module|-fltrans|-fwpa"
            r"|--?save-temps|-aux-info|-M|-o|--keep|--output-directory|--generate-dependencies"
            r"|-fsanitize-coverage-trace-pc-guard-file)",
        ),
        ("rewrites the paths its outputs record", r"^-f[a-z-]*(?:-prefix-map|-compilation-dir)"),
        (
            "reads a file or folder that the request's include_dirs and key do not cover",
            r"^(?:-i|--include|--pre-include|-f(?:no-)?sanitize-[a-z-]*list"
            r"|-fxray-(?:attr-list|always-instrument|never-instrument)|-fmodule-|-fprebuilt-"
            r"|-frandomize-layout-seed-file|-fthinlto-index|-fembed-offload|-fresolution"
            r"|-fbasic-block-sections=list)",
        ),
    )
)
#: A value (after ``=`` or ``,``) that is itself a flag or a response file.
_CARRIED = re.compile(r"[=,]([-@][^=,]*(?:[=,][^,]*)?)")
#: Flags whose value is the next word.
_TAKES_VALUE = {"-I": "-I", "-arch": "-arch=", "-gencode": "-gencode="}
#: Where the rule is documented, for the one-line refusals.
_DOC = "docs/compiling.md#extra-flags-the-allow-list"


def check(flags: Sequence[object], origin: str) -> tuple[str, ...]:
    """The accepted ``extra_flags`` of a request, normalised (``-I DIR`` → ``-IDIR``,
    ``-arch sm_90`` → ``-arch=sm_90``).

    :raises InvalidInputError: one line naming ``origin``, the first flag refused and why.
    """
    if len(flags) > MAX_FLAGS:
        raise InvalidInputError(
            f"{origin}: extra_flags has {len(flags)} flags (at most {MAX_FLAGS})"
        )
    words = [str(f) for f in flags]
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if not isinstance(flags[i], str) or len(word) > MAX_FLAG_CHARS:
            raise InvalidInputError(f"{origin}: extra_flags[{i}]={word[:80]!r} is not a flag")
        if word in _TAKES_VALUE and i + 1 < len(words):
            word = _TAKES_VALUE[word] + words[i + 1]
            i += 1
        if word in ("-arch=native", "--gpu-architecture=native"):
            raise InvalidInputError(
                f"{origin}: extra_flags: {word!r} is the GPU of the host that compiles, which "
                "the key cannot name (and without a GPU nvcc silently builds its default arch): "
                "name the arch, e.g. -arch=sm_90 (docs/compiling.md#native)"
            )
        why = refusal(word)
        if why:
            raise InvalidInputError(f"{origin}: extra_flags: {word!r} is not allowed: {why}")
        out.append(word)
        i += 1
    return tuple(out)


def refusal(word: str) -> str:
    """Why ``word`` (one whole argument) is refused as an extra flag, or ``""`` when it is
    accepted (the rules: the module docstring and docs/compiling.md#extra-flags-the-allow-list).
    """
    if _EXACT.match(word):
        return ""
    for why, spellings in FAMILIES:
        if spellings.match(word):
            return f"it {why}; such flags are refused whatever they carry ({_DOC})"
    carried = _CARRIED.search(word) if word.startswith(("-f", "-m", "-W", "-g")) else None
    if carried:
        return (
            f"its value carries the flag {carried.group(1)!r}, and a flag that carries "
            f"another is refused whatever it carries ({_DOC})"
        )
    if not _ALLOWED.match(word):
        return (
            "only flags that change code generation are accepted: -D, -U, -I, -O*, -f*, "
            f"-m*, -std=, -W*, -g*, -arch, -gencode... ({_DOC})"
        )
    return ""
