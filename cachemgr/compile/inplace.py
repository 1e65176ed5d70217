"""The one-line refusal of a compile through the daemon that reads a file in place
(docs/security.md, "the daemon reads nothing for a caller"; docs/compiling.md).

Through the daemon a compile reads only the bytes sent with the request, from their copy in
the build mirror. An absolute ``#include "/x/y.h"`` names a path, not a file of the mirror:
outside the sandbox the compiler read it where it is (then the compile is refused, by
:func:`refusal`); in the sandbox it is not there at all and the compiler failed with its bare
"No such file or directory". :func:`explain` turns that failure into one line of the same
kind, from the bytes the caller sent and the compiler's "not found" alone — it says nothing
a compile in the sandbox would not (every path outside the view is "not found").
"""

from __future__ import annotations

import re

from cachemgr.compile.inputs import Snapshot

#: ``#include "/abs"`` / ``#include </abs>`` (also ``include_next`` and ``import``).
_ABSOLUTE_INCLUDE = re.compile(
    rb'^[ \t]*#[ \t]*(?:include|include_next|import)[ \t]*["<](/[^">\n]+)[">]', re.MULTILINE
)


def refusal(origin: str, path: str, where: str = "") -> str:
    """The documented refusal: the compile read ``path`` in place, not one of the files
    sent."""
    return (
        f"{origin}: the compile read {path}, which is not among the files sent with the "
        "request (an absolute #include or a CPATH folder); include it by a relative name or "
        "through include_dirs"
    )


def missing(origin: str, path: str, where: str) -> str:
    """The documented refusal for an absolute ``#include`` in ``where`` that the compiler
    did not find (the sandbox shows no path of the caller's)."""
    return (
        f"{origin}: #include of {path} in {where}: No such file in the daemon's sandbox, "
        "which holds only the files sent with the request (an absolute #include names "
        "none of them); include it by a relative name or through include_dirs"
    )


def absolute_includes(snap: Snapshot) -> list[tuple[str, str]]:
    """``(included path, file that includes it)`` for every absolute ``#include`` in the
    bytes of ``snap`` (the files sent), in order."""
    found = []
    for name, blob in (snap.data or {}).items():
        for m in _ABSOLUTE_INCLUDE.finditer(blob.replace(b"\\\n", b"")):
            found.append((m.group(1).decode("utf-8", "replace").strip(), name))
    return found


def explain(snap: Snapshot, origin: str, error: str) -> str | None:
    """For a failed compile of the files a caller sent: the refusal naming the absolute
    ``#include`` the compiler's ``error`` is about, or None when it is about something
    else (the error stands)."""
    if not snap.sent:
        return None
    for path, where in absolute_includes(snap):
        # gcc: "<path>: No such file or directory"; clang: "'<path>' file not found" — only
        # then (a file the compiler did find and choked on keeps its own error)
        if f"{path}: No such file" in error or f"'{path}' file not found" in error:
            return missing(origin, path, where.rsplit("/", 1)[-1])
    return None
