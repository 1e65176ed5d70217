"""The bytes this process parsed from the files a compile's decision is made of — the request
file, the config file, ``op_cache.ini`` — kept as they were read, at the moment they were
parsed. A direct memo (:mod:`cachemgr.cli.directrecord`) binds its hit to these bytes, never
to bytes read again when the memo is written: a file rewritten while the run went on would
otherwise tie the new bytes to the old hit
(docs/performance.md#direct-mode-a-cli-hit-without-the-compile-path).

Nothing is hashed here (a parse costs one entry of a :class:`cachemgr.memo.Memo`), and it is
bounded (:data:`MAX_FILES` names, the least recently parsed forgotten; :data:`MAX_BYTES`
each) so that a daemon, which parses these files for ever and writes no memo, keeps a
constant footprint. A name forgotten is one no memo can name: never a wrong memo.
"""

from __future__ import annotations

import threading

from cachemgr.memo import Memo

#: Names kept at most (the least recently parsed go first).
MAX_FILES = 64
#: Largest content kept (bytes); a bigger one is kept as :data:`TOO_BIG`.
MAX_BYTES = 256 * 1024

#: What is kept for a name parsed with two different contents, or one too big to keep.
MIXED = "mixed"
TOO_BIG = "too big"

_LOCK = threading.Lock()
#: name as the caller gave it → (the path read, its bytes or None when absent) or a marker
_SEEN: Memo[str, tuple[str, bytes | None] | str] = Memo("files parsed", MAX_FILES)


def note(name: str, data: bytes | None, read: str | None = None) -> None:
    """Record that the file ``name`` was parsed with content ``data`` (None: no file
    there), read at the path ``read`` (``name`` resolved; default ``name`` itself). A name
    parsed again with another content or read elsewhere is kept as :data:`MIXED`."""
    got: tuple[str, bytes | None] | str = (read or name, data)
    if data is not None and len(data) > MAX_BYTES:
        got = TOO_BIG
    with _LOCK:
        before = _SEEN.get(name)
        _SEEN.put(name, got if before is None or before == got else MIXED)


def seen(name: str) -> tuple[str, bytes | None]:
    """The path ``name`` was read at and the bytes parsed (None: it was absent).

    :raises LookupError: ``name`` was not parsed by this process (or is forgotten), was parsed
        with two contents, or was too big to keep.
    """
    with _LOCK:
        got = _SEEN.get(name)
    if got is None:
        raise LookupError(f"{name} was not parsed by this run")
    if isinstance(got, str):
        raise LookupError(f"{name}: {got}")
    return got
