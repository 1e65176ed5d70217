"""One pass over the bytes of a compile's file: every fact the compile path reads from them.

Four readers look at the bytes of each source and header a compile reads:

* :mod:`cachemgr.compile.pathkey` — does the file put its own path into the object
  (``__FILE__``, ``__builtin_FILE``, ``assert(``; docs/compiling.md#paths-in-the-binary);
* :mod:`cachemgr.compile.volatile` — the time macros it uses (``__TIME__``, ``__DATE__``,
  ``__TIMESTAMP__``; docs/compiling.md#what-makes-a-kernel-uncached);
* :mod:`cachemgr.compile.embedded` — may it embed data (``incbin``, ``.include``, ``embed``;
  docs/compiling.md#embedded-data);
* :mod:`cachemgr.compile.inputs` — may it include anything but a system header, or a file
  read in place (``include``, ``import``, a digraph or trigraph ``#``, a line splice).

One regular expression finds every candidate of the four in one pass (at every position, so
overlapping words are all seen, as each reader's own search would see them); a reader's
exact check then runs only on a file in which the pass found one of its candidates. The
facts are remembered by the file's SHA-256, computed where the file is hashed, so a miss
reads them from memory instead of scanning its bytes again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cachemgr.memo import Memo

#: Every candidate of the four readers (module docstring), tried at each position.
_ONE_PASS = re.compile(
    rb"(?=(?P<path>__FILE__|__builtin_FILE\b|\bassert\s*\()"
    rb"|(?P<time>__(?:TIMESTAMP|TIME|DATE)__)"
    rb"|(?P<word>include|import|incbin|embed|%:|\?\?=|\\\n))"
)


@dataclass(frozen=True)
class Facts:
    """What one file's bytes hold.

    :ivar names_a_path: it can put its file's path into the object (``__FILE__``,
        ``__builtin_FILE``, ``assert(``).
    :ivar time_macros: the time macros it names, sorted (``__DATE__``, ``__TIME__``,
        ``__TIMESTAMP__``).
    :ivar words: it holds an ``include``, ``import``, ``incbin``, ``embed``, ``%:``, ``??=``
        or a line splice: the include checks must look at it (False: they need not).
    :ivar embeds: it holds ``incbin``, ``.include`` or ``embed``: the embedded-data scan
        must look at it (False: it embeds nothing).
    """

    names_a_path: bool
    time_macros: tuple[str, ...]
    words: bool
    embeds: bool


#: The facts of a file's bytes by their SHA-256 (hex).
_by_digest: Memo[str, Facts] = Memo("byte facts", 16384)


def scan(blob: bytes) -> Facts:
    """The facts of ``blob``, found in one pass (not remembered: :func:`facts` does)."""
    path, words, embeds = False, False, False
    times: set[str] = set()
    for m in _ONE_PASS.finditer(blob):
        kind = m.lastgroup
        if kind == "path":
            path = True
        elif kind == "time":
            times.add(m.group("time").decode())
        else:
            words = True
            word = m.group("word")
            if word in (b"incbin", b"embed") or (word == b"include" and _after_dot(blob, m)):
                embeds = True
    return Facts(path, tuple(sorted(times)), words, embeds)


def _after_dot(blob: bytes, m: re.Match[bytes]) -> bool:
    return m.start() > 0 and blob[m.start() - 1 : m.start()] == b"."


def facts(blob: bytes, digest: str | None = None) -> Facts:
    """The facts of ``blob`` (whose hex SHA-256 is ``digest``), remembered by ``digest``;
    scanned each time without one."""
    if digest is None:
        return scan(blob)
    known = _by_digest.get(digest)
    if known is None:
        known = scan(blob)
        _by_digest.put(digest, known)
    return known


def remembered(digest: str) -> Facts | None:
    """The facts of the file with SHA-256 ``digest`` if its bytes were scanned before."""
    return _by_digest.get(digest)
