"""The ``extra_flags`` a compile request may carry: an allow-list (layer 6; issue 11 item 3).

A request's ``extra_flags`` go to the compiler as they are, after cachemgr's own flags, and
are part of the key (SPEC §3.2). Only flags that change code generation and nothing else are
accepted: a flag that names an output path, reads a file of arguments (``@file``), changes
where the compiler finds its own programs (``-B``), loads code into it (``-fplugin*``,
``-specs``, ``-load``) or that is unknown is refused with one line naming it (exit 2).

Accepted (gcc/clang/nvcc/ccec spellings): ``-D…``, ``-U…``, ``-I…`` (also ``-I DIR`` as two
words), ``-O…``, ``-f…`` except ``-fplugin…``/``-fprofile-generate…``/``-fprofile-use…``
(they read or write files), ``-m…``, ``-std=…``, ``-W…`` except ``-Wl,``/``-Wa,``/``-Wp,``
(they pass options to other programs), ``-g…``, ``-w``, ``-pedantic``, ``--use_fast_math``,
``-arch=…``/``-arch …``, ``-gencode=…``/``-gencode …``, ``--ftz=``, ``--prec-div=``,
``--prec-sqrt=``, ``--fmad=``, ``-maxrregcount=…``, ``--expt-relaxed-constexpr``,
``--expt-extended-lambda``, ``-lineinfo``, ``-Xptxas=-O…``.
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
    r"|-gencode=arch=compute_[0-9]+[af]?,code=(?:sm|compute)_[0-9]+[af]?"
    r"|-Xptxas=-O[0-3])$"
)
#: Flags of the allowed families that still read, write or run something else.
_REFUSED = re.compile(
    r"^(?:-fplugin|-fprofile-(?:generate|use|dir)|-fdump-|-fsave-|-fcoverage|-fstack-usage"
    r"|-fcallgraph-info|-fdebug-prefix-map|-ffile-prefix-map|-fmacro-prefix-map|-Wl,|-Wa,|-Wp,"
    r"|-frecord-gcc-switches|-fsanitize-blacklist|-fsanitize-ignorelist)"
)
#: Flags whose value is the next word.
_TAKES_VALUE = {"-I": "-I", "-arch": "-arch=", "-gencode": "-gencode="}


def check(flags: Sequence[object], origin: str) -> tuple[str, ...]:
    """The accepted ``extra_flags`` of a request, normalised (``-I DIR`` → ``-IDIR``,
    ``-arch sm_90`` → ``-arch=sm_90``).

    :raises InvalidInputError: one line naming ``origin`` and the first flag refused.
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
        if _REFUSED.match(word) or not _ALLOWED.match(word):
            raise InvalidInputError(
                f"{origin}: extra_flags: {word!r} is not allowed (only flags that change code "
                "generation: -D, -U, -I, -O*, -f*, -m*, -std=, -W*, -g*, -arch, -gencode...; "
                "no output paths, @files, -B, -specs or plugins)"
            )
        out.append(word)
        i += 1
    return tuple(out)
