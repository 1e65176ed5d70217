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
| GET    | /jobs/{id}      | state of a submitted compile |
| POST   | /reload         | reload config and op_cache.ini (same path as SIGHUP) |
| POST   | /hits           | ``{"hits": n}``: hits a client served itself, for the counters |
| POST   | /stats/zero     | reset the counters of the kernel cache served (``stats --zero``) |
| POST   | /stop           | stop as on SIGTERM; only the daemon's own user, on the Unix socket |

Errors are ``{"error": "<one line>"}`` with 400 (bad input), 401/403/415/421 (TCP guard;
403 also for ``/stop`` by another user), 404, 405, 413, 429 (a caller over its share of
connections or queued jobs), 503 (stopping).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from typing import Any, Protocol

from cachemgr.compile.results import GcResult, StatsResult
from cachemgr.daemon import peer
from cachemgr.daemon.server import Response, error
from cachemgr.errors import CacheMgrError

Alive = Callable[[], bool]

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
            if path == "/compile" and not self.service.accepting:
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
        if isinstance(hits, bool) or not isinstance(hits, int) or not 0 <= hits <= 10**9:
            return error(400, f"/hits needs an integer 'hits' 0..1e9, not {hits!r}")
        return Response(200, self.service.report_hits(hits))

    def _compile(self, body: dict[str, Any], alive: Alive) -> Response:
        if not isinstance(body.get("request"), dict):
            return error(400, "/compile needs a JSON object field 'request'")
        status, data = self.service.compile(body, alive)
        return Response(status, data)


def _stop(body: dict[str, Any], alive: Alive) -> Response:
    """``POST /stop`` (``cachemgr stop``, like ``sccache --stop-server``): the same path as
    SIGTERM — stop taking work, let running compiles finish, exit 0. Only a caller with the
    daemon's own uid, as ``SO_PEERCRED`` on the Unix socket tells it, may ask: the socket is
    group-writable, and group members may compile but not stop the service."""
    caller = peer.current()
    uid = caller.uid if caller is not None else None
    if uid != os.getuid():
        who = "a TCP caller" if uid is None else f"uid {uid}"
        return error(403, f"/stop: only uid {os.getuid()} (the daemon's user) may, not {who}")
    log.info("stop requested over the socket by uid %d", uid)
    os.kill(os.getpid(), signal.SIGTERM)
    return Response(200, {"stopping": True, "pid": os.getpid()})


def _one(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None
