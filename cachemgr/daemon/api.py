"""The daemon's HTTP API: routes → service calls (described in ``docs/openapi.json``).

| method | path            | what |
|--------|-----------------|------|
| GET    | /health         | liveness: ``{"status", "service", "pid", "version", "uptime_s"}`` |
| GET    | /metrics        | Prometheus text format |
| GET    | /config         | settings with origins (like ``cachemgr config --json``);
|        |                 | ``?sections=1``: ``{"settings", "sections"}`` for clients |
| GET    | /stats          | counters and per-chip-folder figures (``?soc=``) |
| POST   | /gc             | eviction now: ``{"ratio", "soc", "min_age_s", "dry_run"}`` |
| POST   | /lookup         | verified lookup: ``{"soc_version", "kernel_name"}`` |
| POST   | /compile        | ``{"request", "base_dir", "wait", "priority"}`` → outcome or job id |
| POST   | /compile/if-config | ``/compile``'s body and ``"config_digest"``: compiled only when |
|        |                 | the digest of this daemon's ``/config?sections=1`` answer is that; |
|        |                 | else ``412``, nothing done (a direct-mode hit, one round trip) |
| GET    | /jobs/{id}      | state of a submitted compile |
| POST   | /reload         | reload config and op_cache.ini (same path as SIGHUP); admin |
| POST   | /hits           | ``{"hits": n}``: hits a client served itself, for the counters;
|        |                 | n ≤ 100,000, a caller's reports bounded per second (429); |
|        |                 | → ``{"counted": n}`` |
| POST   | /stats/zero     | reset the counters of the cache served (``stats --zero``); admin |
| POST   | /stop           | stop as on SIGTERM; admin |

*admin*: only the daemon's own user and root, as ``SO_PEERCRED`` on the Unix socket tells it
(:data:`ADMIN_ONLY`); the socket is group-writable and group members may use the cache, not
run the service. The audit of every endpoint (who may, and why) is in ``docs/security.md``.

Errors are ``{"error": "<one line>"}`` with 400 (bad input), 401/403/415/421 (TCP guard;
403 also for an admin endpoint asked by anyone else), 404, 405, 408 (a request not read whole
within ``request_timeout_s``), 412 (``/compile/if-config``: the settings changed), 413, 429
(a caller over its share of connections or queued jobs), 503 (stopping).
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Callable
from typing import Any, Protocol

from cachemgr import directwire
from cachemgr.compile.results import GcResult, StatsResult
from cachemgr.constants import MAX_HITS_PER_REPORT
from cachemgr.daemon import peer
from cachemgr.daemon.server import Response, error
from cachemgr.errors import CacheMgrError
from cachemgr.peer import user_name

Alive = Callable[[], bool]

#: Endpoints that change the service's own state rather than use the cache: only the daemon's
#: user and root may call them. The others stay open to every caller the socket admits —
#: ``/compile``, ``/lookup``, ``/hits`` (every client reports its local hits) and ``/gc`` (a
#: group member may already evict by hand: the entries are group-writable,
#: docs/design.md#sharing-and-locking).
ADMIN_ONLY = frozenset({"/reload", "/stats/zero", "/stop"})

#: The compile endpoints (the second: only when the caller's settings are the daemon's).
_COMPILES = frozenset({"/compile", directwire.ENDPOINT})

log = logging.getLogger(__name__)


class ServiceLike(Protocol):
    """What the API needs of the service (see :class:`cachemgr.daemon.service.Service`)."""

    accepting: bool

    def health(self) -> dict[str, Any]: ...
    def metrics(self) -> bytes: ...
    def config(self, sections: bool = False) -> dict[str, Any]: ...
    def report_hits(self, hits: int) -> dict[str, Any]: ...
    def stats(self, soc: str | None) -> StatsResult: ...
    def zero_stats(self) -> dict[str, Any]: ...
    def gc(self, params: dict[str, Any]) -> GcResult: ...
    def lookup(self, soc_version: str, kernel_name: str) -> dict[str, Any]: ...
    def compile(self, body: dict[str, Any], alive: Alive) -> tuple[int, dict[str, Any]]: ...
    def job(self, job_id: str) -> dict[str, Any] | None: ...
    def reload(self) -> dict[str, Any]: ...


class Api:
    """Routes requests to ``service``; turns cachemgr errors into 4xx/5xx JSON answers."""

    def __init__(self, service: ServiceLike) -> None:
        self.service = service
        self._config_digest: tuple[bytes, str] | None = None
        self._get: dict[str, Callable[[dict[str, list[str]]], Response]] = {
            "/health": lambda q: Response(200, service.health()),
            "/metrics": lambda q: Response(
                200, service.metrics(), "text/plain; version=0.0.4; charset=utf-8"
            ),
            "/config": lambda q: Response(200, service.config(bool(_one(q, "sections")))),
            "/stats": lambda q: Response(200, service.stats(_one(q, "soc")).to_json()),
        }
        self._post: dict[str, Callable[[dict[str, Any], Alive], Response]] = {
            "/gc": lambda b, alive: Response(200, service.gc(b).to_json()),
            "/lookup": self._lookup,
            "/compile": self._compile,
            directwire.ENDPOINT: self._compile_if_config,
            "/reload": lambda b, alive: Response(200, service.reload()),
            "/hits": self._hits,
            "/stats/zero": lambda b, alive: Response(200, service.zero_stats()),
            "/stop": _stop,
        }

    def __call__(
        self, method: str, path: str, query: dict[str, list[str]], body: Any, alive: Alive
    ) -> Response:
        try:
            return self._route(method, path.rstrip("/") or "/", query, body, alive)
        except CacheMgrError as exc:  # 429 for a caller over its share of the queue
            status = getattr(exc, "http_status", None) or (400 if exc.exit_code == 2 else 500)
            return error(status, str(exc))

    def _route(
        self, method: str, path: str, query: dict[str, list[str]], body: Any, alive: Alive
    ) -> Response:
        if path.startswith("/jobs/") and method == "GET":
            found = self.service.job(path[len("/jobs/") :])
            return Response(200, found) if found is not None else error(404, f"no job {path[6:]!r}")
        if path in self._get:
            if method != "GET":
                return error(405, f"{method} {path}: use GET")
            return self._get[path](query)
        if path in self._post:
            if method != "POST":
                return error(405, f"{method} {path}: use POST")
            if body is None:
                body = {}
            if not isinstance(body, dict):
                return error(400, f"{path}: body must be a JSON object, not {type(body).__name__}")
            if path in ADMIN_ONLY:
                refusal = admin_refusal(path)
                if refusal is not None:
                    return refusal
            if path in _COMPILES and not self.service.accepting:
                return error(503, "daemon is stopping; not taking new work")
            return self._post[path](body, alive)
        return error(404, f"unknown endpoint {method} {path}")

    def _lookup(self, body: dict[str, Any], alive: Alive) -> Response:
        soc, kernel = body.get("soc_version"), body.get("kernel_name")
        if not isinstance(soc, str) or not isinstance(kernel, str):
            return error(400, "/lookup needs string fields soc_version and kernel_name")
        return Response(200, self.service.lookup(soc, kernel))

    def _hits(self, body: dict[str, Any], alive: Alive) -> Response:
        hits = body.get("hits")
        most = MAX_HITS_PER_REPORT
        if isinstance(hits, bool) or not isinstance(hits, int) or not 0 <= hits <= most:
            shown = repr(hits) if len(repr(hits)) <= 40 else f"{repr(hits)[:40]}…"
            return error(400, f"/hits needs an integer 'hits' 0..{most} (one report), not {shown}")
        return Response(200, self.service.report_hits(hits))

    def _compile(self, body: dict[str, Any], alive: Alive) -> Response:
        if not isinstance(body.get("request"), dict):
            return error(400, "/compile needs a JSON object field 'request'")
        status, data = self.service.compile(body, alive)
        return Response(status, data)

    def _compile_if_config(self, body: dict[str, Any], alive: Alive) -> Response:
        """``/compile``, when the caller prepared its request with the settings this daemon
        answers ``GET /config?sections=1`` with now (the digest a client computes of that
        answer, :func:`cachemgr.directwire.config_digest`); ``412`` with nothing done
        otherwise: the caller then fetches them and prepares again
        (docs/performance.md#direct-mode-a-cli-hit-without-the-compile-path)."""
        given = body.pop(directwire.CONFIG_FIELD, None)
        if not isinstance(given, str):
            field = directwire.CONFIG_FIELD
            return error(400, f"{directwire.ENDPOINT} needs a string field {field!r}")
        if given != self.config_digest():
            return error(
                directwire.CONFIG_CHANGED,
                f"{directwire.ENDPOINT}: the daemon's settings are not those the request was "
                "prepared with (GET /config?sections=1 has changed); nothing was done",
            )
        return self._compile(body, alive)

    def config_digest(self) -> str:
        """The digest a client computes of this daemon's ``GET /config?sections=1`` answer:
        of the answer as it is sent (:meth:`Response.encode`), decoded as the client does.
        The last one is kept with the bytes it is of (decoding and hashing again: ~60 µs)."""
        sent = Response(200, self.service.config(True)).encode()
        last = self._config_digest
        if last is not None and last[0] == sent:
            return last[1]
        digest = directwire.config_digest(json.loads(sent))
        self._config_digest = (sent, digest)
        return digest


def admin_refusal(path: str) -> Response | None:
    """None when the caller of this request may call admin endpoint ``path``: it runs as the
    daemon's own uid or as root, as ``SO_PEERCRED`` on the Unix socket tells it (a TCP caller
    has no kernel-vouched identity and may not); else ``403`` with one line saying who may."""
    caller = peer.current()
    if caller is None:  # in-process use, not a request
        return None
    uid = caller.uid
    if uid is not None and uid in (os.getuid(), 0):
        return None
    who = "a TCP caller" if uid is None else f"uid {uid} ({user_name(uid)})"
    log.warning("refused %s to %s: only the daemon's user or root may", path, caller.describe())
    return error(
        403,
        f"{path}: only the daemon's user ({user_name(os.getuid())}, uid {os.getuid()}) or root "
        f"may, on the Unix socket; you are {who}",
    )


def _stop(body: dict[str, Any], alive: Alive) -> Response:
    """``POST /stop`` (``cachemgr stop``, like ``sccache --stop-server``): the same path as
    SIGTERM — stop taking work, let running compiles finish, exit 0. Admin only
    (:data:`ADMIN_ONLY`): group members may compile but not stop the service."""
    caller = peer.current()
    log.info("stop requested over the socket by %s", caller.describe() if caller else "?")
    os.kill(os.getpid(), signal.SIGTERM)
    return Response(200, {"stopping": True, "pid": os.getpid()})


def _one(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None
