"""HTTP/JSON transport of the daemon: a threading HTTP/1.1 server on a Unix socket (mode
0660, so the group decides who may submit) and optionally on a loopback TCP port.

The transport knows nothing of caches: it reads a bounded body, hands ``(method, path,
query, body, alive)`` to an ``app`` callable and writes back what it returns. ``alive()``
tells a long handler (a compile) whether the caller is still connected.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import select
import socket
import socketserver
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cachemgr.daemon import peer
from cachemgr.daemon.connections import BoundedServerMixin, Bounds
from cachemgr.errors import ConfigError
from cachemgr.storage import fsutil

log = logging.getLogger(__name__)

#: Largest request body accepted (bytes); larger → 413.
MAX_BODY_BYTES = 1 << 20
#: A body refused unread (413, 411) is read and thrown away after the
#: answer — at most this many bytes, for at most :data:`DISCARD_MAX_S` seconds — so the
#: caller's send completes and it reads the answer, instead of a reset while still sending.
DISCARD_MAX_BYTES = 64 << 20
DISCARD_MAX_S = 5.0
SOCKET_MODE = 0o660


@dataclass(frozen=True)
class Response:
    """What an app returns: HTTP status, a JSON-able body (or text), content type."""

    status: int
    body: Any
    content_type: str = "application/json"

    def encode(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        if isinstance(self.body, str) and not self.content_type.endswith("json"):
            return self.body.encode()
        return (json.dumps(self.body, default=str) + "\n").encode()


App = Callable[[str, str, dict[str, list[str]], Any, Callable[[], bool]], Response]
#: Checks a request's method and headers before its body is read; a refusal or None.
Guard = Callable[[str, Any], "Response | None"]


def error(status: int, message: str) -> Response:
    """A JSON error answer ``{"error": message}``."""
    return Response(status, {"error": message})


def parse_body(raw: bytes) -> Any:
    """Decode a request body as strict JSON.

    :raises ValueError: one line for anything a JSON object of text cannot be: not UTF-8,
        malformed, ``NaN``/``Infinity``, a number of more than 4300 digits, nesting deeper
        than the interpreter's recursion limit, a lone UTF-16 surrogate (``"\\ud800"``).
    """
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"request body is not JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:  # 5000-digit numbers, deep nesting
        raise ValueError(f"request body is not acceptable JSON: {exc}") from None
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("request body holds a lone UTF-16 surrogate: not valid text") from None
    except RecursionError:
        raise ValueError("request body is nested too deeply") from None
    return body


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


class RequestDeadline(Exception):
    """A request's last byte did not arrive within its whole-request deadline (slowloris), or
    (``auth`` true) a TCP connection did not authenticate within ``auth_deadline_s``."""

    def __init__(self, auth: bool = False) -> None:
        super().__init__("auth" if auth else "request")
        self.auth = auth


class _DeadlineReader(io.RawIOBase):
    """The connection as the handler reads it, with a whole-request deadline: from the first
    byte of a request (:meth:`arm`, then the first read that returns data) until its body is
    read (:meth:`disarm`) at most ``limit_s`` seconds may pass, however the bytes trickle in.
    Until ``auth_by`` (``time.monotonic()`` seconds; None = no such deadline) is cleared, every
    read ends at it too: a TCP connection that has not authenticated by then. Each read still
    waits at most ``idle_s`` for the next bytes (the socket's timeout).

    :raises RequestDeadline: from :meth:`readinto` once a deadline has passed.
    """

    def __init__(
        self, sock: socket.socket, idle_s: float | None, limit_s: float, auth_by: float | None
    ) -> None:
        super().__init__()
        self._sock = sock
        self._idle_s = idle_s
        self.limit_s = limit_s
        self.auth_by = auth_by
        self._armed = False
        self._deadline: float | None = None

    def readable(self) -> bool:
        return True

    def arm(self) -> None:
        """A new request starts: its clock starts with its first byte."""
        self._armed, self._deadline = True, None

    def disarm(self) -> None:
        """The request is read whole: later reads (the next request's) are not timed."""
        self._armed, self._deadline = False, None

    def _next_deadline(self) -> tuple[float, bool] | None:
        """The nearest deadline and whether it is the authentication one, or None."""
        limits = [(d, False) for d in (self._deadline,) if d is not None]
        if self.auth_by is not None:
            limits.append((self.auth_by, True))
        return min(limits) if limits else None

    def readinto(self, buffer: Any) -> int:
        nearest = self._next_deadline()
        # no deadline yet: wait up to idle_s (the socket's timeout) for the first byte
        got = self._sock.recv_into(buffer) if nearest is None else self._recv_by(buffer, *nearest)
        if got and self._armed and self._deadline is None:
            self._deadline = time.monotonic() + self.limit_s
        return got

    def _recv_by(self, buffer: Any, deadline: float, auth: bool) -> int:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RequestDeadline(auth)
        self._sock.settimeout(left if self._idle_s is None else min(left, self._idle_s))
        try:
            return self._sock.recv_into(buffer)
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise RequestDeadline(auth) from None
            raise
        finally:
            self._sock.settimeout(self._idle_s)  # writes keep the idle timeout


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.1"  # so a garbage request line still gets a status line
    server_version = "cachemgr"
    # reads time out after [daemon] idle_timeout_s, set per connection (connections.py)
    timeout = None
    #: bytes of the current request's body refused unread (thrown away after the answer)
    _unread = 0

    def setup(self) -> None:
        super().setup()
        limit_s = (getattr(self.server, "bounds", None) or Bounds()).request_timeout_s
        deadline_of = getattr(self.server, "auth_deadline", None)
        auth_by = deadline_of(self.connection) if deadline_of is not None else None
        idle_s = self.connection.gettimeout()
        self._reader = _DeadlineReader(self.connection, idle_s, limit_s, auth_by)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        """One request, its request line, headers and body read within ``request_timeout_s``
        of its first byte ([daemon] table, :class:`~.connections.Bounds`); a slower one is
        answered 408 and the connection closed, and so is a TCP connection whose request
        headers with the token are not read ``auth_deadline_s`` after its accept. The answer
        (a long compile) is not timed."""
        self._reader.arm()
        try:
            super().handle_one_request()
        except RequestDeadline as late:
            self._too_slow(late.auth)

    def parse_request(self) -> bool:
        """Parse the request line and headers; a TCP connection whose headers carry the
        token is authenticated from now on, for its life (:mod:`.connections`)."""
        if not super().parse_request():
            return False
        authenticates = getattr(self.server, "authenticates", None)
        if self._reader.auth_by is None or authenticates is None:
            return True
        if authenticates(self.headers) and self.server.authenticated(self.connection):  # type: ignore[attr-defined]
            self._reader.auth_by = None
        return True

    def _too_slow(self, auth: bool) -> None:
        what = self._late_auth() if auth else self._late_request()
        _drain(self.connection)  # what has arrived, so closing does not reset
        if not hasattr(self, "requestline"):  # the request line itself was too slow
            self.requestline, self.command = "", ""
            self.request_version = self.default_request_version
        self.send_error(408, f"{what}; closing the connection")
        self.close_connection = True

    def _late_auth(self) -> str:
        """Log (one line per interval: :meth:`~.connections.BoundedServerMixin.note_closed`)
        and describe a TCP connection closed for not authenticating in time."""
        limit = self.server.bounds.auth_deadline_s  # type: ignore[attr-defined]
        what = f"not authenticated {limit:g} s after connecting ([daemon] auth_deadline_s)"
        self.server.note_closed("auth deadline", f"closed TCP connections {what}")  # type: ignore[attr-defined]
        return what + ": send 'Authorization: Bearer <token>' with the first request"

    def _late_request(self) -> str:
        """Log and describe a request not read whole within its deadline."""
        limit = self._reader.limit_s
        caller = peer.peer_credentials(self.connection)
        who = caller.describe() if caller.uid is not None else "a TCP caller"
        log.warning(
            "closing the connection of %s: its request was not complete %g s after its first "
            "byte ([daemon] request_timeout_s)",
            who,
            limit,
        )
        return f"request not complete {limit:g} s after its first byte ([daemon] request_timeout_s)"

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Protocol errors (bad request line, headers) answered as JSON, like every error."""
        text = message or self.responses.get(code, ("error",))[0]
        data = error(code, text).encode()
        self.close_connection = True
        try:
            self.send_response(code, text)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD" and code >= 200 and code not in (204, 304):
                self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        self._unread = 0
        resp = self._read_and_dispatch(method)
        data = resp.encode()
        # the status line, headers and body in one write: one wake-up of the caller, who
        # reads the answer whole (a second write cost a CLI hit ~0.1-1 ms on a busy host)
        buffer = io.BytesIO()
        wire, self.wfile = self.wfile, buffer
        try:
            self.send_response(resp.status)
            self.send_header("Content-Type", resp.content_type)
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            answer = buffer.getvalue()
        finally:
            self.wfile = wire
        try:
            self.wfile.write(answer)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        if self._unread:
            discard_body(self.connection, self._unread)

    def _refuse_unread(self, resp: Response, length: int) -> Response:
        """``resp``, answered before the body of ``length`` bytes is read: the connection
        closes after it, the body read and thrown away first (:func:`discard_body`)."""
        self.close_connection = True
        self._unread = length
        return resp

    def _read_and_dispatch(self, method: str) -> Response:
        if self.headers.get("Transfer-Encoding"):  # its body would be read as the next request
            chunked = error(411, "chunked or encoded bodies are not accepted; send Content-Length")
            return self._refuse_unread(chunked, DISCARD_MAX_BYTES)
        lengths = self.headers.get_all("Content-Length") or []
        if len(lengths) > 1:  # RFC 9112 §6.3: two lengths make the framing unknowable
            self.close_connection = True
            return error(400, "more than one Content-Length")
        given = lengths[0].strip() if lengths else "0"
        if not (given.isascii() and given.isdigit()):  # int() would take "1_0", "+5", "٣"
            self.close_connection = True
            return error(400, f"Content-Length {given[:40]!r} is not a number of bytes")
        length = int(given)
        limit = getattr(self.server, "max_body_bytes", MAX_BODY_BYTES)
        if length > limit:  # do not read a body we refuse: throw it away after the answer
            return self._refuse_unread(error(413, too_large(length, limit)), length)
        guard: Guard | None = getattr(self.server, "guard", None)
        if guard is not None:
            refusal = guard(self.command, self.headers)
            if refusal is not None:  # an unauthenticated caller: no time spent on its body
                self.close_connection = True
                return refusal
        raw = self.rfile.read(length) if length else b""
        self._reader.disarm()  # read whole: the answer (a long compile) is not timed
        body: Any = None
        if raw:
            try:
                body = parse_body(raw)
            except ValueError as exc:
                return error(400, str(exc))
        parts = urlsplit(self.path)
        app: App = self.server.app  # type: ignore[attr-defined]
        try:
            with peer.serving(peer.peer_credentials(self.connection)):
                return app(method, parts.path, parse_qs(parts.query), body, self._alive)
        except Exception as exc:  # one line to the caller, the details in the log
            log.exception("internal error on %s %s", method, parts.path)
            return error(500, f"internal error: {type(exc).__name__}: {exc}")

    def _alive(self) -> bool:
        """False once the caller has hung up (EOF readable on the connection)."""
        try:
            ready, _, _ = select.select([self.connection], [], [], 0)
            if not ready:
                return True
            return bool(self.connection.recv(1, socket.MSG_PEEK))
        except OSError:
            return False

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)


class _UnixServer(BoundedServerMixin, socketserver.UnixStreamServer):
    request_queue_size = 128


class _TCPServer(BoundedServerMixin, socketserver.TCPServer):
    allow_reuse_address = True
    request_queue_size = 128


#: The longest path a Unix socket can be bound at: ``sun_path`` holds 108 bytes with its NUL
#: (unix(7)).
MAX_SOCKET_PATH_BYTES = 107


def _check_path_length(socket_path: Path) -> None:
    """:raises ConfigError: ``socket_path`` is longer than a Unix socket can be bound at (the
    kernel's own refusal, ``AF_UNIX path too long``, names neither the path nor the limit)."""
    size = len(os.fsencode(socket_path))
    if size > MAX_SOCKET_PATH_BYTES:
        raise ConfigError(
            f"socket path {socket_path} is {size} bytes; a Unix socket path holds at most "
            f"{MAX_SOCKET_PATH_BYTES} (unix(7)): pick a shorter one (--socket or CACHEMGR_SOCKET)"
        )


class HttpServer:
    """Serves ``app`` on a Unix socket and optionally a loopback TCP port, each in a thread.

    :param socket_path: where to bind; the caller has made sure no live daemon owns it.
    :param tcp: ``(host, port)``; only loopback hosts are accepted.
    :param max_body_bytes: larger request bodies are answered 413 unread.
    :param bounds: connection limits and the idle timeout (:mod:`.connections`).
    :param tcp_guard: checks every TCP request's headers before its body is read (token,
        ``Host``, ``Origin``, content type: :mod:`.httpauth`); returns a refusal or None.
    :param tcp_authenticates: whether a TCP request's headers carry the token: a TCP
        connection counts as unauthenticated until they do (:mod:`.connections`).
    :raises OSError: when binding fails.
    :raises ValueError: for a non-loopback TCP host, or a TCP listener without a guard and
        a token check.
    """

    def __init__(
        self,
        app: App,
        socket_path: Path,
        tcp: tuple[str, int] | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        bounds: Bounds | None = None,
        tcp_guard: Callable[[tuple[str, int]], Guard] | None = None,
        tcp_authenticates: Callable[[Any], bool] | None = None,
    ) -> None:
        self.socket_path = socket_path
        self._app = app
        self._max_body_bytes = max_body_bytes
        _check_path_length(socket_path)
        fsutil.ensure_dir(socket_path.parent)
        _unlink_stale(socket_path)
        self._bounds = bounds or Bounds()
        self._unix = self._bind_unix()
        self._servers: list[socketserver.BaseServer] = [self._unix]
        self.tcp_address: tuple[str, int] | None = None
        if tcp is not None:
            if tcp[0] not in ("127.0.0.1", "localhost", "::1"):
                raise ValueError(f"--tcp host {tcp[0]!r} is not a loopback address")
            if tcp_guard is None or tcp_authenticates is None:
                raise ValueError("a TCP listener needs a guard (token, Host and Origin checks)")
            srv = _TCPServer(tcp, _Handler)
            srv.app = app  # type: ignore[attr-defined]
            srv.bound(self._bounds, tcp_authenticates)
            host, port = srv.server_address[:2]  # typed str | bytes: a TCP host is a str
            address = (host if isinstance(host, str) else bytes(host).decode(), port)
            srv.guard = tcp_guard(address)  # type: ignore[attr-defined]
            srv.max_body_bytes = max_body_bytes  # type: ignore[attr-defined]
            self.tcp_address = address
            self._servers.append(srv)
        self._threads: list[threading.Thread] = []

    def _bind_unix(self) -> _UnixServer:
        old = os.umask(0o117)
        try:
            srv = _UnixServer(str(self.socket_path), _Handler)
        finally:
            os.umask(old)
        os.chmod(self.socket_path, SOCKET_MODE)
        srv.app = self._app  # type: ignore[attr-defined]
        srv.bound(self._bounds)
        srv.max_body_bytes = self._max_body_bytes  # type: ignore[attr-defined]
        st = os.stat(self.socket_path)
        self._socket_ident = (st.st_dev, st.st_ino)
        return srv

    def start(self) -> None:
        """Start serving in background threads."""
        for srv in self._servers:
            self._serve_in_thread(srv)

    def _serve_in_thread(self, srv: socketserver.BaseServer) -> None:
        thread = threading.Thread(target=srv.serve_forever, name="cachemgr-http", daemon=True)
        thread.start()
        self._threads.append(thread)

    def socket_lost(self) -> str:
        """Why the Unix socket file is no longer ours (removed by a ``/tmp`` cleaner,
        replaced), or ``""`` while it is."""
        try:
            st = os.lstat(self.socket_path)
        except FileNotFoundError:
            return "its socket file was removed"
        except OSError as exc:
            return f"its socket file cannot be checked ({exc.strerror})"
        if (st.st_dev, st.st_ino) != self._socket_ident:
            return "its socket file was replaced"
        return ""

    def recreate_socket(self) -> None:
        """Bind a new Unix socket at the same path and serve it; close the lost one. A
        socket file that replaced ours is removed (the daemon's lock on ``<socket>.lock``
        says the path is ours); anything else there is left and the error raised.

        :raises OSError: the path holds something else, or binding fails.
        """
        st = fsutil.lstat_or_none(self.socket_path)
        if st is not None and stat.S_ISSOCK(st.st_mode):
            _unlink_stale(self.socket_path)
        fsutil.ensure_dir(self.socket_path.parent)
        new = self._bind_unix()
        old, self._unix = self._unix, new
        self._servers = [new if srv is old else srv for srv in self._servers]
        self._serve_in_thread(new)
        old.shutdown()
        old.server_close()
        reserve = getattr(old, "_reserve", None)  # its spare descriptor for shedding
        if reserve is not None:
            os.close(reserve)
            old._reserve = None

    def stop(self) -> None:
        """Stop accepting, close the listening sockets and remove the socket file."""
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()
        for thread in self._threads:
            thread.join(timeout=10)
        fsutil.safe_unlink(self.socket_path)


def too_large(length: int, limit: int) -> str:
    """The 413 message: the body's size (bytes), the limit and the setting that raises it
    (docs/daemon.md: a request's inputs count against ``[daemon] max_body_bytes``)."""
    return (
        f"request body of {length} bytes is over the daemon's {limit}-byte limit "
        f"([daemon] max_body_bytes): set max_body_bytes = {length} or more in the "
        "[daemon] table of the daemon's config file and restart it"
    )


def discard_body(sock: socket.socket, length: int) -> None:
    """After answering a request whose body was refused unread: end the sending side (the
    caller reads the answer, then EOF), then read and throw away up to ``length`` bytes
    (at most :data:`DISCARD_MAX_BYTES`, for at most :data:`DISCARD_MAX_S` seconds) so the
    caller's send is not reset while it still sends. Never raises."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    timeout = sock.gettimeout()
    deadline = time.monotonic() + DISCARD_MAX_S
    left = min(length, DISCARD_MAX_BYTES)
    try:
        while left > 0:
            wait = deadline - time.monotonic()
            if wait <= 0:
                break
            sock.settimeout(wait)
            chunk = sock.recv(min(left, 1 << 16))
            if not chunk:
                break
            left -= len(chunk)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sock.settimeout(timeout)


def _drain(sock: socket.socket) -> None:
    """Read what has arrived on ``sock`` without waiting. (``MSG_DONTWAIT`` alone does not
    do: on a socket with a timeout Python first waits up to that timeout for data.)"""
    timeout = sock.gettimeout()
    try:
        sock.setblocking(False)
        sock.recv(1 << 16)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sock.settimeout(timeout)


def _unlink_stale(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise
