"""``cachemgr serve``: run the daemon (systemd ``Type=notify`` service or in a terminal);
``cachemgr status``: is one answering."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cachemgr.cli.common import (
    SafeFormatter,
    Seconds,
    cache_options,
    daemon_socket_option,
    emit_json,
    failure,
    load_settings,
    printable,
    refused_by_daemon,
    remote_option,
    report_line,
    same_cache_hint,
    same_folder,
    unreached_exit_code,
    warning,
)
from cachemgr.client import Client, DaemonError, DaemonUnavailable, default_socket_path
from cachemgr.daemon import main as daemon_main
from cachemgr.errors import CacheMgrError, ConfigError
from cachemgr.storage import fsutil
from cachemgr.words import plural

if TYPE_CHECKING:
    from cachemgr.config.options import Settings

#: The daemon's log line outside journald: every line carries its time.
TIMESTAMPED = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _under_journald() -> bool:
    """True when stderr is journald's stream (systemd sets ``JOURNAL_STREAM`` to its
    ``device:inode``; a redirected stderr no longer matches)."""
    value = os.environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in value.split(":"))
        st = os.fstat(2)
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


@click.command("serve", short_help="Run the cache daemon until SIGTERM.")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML config file (env CACHEMGR_CONFIG); SIGHUP re-reads it.",
)
@click.option(
    "--cache-dir",
    "op_compiler_cache_dir",
    metavar="DIR",
    help="op_compiler_cache_dir: cache root (kernel cache at DIR/kernel_cache).",
)
@click.option("--host-id", metavar="ID", help="Host id for ASCEND_CACHE_PATH/kernel_cache_<ID>.")
@click.option(
    "--socket",
    "socket_path",
    type=click.Path(path_type=Path),
    help="Unix socket (default: $CACHEMGR_SOCKET, else cachemgr.sock in $RUNTIME_DIRECTORY, "
    "else in $XDG_RUNTIME_DIR/cachemgr, else in /tmp/cachemgr-UID).",
)
@click.option(
    "--tcp-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Also listen on 127.0.0.1:PORT (0 = pick a free port).",
)
@click.option(
    "--allow-root",
    is_flag=True,
    help="Run even as root (refused otherwise: use a dedicated user).",
)
@click.option(
    "--govern-only",
    is_flag=True,
    help="Only keep the [daemon] govern roots within their limits: no compiles (runs as "
    "root, see systemd/cachemgr-governor.service).",
)
@remote_option
def serve_cmd(
    config_file: Path | None,
    op_compiler_cache_dir: str | None,
    host_id: str | None,
    socket_path: Path | None,
    tcp_port: int | None,
    allow_root: bool,
    govern_only: bool,
    remotes: tuple[str, ...],
) -> None:
    """Run the cache daemon until SIGTERM (exit 0 after running compiles finish)."""
    root = logging.getLogger()
    if root.level > logging.INFO:
        root.setLevel(logging.INFO)
    if not _under_journald():  # journald stamps each line itself
        for handler in root.handlers:
            handler.setFormatter(SafeFormatter(TIMESTAMPED))
    cli_values: dict[str, object] = {
        "op_compiler_cache_dir": op_compiler_cache_dir,
        "host_id": host_id,
    }
    sys.exit(
        daemon_main.serve(
            cli_values, config_file, socket_path, tcp_port, allow_root, remotes, govern_only
        )
    )


@click.command("status", short_help="Tell whether a daemon answers, with its pid and uptime.")
@daemon_socket_option
@click.option(
    "--wait",
    "wait_s",
    type=Seconds(),
    default=0.0,
    help="Wait up to this many seconds for the daemon to answer.",
)
@click.option("--json", "as_json", is_flag=True, help="The daemon's /health answer as JSON.")
@cache_options
def status_cmd(socket_path: Path | None, wait_s: float, as_json: bool, **kw: Any) -> None:
    """Is a daemon answering? Its pid, uptime, degraded states and a refused reload.

    The line names the kernel cache it serves (--json: kernel_cache_dir). With --cache-dir,
    --host-id or --config: whether it serves that cache.

    Exit codes: 0 a daemon answers (and serves that cache); 1 none answers (within --wait
    seconds), or the one that answers serves another cache; 2 this user may not reach it
    (its socket or a folder on the way is closed to it) or does not trust its socket.
    """
    settings = _named_cache(kw)
    client = _client(socket_path, settings, timeout_s=5)
    deadline = time.monotonic() + wait_s
    delay = 0.02
    while True:
        try:
            health = client.health()
            break
        except CacheMgrError as exc:
            if time.monotonic() >= deadline:
                failure(str(exc))
                sys.exit(unreached_exit_code(exc))
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.5)
    other = _serves_other(client, settings, "status")
    if as_json:
        emit_json(health)
    else:
        served = _served(health, settings, other)
        click.echo(
            f"cachemgr daemon {health['status']}: pid {health['pid']}, "
            f"up {health['uptime_s']:.0f} s, socket {client.socket_path}{served}"
        )
        for line in status_lines(health):
            click.echo(line)
        status_warnings(health)
    if other:
        click.echo(f"cachemgr: {other}", err=True)
        sys.exit(1)


def _served(health: dict[str, Any], settings: Settings | None, other: str) -> str:
    """``, serves <kernel cache>`` for ``status``'s line: the cache this command named when
    the daemon serves it (by that name), else the one ``/health`` says it serves; nothing
    from a daemon that does not say (an older one) or governs only."""
    if settings is not None and not other:
        return f", serves {settings.layout.kernel_cache_dir}"
    theirs = health.get("kernel_cache_dir")
    if isinstance(theirs, str) and theirs and not health.get("govern_only"):
        return f", serves {printable(theirs)}"
    return ""


def _named_cache(kw: dict[str, Any]) -> Settings | None:
    """The cache ``status``/``stop`` were told about (``--cache-dir``, ``--host-id``,
    ``--config``, resolved as every command resolves them:
    docs/configuration.md), or None when none of them was given: then any daemon at the
    socket is the one meant.

    :raises ConfigError: a bad value (one line naming it and its origin).
    """
    if not any(kw.get(k) for k in ("op_compiler_cache_dir", "host_id", "config_file")):
        return None
    return load_settings(soc_version=None, writable=False, **kw)


def _client(socket_path: Path | None, settings: Settings | None, timeout_s: float) -> Client:
    """The client of the daemon at ``--socket`` (else the default socket), trusting the
    ``[daemon] user`` of the named config file as the other commands do."""
    user = settings.sections.get("daemon", {}).get("user") if settings else None
    return Client(
        socket_path or default_socket_path(),
        timeout_s=timeout_s,
        local_hits=False,
        daemon_user=user if isinstance(user, str) and user else None,
    )


def _serves_other(client: Client, settings: Settings | None, command: str) -> str:
    """``""`` when the daemon serves the cache of ``settings`` (or none was named), else the
    line that says which cache it serves, which this command named and how to reach it.

    :raises CacheMgrError: the daemon does not answer ``/config``.
    """
    if settings is None:
        return ""
    theirs_settings = client.config(sections=True)["settings"]
    theirs = str(theirs_settings["kernel_cache_dir"]["value"])
    ours = settings.layout.kernel_cache_dir
    if same_folder(theirs, str(ours)):
        return ""
    kc = settings["kernel_cache_dir"]
    return (
        f"{command}: the daemon at {client.socket_path} serves {theirs}, not this command's "
        f"{ours} (from {kc.origin} {kc.source}".rstrip()
        + f"); to name its cache, {same_cache_hint(theirs_settings)}"
    )


def status_warnings(health: dict[str, Any]) -> None:
    """``/health``'s warnings (a cache every local user can read, a weakened remote tier) as
    ``cachemgr: warning: …`` lines on stderr, none with ``-q``, as every command's
    warnings (docs/commands.md#options-every-command-shares)."""
    for line in health.get("warnings") or []:
        warning(str(line).removeprefix("warning: "))


def status_lines(health: dict[str, Any]) -> list[str]:
    """The last reload when it was refused, the degraded states and the first scan's
    progress from ``/health`` (its warnings are :func:`status_warnings`)."""
    lines = []
    if health.get("govern_only"):
        lines.append("govern only: no compiles here (serve --govern-only)")
    reload = health.get("last_reload")
    if isinstance(reload, dict) and reload.get("ok") is False:
        lines.append(
            f"last reload failed at {reload.get('at')}: {reload.get('error')}; the daemon "
            "runs on the configuration it had before"
        )
    scan = health.get("scan")
    if isinstance(scan, dict) and scan.get("state") != "done" and not health.get("govern_only"):
        lines.append(
            f"first scan: {scan.get('state')}, {scan.get('chip_folders_done')} of "
            f"{plural(int(scan.get('chip_folders_total') or 0), 'chip folder')}, "
            f"{plural(int(scan.get('files') or 0), 'file')}, "
            f"{scan.get('seconds')} s"
        )
    for problem in health.get("degraded") or []:
        lines.append(f"degraded: {problem}")
    governed = health.get("governed")
    if isinstance(governed, dict):
        from cachemgr.cli.governed import governed_lines

        lines += governed_lines(governed, detail=False)
    stuck = health.get("stuck")
    if stuck:
        lines.append(f"no progress in: {', '.join(stuck)} (systemd's watchdog will restart it)")
    remotes = health.get("remotes")
    for name, row in sorted(remotes.items()) if isinstance(remotes, dict) else ():
        lines.append(
            f"remote {name}: {row.get('state')}, {row.get('hits', 0)} hits, "
            f"{row.get('misses', 0)} misses, {row.get('errors', 0)} errors, "
            f"{row.get('bytes_in', 0)} bytes in, {row.get('bytes_out', 0)} bytes out"
        )
    return lines


@click.command("stop", short_help="Stop the daemon and wait until it has exited.")
@daemon_socket_option
@click.option(
    "--wait",
    "wait_s",
    type=Seconds(),
    default=120.0,
    show_default=True,
    help="Seconds to wait for running compiles to finish and the daemon to exit.",
)
@cache_options
def stop_cmd(socket_path: Path | None, wait_s: float, **kw: Any) -> None:
    """Ask the daemon to stop (like sccache --stop-server); wait until it has exited.

    The daemon stops as on SIGTERM: it takes no new work, lets running compiles finish
    and exits 0. Only its own user or root may stop it (root trusts the socket of a daemon
    running as another user when CACHEMGR_DAEMON_USER names that user). With --cache-dir,
    --host-id or --config it stops the daemon only when it serves that cache.

    Exit codes: 0 it stopped; 1 no daemon answers, or it is still running after --wait
    seconds; 2 the caller may not stop it or may not reach it (its socket or a folder on
    the way is closed to it), the socket belongs to a user not trusted, or the daemon
    serves another cache than the one named (it keeps running).
    """
    settings = _named_cache(kw)
    client = _client(socket_path, settings, timeout_s=30)
    try:
        other = _serves_other(client, settings, "stop")
        if other:
            raise ConfigError(f"{other}; nothing stopped")
        answer = client.request("POST", "/stop")
    except DaemonUnavailable as exc:
        failure(str(exc))
        sys.exit(unreached_exit_code(exc))
    except DaemonError as exc:
        if exc.status != 403:
            raise
        line = refused_by_daemon(exc, "stop", client.socket_path, "nothing stopped")
        raise DaemonError(line, exc.status) from exc
    pid = answer.get("pid")
    deadline = time.monotonic() + wait_s
    delay = 0.02
    while client.available() or _alive(pid):
        if time.monotonic() >= deadline:
            click.echo(
                f"cachemgr: daemon pid {pid} is still finishing its compiles after "
                f"{wait_s:g} s (socket {client.socket_path})",
                err=True,
            )
            sys.exit(1)
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
    report_line(f"cachemgr daemon pid {pid} stopped (socket {client.socket_path})")


def _alive(pid: object) -> bool:
    """True while process ``pid`` (the daemon, same host) exists."""
    if not isinstance(pid, int) or not fsutil.pid_alive(pid):
        return False
    try:  # an exited child its parent has not reaped yet is a zombie: it has stopped
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True
