"""When a binary holds the caller's paths, the caller's folder is in its key
(docs/compiling.md#paths-in-the-binary).

Every compile runs from a private mirror of the caller's files; the backends map the mirror
back to the caller's paths (``-ffile-prefix-map``), so ``__FILE__`` and the DWARF names are the
caller's own. Such a binary differs between two copies of one project, so — as ccache's
``hash_dir`` does for debug info — its key holds the source's folder when the binary can
contain a path:

* the command emits debug information: a ``-g`` flag other than ``-g0`` (the last ``-g…``
  counts), nvcc's ``-G`` or ``-lineinfo``;
* or the source or one of its headers (the bytes hashed: system headers excepted) names the
  current file — ``__FILE__``, ``__builtin_FILE`` — or calls ``assert(`` (the C library's and
  CUDA's ``assert`` expand to ``__FILE__`` inside their own headers). A byte scan: a mention
  in a comment counts too, which only costs sharing.

Without either, a copy of the project in another folder shares the entry (the key holds
header paths relative to the source's folder).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from cachemgr.compile import bytescan

#: The most bytes of one file scanned when its bytes are not at hand.
MAX_SCAN_BYTES = 64 << 20


def names_a_path(blob: bytes) -> bool:
    """True when ``blob`` (a source or header) can put its file's path into the object."""
    return bytescan.scan(blob).names_a_path


def note(digest: str, blob: bytes) -> None:
    """Remember whether the file whose SHA-256 is ``digest`` names a path (called where a file
    is hashed, so a hit reads nothing again): the one pass of :mod:`.bytescan`."""
    bytescan.facts(blob, digest)


def file_names_a_path(path: str, digest: str, data: bytes | None = None) -> bool:
    """Whether the file ``path`` with SHA-256 ``digest`` names a path: from ``data`` when
    given, from what :func:`note` remembered, else by reading it (True when it cannot be
    read: the safe answer)."""
    known = bytescan.remembered(digest)
    if known is not None:
        return known.names_a_path
    if data is None:
        try:
            with open(path, "rb") as fh:
                data = fh.read(MAX_SCAN_BYTES)
        except OSError:
            return True
    return bytescan.facts(data, digest).names_a_path


def emits_debug_info(flags: Sequence[str]) -> bool:
    """True when a command with ``flags`` writes DWARF: the last ``-g…`` is not ``-g0``, or
    nvcc's ``-G`` / ``-lineinfo`` is there."""
    debug = False
    for flag in flags:
        if flag in ("-G", "-lineinfo"):
            return True
        if flag.startswith("-g") and not flag.startswith("-gencode"):
            debug = flag != "-g0"
    return debug


def folder_in_binary(
    source: str,
    source_sha256: str,
    headers: Mapping[str, str],
    flags: Sequence[str],
    data: Mapping[str, bytes] | None = None,
) -> str | None:
    """The caller's source folder when the binary of this compile holds paths (module
    docstring), else None.

    :param headers: path → SHA-256 of every header read (system headers excepted).
    :param data: path → bytes, when the caller's bytes are at hand (a sent snapshot).
    """
    folder = os.path.dirname(source)
    if emits_debug_info(flags):
        return folder
    blobs = data or {}
    for path, digest in [(source, source_sha256), *headers.items()]:
        if file_names_a_path(path, digest, blobs.get(path)):
            return folder
    return None
