"""``cachemgr.Client``: how frameworks and the CLI reach a running daemon (layer 8).

HTTP/1.1 with JSON bodies over the daemon's Unix socket (keep-alive, one connection per
thread), or a loopback TCP port. The client never imports the server (.importlinter: the CLI is a
client). Where no daemon answers, :class:`DaemonUnavailable` is raised and callers such as
the CLI run the work in-process instead.

**Hits in the caller's process.** Like ccache, the client serves a hit itself: with the
daemon's settings (fetched from ``/config?sections=1`` and refreshed every
:data:`LOCAL_CONFIG_TTL_S` seconds) it computes the same key with the same code the daemon
runs, and does the same verified lookup (SHA-256 of every binary, atime set) on the shared
cache; a request served so once is served again from what its key was made from,
re-checked (:mod:`cachemgr.localhit`). Only misses — and every request the rules send
elsewhere (debug, ``force``, ``disable``, precompiled-binary first) — go to the daemon,
whose queue compiles each kernel
once. Hits served locally are reported to the daemon's counters (``POST /hits``) at most
once a second and on :meth:`Client.close`. ``Client(local_hits=False)`` sends everything.

**The caller's files travel with the request**. The client
runs as the caller: it reads the kernel source, the headers the compiler reads (from the
header manifest, or the compiler's dependency listing on a miss) and the ``op_debug_config``
file, and sends their bytes (:func:`cachemgr.compile.inputs.to_wire`). The daemon computes the key
from exactly those bytes and compiles them in a private folder; it never opens a path a
caller named. A request without them is accepted only from the daemon's own user.

Example::

    from cachemgr import Client
    client = Client()                       # $CACHEMGR_SOCKET or the default socket
    out = client.compile_file("examples/requests/c_add.json")   # a CompileOutcome
    print(out.kernel_name, out.status, out.policy.describe())
    out.to_json()                           # the same as a dict (compile --json's object)
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar, overload

from cachemgr import sockcheck, sockpath
from cachemgr.compile.results import CompileOutcome, GcResult, StatsResult
from cachemgr.constants import MAX_HITS_PER_REPORT
from cachemgr.errors import CacheMgrError, CompileError, InvalidInputError
from cachemgr.sockcheck import UntrustedDaemon

if TYPE_CHECKING:
    import http.client

    from cachemgr import localhit
    from cachemgr.compile import build, keys
    from cachemgr.config import options

# The hit path's modules (build, keys, inputs, kernel_meta, http.client...) are imported where
# they are used, so a CLI command that finds no daemon never pays for them.

log = logging.getLogger(__name__)

SOCKET_NAME = sockpath.SOCKET_NAME
#: How long a client trusts the daemon's settings before fetching them again (seconds).
LOCAL_CONFIG_TTL_S = 5.0
#: Locally served hits are reported to the daemon at most this often (seconds).
HIT_REPORT_INTERVAL_S = 1.0
#: Parsed requests a client remembers (entries).
PARSED_CACHE_SIZE = 1024


class DaemonUnavailable(CacheMgrError):
    """No daemon answers on the socket (missing, refused, or not a cachemgr daemon)."""

    exit_code = 1


class DaemonOutOfReach(DaemonUnavailable):
    """A daemon may be there, but this user may not connect (``EACCES`` on the socket or a
    folder on the way): one line naming the group that may (docs/daemon.md)."""


class DaemonError(CacheMgrError):
    """The daemon answered with an error; ``status`` is the HTTP status (4xx = bad input)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status
        self.exit_code = 2 if 400 <= status < 500 and status not in (408, 409) else 1


def runtime_dir(env: Mapping[str, str] | None = None) -> Path:
    """Folder of the daemon's socket (:func:`cachemgr.sockpath.runtime_dir`)."""
    return Path(sockpath.runtime_dir(os.environ if env is None else env))


def default_socket_path(env: Mapping[str, str] | None = None) -> Path:
    """``$CACHEMGR_SOCKET``, else ``<runtime dir>/cachemgr.sock``
    (:func:`cachemgr.sockpath.default_socket`)."""
    return Path(sockpath.default_socket(os.environ if env is None else env))


