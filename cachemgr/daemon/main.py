"""``cachemgr serve``: the daemon's main loop (Patroni's shape: signal handlers only set flags;
the loop reacts; SIGHUP and ``/reload`` share one path).

Start: resolve the config (a bad one exits non-zero naming it) → check the cache root (this
user may write it; fcntl locks work, else ``lock_fallback``: docs/design.md#sharing-and-locking) →
refuse if a live daemon owns the socket ("already running, pid N"), reclaim a dead one's socket →
reclaim what crashed processes left, index the cache and start governance → serve → ``READY=1``.
SIGHUP: reload, keeping the old config on error. SIGTERM or SIGINT: ``STOPPING=1``, stop taking
work, finish what runs, exit 0.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from cachemgr import sockpath
from cachemgr.client import Client, default_socket_path
from cachemgr.compilers import process, sandbox
from cachemgr.config import options
from cachemgr.daemon import httpauth, rootcheck
from cachemgr.daemon.api import Api
from cachemgr.daemon.config import DaemonConfig
from cachemgr.daemon.connections import bounds_of
from cachemgr.daemon.governor import check_globs
from cachemgr.daemon.heartbeat import MAIN, SERVER, Heartbeats
from cachemgr.daemon.notify import Notifier
from cachemgr.daemon.server import HttpServer
from cachemgr.daemon.service import Service
from cachemgr.daemon.state import state_dir
from cachemgr.errors import CacheMgrError, ConfigError
from cachemgr.remote import config as remote_config
from cachemgr.storage import fsutil

log = logging.getLogger(__name__)


class AlreadyRunning(CacheMgrError):
    """Another live daemon owns the socket."""

    exit_code = 1


class _Flags:
    def __init__(self) -> None:
        self.reload = False
        self.stop = False


def _claim_socket(socket_path: Path) -> fsutil.FcntlLock:
    """Take ``<socket>.lock`` for the daemon's lifetime; refuse if a live daemon holds it.

    A socket file left by a dead daemon (nothing answers) is reclaimed.

    :raises AlreadyRunning: naming the live daemon's pid.
    :raises ConfigError: the socket's folder cannot be made or is not safe (see
        :func:`check_socket_dir`).
    """
    check_socket_dir(socket_path.parent)
    lock = fsutil.FcntlLock(socket_path.with_name(socket_path.name + ".lock"))
    if not lock.acquire(blocking=False):
        raise AlreadyRunning(_holder(socket_path))
    client = Client(socket_path, timeout_s=2)
    if socket_path.exists() and client.available():
        pid = client.health().get("pid")
        lock.release()
        raise AlreadyRunning(f"already running, pid {pid} ({socket_path})")
    # the folder's file mode, as the lock beside it (0660 in the unit's 0750 runtime folder):
    # no bit for others, whatever the umask (docs/shared-cache.md#outsiders-read-nothing)
    fsutil.atomic_write_bytes(lock.path.with_suffix(".pid"), f"{os.getpid()}\n".encode())
    return lock


def check_socket_dir(folder: Path) -> None:
    """Create the socket's folder (0700 when we make it) and refuse one another user could
    tamper with: it must belong to us or root and not be writable by others unless sticky.

    :raises ConfigError: naming the folder, where its path came from and what to do.
    """
    origin = _socket_origin()
    try:
        if not folder.exists():
            folder.mkdir(mode=0o700, parents=True)
        st = folder.stat()
    except OSError as exc:
        raise ConfigError(
            f"cannot use {folder} for the daemon's socket (from {origin}): "
            f"{exc.strerror}; pass --socket PATH or set CACHEMGR_SOCKET"
        ) from None
    foreign = st.st_uid not in (os.getuid(), 0)
    open_to_all = st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX
    if foreign or open_to_all:
        raise ConfigError(
            f"refusing socket folder {folder} (from {origin}): owned by uid {st.st_uid}, "
            f"mode {stat.S_IMODE(st.st_mode):o} — another user could replace the socket; "
            "remove it or pass --socket PATH"
        )


def _socket_origin() -> str:
    origin, source = sockpath.socket_origin(os.environ)
    return f"${source}" if origin == "env" else f"the default {source}"


def _holder(socket_path: Path) -> str:
    """One line on the daemon that holds ``<socket>.lock``: its pid, where it serves, and
    whether it answers there (a daemon whose socket file was removed)."""
    pid = _pid_of(socket_path)
    try:
        Client(socket_path, timeout_s=2).health()
        answer = "it answers there"
    except CacheMgrError as exc:
        answer = (
            "its socket file is missing (removed by a /tmp cleaner?); the daemon re-creates "
            "it within seconds"
            if not socket_path.exists()
            else f"it does not answer there ({exc})"
        )
        answer += f"; if it stays so, stop it (kill {pid}) and start again"
    return f"already running, pid {pid}, socket {socket_path}: {answer}"


def _pid_of(socket_path: Path) -> str:
    try:
        return str(Client(socket_path, timeout_s=2).health().get("pid", "?"))
    except CacheMgrError:
        pid_file = socket_path.with_name(socket_path.name + ".pid")
        try:
            return pid_file.read_text().strip() or "?"
        except OSError:
            return "?"


def _wakeup_pipe(flags: _Flags) -> tuple[socket.socket, socket.socket]:
    """A socketpair whose write end receives a byte per signal (``set_wakeup_fd``), so the
    main loop can block in ``select`` and still react to signals at once."""
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    reader.setblocking(False)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)

    def on_hup(signum: int, frame: object) -> None:
        flags.reload = True

    def on_term(signum: int, frame: object) -> None:
        flags.stop = True

    signal.signal(signal.SIGHUP, on_hup)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return reader, writer


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(512):
            pass
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
            raise


def run(
    resolve: Callable[[], options.Settings],
    config: DaemonConfig,
    socket_path: Path,
    tcp_port: int | None = None,
    note: str = "",
    box: sandbox.Sandbox | None = None,
    remotes: Sequence[str] = (),
    govern_only: bool = False,
) -> int:
    """Run the daemon until SIGTERM/SIGINT; return the exit code (0 on a clean stop).

    ``note`` is added to systemd's ``STATUS=`` (e.g. a local-cache fallback,
    docs/design.md#sharing-and-locking).

    :raises ConfigError: bad configuration at start (before anything is started).
    :raises AlreadyRunning: a live daemon owns ``socket_path``.
    """
    # Many handler threads each do short bursts of work: a shorter GIL switch interval than
    # CPython's 5 ms keeps one burst from making the others wait (hit latency).
    sys.setswitchinterval(0.0005)
    if tcp_port is not None:  # from the command line: 0 picks a free port
        tcp: tuple[str, int] | None = (config.tcp_host, tcp_port)
    else:
        tcp = (config.tcp_host, config.tcp_port) if config.tcp_port else None
    token = httpauth.load_token(config.tcp_token_file) if tcp else None
    tcp_guard = httpauth.guard(token) if token else None
    tcp_auth = httpauth.bearer(token) if token else None
    bounds = bounds_of(config, tcp=tcp is not None)
    notifier = Notifier()
    flags = _Flags()
    wake, wake_writer = _wakeup_pipe(flags)
    lock = _claim_socket(socket_path)
    service = Service(resolve, config, state_dir() / "counters.json", remotes, govern_only)
    service.sandbox = box
    server = None
    try:
        service.start()
        server = HttpServer(
            Api(service), socket_path, tcp, config.max_body_bytes, bounds, tcp_guard, tcp_auth
        )
        server.start()
        service.tcp_address = server.tcp_address
        where = f"{socket_path}" + (f" and {server.tcp_address}" if server.tcp_address else "")
        log.info("serving on %s (pid %d)", where, os.getpid())
        serving = f"serving {service.settings.value('kernel_cache_dir')}"
        if govern_only:
            serving = f"governing {', '.join(config.govern)}"
        notifier.ready(f"{serving}; {note}" if note else serving)
        probe = _ServerProbe(socket_path, service.heartbeats, flags)
        probe.start()
        _loop(service, notifier, flags, wake, server)
    finally:
        notifier.stopping()
        log.info("stopping: finishing running compiles")
        service.accepting = False
        service.stop(config.stop_timeout_s)
        if server is not None:
            server.stop()
        lock.release(unlink=True)
        fsutil.safe_unlink(socket_path.with_name(socket_path.name + ".pid"))
        notifier.close()
        signal.set_wakeup_fd(-1)
        wake.close()
        wake_writer.close()
    log.info("stopped")
    return 0


class _ServerProbe(threading.Thread):
    """Proves that the request server works: a real ``/health`` request over the daemon's own
    socket every :data:`PROBE_INTERVAL_S`; each answer is the server's heartbeat."""

    def __init__(self, socket_path: Path, heartbeats: Heartbeats, flags: _Flags) -> None:
        super().__init__(name="cachemgr-probe", daemon=True)
        self.interval_s = probe_interval(heartbeats)
        self.client = Client(socket_path, timeout_s=max(1.0, self.interval_s), local_hits=False)
        self.heartbeats = heartbeats
        self.flags = flags

    def run(self) -> None:
        while not self.flags.stop:
            try:
                self.client.health()
                self.heartbeats.beat(SERVER)
            except (CacheMgrError, OSError) as exc:
                log.debug("server probe failed: %s", exc)
            finally:
                self.client.close()  # a new connection each time: it must be accepted
            time.sleep(self.interval_s)


