"""Where the preprocessor looked for each header before it found it (layer 6, below
:mod:`cachemgr.compile.inputs`; the rule is docs/compiling.md#files-looked-for).

A hit must be the binary of exactly these inputs, and the headers a compile read are only
half of them: a header of the same name created next to the source, in an earlier
``include_dirs`` folder, or the file a ``__has_include`` asked about, changes what the same
command builds although every file read is unchanged. ccache's direct mode does not see
those (it checks the files it recorded); cachemgr records the places searched in vain and a
hit checks, by one ``stat`` each, that none of them exists now.

**How the places are found.** Every file the compiler read (the source, its headers and,
when the request has include folders, the system headers too: theirs can be shadowed from
an include folder) is scanned for its ``#include``, ``#include_next``, ``#import``,
``__has_include`` and ``__has_include_next`` names (:func:`directives`, remembered per
content digest). Each name's candidates follow the compiler's search order (gcc's
"Search Path" chapter; clang and nvcc's host preprocessor do the same): for ``"…"`` the
including file's folder, then each include folder in order; for ``<…>`` the include folders;
for ``_next`` the include folders after the one holding the including file. The first
candidate that exists is where the name resolves; the ones before it are *absent* and are
recorded (:func:`search`). A file the search finds that the compiler did not read (a
``__has_include`` that was true, an ``#include`` in a branch not taken) is a file of the
compile too: the caller hashes and mirrors it, so the build mirror answers the probe as the
caller's folder does.

The compiler's own search folders need not be known: an include folder (``-I``, the only
folder flag a request may carry: :mod:`cachemgr.compile.extraflags`) is searched before every
folder of the compiler and the system, so the candidates that may be created and change the
binary are the ones in the source's folders and the include folders; a candidate in a
system folder (:func:`cachemgr.compile.inputs.is_system`) is never recorded (system headers are
the compiler's identity, as ccache's ``system_headers = false``) but, when it exists, still
ends the search.

**Limits.** A name built by a macro (``#include MACRO``) or a ``__has_include(MACRO)`` is
not seen: the compile then writes its dependency output and a file read outside the mirror
is never cached (:func:`cachemgr.compile.inputs.reads_not_hashed`), but a *shadowing* header
created later for such a name is not detected. ``#`` spelled as a digraph (``%:``) is not
followed. A name in a comment is followed (an extra probe costs a miss, never a wrong hit).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from cachemgr import direct
from cachemgr.memo import Memo

#: The most places recorded for one compile (a manifest holds them all).
MAX_ABSENT = 1 << 16

_DIRECTIVE = re.compile(
    rb'^[ \t]*#[ \t]*(include_next|include|import)[ \t]*([<"])([^>"\n]+)[>"]', re.MULTILINE
)
_HAS_INCLUDE = re.compile(rb'__has_include(_next)?[ \t]*\([ \t]*([<"])([^>"\n)]+)[>"][ \t]*\)')


@dataclass(frozen=True)
class Directive:
    """One name a file looks for: ``quoted`` (``"…"``, else ``<…>``), ``after`` (an
    ``_next`` form: the search starts after the including file's folder), ``name``."""

    quoted: bool
    after: bool
    name: str


#: Directives of a file's bytes by its SHA-256 (hex).
_directives: Memo[str, tuple[Directive, ...]] = Memo("include directives", 16384)


def remembered(digest: str) -> tuple[Directive, ...] | None:
    """:func:`directives` of the content ``digest`` if it was scanned before."""
    return _directives.get(digest)


def directives(blob: bytes, digest: str) -> tuple[Directive, ...]:
    """The names ``blob`` (the bytes whose hex SHA-256 is ``digest``) looks for, in order,
    each once; line continuations joined first."""
    known = _directives.get(digest)
    if known is not None:
        return known
    text = blob.replace(b"\\\n", b"") if b"\\\n" in blob else blob
    found: list[tuple[int, Directive | None]] = []
    for m in _DIRECTIVE.finditer(text):
        found.append((m.start(), _directive(m.group(2), m.group(1) == b"include_next", m[3])))
    for m in _HAS_INCLUDE.finditer(text):
        found.append((m.start(), _directive(m.group(2), m.group(1) is not None, m[3])))
    ordered = (d for _, d in sorted(found, key=lambda x: x[0]) if d is not None)
    out = tuple(dict.fromkeys(ordered))
    _directives.put(digest, out)
    return out


def _directive(opener: bytes, after: bool, name: bytes) -> Directive | None:
    """The directive, or None for a name that is not UTF-8 text (bytes of a data file that
    happen to look like a directive; a real header name is text)."""
    try:
        text = name.strip().decode("utf-8")
    except UnicodeDecodeError:
        return None
    return Directive(opener == b'"', after, text) if text else None


def candidates(d: Directive, including: str, include_dirs: Sequence[str]) -> list[str]:
    """Where the compiler looks for ``d`` named in the file ``including`` (an absolute,
    normalised path), in order, up to the compiler's own folders (see the module
    docstring)."""
    if os.path.isabs(d.name):
        return [os.path.normpath(d.name)]
    if d.after:
        start = next(
            (i + 1 for i, f in enumerate(include_dirs) if including.startswith(f + "/")), 0
        )
        folders: Iterable[str] = include_dirs[start:]
    elif d.quoted:
        folders = [os.path.dirname(including), *include_dirs]
    else:
        folders = include_dirs
    return [os.path.normpath(os.path.join(f, d.name)) for f in folders]


#: True when the compiler would open a path as a header: it exists (links followed, as the
#: compiler's ``open`` does) and is no folder (gcc skips a folder and searches on); a path
#: that cannot be checked (no permission) counts as existing (its compile fails or differs:
#: never assume it away). Defined once, in the direct path's standard-library module.
on_disk = direct.on_disk


@dataclass
class Searched:
    """What :func:`search` found: ``absent`` (places searched in vain, outside the system
    folders) and ``found`` (non-system files a search ended at)."""

    absent: set[str] = field(default_factory=set)
    found: set[str] = field(default_factory=set)


def search(
    files: Mapping[str, Sequence[Directive]],
    include_dirs: Sequence[str],
    present: Callable[[str], bool],
    system: Callable[[str], bool],
    system_dirs: Callable[[], tuple[str, ...]],
) -> Searched:
    """Follow every directive of ``files`` (including path → its directives) through the
    search order: the first candidate ``present`` says exists ends a name's search (kept in
    ``found`` unless ``system`` says it is the system's), every candidate before it is
    ``absent`` unless it lies below one of ``system_dirs()`` (asked once, when needed: an
    absent place's links cannot be followed, so it is judged by its name)."""
    out = Searched()
    dirs = [os.path.normpath(str(d)) for d in include_dirs]
    seen: dict[str, bool | None] = {}  # place → found non-system / system / absent (None)
    vain: set[str] = set()
    for including, names in files.items():
        for d in names:
            for place in candidates(d, including, dirs):
                if place not in seen:
                    seen[place] = (not system(place)) if present(place) else None
                state = seen[place]
                if state is None:
                    vain.add(place)
                    continue
                if state:
                    out.found.add(place)
                break
    if vain:
        prefixes = system_dirs()
        out.absent = {p for p in vain if not p.startswith(prefixes)}
    return out


def still_absent(paths: Iterable[str]) -> bool:
    """True when none of ``paths`` would be opened as a header now (:func:`on_disk`): the
    check a hit makes, one ``stat`` per place, no preprocessor."""
    return not any(on_disk(p) for p in paths)