@cache
def _unix_connection_class() -> Callable[[str, float, set[int]], http.client.HTTPConnection]:
    """:class:`http.client.HTTPConnection` over a Unix socket whose folder, file and serving
    process belong to a trusted user (:mod:`cachemgr.sockcheck`). Made on
    first use: ``http.client`` pulls in ``email`` and ``ssl``."""
    import http.client

    class _UnixConnection(http.client.HTTPConnection):
        def __init__(self, path: str, timeout: float, trusted: set[int]) -> None:
            super().__init__("localhost", timeout=timeout)
            self._path = path
            self._trusted = trusted

        def connect(self) -> None:
            sockcheck.check_path(Path(self._path), self._trusted)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(self._path)
                sockcheck.check_peer(sock, Path(self._path), self._trusted)
            except BaseException:
                sock.close()
                raise
            self.sock = sock

    return _UnixConnection


def _closed_folder(path: Path) -> tuple[Path, os.stat_result] | None:
    """The first folder above ``path``, from the top, this user may not enter, with its
    status; None when every one may be entered (or the closed one cannot be seen)."""
    for folder in reversed(path.parents):
        if not os.access(folder, os.X_OK):
            try:
                return folder, os.stat(folder)
            except OSError:
                return None
    return None


def _name_of(ident: int, db: Literal["pwd", "grp"]) -> str:
    """The name of user (``pwd``) or group (``grp``) ``ident``, else the number; the modules
    are imported here: only the line for a refused socket names an owner or a group."""
    try:
        if db == "pwd":
            import pwd

            return pwd.getpwuid(ident).pw_name
        import grp

        return grp.getgrgid(ident).gr_name
    except KeyError:
        return str(ident)


