"""Bounded connections for the daemon's HTTP servers (issue 10, items 5 and 9).

Every accepted connection is identified (``SO_PEERCRED`` on the Unix socket: pid, uid, gid;
TCP callers all count as one caller, ``"tcp"``) and admitted only while the daemon holds fewer
than ``max_connections`` connections in all and fewer than ``max_connections_per_caller`` from
that caller. Otherwise it is answered at once from the accept thread (``429`` for a caller over
its share, ``503`` when full) and closed, with a warning in the log (at most one line per
:data:`WARN_INTERVAL_S` and reason, with the count). So 1,000 idle connections of one group
member take that member's share, not the service.

An admitted connection gets its own thread and a read timeout (``idle_timeout_s``): a caller
that sends nothing, or stops halfway through a request, is closed. A caller that keeps sending
too slowly (a byte a second: each read succeeds) meets the whole-request deadline
(``request_timeout_s``, from a request's first byte to its last; :mod:`.server`).

When the process runs out of descriptors (``EMFILE``/``ENFILE``) the accept loop does not
spin on the pending connection: a reserved descriptor is released, the connection is
accepted, answered ``503`` and closed, and the reserve taken again (the libev/nginx idiom).

The caller of each request is handed to the service by :mod:`cachemgr.daemon.peer`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from cachemgr.daemon.peer import Peer, peer_credentials
from cachemgr.peer import user_name

log = logging.getLogger(__name__)

#: A shed reason is logged at most this often (seconds); the count says how many were shed.
WARN_INTERVAL_S = 10.0
#: After a failed accept that could not be shed, wait this long before the next (seconds).
NO_FD_PAUSE_S = 0.05


@dataclass(frozen=True)
class Bounds:
    """Connection limits (from the ``[daemon]`` table).

    :ivar max_connections: connections held at once, in all.
    :ivar max_per_caller: connections held at once by one uid (TCP callers: one share).
    :ivar idle_timeout_s: a connection that sends nothing for this long is closed (seconds).
    :ivar request_timeout_s: a request whose last byte (headers and body) has not arrived
        this long after its first is answered 408 and closed (seconds; the slowloris).
    """

    max_connections: int = 512
    max_per_caller: int = 128
    idle_timeout_s: float = 30.0
    request_timeout_s: float = 30.0


class _Shed:
    """Counts shed connections per reason and logs one warning per interval."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._last: dict[str, float] = {}

    def note(self, reason: str, detail: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._counts[reason] += 1
            if now - self._last.get(reason, float("-inf")) < WARN_INTERVAL_S:
                return
            self._last[reason] = now
            count, self._counts[reason] = self._counts[reason], 0
        log.warning(
            "shedding connections (%d in the last %.0f s): %s", count, WARN_INTERVAL_S, detail
        )


class BoundedServerMixin:
    """A ``socketserver`` mixin (instead of ``ThreadingMixIn``): one thread per admitted
    connection, bounded as described in the module docstring. Call :meth:`bound` once after
    construction."""

    bounds = Bounds()

    def bound(self, bounds: Bounds) -> None:
        """Apply ``bounds`` and reserve a spare descriptor for shedding when none are left."""
        self.bounds = bounds
        self._held: Counter[Any] = Counter()
        self._held_lock = threading.Lock()
        self._shed = _Shed()
        self._reserve: int | None = _reserve_fd()

    # --- accepting --------------------------------------------------------------------------

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            accepted: tuple[socket.socket, Any] = super().get_request()  # type: ignore[misc]
            return accepted
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self._shed_without_descriptors()
            raise

    def _shed_without_descriptors(self) -> None:
        listener: socket.socket = self.socket  # type: ignore[attr-defined]
        if self._reserve is None:
            self._reserve = _reserve_fd()
        if self._reserve is None:
            self._shed.note("descriptors", "no file descriptors left and none in reserve")
            time.sleep(NO_FD_PAUSE_S)  # nothing to accept with: do not spin
            return
        os.close(self._reserve)
        self._reserve = None
        try:
            conn, _ = listener.accept()
        except OSError:
            conn = None
        if conn is not None:
            _refuse(conn, 503, "the daemon has no file descriptors left; try again later")
        self._reserve = _reserve_fd()
        self._shed.note(
            "descriptors", "no file descriptors left (EMFILE): new connections are refused"
        )

    def process_request(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any
    ) -> None:
        if isinstance(request, tuple):  # a datagram server's request: never ours
            raise TypeError("BoundedServerMixin serves stream sockets only")
        caller = peer_credentials(request)
        key: Any = caller.uid if caller.uid is not None else "tcp"
        refusal = self._admit(key, caller)
        if refusal is not None:
            _refuse(request, *refusal)
            return
        thread = threading.Thread(
            target=self._serve_connection,
            args=(request, client_address, key, caller),
            name="cachemgr-conn",
            daemon=True,
        )
        try:
            thread.start()
        except RuntimeError:  # no more threads
            self._release(key)
            self._shed.note("threads", "cannot start a thread for a new connection")
            _refuse(request, 503, "the daemon cannot take more connections; try again later")

    def _admit(self, key: Any, caller: Peer) -> tuple[int, str] | None:
        b = self.bounds
        with self._held_lock:
            total = sum(self._held.values())
            if self._held[key] >= b.max_per_caller:
                who = _describe(caller)
                held = self._held[key]
            elif total >= b.max_connections:
                who, held = "", total
            else:
                self._held[key] += 1
                return None
        if who:
            msg = f"too many connections from {who}: {held} open, limit {b.max_per_caller}"
            self._shed.note(f"caller {key}", msg)
            return 429, msg + " ([daemon] max_connections_per_caller)"
        msg = f"the daemon holds {held} connections, its limit ([daemon] max_connections)"
        self._shed.note("full", msg)
        return 503, msg + "; try again later"

    def _release(self, key: Any) -> None:
        with self._held_lock:
            self._held[key] -= 1
            if self._held[key] <= 0:
                del self._held[key]

    def _serve_connection(
        self, request: socket.socket, client_address: Any, key: Any, caller: Peer
    ) -> None:
        try:
            request.settimeout(self.bounds.idle_timeout_s)
            self.finish_request(request, client_address)  # type: ignore[attr-defined]
        except Exception as exc:  # a broken connection ends that connection only
            log.debug("connection of %s ended: %s", _describe(caller), exc)
        finally:
            self.shutdown_request(request)  # type: ignore[attr-defined]
            self._release(key)

    def connections_held(self) -> int:
        """Connections admitted and not yet closed."""
        with self._held_lock:
            return sum(self._held.values())

    def server_close(self) -> None:
        super().server_close()  # type: ignore[misc]
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None


def _describe(caller: Peer) -> str:
    """``pid 12 uid 1001 gid 1001 (alice)``, or ``TCP callers``."""
    if caller.uid is None:
        return "TCP callers"
    return f"{caller.describe()} ({user_name(caller.uid)})"


def _reserve_fd() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _refuse(conn: socket.socket, status: int, message: str) -> None:
    """Answer ``status`` with ``{"error": message}`` without blocking, and close."""
    body = (json.dumps({"error": message}) + "\n").encode()
    reason = {429: "Too Many Requests", 503: "Service Unavailable"}.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with contextlib.suppress(OSError):
        # read what the caller already sent, so that closing does not reset the connection
        # before it reads the answer
        conn.recv(1 << 16, socket.MSG_DONTWAIT)
    try:
        conn.send(head + body, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
    except OSError:
        pass
    finally:
        conn.close()