#: Seconds between checks of the socket file and probes of the request server (at most).
#: Each probe is a connection and a handler thread, ~0.9 ms of CPU: at 2 s an idle daemon
#: used 13 ms of CPU per 10 s (perf stat task-clock), at 5 s 9 ms — under the bench's one
#: tick; systemd's watchdog and the 60 s heartbeat timeout need far less often.
PROBE_INTERVAL_S = 5.0


def probe_interval(heartbeats: Heartbeats) -> float:
    """Seconds between probes: :data:`PROBE_INTERVAL_S`, or a third of the heartbeat timeout
    when that is shorter (a part is stale only after several missed beats)."""
    return min(PROBE_INTERVAL_S, heartbeats.timeout_s / 3)


def _check_socket(server: HttpServer | None) -> None:
    """Re-create a socket file that was removed or replaced."""
    if server is None:
        return
    why = server.socket_lost()
    if not why:
        return
    try:
        server.recreate_socket()
    except OSError as exc:
        log.error("the daemon is unreachable: %s, and re-creating it failed: %s", why, exc)
        return
    log.warning("%s; re-created %s", why, server.socket_path)


def _loop(
    service: Service,
    notifier: Notifier,
    flags: _Flags,
    wake: socket.socket,
    server: HttpServer | None = None,
) -> None:
    """React to signals; every tick check the socket file and, when every part of the
    daemon made progress (:class:`~cachemgr.daemon.heartbeat.Heartbeats`), ping systemd's
    watchdog."""
    interval = notifier.watchdog_interval_s
    every = probe_interval(service.heartbeats)
    tick = min(interval, every) if interval else every
    shown: list[str] = []
    while not flags.stop:
        service.heartbeats.beat(MAIN)
        _check_socket(server)
        degraded = service.degraded()
        if degraded != shown:  # STATUS= follows the degraded states
            shown = degraded
            notifier.status(_state(service, degraded))
        if interval and not service.heartbeats.stale():
            notifier.watchdog()
        select.select([wake], [], [], tick)  # blocks: one wake-up per tick when idle
        _drain(wake)
        if flags.reload and not flags.stop:
            flags.reload = False
            notifier.reloading()
            result = service.reload()
            shown = service.degraded()
            state = _state(service, shown)  # what it does now, not "reloaded" for good
            done = "reloaded" if result["reloaded"] else f"reload failed: {result['error']}"
            notifier.send(READY=1, STATUS=f"{state} ({done} at {time.strftime('%H:%M:%S')})")