class Client:
    """A client of one daemon.

    :param socket_path: the Unix socket (default :func:`default_socket_path`).
    :param tcp: ``(host, port)`` to use a loopback TCP port instead of the socket.
    :param timeout_s: per-request timeout in seconds (a compile may take minutes).
    :param token: the TCP listener's secret (the content of the daemon's
        ``[daemon] tcp_token_file``), sent as ``Authorization: Bearer``; TCP only.
    :param daemon_user: the user the daemon runs as, trusted besides the caller and root
        (default ``$CACHEMGR_DAEMON_USER``); a socket of anyone else is refused
        (:class:`UntrustedDaemon`, see :mod:`cachemgr.sockcheck`).
    """

    def __init__(
        self,
        socket_path: Path | str | None = None,
        tcp: tuple[str, int] | None = None,
        timeout_s: float = 900.0,
        local_hits: bool = True,
        token: str | None = None,
        daemon_user: str | None = None,
    ) -> None:
        self.socket_path = Path(socket_path) if socket_path else default_socket_path()
        self.tcp = tcp
        self._auth = {"Authorization": f"Bearer {token}"} if tcp and token else {}
        self.daemon_user = daemon_user
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._side = _LocalHits(self)
        self._hits = self._side if local_hits else None
        self._targets: dict[str, _Target] = {}

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self.tcp:
                import http.client

                conn = http.client.HTTPConnection(*self.tcp, timeout=self.timeout_s)
            else:
                trusted = sockcheck.trusted_uids(self.daemon_user)
                conn = _unix_connection_class()(str(self.socket_path), self.timeout_s, trusted)
            self._local.conn = conn
        return conn

    def close(self) -> None:
        """Report pending local hits, close the chip folders kept open for them
        (:mod:`cachemgr.storage.heldchip`) and this thread's connection."""
        if self._hits is not None:
            self._hits.close()
        self._drop_connection()

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """Send one request; return the decoded JSON answer.

        :raises DaemonUnavailable: nothing listens on the socket/port.
        :raises DaemonError: the daemon answered 4xx/5xx (its one-line message).
        """
        import http.client

        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        headers.update(self._auth)
        for attempt in (1, 2):  # a kept-alive connection the server closed: retry once
            conn = self._conn()
            try:
                try:
                    conn.request(method, path, body=payload, headers=headers)
                except (BrokenPipeError, ConnectionResetError) as sending:
                    # the daemon may have answered before reading it all (413: over
                    # [daemon] max_body_bytes) and closed: its answer is still there to read
                    try:
                        resp = conn.getresponse()
                        raw = resp.read()
                    except (http.client.HTTPException, OSError):
                        raise sending from None  # no answer: it hung up (retried once)
                    self._drop_connection()
                    break
                resp = conn.getresponse()
                raw = resp.read()
                break
            except UntrustedDaemon:
                self._drop_connection()  # nothing was sent; the next request checks again
                raise
            except (ConnectionRefusedError, FileNotFoundError) as exc:
                self._drop_connection()
                raise DaemonUnavailable(f"no daemon at {self._where()}: {exc.strerror}") from exc
            except PermissionError as exc:  # a daemon may be there: this user may not reach it
                self._drop_connection()
                raise DaemonOutOfReach(self._refused_line(exc)) from exc
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self._drop_connection()
                if attempt == 2:
                    raise DaemonUnavailable(f"daemon at {self._where()} hung up") from exc
            except OSError as exc:
                self._drop_connection()
                raise DaemonUnavailable(f"no daemon at {self._where()}: {exc}") from exc
        return _decode(resp.status, raw, resp.getheader("Content-Type", ""))

    def _object(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """:meth:`request` for an endpoint that answers a JSON object.

        :raises DaemonError: the answer is something else (named, with the endpoint).
        """
        answer = self.request(method, path, body)
        if not isinstance(answer, dict):
            raise DaemonError(
                f"{method} {path}: the daemon answered {answer!r:.80}, not an object", 502
            )
        return answer

    def _where(self) -> str:
        return f"{self.tcp[0]}:{self.tcp[1]}" if self.tcp else str(self.socket_path)

    def _refused_line(self, exc: PermissionError) -> str:
        """One line for a socket this user may not connect to (``EACCES``): what the modes
        on the way say (docs/daemon.md: the unit serves the members of one group) — the group
        of the socket, or of the folder on the way this user may not enter (the unit's
        ``RuntimeDirectory=`` is ``0750``, of its user and the group), when this process is
        not in it; the socket's owner alone (the group is then not named: joining it would
        not help); or, when the modes let this process in, its ACL."""
        line = f"cannot reach the daemon at {self._where()}: {exc.strerror}"
        if self.tcp or self.socket_path is None:
            return line  # a rule of this host (a firewall, a security module): no modes
        target, what = self.socket_path, "its socket"
        try:
            st = os.stat(target)
        except OSError:
            closed = _closed_folder(target)
            if closed is None:
                return line + " (this user may not enter a folder on the way)"
            target, st = closed
            what = f"the folder {target} on the way"
            if not st.st_mode & stat.S_IXGRP:  # no group may enter it either
                octal = f"{stat.S_IMODE(st.st_mode):04o}"
                return line + f" (this user may not enter a folder on the way, {target}: {octal})"
        else:
            if not st.st_mode & stat.S_IWGRP:  # joining its group would not help
                mode = stat.filemode(st.st_mode)
                owner = _name_of(st.st_uid, "pwd")
                return line + f" (its socket, mode {mode}, lets in only its owner {owner})"
        group = _name_of(st.st_gid, "grp")
        if st.st_gid not in {os.getegid(), *os.getgroups()}:
            return line + f" ({what} is for the members of group {group}: `id` shows yours)"
        acl = f"getfacl {target}"
        return line + f" (its modes let group {group} in, and this process is in it: {acl})"

    # --- endpoints ------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``GET /health``: ``{"status": "ok", "pid": …, "version": …, "uptime_s": …}``."""
        return self._object("GET", "/health")

    def available(self) -> bool:
        """True when a cachemgr daemon answers ``/health``.

        :raises UntrustedDaemon: the socket belongs to a user this client does not trust.
        """
        try:
            return self.health().get("service") == "cachemgr"
        except UntrustedDaemon:
            raise
        except CacheMgrError:
            return False

    def config(self, sections: bool = False) -> dict[str, Any]:
        """``GET /config``: the daemon's settings with origins. With ``sections``,
        ``GET /config?sections=1`` (``{"settings": …, "sections": …}``, what local hits
        need), remembered in this process for :data:`LOCAL_CONFIG_TTL_S` seconds: the CLI's
        routing check and the compile after it cost one round trip.

        :raises DaemonError: the daemon's error, or an answer that is not an object.
        """
        if sections:
            return self._side.config_answer()[0]
        return self._object("GET", "/config")

    def stats(self, soc_version: str | None = None) -> StatsResult:
        """``GET /stats``: counters (``hits``, ``misses``, ``compiles``…) and chip folders
        (this client's pending local hits are reported first).

        :raises DaemonError: the daemon's error, or an answer that is not a stats object.
        """
        if self._hits is not None:
            self._hits.flush(force=True)
        answer = self._object("GET", "/stats" + (f"?soc={soc_version}" if soc_version else ""))
        return _typed(StatsResult, answer, "/stats")

    def gc(self, **params: Any) -> GcResult:
        """``POST /gc`` with ``ratio``, ``soc``, ``min_age_s``, ``dry_run``.

        :raises DaemonError: the daemon's error, or an answer that is not a gc report.
        """
        answer = self._object("POST", "/gc", {k: v for k, v in params.items() if v is not None})
        return _typed(GcResult, answer, "/gc")

    def lookup(self, soc_version: str, kernel_name: str) -> dict[str, Any]:
        """``POST /lookup``: a verified lookup; ``{"status": "hit"|"miss", …}``."""
        return self._object(
            "POST", "/lookup", {"soc_version": soc_version, "kernel_name": kernel_name}
        )

    @overload
    def compile(
        self,
        request: Mapping[str, Any],
        base_dir: Path | str | None = None,
        wait: Literal[True] = True,
        priority: int = 0,
        replace: bool = False,
        session: str | None = None,
        out_dir: Path | str | None = None,
    ) -> CompileOutcome: ...

    @overload
    def compile(
        self,
        request: Mapping[str, Any],
        base_dir: Path | str | None = None,
        *,
        wait: Literal[False],
        priority: int = 0,
        replace: bool = False,
        session: str | None = None,
        out_dir: Path | str | None = None,
    ) -> dict[str, Any]: ...

    def compile(
        self,
        request: Mapping[str, Any],
        base_dir: Path | str | None = None,
        wait: bool = True,
        priority: int = 0,
        replace: bool = False,
        session: str | None = None,
        out_dir: Path | str | None = None,
    ) -> CompileOutcome | dict[str, Any]:
        """Compile (or hit) one request: its :class:`~cachemgr.results.CompileOutcome`
        (``status``, ``files``, ``seconds``, the ``policy`` applied…; ``.to_json()`` for a
        dict), with ``via`` ``"client"`` for a hit served in this process, ``"daemon"``
        otherwise. With ``wait=False`` returns ``{"job_id": …}`` to poll with :meth:`job`.
        Relative paths in the request are relative to ``base_dir`` (default: the current
        directory). ``replace`` recompiles and replaces this one entry (docs/design.md#cache-modes).
        ``session``: requests of one session clear a chip folder at most once with ``force``
        (default: each call is its own session, so each ``force`` call clears).
        This caller's values of the variables its compiler reads (``CPATH``,
        ``NVCC_APPEND_FLAGS``, ``SOURCE_DATE_EPOCH``…; docs/compiling.md#the-environment) go
        with the request as ``compile_env``: the daemon compiles with exactly those.

        Debug artefacts and ``disable`` kernels are handed back by the daemon and written
        here, as the caller: debug ones to
        ``<base>/kernel_meta/<host>_<pid>/`` with base = the request's ``debug_dir`` >
        ``$ASCEND_WORK_PATH`` > the current directory; ``disable`` ones to ``out_dir``
        (default: the current directory); ``files`` names the files written. A folder this
        user cannot write is refused before anything is compiled (400, one line).

        :raises DaemonError: a bad request (400: one line), or the daemon's error.
        :raises DaemonUnavailable: no daemon answers.
        """
        start = time.perf_counter()
        local = wait and not replace and self._hits is not None
        if local and self._hits is not None:
            again = self._hits.again(request, base_dir, start)
            if again is not None:
                return again
        context = self._side.context(request, base_dir) if local else None
        base = self._side.base(base_dir)
        try:
            prepared = self._side.prepare(request, base, context)
        except InvalidInputError as exc:
            raise DaemonError(str(exc), 400) from exc
        except CompileError as exc:  # e.g. the dependency listing names a missing header
            return self._side.failed(request, base, exc, start)
        if prepared is not None and local and self._hits is not None:
            found = self._hits.lookup_prepared(prepared, start, context, base)
            if found is not None:
                return found
        from cachemgr.compile import environment

        body: dict[str, Any] = {
            "request": dict(request),
            "base_dir": base,
            "wait": wait,
            "priority": priority,
            "replace": replace,
            # the daemon compiles with this caller's values of what its compiler reads
            "compile_env": environment.from_caller(os.environ, os.getcwd()),
        }
        if session is not None:
            body["session"] = session
        target = None
        if prepared is not None:
            target = self._output_target(prepared, out_dir)
            body["deliver"] = target is not None
        if prepared is not None:
            try:
                body["inputs"] = self._side.wire_inputs(prepared, request, base)
            except InvalidInputError as exc:
                raise DaemonError(str(exc), 400) from exc
        answer = self._object("POST", "/compile", body)
        if "status" in answer:
            answer["via"] = "daemon"
        if target is not None:
            if "job_id" in answer and "status" not in answer:
                self._targets[answer["job_id"]] = target
            else:
                _write_outputs(answer, target)
        if "status" not in answer:
            return answer  # wait=False: the job to poll
        return _typed(CompileOutcome, answer, "/compile")

    def _output_target(
        self, prepared: build.Prepared, out_dir: Path | str | None
    ) -> _Target | None:
        """Where this caller wants the outputs of ``prepared`` (debug artefacts: its
        kernel_meta folder; ``disable`` kernels: ``out_dir``), checked writable; None when it
        has none.

        :raises DaemonError: 400 when the folder cannot be written (one line).
        """
        from cachemgr.compile import kernel_meta
        from cachemgr.config import layout

        decision = prepared.decision
        try:
            if decision.debug.on:
                base, origin = kernel_meta.caller_base(
                    prepared.request.options, os.environ, Path.cwd()
                )
                folder = layout.kernel_meta_dir(base)
                kernel_meta.check_base(folder, origin)
                return _Target(True, folder)
            if not decision.cache.write:
                folder = Path(out_dir or Path.cwd()).absolute()
                kernel_meta.check_output_dir(folder, "out_dir, default the current directory")
                return _Target(False, folder)
        except InvalidInputError as exc:
            raise DaemonError(str(exc), 400) from exc
        return None

    @overload
    def compile_file(
        self, path: Path | str, wait: Literal[True] = True, priority: int = 0
    ) -> CompileOutcome: ...

    @overload
    def compile_file(
        self, path: Path | str, wait: Literal[False], priority: int = 0
    ) -> dict[str, Any]: ...

    def compile_file(
        self, path: Path | str, wait: bool = True, priority: int = 0
    ) -> CompileOutcome | dict[str, Any]:
        """Compile the request in JSON file ``path`` (its folder is the base of relative paths).

        :raises CacheMgrError: unreadable file or malformed JSON (one line naming the file).
        """
        from cachemgr.storage import safeio

        path = Path(path)
        try:
            # non-blocking, regular files only, capped
            data = json.loads(safeio.read_regular(path.resolve()).decode("utf-8"))
        except safeio.UnsafeFileError as exc:
            raise DaemonError(f"request file {exc}", 400) from exc
        except (OSError, ValueError) as exc:
            raise DaemonError(f"request file {path}: {exc}", 400) from exc
        base = path.resolve().parent
        if not wait:
            return self.compile(data, base_dir=base, wait=False, priority=priority)
        return self.compile(data, base_dir=base, priority=priority)

    def job(self, job_id: str) -> dict[str, Any]:
        """``GET /jobs/<id>``: ``{"state": "queued"|"running"|"done"|"failed", …}`` (handed
        back outputs written as :meth:`compile` writes them)."""
        answer = self._object("GET", f"/jobs/{job_id}")
        target = self._targets.get(job_id)
        if target is not None and isinstance(answer, dict) and "outputs" in answer:
            _write_outputs(answer, target)
            self._targets.pop(job_id, None)
        return answer

    def reload(self) -> dict[str, Any]:
        """``POST /reload``: reload the config and op_cache.ini (same path as SIGHUP)."""
        return self._object("POST", "/reload", {})


class _LocalHits:
    """The hit path run in the caller's process (see the module docstring)."""

    def __init__(self, client: Client) -> None:
        from cachemgr.compile.request import ParsedRequests

        self.client = client
        self._lock = threading.Lock()
        self._settings: options.Settings | None = None
        self._compilers: keys.Compilers | None = None
        self._fetched = 0.0
        self._doc: tuple[Any, Any] | None = None  # the answer self._settings was made from
        self._answer: tuple[dict[str, Any], float] | None = None  # /config?sections=1, when
        self._parsed = ParsedRequests(PARSED_CACHE_SIZE)
        self._pending = 0
        self._flushed = float("-inf")  # the first hit is reported at once
        self.disabled = False
        self._plans: localhit.HitPlans | None = None  # made with the first hit

    def base(self, base_dir: Path | str | None) -> str:
        """The resolved folder of a request's relative paths (:func:`localhit.resolved_base`)."""
        from cachemgr import localhit

        return localhit.resolved_base(base_dir)

    def context(
        self, data: Mapping[str, Any], base_dir: Path | str | None
    ) -> localhit.Context | None:
        """What preparing ``data`` here depends on (:meth:`localhit.HitPlans.context`), the
        daemon's settings included; None when they cannot be had."""
        from cachemgr import localhit

        try:
            settings, compilers = self._state()
        except (CacheMgrError, OSError, KeyError, TypeError, ValueError):
            return None
        return localhit.HitPlans.context(data, base_dir, settings, compilers)

    def again(
        self, data: Mapping[str, Any], base_dir: Path | str | None, start: float
    ) -> CompileOutcome | None:
        """A remembered request's hit, its inputs re-checked rather than its key recomputed
        (:mod:`cachemgr.localhit`); None when it is not remembered or a re-check fails."""
        plans = self._plans
        if plans is None or self.disabled:
            return None
        try:
            settings, compilers = self._state()
        except (CacheMgrError, OSError, KeyError, TypeError, ValueError):
            return None
        found = plans.again(data, base_dir, settings, compilers, start)
        if found is not None:
            self._count()
        return found

    def config_answer(self) -> tuple[dict[str, Any], float]:
        """The daemon's ``GET /config?sections=1`` answer and when it was fetched
        (:func:`time.monotonic`, seconds); asked again after :data:`LOCAL_CONFIG_TTL_S`.

        :raises DaemonError: the daemon's error, or an answer that is not an object.
        """
        now = time.monotonic()
        with self._lock:
            if self._answer is not None and now - self._answer[1] < LOCAL_CONFIG_TTL_S:
                return self._answer
        answer = (self.client._object("GET", "/config?sections=1"), now)
        with self._lock:
            self._answer = answer
        return answer

    def _state(self) -> tuple[options.Settings, keys.Compilers]:
        """The daemon's settings and compilers, fetched again after
        :data:`LOCAL_CONFIG_TTL_S`; the same objects while the daemon's answer is the same
        (so the requests :mod:`cachemgr.localhit` remembers stay valid)."""
        now = time.monotonic()
        with self._lock:
            if self._settings is not None and now - self._fetched < LOCAL_CONFIG_TTL_S:
                return self._settings, self._compilers  # type: ignore[return-value]
        from cachemgr.compile import keys
        from cachemgr.config import options

        data, now = self.config_answer()
        doc = (data["settings"], data.get("sections"))
        with self._lock:
            if self._settings is not None and doc == self._doc:
                self._fetched = now
                return self._settings, self._compilers  # type: ignore[return-value]
        settings = options.Settings.from_json(*doc)
        with self._lock:
            if self._settings is None or settings.sections != self._settings.sections:
                self._compilers = keys.Compilers(settings.sections.get("compilers", {}))
            self._settings, self._fetched, self._doc = settings, now, doc
            return settings, self._compilers  # type: ignore[return-value]

    def prepare(
        self, data: Mapping[str, Any], base: str, context: localhit.Context | None = None
    ) -> build.Prepared | None:
        """The request prepared here, as the caller, with the daemon's settings (those of
        ``context`` when given): its key and its inputs' digests (source, headers, ``.cfg``).
        None when the daemon's settings cannot be had or used here (then the daemon is asked
        without inputs and answers or refuses itself).

        :raises InvalidInputError: a bad request (the same one line the daemon would give).
        :raises CompileError: the dependency listing failed (a missing header...).
        """
        from cachemgr.compile import pipeline

        try:
            if context is not None:
                settings, compilers = context.settings, context.compilers
            else:
                settings, compilers = self._state()
        except (CacheMgrError, OSError, KeyError, TypeError, ValueError) as exc:
            log.debug("client-side preparation not possible: %s", exc)
            return None
        request = self._parsed.get(data, base, origin="compile request")
        try:
            return pipeline.prepare(request, settings, compilers, pipeline.JobOptions())
        except (InvalidInputError, CompileError):
            raise
        except (CacheMgrError, OSError) as exc:
            log.debug("client-side preparation failed: %s", exc)
            return None

    def wire_inputs(
        self, prepared: build.Prepared, data: Mapping[str, Any], base: str
    ) -> dict[str, Any]:
        """The bytes of ``prepared``'s inputs as the request carries them; read again when a
        file changed since it was hashed (the bytes sent are the bytes hashed).

        :raises InvalidInputError: an input that cannot be read, or one that keeps changing.
        """
        from cachemgr.compile import inputs, pipeline

        for _ in range(3):
            frozen = pipeline.freeze(prepared)
            if frozen is not None:
                return inputs.to_wire(frozen.inputs, listed=frozen.scanned)
            settings, compilers = self._state()
            request = self._parsed.get(data, base, origin="compile request")
            prepared = pipeline.prepare(request, settings, compilers, pipeline.JobOptions())
        raise InvalidInputError(
            f"{prepared.request.kernel_source} (or a header) kept changing while it was read"
        )

    def failed(
        self, data: Mapping[str, Any], base: str, error: CompileError, start: float
    ) -> CompileOutcome:
        """The answer for a request that failed here, before the daemon was asked (a header
        missing from the dependency listing): ``failed``, with the policy decided for it
        (:func:`cachemgr.compile.pipeline.failed_before_prepared`), or an unresolved one."""
        from cachemgr.compile import build, pipeline

        try:
            settings, _ = self._state()
            request = self._parsed.get(data, base, origin="compile request")
            out = pipeline.failed_before_prepared(request, settings, error, pipeline.JobOptions())
        except (CacheMgrError, OSError, KeyError, TypeError, ValueError):
            out = CompileOutcome.failed_early(build.error_text(error))
        seconds = time.perf_counter() - start
        return dataclasses.replace(out, request="", seconds=seconds, via="client")

    def lookup(self, data: Mapping[str, Any], base: str) -> CompileOutcome | None:
        """A verified hit served here, or None (then the daemon answers). Any error — bad
        input, a daemon that cannot be asked — also gives None: the daemon's answer, or
        its error, is the one the caller sees."""
        start = time.perf_counter()
        try:
            prepared = self.prepare(data, base)
        except CacheMgrError as exc:
            log.debug("local hit path not taken: %s", exc)
            return None
        return None if prepared is None else self.lookup_prepared(prepared, start)

    def lookup_prepared(
        self,
        prepared: build.Prepared,
        start: float,
        context: localhit.Context | None = None,
        base: str = "",
    ) -> CompileOutcome | None:
        """A verified hit for ``prepared`` served here, or None. With ``context`` (taken
        before ``prepared`` was, for a request whose base folder resolved to ``base``) the
        request is remembered for :meth:`again`."""
        from cachemgr import localhit
        from cachemgr.compile import build, pipeline

        if self.disabled:
            return None
        try:
            decision = prepared.decision
            if decision.debug.on or decision.binary_first or not decision.cache.read:
                return None
            if decision.cache.clear_first:  # force: the daemon clears, then compiles
                return None
            outcome = pipeline.find_cached(prepared)
        except (CacheMgrError, OSError, KeyError, TypeError, ValueError) as exc:
            log.debug("local hit path not taken: %s", exc)
            return None
        if outcome is None:
            return None
        self._count()
        seconds = time.perf_counter() - start
        outcome = build.with_policy(outcome, prepared)
        outcome = dataclasses.replace(outcome, seconds=seconds, via="client")
        if context is not None:
            if self._plans is None:
                self._plans = localhit.HitPlans()
            self._plans.remember(context, base, prepared, outcome)
        return outcome

    def _count(self) -> None:
        """One more hit served here: reported with the next :meth:`flush`."""
        with self._lock:
            self._pending += 1
            due = time.monotonic() - self._flushed >= HIT_REPORT_INTERVAL_S
        if due:
            self.flush()

    def close(self) -> None:
        """Report pending hits; close the chip folders the remembered requests keep open."""
        self.flush(force=True)
        if self._plans is not None:
            self._plans.close()

    def flush(self, force: bool = False) -> None:
        """Report pending hits (at most once per :data:`HIT_REPORT_INTERVAL_S`)."""
        now = time.monotonic()
        with self._lock:
            due = self._pending and (force or now - self._flushed >= HIT_REPORT_INTERVAL_S)
            if not due:
                return
            pending, self._pending, self._flushed = self._pending, 0, now
            pending = min(pending, MAX_HITS_PER_REPORT)  # what one report may hold
        try:
            self.client.request("POST", "/hits", {"hits": pending})
        except CacheMgrError as exc:
            log.debug("could not report %d hits: %s", pending, exc)


class _Target(NamedTuple):
    """Where a caller writes the outputs the daemon hands back."""

    kernel_meta: bool  # debug artefacts: into <folder>/<host>_<pid>/; else into folder
    folder: Path


_Result = TypeVar("_Result", CompileOutcome, GcResult, StatsResult)


def _typed(kind: type[_Result], answer: Mapping[str, Any], endpoint: str) -> _Result:
    """``kind.from_json(answer)`` (``CompileOutcome``, ``GcResult``, ``StatsResult``).

    :raises DaemonError: an answer that is not of that shape (502: a bad gateway).
    """
    try:
        return kind.from_json(answer)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DaemonError(f"{endpoint}: the daemon's answer is malformed ({exc!r})", 502) from exc


def _write_outputs(answer: dict[str, Any], target: _Target) -> None:
    """Write the outputs the daemon handed back, as this process's user, with the names of a
    local run: debug artefacts into ``<kernel_meta>/<host>_<pid>/``, ``disable`` kernels into
    the output folder (the json last: a visible json means a whole kernel). The folder is
    opened once and every file is written relative to its descriptor (a temp name with
    ``O_EXCL | O_NOFOLLOW``, then ``renameat``), so a member who swaps the folder for a link
    meanwhile redirects nothing (docs/compiling.md, "Where outputs go"). ``files`` then
    names them.

    :raises UnsafePathError: the ``kernel_meta`` folder is another user's link or folder.
    :raises OSError: the folder cannot be created, opened or written.
    """
    from cachemgr.compile import kernel_meta
    from cachemgr.config import layout
    from cachemgr.storage import fsutil
    from cachemgr.storage.safedir import SafeDir

    outputs = answer.pop("outputs", None)
    if not isinstance(outputs, list):
        return
    if target.kernel_meta:
        opened = kernel_meta.open_process_dir(target.folder)
    else:
        opened = SafeDir.open(fsutil.ensure_dir(target.folder))  # the caller's --out-dir
    order = sorted(outputs, key=lambda o: str(o.get("name", "")).endswith(".json"))
    written = []
    with opened as folder:
        for item in order:
            name = layout.safe_file_name(item.get("name"), "output file")
            data = base64.b64decode(item["data"])
            fsutil.atomic_write_bytes(folder.path / name, data, dir_fd=folder.fd)
            written.append(folder.path / name)
    names = {p.name: p for p in written}
    answer["files"] = [str(names[n]) for n in (o["name"] for o in outputs) if n in names]


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
