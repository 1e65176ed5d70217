"""Bounded connections for the daemon's HTTP servers.

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

Over TCP (no kernel-vouched identity; every request must carry the listener's token,
:mod:`.httpauth`) a connection is *unauthenticated* until the headers of a request on it with
the valid token have been read (by its handler thread, :mod:`.server`), and stays
authenticated for its life (keep-alive). An unauthenticated connection

* is closed ``auth_deadline_s`` (2 s) after its accept if it has not authenticated by then
  (answered ``408``; :mod:`.server`), whatever it sends or does not send;
* holds a place in :class:`~.unauth.UnauthPool`: at most ``max_unauth_per_address`` per
  source address and ``max_unauth_connections`` in all, both below the TCP share
  (``max_connections_per_caller``), so the rest of the share is for authenticated
  connections. A newcomer that finds its address or the pool full evicts the oldest
  unauthenticated connection (its own address's first), and so does a newcomer that finds
  the share full: authenticated callers always have room while unauthenticated connections
  hold any (docs/security.md#9-connections-are-bounded).

The Unix socket needs no token (its mode and group decide) and keeps the bounds above.

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cachemgr.daemon.peer import Peer, peer_credentials
from cachemgr.daemon.unauth import UnauthPool
from cachemgr.errors import ConfigError
from cachemgr.peer import user_name

log = logging.getLogger(__name__)

#: A shed reason is logged at most this often (seconds); the count says how many were shed.
WARN_INTERVAL_S = 10.0
#: After a failed accept that could not be shed, wait this long before the next (seconds).
NO_FD_PAUSE_S = 0.05
#: Decides whether a request's headers (an :class:`email.message.Message`) carry the token.
Authenticates = Callable[[Any], bool]


@dataclass(frozen=True)
class Bounds:
    """Connection limits (from the ``[daemon]`` table).

    :ivar max_connections: connections held at once, in all.
    :ivar max_per_caller: connections held at once by one uid (TCP callers: one share).
    :ivar idle_timeout_s: a connection that sends nothing for this long is closed (seconds).
    :ivar request_timeout_s: a request whose last byte (headers and body) has not arrived
        this long after its first is answered 408 and closed (seconds; the slowloris).
    :ivar auth_deadline_s: a TCP connection not authenticated this long after its accept is
        answered 408 and closed (seconds).
    :ivar max_unauth_per_address: unauthenticated TCP connections held per source address.
    :ivar max_unauth: unauthenticated TCP connections held in all; below ``max_per_caller``
        and ``max_connections`` (:func:`bounds_of` checks).
    """

    max_connections: int = 512
    max_per_caller: int = 128
    idle_timeout_s: float = 30.0
    request_timeout_s: float = 30.0
    auth_deadline_s: float = 2.0
    max_unauth_per_address: int = 8
    max_unauth: int = 32


def bounds_of(config: Any, where: str = "[daemon]", tcp: bool = True) -> Bounds:
    """The :class:`Bounds` of a ``[daemon]`` table (a :class:`~.config.DaemonConfig`).

    :param tcp: a TCP listener will run: the unauthenticated connections' total must then
        leave room in the TCP share for authenticated ones
        (docs/security.md#9-connections-are-bounded).
    :raises ConfigError: ``max_unauth_connections`` not below ``max_connections_per_caller``
        and ``max_connections`` (one line naming both values and ``where``).
    """
    b = Bounds(
        config.max_connections,
        config.max_connections_per_caller,
        config.idle_timeout_s,
        config.request_timeout_s,
        config.auth_deadline_s,
        config.max_unauth_per_address,
        config.max_unauth_connections,
    )
    pool = min(b.max_per_caller, b.max_connections)
    if tcp and b.max_unauth >= pool:
        raise ConfigError(
            f"{where}: max_unauth_connections = {b.max_unauth} must be below "
            f"max_connections_per_caller = {b.max_per_caller} and max_connections = "
            f"{b.max_connections}, or unauthenticated TCP connections could take every place"
        )
    return b


@dataclass(eq=False)
class Ticket:
    """One admitted connection's place in the bounds.

    :ivar address: the TCP source address; None on the Unix socket (no token needed).
    :ivar since: when it was accepted (``time.monotonic()`` seconds).
    :ivar authenticated: a request's headers with the token have been read on it (TCP).
    :ivar released: its place has been given back (it closed, or was evicted).
    """

    sock: socket.socket
    key: Any
    caller: Peer
    address: str | None
    since: float
    authenticated: bool
    released: bool = False

    @property
    def needs_auth(self) -> bool:
        """A TCP connection that has not authenticated yet."""
        return self.address is not None and not self.authenticated


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

    def bound(self, bounds: Bounds, authenticates: Authenticates | None = None) -> None:
        """Apply ``bounds`` and reserve a spare descriptor for shedding when none are left.

        :param authenticates: a TCP listener's check of a request's headers for the token;
            given, connections count as unauthenticated until it passes (module docstring).
        """
        self.bounds = bounds
        self.authenticates = authenticates
        self._held: Counter[Any] = Counter()
        self._held_lock = threading.Lock()
        self._tickets: dict[socket.socket, Ticket] = {}
        self._unauth: UnauthPool[Ticket] = UnauthPool(
            bounds.max_unauth_per_address, bounds.max_unauth
        )
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
        address = None
        if self.authenticates is not None:
            address = str(client_address[0]) if isinstance(client_address, tuple) else "?"
        ticket = Ticket(request, key, caller, address, time.monotonic(), authenticated=False)
        refusal = self._admit(ticket)
        if refusal is not None:
            _refuse(request, *refusal)
            return
        thread = threading.Thread(
            target=self._serve_connection,
            args=(request, client_address, ticket),
            name="cachemgr-conn",
            daemon=True,
        )
        try:
            thread.start()
        except RuntimeError:  # no more threads
            self._release(ticket)
            self._shed.note("threads", "cannot start a thread for a new connection")
            _refuse(request, 503, "the daemon cannot take more connections; try again later")

    def _admit(self, ticket: Ticket) -> tuple[int, str] | None:
        """Take a place for ``ticket``, evicting an unauthenticated TCP connection when its
        address, the unauthenticated pool or the share is full; the refusal otherwise."""
        with self._held_lock:
            victim = None
            if ticket.needs_auth:
                victim = self._unauth.victim_for(str(ticket.address))
            if victim is None and self._over(ticket.key) and len(self._unauth):
                victim = self._unauth.oldest_of_largest()
            if victim is not None:
                self._evict_locked(victim)
            over = self._over(ticket.key)
            if over is None:
                self._held[ticket.key] += 1
                self._tickets[ticket.sock] = ticket
                if ticket.needs_auth:
                    self._unauth.add(ticket, str(ticket.address))
                return None
        return self._refusal(over, ticket)

    def _over(self, key: Any) -> str | None:
        """Which bound a new connection of ``key`` would break ("caller", "full"), or None."""
        if self._held[key] >= self.bounds.max_per_caller:
            return "caller"
        if sum(self._held.values()) >= self.bounds.max_connections:
            return "full"
        return None

    def _refusal(self, over: str, ticket: Ticket) -> tuple[int, str]:
        b = self.bounds
        with self._held_lock:
            held = self._held[ticket.key] if over == "caller" else sum(self._held.values())
        if over == "caller":
            who = _describe(ticket.caller)
            msg = f"too many connections from {who}: {held} open, limit {b.max_per_caller}"
            self._shed.note(f"caller {ticket.key}", msg)
            return 429, msg + " ([daemon] max_connections_per_caller)"
        msg = f"the daemon holds {held} connections, its limit ([daemon] max_connections)"
        self._shed.note("full", msg)
        return 503, msg + "; try again later"

    def _evict_locked(self, victim: Ticket) -> None:
        """Close an unauthenticated connection to make room (the lock is held: its thread
        has not closed the socket yet, it does so only after giving its place back)."""
        age = time.monotonic() - victim.since
        self._release_locked(victim)
        with contextlib.suppress(OSError):  # its thread's read returns end-of-file
            victim.sock.shutdown(socket.SHUT_RDWR)
        self._shed.note(
            "unauthenticated",
            f"evicted an unauthenticated TCP connection from {victim.address} after {age:.2f} s "
            "to make room ([daemon] max_unauth_per_address, max_unauth_connections)",
        )

    def authenticated(self, sock: socket.socket) -> bool:
        """The handler of ``sock`` has read a request's headers with the valid token: the
        connection leaves the unauthenticated pool for good. False when it was evicted."""
        with self._held_lock:
            ticket = self._tickets.get(sock)
            if ticket is None or ticket.released:
                return False
            ticket.authenticated = True
            self._unauth.remove(ticket)
            return True

    def auth_deadline(self, sock: socket.socket) -> float | None:
        """When ``sock`` must have authenticated (``time.monotonic()`` seconds), or None when
        it needs no token or has authenticated."""
        with self._held_lock:
            ticket = self._tickets.get(sock)
        if ticket is None or not ticket.needs_auth:
            return None
        return ticket.since + self.bounds.auth_deadline_s

    def note_closed(self, reason: str, detail: str) -> None:
        """Log a closed connection, at most one line per :data:`WARN_INTERVAL_S` per reason
        (an outsider's thousands of connections make one line, with the count)."""
        self._shed.note(reason, detail)

    def _release(self, ticket: Ticket) -> None:
        with self._held_lock:
            self._release_locked(ticket)
            self._tickets.pop(ticket.sock, None)

    def _release_locked(self, ticket: Ticket) -> None:
        if ticket.released:
            return
        ticket.released = True
        self._unauth.remove(ticket)
        self._held[ticket.key] -= 1
        if self._held[ticket.key] <= 0:
            del self._held[ticket.key]

    def _serve_connection(
        self, request: socket.socket, client_address: Any, ticket: Ticket
    ) -> None:
        try:
            request.settimeout(self.bounds.idle_timeout_s)
            self.finish_request(request, client_address)  # type: ignore[attr-defined]
        except Exception as exc:  # a broken connection ends that connection only
            log.debug("connection of %s ended: %s", _describe(ticket.caller), exc)
        finally:
            self._release(ticket)  # first: an eviction never shuts down a closed socket
            self.shutdown_request(request)  # type: ignore[attr-defined]

    def connections_held(self) -> int:
        """Connections admitted and not yet closed."""
        with self._held_lock:
            return sum(self._held.values())

    def server_close(self) -> None:
        super().server_close()  # type: ignore[misc]
        # socketserver closes a server whose bind failed, before bound() ran: nothing reserved
        reserve = getattr(self, "_reserve", None)
        if reserve is not None:
            os.close(reserve)
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
