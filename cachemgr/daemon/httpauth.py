"""The TCP listener's guard.

The Unix socket is guarded by its mode and group; a loopback TCP port is open to every local
user and to any web page a browser on this host opens (DNS rebinding, cross-site POSTs). So
every TCP request must carry:

* ``Authorization: Bearer <token>``, the secret read at start from ``[daemon] tcp_token_file``
  (a regular file of the daemon's user, mode ``0600`` or ``0400``; compared in constant time);
* ``Host`` equal to the listener's own ``address:port`` (or ``localhost:port``), which a
  rebound foreign name is not;
* no ``Origin`` other than the listener's own (browsers send one on cross-site requests);
* for a ``POST``: ``Content-Type: application/json`` (an HTML form cannot send it without a
  CORS preflight, which this server never grants).

Without a token file the TCP listener does not start (exit 2, one line).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

from cachemgr.daemon.server import Response, error
from cachemgr.errors import ConfigError
from cachemgr.storage import secretfile

#: Shortest token accepted (characters): 128 bits as hex.
MIN_TOKEN_CHARS = 32
#: Largest token file read (bytes).
MAX_TOKEN_FILE_BYTES = 4096


def load_token(path: str, where: str = "[daemon] tcp_token_file") -> bytes:
    """Read the token from ``path``: a regular file (not a link) owned by this process's
    user, not readable or writable by group or others, holding one line of at least
    :data:`MIN_TOKEN_CHARS` characters.

    :raises ConfigError: one line naming the file, what is wrong and how to fix it.
    """
    if not path:
        raise ConfigError(
            f"the TCP listener needs a secret token: set {where} to a file of mode 0600 "
            "(e.g. `openssl rand -hex 32 > FILE && chmod 600 FILE`)"
        )
    raw = secretfile.read_private(path, where, MAX_TOKEN_FILE_BYTES, "the token")
    token = raw.strip()
    if len(raw) > MAX_TOKEN_FILE_BYTES or len(token) < MIN_TOKEN_CHARS or b"\n" in token:
        raise ConfigError(
            f"{where}={path!r} must hold one line of {MIN_TOKEN_CHARS} to "
            f"{MAX_TOKEN_FILE_BYTES} characters (e.g. `openssl rand -hex 32`)"
        )
    return token


def guard(token: bytes) -> Callable[[tuple[str, int]], Callable[[str, Any], Response | None]]:
    """A guard factory for :class:`cachemgr.daemon.server.HttpServer`: given the listener's
    bound ``(address, port)``, returns the check run on every request's method and headers."""
    authenticated = bearer(token)

    def for_address(address: tuple[str, int]) -> Callable[[str, Any], Response | None]:
        host, port = address[0], address[1]
        literal = f"[{host}]" if ":" in host else host
        hosts = {f"{literal}:{port}", f"localhost:{port}"}
        origins = {f"http://{h}" for h in hosts}

        def check(method: str, headers: Any) -> Response | None:
            sent_host = (headers.get("Host") or "").strip().lower()
            if sent_host not in hosts:
                return error(
                    421, f"Host {sent_host!r} is not this listener ({literal}:{port}); refused"
                )
            origin = headers.get("Origin")
            if origin is not None and origin.strip().lower() not in origins:
                return error(403, f"cross-site request from Origin {origin!r} refused")
            if not authenticated(headers):
                return error(401, "missing or wrong 'Authorization: Bearer <token>'")
            ctype = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
            if method not in ("GET", "HEAD") and ctype != "application/json":
                return error(
                    415, f"Content-Type {ctype or 'none'!r} refused: send application/json"
                )
            return None

        return check

    return for_address


def bearer(token: bytes) -> Callable[[Any], bool]:
    """The check of a request's headers (an :class:`email.message.Message`) for
    ``Authorization: Bearer <token>``, compared in constant time. A TCP connection on which
    it passed once is authenticated (docs/security.md#9-connections-are-bounded)."""

    def check(headers: Any) -> bool:
        return _authorized(headers.get("Authorization") or "", token)

    return check


def _authorized(header: str, token: bytes) -> bool:
    scheme, _, value = header.strip().partition(" ")
    given = value.strip().encode("utf-8", "replace")
    ok = hmac.compare_digest(given, token)  # constant time for equal lengths
    return scheme.lower() == "bearer" and ok
