"""Files a compile embeds without the preprocessor: ``.incbin`` and ``.include`` in inline
assembly, ``#embed`` (layer 6, below :mod:`cachemgr.compile.inputs`; the rule is
docs/compiling.md#embedded-data).

The assembler reads the file of an ``.incbin "data.bin"`` (or an ``.include "x.s"``)
itself, so no compiler lists it in its dependency output: without this scan a changed data
file still hit. Every file of a compile (source and headers) is scanned for those
directives (a cheap text scan, remembered per content digest):

* a literal name — in C, C++ and CUDA an inline-assembly string spells it ``\\"name\\"`` —
  relative to the folder the compiler runs in is resolved as a compile by hand in the
  source's folder would: against the source's folder. That file is an input of the compile
  like a header: hashed, in the key, mirrored, and written into the build folder at the same
  relative name so the assembler (which runs in the build folder) reads those bytes;
* anything else — a name built by macros or string concatenation (``".incbin \\"" FILE
  "\\""``), an absolute name, a name leaving the folder (``..``), ``#embed`` or
  ``__has_embed`` (whose search cachemgr does not follow) — makes the kernel one that is
  compiled and not cached, with one note naming the file and line.

A mention of ``.incbin`` followed by a quote in a comment counts too (conservative: a
kernel compiled uncached, never a wrong hit).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cachemgr.compile import bytescan
from cachemgr.memo import Memo

_USE = re.compile(rb'\.(incbin|include)[ \t]*\\?"|^[ \t]*#[ \t]*embed\b|__has_embed\b', re.M)
_LITERAL = re.compile(rb'\.(?:incbin|include)[ \t]+\\"([^"\\\n]+)\\"')


@dataclass(frozen=True)
class Uses:
    """What one file embeds: ``names`` (literal relative names, in order) and ``problem``
    (why the kernel cannot be cached, naming the line; None when every use is literal)."""

    names: tuple[str, ...] = ()
    problem: str | None = None


#: Embedded-data uses of a file's bytes by (SHA-256 in hex, path).
_uses: Memo[tuple[str, str], Uses] = Memo("embedded data uses", 16384)


def remembered(digest: str, path: str) -> Uses | None:
    """:func:`uses` of the file ``path`` with content ``digest`` if it was scanned before."""
    return _uses.get((digest, path))


def uses(blob: bytes, digest: str, path: str) -> Uses:
    """The embedded-data uses of ``blob`` (the bytes of ``path`` whose hex SHA-256 is
    ``digest``). The problem's text names ``path`` and the line."""
    known = _uses.get((digest, path))
    if known is not None:
        return known
    names: list[str] = []
    problem = None
    for m in _USE.finditer(blob) if bytescan.facts(blob, digest).embeds else ():
        line = blob.count(b"\n", 0, m.start()) + 1
        lit = _LITERAL.match(blob, m.start())
        name = lit.group(1).decode("utf-8", "replace") if lit else None
        if name is None:
            what = m.group(0).decode("ascii", "replace").strip().rstrip('\\"').strip()
            problem = f"{path}:{line}: {what} reads a file whose name cachemgr cannot resolve"
        elif os.path.isabs(name) or ".." in name.split("/") or name.startswith("."):
            problem = f"{path}:{line}: .incbin/.include of {name!r} (not below the source folder)"
        else:
            names.append(os.path.normpath(name))
        if problem:
            break
    out = Uses(tuple(dict.fromkeys(names)), problem)
    _uses.put((digest, path), out)
    return out


@dataclass(frozen=True)
class Embedded:
    """The embedded data of a compile: ``files`` (relative name → absolute path, resolved
    against the source's folder) and ``problem`` (the first reason not to cache, or None)."""

    files: Mapping[str, str]
    problem: str | None = None


def resolve(found: Iterable[Uses], source: str) -> Embedded:
    """The embedded data of a compile whose files embed ``found`` (:func:`uses` of each),
    names resolved against the folder of ``source`` (see the module docstring)."""
    folder = os.path.dirname(source)
    files: dict[str, str] = {}
    for one in found:
        if one.problem:
            return Embedded(files, f"{one.problem}: compiled, not cached")
        for name in one.names:
            files[name] = os.path.join(folder, name)
    return Embedded(files)