def _state(service: Service, degraded: list[str]) -> str:
    """systemd's ``STATUS=`` line: ``serving <kernel cache>``, or the degraded states."""
    if degraded:
        return "degraded: " + "; ".join(degraded)
    return f"serving {service.settings.value('kernel_cache_dir')}"


def refuse_root(allow_root: bool) -> None:
    """The daemon compiles for others and removes files in a shared folder: as root a
    mistake (or a planted link) reaches the whole system. Refuse unless told explicitly.

    :raises ConfigError: running as root without ``--allow-root``.
    """
    if os.geteuid() == 0 and not allow_root:
        raise ConfigError(
            "refusing to run the daemon as root: run it as a dedicated user (systemd "
            "User=, see systemd/cachemgr.service) or pass --allow-root"
        )
    if os.geteuid() == 0:
        log.warning("running as root (--allow-root): a dedicated user is safer")


def serve(
    cli_values: dict[str, object],
    config_file: Path | None,
    socket_path: Path | None,
    tcp_port: int | None,
    allow_root: bool = False,
    remotes: Sequence[str] = (),
    govern_only: bool = False,
) -> int:
    """Resolve settings and the ``[daemon]`` table, check the cache root (access, fcntl
    locks, ``lock_fallback``: :mod:`cachemgr.daemon.rootcheck`), then :func:`run`.

    ``govern_only`` (``serve --govern-only``, run as root under
    ``systemd/cachemgr-governor.service``): only the ``[daemon] govern`` roots are governed,
    nothing is compiled and the configured cache root is neither checked nor governed
    (docs/daemon.md#the-privileges-it-needs).

    :raises ConfigError: running as root without ``allow_root``; a bad value (named, with
        the file); a TCP listener without a valid ``tcp_token_file`` — before anything starts.
    :raises CachePermissionError: this user cannot write the kernel cache (one line naming
        the folder, the user, the group and the fix; docs/design.md#sharing-and-locking).
    :raises LocksUnavailable: fcntl locks do not work there and the fallback is "refuse".
    """

    def resolve_with(values: Mapping[str, object], writable: bool = True) -> options.Settings:
        return options.resolve(cli=values, config_file=config_file, writable=writable)

    if not govern_only:  # the governor runs as root by design, capabilities bounded
        refuse_root(allow_root)
    settings = resolve_with(cli_values, writable=not govern_only)
    for problem in settings.problems:
        log.warning("%s", problem)
    where = f"config {config_file or os.environ.get('CACHEMGR_CONFIG', '')} [daemon]"
    config = DaemonConfig.from_table(settings.sections.get("daemon"), where)
    for name in filter(None, (n.strip() for n in config.debug_loggers.split(","))):
        logging.getLogger(name).setLevel(logging.DEBUG)
    check_globs(config.govern, f"{where} govern")  # a bad glob: one line, before anything
    if govern_only:
        return _serve_govern_only(resolve_with, cli_values, config, socket_path, where)
    if tcp_port is not None or config.tcp_port:
        httpauth.load_token(config.tcp_token_file)  # no token, no TCP: say so before anything
        bounds_of(config, where)  # room for authenticated TCP connections
    checked = rootcheck.check_root(cli_values, resolve_with, config)

    def resolve() -> options.Settings:
        return resolve_with(checked.cli_values)

    socket_path = socket_path or default_socket_path()
    remote = remote_config.from_settings(settings, list(remotes))  # a bad --remote: first
    secrets = [Path(config.tcp_token_file)] if config.tcp_token_file else []
    box = _sandbox(settings, config_file, socket_path, [*secrets, *remote.secret_files()])
    return run(resolve, config, socket_path, tcp_port, checked.fallback_note, box, remotes)


