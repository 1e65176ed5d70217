"""``cachemgr.Client``: how frameworks and the CLI reach a running daemon (layer 8).

HTTP/1.1 with JSON bodies over the daemon's Unix socket (keep-alive, one connection per
thread), or a loopback TCP port. The client never imports the server (STYLE.md: the CLI is a
client). Where no daemon answers, :class:`DaemonUnavailable` is raised and callers such as
the CLI run the work in-process instead.

Example::

    from cachemgr import Client
    client = Client()                       # $CACHEMGR_SOCKET or the default socket
    out = client.compile_file("examples/requests/c_add.json")
    print(out["kernel_name"], out["status"])   # "hit" | "compiled" | "binary" | "debug"
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cachemgr.errors import CacheMgrError

SOCKET_NAME = "cachemgr.sock"


class DaemonUnavailable(CacheMgrError):
    """No daemon answers on the socket (missing, refused, or not a cachemgr daemon)."""

    exit_code = 1


class DaemonError(CacheMgrError):
    """The daemon answered with an error; ``status`` is the HTTP status (4xx = bad input)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status
        self.exit_code = 2 if 400 <= status < 500 and status not in (408, 409) else 1


def runtime_dir(env: Mapping[str, str] | None = None) -> Path:
    """Folder of the daemon's socket: ``$RUNTIME_DIRECTORY`` under systemd, else
    ``$XDG_RUNTIME_DIR/cachemgr``, else ``/tmp/cachemgr-<uid>``."""
    env = os.environ if env is None else env
    if env.get("RUNTIME_DIRECTORY"):
        return Path(env["RUNTIME_DIRECTORY"].split(":")[0])
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "cachemgr"
    return Path(f"/tmp/cachemgr-{os.getuid()}")


def default_socket_path(env: Mapping[str, str] | None = None) -> Path:
    """``$CACHEMGR_SOCKET``, else ``<runtime dir>/cachemgr.sock``."""
    env = os.environ if env is None else env
    if env.get("CACHEMGR_SOCKET"):
        return Path(env["CACHEMGR_SOCKET"])
    return runtime_dir(env) / SOCKET_NAME


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class Client:
    """A client of one daemon.

    :param socket_path: the Unix socket (default :func:`default_socket_path`).
    :param tcp: ``(host, port)`` to use a loopback TCP port instead of the socket.
    :param timeout_s: per-request timeout in seconds (a compile may take minutes).
    """

    def __init__(
        self,
        socket_path: Path | str | None = None,
        tcp: tuple[str, int] | None = None,
        timeout_s: float = 900.0,
    ) -> None:
        self.socket_path = Path(socket_path) if socket_path else default_socket_path()
        self.tcp = tcp
        self.timeout_s = timeout_s
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self.tcp:
                conn = http.client.HTTPConnection(*self.tcp, timeout=self.timeout_s)
            else:
                conn = _UnixConnection(str(self.socket_path), self.timeout_s)
            self._local.conn = conn
        return conn

    def close(self) -> None:
        """Close this thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """Send one request; return the decoded JSON answer.

        :raises DaemonUnavailable: nothing listens on the socket/port.
        :raises DaemonError: the daemon answered 4xx/5xx (its one-line message).
        """
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        for attempt in (1, 2):  # a kept-alive connection the server closed: retry once
            conn = self._conn()
            try:
                conn.request(method, path, body=payload, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                break
            except (ConnectionRefusedError, FileNotFoundError) as exc:
                self.close()
                raise DaemonUnavailable(f"no daemon at {self._where()}: {exc.strerror}") from exc
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self.close()
                if attempt == 2:
                    raise DaemonUnavailable(f"daemon at {self._where()} hung up") from exc
            except OSError as exc:
                self.close()
                raise DaemonUnavailable(f"no daemon at {self._where()}: {exc}") from exc
        return _decode(resp.status, raw, resp.getheader("Content-Type", ""))

    def _where(self) -> str:
        return f"{self.tcp[0]}:{self.tcp[1]}" if self.tcp else str(self.socket_path)

    # --- endpoints ------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``GET /health``: ``{"status": "ok", "pid": …, "version": …, "uptime_s": …}``."""
        return self.request("GET", "/health")

    def available(self) -> bool:
        """True when a cachemgr daemon answers ``/health``."""
        try:
            return self.health().get("service") == "cachemgr"
        except CacheMgrError:
            return False

    def config(self) -> dict[str, Any]:
        """``GET /config``: the daemon's settings with origins."""
        return self.request("GET", "/config")

    def stats(self, soc_version: str | None = None) -> dict[str, Any]:
        """``GET /stats``: counters (``hits``, ``misses``, ``compiles``…) and chip folders."""
        return self.request("GET", "/stats" + (f"?soc={soc_version}" if soc_version else ""))

    def gc(self, **params: Any) -> dict[str, Any]:
        """``POST /gc`` with ``ratio``, ``soc``, ``min_age_s``, ``dry_run``."""
        return self.request("POST", "/gc", {k: v for k, v in params.items() if v is not None})

    def lookup(self, soc_version: str, kernel_name: str) -> dict[str, Any]:
        """``POST /lookup``: a verified lookup; ``{"status": "hit"|"miss", …}``."""
        return self.request(
            "POST", "/lookup", {"soc_version": soc_version, "kernel_name": kernel_name}
        )

    def compile(
        self,
        request: Mapping[str, Any],
        base_dir: Path | str | None = None,
        wait: bool = True,
        priority: int = 0,
    ) -> dict[str, Any]:
        """``POST /compile``: compile (or hit) one request; with ``wait=False`` returns
        ``{"job_id": …}`` to poll with :meth:`job`. Relative paths in the request are
        relative to ``base_dir`` (default: the current directory)."""
        body = {
            "request": dict(request),
            "base_dir": str(Path(base_dir or os.getcwd()).resolve()),
            "wait": wait,
            "priority": priority,
        }
        return self.request("POST", "/compile", body)

    def compile_file(
        self, path: Path | str, wait: bool = True, priority: int = 0
    ) -> dict[str, Any]:
        """Compile the request in JSON file ``path`` (its folder is the base of relative paths).

        :raises CacheMgrError: unreadable file or malformed JSON (one line naming the file).
        """
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DaemonError(f"request file {path}: {exc}", 400) from exc
        return self.compile(data, base_dir=path.resolve().parent, wait=wait, priority=priority)

    def job(self, job_id: str) -> dict[str, Any]:
        """``GET /jobs/<id>``: ``{"state": "queued"|"running"|"done"|"failed", …}``."""
        return self.request("GET", f"/jobs/{job_id}")

    def reload(self) -> dict[str, Any]:
        """``POST /reload``: reload the config and op_cache.ini (same path as SIGHUP)."""
        return self.request("POST", "/reload", {})


def _decode(status: int, raw: bytes, ctype: str) -> Any:
    if "json" in ctype:
        try:
            data = json.loads(raw)
        except ValueError:
            data = {"error": raw[:200].decode("utf-8", "replace")}
    else:
        data = raw.decode("utf-8", "replace")
    if status >= 400:
        message = data.get("error", str(data)) if isinstance(data, dict) else str(data)
        raise DaemonError(message, status)
    return data
