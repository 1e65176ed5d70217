"""The size cap of uploads (docs/remote.md#sizes): an entry bigger than a remote's cap is not
sent, and a server refusing one for its size (HTTP 413) is that entry's problem, not an
outage — it never counts toward the remote's circuit breaker."""

from __future__ import annotations

from typing import Any

from cachemgr.remote import blob


class EntryTooBig(ValueError):
    """An entry not uploaded for its size; the message says which cap (one line)."""


def upload_cap(tier: Any) -> int:
    """The biggest blob (bytes) sent to ``tier``: its reading cap (``max_blob_bytes``,
    default :data:`cachemgr.remote.blob.DEFAULT_MAX_BLOB_BYTES`), since no reader takes a
    bigger one."""
    cap = getattr(tier, "max_blob_bytes", None)
    if isinstance(cap, int) and not isinstance(cap, bool):
        return cap
    return blob.DEFAULT_MAX_BLOB_BYTES


def check_blob(data: bytes, cap: int, where: str) -> None:
    """Refuse to send a blob over ``cap`` bytes.

    :param where: the remote as errors name it.
    :raises EntryTooBig: ``data`` is bigger than ``cap``.
    """
    if len(data) > cap:
        raise EntryTooBig(f"{where}: the blob is {len(data)} bytes, over the {cap}-byte cap")