def _serve_govern_only(
    resolve_with: Callable[..., options.Settings],
    cli_values: Mapping[str, object],
    config: DaemonConfig,
    socket_path: Path | None,
    where: str,
) -> int:
    """``serve --govern-only``: no compile service, so no cache-root check, no sandbox, no
    TCP listener; the socket answers ``status``, ``stats`` and ``/metrics``.

    :raises ConfigError: ``[daemon] govern`` is empty, or a TCP port is configured.
    """
    if not config.govern:
        raise ConfigError(f"{where}: serve --govern-only needs govern = [globs of cache roots]")
    if config.tcp_port:
        raise ConfigError(f"{where}: serve --govern-only serves no TCP listener (tcp_port)")

    def resolve() -> options.Settings:
        return resolve_with(cli_values, writable=False)

    return run(resolve, config, socket_path or default_socket_path(), govern_only=True)


def _sandbox(
    settings: options.Settings,
    config_file: Path | None,
    socket_path: Path,
    secret_files: list[Path],
) -> sandbox.Sandbox:
    """The compilers' sandbox: the daemon user's private folders — HOME,
    state, config and runtime folders, and the folders of ``secret_files`` (the TCP token,
    remotes' password and token files) — hidden from every compiler process it runs.

    :raises ConfigError: a bad ``[sandbox]`` table.
    """
    config = config_file or os.environ.get("CACHEMGR_CONFIG")
    private = [Path.home(), state_dir(), socket_path.parent]
    private += [p.absolute().parent for p in secret_files]
    if config:
        private.append(Path(config).absolute().parent)
    box = sandbox.from_table(settings.sections.get("sandbox"), private)
    process.use_sandbox(box)
    return box
