"""Who is calling: the peer credentials of the connection a handler thread serves.
The transport sets them per request (:func:`serving`); the service reads them
(:func:`current`) to log each compile with its caller and to accept a request that names
paths instead of carrying its files' bytes only from the daemon's own user.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from cachemgr.peer import of_socket


@dataclass(frozen=True)
class Peer:
    """A caller: ``pid``, ``uid``, ``gid`` from ``SO_PEERCRED`` (Unix socket), or all None
    over TCP (no kernel-vouched identity)."""

    pid: int | None
    uid: int | None
    gid: int | None

    @property
    def is_daemon_user(self) -> bool:
        """True when the caller runs as the daemon's own user."""
        return self.uid is not None and self.uid == os.getuid()

    def describe(self) -> str:
        """``pid 12 uid 1000 gid 1000`` (or ``tcp (no credentials)``)."""
        if self.uid is None:
            return "tcp (no credentials)"
        return f"pid {self.pid} uid {self.uid} gid {self.gid}"


_UNKNOWN = Peer(None, None, None)
_local = threading.local()


def peer_credentials(sock: socket.socket) -> Peer:
    """``SO_PEERCRED`` of a connected Unix socket (:func:`cachemgr.peer.of_socket`); an
    unknown peer for any other socket, or one already closed."""
    try:
        cred = of_socket(sock)
    except OSError:
        return _UNKNOWN
    return _UNKNOWN if cred is None else Peer(cred.pid, cred.uid, cred.gid)


@contextlib.contextmanager
def serving(peer: Peer) -> Iterator[None]:
    """Within the block, :func:`current` is ``peer`` (in this thread)."""
    old = getattr(_local, "peer", None)
    _local.peer = peer
    try:
        yield
    finally:
        _local.peer = old


def current() -> Peer | None:
    """The caller this thread serves, or None outside a request (in-process use)."""
    return getattr(_local, "peer", None)
