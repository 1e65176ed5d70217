"""Shared pieces of the CLI (layer 9): common options, settings loading, output helpers."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import click

from cachemgr.console import VERBOSITY as VERBOSITY  # re-exported: the CLI's modules
from cachemgr.console import SafeFormatter as SafeFormatter
from cachemgr.console import Verbosity as Verbosity
from cachemgr.console import json_text, warning_line
from cachemgr.console import printable as printable
from cachemgr.constants import MAX_SECONDS
from cachemgr.errors import CacheMgrError, ConfigError

if TYPE_CHECKING:  # imported where used: `cachemgr --help` needs neither
    from cachemgr.client import Client
    from cachemgr.config.options import Settings

F = TypeVar("F", bound=Callable[..., Any])


if TYPE_CHECKING:  # click ≥ 8.2 makes ParamType generic; 8.1 (allowed) cannot subscript it
    _ParamType: TypeAlias = click.ParamType[float, Any]
else:
    _ParamType = click.ParamType


class Seconds(_ParamType):
    """A finite number of seconds within ``lo``..``MAX_SECONDS`` (``lo`` excluded when
    ``lo_open``): ``--timeout nan`` or ``inf`` was a raw Python error after the request was
    read (exit 1), ``status --wait nan`` waited forever; now one line, exit 2."""

    name = "seconds"

    def __init__(self, lo: float = 0.0, lo_open: bool = False) -> None:
        self.lo, self.lo_open = lo, lo_open

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """:raises click.BadParameter: (via ``fail``) not a number in the range."""
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = math.nan
        low_ok = seconds > self.lo if self.lo_open else seconds >= self.lo
        if not (math.isfinite(seconds) and low_ok and seconds <= MAX_SECONDS):
            top = MAX_SECONDS
            span = f"over {self.lo:g}, at most {top:g}" if self.lo_open else f"{self.lo:g}..{top:g}"
            self.fail(f"{value!r} is not a number of seconds {span}", param, ctx)
        return seconds


def settings_options(func: F) -> F:
    """Add ``--cache-dir``, ``--host-id``, ``--soc`` and ``--config`` to a command."""
    return _with_settings_options(func, soc=True)


def cache_options(func: F) -> F:
    """Add ``--cache-dir``, ``--host-id`` and ``--config``: which kernel cache, for a command
    that acts on all its chip folders (no ``--soc``; e.g. ``limits``)."""
    return _with_settings_options(func, soc=False)


def _with_settings_options(func: F, soc: bool) -> F:
    decorators = [
        click.option(
            "--cache-dir",
            "op_compiler_cache_dir",
            metavar="DIR",
            help="op_compiler_cache_dir: cache root (kernel cache at DIR/kernel_cache).",
        ),
        click.option(
            "--host-id",
            metavar="ID",
            help="Host id for ASCEND_CACHE_PATH/kernel_cache_<ID> (env CACHEMGR_HOST_ID).",
        ),
    ]
    if soc:
        decorators.append(
            click.option("--soc", "soc_version", metavar="SOC", help="Only this chip folder.")
        )
    decorators.append(
        click.option(
            "--config",
            "config_file",
            type=click.Path(dir_okay=False, path_type=Path),
            help="TOML config file (env CACHEMGR_CONFIG).",
        )
    )
    for deco in reversed(decorators):
        func = deco(func)
    return func


def remote_option(func: F) -> F:
    """Add ``--remote URL`` (repeatable): the remote tiers, in lookup order.
    Given, it replaces ``CACHEMGR_REMOTE_STORAGE`` and ``[remote] storage``."""
    return click.option(
        "--remote",
        "remotes",
        multiple=True,
        metavar="URL",
        help=(
            "A remote tier, e.g. redis://host:6379/0 or 'http://host:8080/cache|layout=bazel' "
            "(repeatable, asked in order; replaces CACHEMGR_REMOTE_STORAGE and [remote] "
            "storage)."
        ),
    )(func)


def load_settings(
    op_compiler_cache_dir: str | None,
    host_id: str | None,
    soc_version: str | None,
    config_file: Path | None,
    warn: bool = True,
    writable: bool = True,
    **extra: Any,
) -> Settings:
    """Resolve settings from the command line and environment; print each problem as a
    warning line on stderr (docs/design.md#options-and-their-origins)."""
    cli = {
        "op_compiler_cache_dir": op_compiler_cache_dir,
        "host_id": host_id,
        "soc_version": soc_version,
        **extra,
    }
    from cachemgr.config import options

    settings = options.resolve(cli=cli, config_file=config_file, writable=writable)
    if warn:
        for problem in settings.problems:
            warning(problem)
    return settings


def chip_dirs(settings: Settings) -> list[Path]:
    """The chip folders to act on: the one of ``--soc`` or every existing one, with a
    warning line when that folder or the kernel cache is missing
    (:func:`cachemgr.localstats.chip_dirs`)."""
    from cachemgr import localstats

    return localstats.chip_dirs(settings, warning)


def warn_if_no_kernel_cache(settings: Settings) -> None:
    """One warning line when the resolved kernel cache folder does not exist
    (:func:`cachemgr.localstats.warn_if_no_kernel_cache`)."""
    from cachemgr import localstats

    localstats.warn_if_no_kernel_cache(settings, warning)


def warning(message: str) -> None:
    """One warning line on stderr (not with ``-q``)."""
    if VERBOSITY.level < 0:
        return
    click.echo(warning_line(message), err=True)


def error_line(message: str) -> str:
    """``cachemgr: error: MESSAGE``, safe for a terminal."""
    return printable(f"cachemgr: error: {message}")


def failure(message: str) -> None:
    """A line that explains a non-zero exit (a file not removed, a chip folder skipped or
    over its limit): ``cachemgr: error: …`` on stderr at every verbosity, ``-q`` included —
    one label for one exit code, never left unexplained (docs/commands.md, "Options every
    command shares")."""
    click.echo(error_line(message), err=True)


def refused_by_daemon(exc: CacheMgrError, command: str, socket: object, outcome: str) -> str:
    """The line for an admin request the daemon refused (``403``: only its user and root may,
    docs/security.md#5a-admin-endpoints-the-daemons-user-and-root-only), worded as the CLI's
    other refusals — ``<command>: <why>; <what did not happen>`` — not the endpoint's raw
    ``/stop: only …``: ``stop: refused by the daemon at SOCK: only the daemon's user (…) or
    root may, …; nothing stopped``."""
    why = str(exc)
    if why.startswith("/"):  # the daemon names its endpoint first
        why = why.partition(": ")[2] or why
    return f"{command}: refused by the daemon at {socket}: {why}; {outcome}"


def unreached_exit_code(exc: CacheMgrError) -> int:
    """``status``'s and ``stop``'s exit code when the daemon was not reached: 2 when this
    user may not reach it (``EACCES`` on its socket or a folder on the way) or does not trust
    its socket — as ``stats``, routed there, exits — else 1: none answers (docs/commands.md)."""
    from cachemgr.client import DaemonOutOfReach
    from cachemgr.sockcheck import UntrustedDaemon

    return 2 if isinstance(exc, (DaemonOutOfReach, UntrustedDaemon)) else 1


def report_line(line: str, failed: bool = False, err: bool = False) -> None:
    """A line of what a command did (``compiled …``, gc's and purge's reports, ``verify``'s
    count): on stdout (``err``: stderr) at default verbosity, not with ``-q`` (errors only) —
    unless it tells a failure (``failed``), which ``-q`` shows as an error line. What a
    command is asked to show (``ls``, ``stats``, ``config``, any ``--json``) is not a
    report: it is printed whatever the verbosity."""
    if VERBOSITY.level >= 0:
        click.echo(line, err=err)
    elif failed:
        click.echo(error_line(line), err=True)


def int_option(raw: str | None, option: str, low: int, high: int, accepted: str = "") -> int | None:
    """A strict integer option value in ``low..high`` (no unit suffix), or None when the
    option was not given.

    :param accepted: the accepted values in words (default ``an integer low..high``).
    :raises ConfigError: anything else, as every bad value is worded
        (``--ratio='180' (from option) is invalid; accepted: an integer 0..100``).
    """
    if raw is None:
        return None
    try:
        value: int | None = int(raw.strip())
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        words = accepted or f"an integer {low}..{high}"
        raise ConfigError(f"{option}={raw!r} (from option) is invalid; accepted: {words}")
    return value


def emit_json(data: Any) -> None:
    """Print ``data`` as one JSON document on stdout."""
    click.echo(json_text(data))


def stdout_is_tty() -> bool:
    """True when stdout is a terminal (progress bars and prompts only then). A process started
    with stdout closed (``sys.stdout`` is None) has none: ``click.echo`` skips its output."""
    return sys.stdout is not None and sys.stdout.isatty()


def daemon_socket_option(func: F) -> F:
    """Add ``--socket PATH`` for commands that talk only to a daemon (status, stop)."""
    return click.option(
        "--socket",
        "socket_path",
        type=click.Path(dir_okay=False, path_type=Path),
        help="The daemon's socket (env CACHEMGR_SOCKET, else the default socket).",
    )(func)


def socket_option(func: F) -> F:
    """Add ``--socket PATH`` and ``--local``: where the command runs (see :func:`route`)."""
    func = click.option(
        "--local",
        "run_local",
        is_flag=True,
        help="Run in this process, never through a daemon.",
    )(func)
    return click.option(
        "--socket",
        "socket_path",
        type=click.Path(dir_okay=False, path_type=Path),
        help=(
            "The daemon to run through (env CACHEMGR_SOCKET); an error when no daemon "
            "answers there or it serves another cache. Without it (and without --local) "
            "the default socket is used when its daemon serves this cache, else this process."
        ),
    )(func)


@dataclass(frozen=True)
class Route:
    """Where a command runs: through a daemon (``via="daemon"``) or in this process.

    :ivar socket: the daemon's socket (None in process).
    :ivar reason: why, in a few words (shown with ``-v`` and in ``--json``).
    :ivar notice: a line every run shows (not with ``-q``): a daemon passed by that the
        operator may have meant (docs/commands.md, "Routing").
    """

    via: str
    client: Client | None
    socket: str | None
    reason: str
    notice: str = ""

    def to_json(self) -> dict[str, Any]:
        """``{"via", "socket", "reason"}``."""
        return {"via": self.via, "socket": self.socket, "reason": self.reason}

    def announce(self) -> None:
        """The notice, if any, as a warning line; with ``-v`` one line on stderr: where the
        command runs and why."""
        if self.notice:
            warning(self.notice)
        if VERBOSITY.level > 0:
            where = f"daemon at {self.socket}" if self.via == "daemon" else "this process"
            click.echo(f"cachemgr: route: {where} ({self.reason})", err=True)


def route(
    socket_path: Path | None,
    run_local: bool,
    settings: Settings,
    local_only: str | None = None,
) -> Route:
    """Decide explicitly where a command runs.

    * ``--local``: in this process.
    * ``--socket PATH`` or ``$CACHEMGR_SOCKET``: that daemon, or an error (exit 2) when
      none answers there or it serves another kernel cache than these settings name.
    * neither: the default socket when a daemon there serves this kernel cache, else in
      this process.

    :param local_only: an option given on the command line that only works in this process
        (e.g. ``--workers``): it routes here unless a socket was named explicitly (then it is
        an error).
    :raises ConfigError: ``--local`` with a socket, an explicit socket without a daemon or
        with a daemon of another cache, or ``local_only`` with an explicit socket.
    """
    env_socket = os.environ.get("CACHEMGR_SOCKET")
    named = (
        (f"--socket={socket_path} (from option)", socket_path)
        if socket_path
        else (f"CACHEMGR_SOCKET={env_socket} (from env)", Path(env_socket))
        if env_socket
        else None
    )
    if run_local:
        if socket_path:
            raise ConfigError("--local and --socket (from option) exclude each other; pick one")
        return Route("local", None, None, "--local")
    if named is not None and local_only:
        origin, path = named
        raise ConfigError(
            f"{local_only} (from option) works only in this process, but {origin} "
            "names a daemon; drop one of them"
        )
    if local_only:
        return Route("local", None, None, f"{local_only} runs the command in this process")
    from cachemgr.client import Client, DaemonOutOfReach, default_socket_path
    from cachemgr.sockcheck import UntrustedDaemon

    path = named[1] if named else default_socket_path()
    if named is None and not os.path.lexists(path):  # no daemon: no HTTP client to import
        return Route("local", None, None, f"no daemon answers at the default socket {path}")
    daemon_user = settings.sections.get("daemon", {}).get("user") or None
    client = Client(
        path,
        timeout_s=3600,
        local_hits=False,
        daemon_user=daemon_user if isinstance(daemon_user, str) else None,
    )
    ours = str(settings.layout.kernel_cache_dir)
    try:
        # the answer with sections is the one a compile's local preparation asks for next:
        # remembered by the client, one round trip serves both
        their_settings = client.config(sections=True)["settings"]
        theirs = their_settings["kernel_cache_dir"]["value"]
    except UntrustedDaemon:  # a socket of a stranger: refused, never silently local (exit 2)
        raise
    except (CacheMgrError, KeyError, TypeError) as exc:
        if named is not None and isinstance(exc, DaemonOutOfReach):  # not for this user
            raise ConfigError(f"{named[0]}: {exc}") from exc
        if named is not None:
            raise ConfigError(
                f"{named[0]}: no cachemgr daemon answers there ({exc}); "
                "start one with `cachemgr serve --socket PATH` or use --local"
            ) from exc
        return Route("local", None, None, f"no daemon answers at the default socket {path}")
    if not same_folder(theirs, ours):
        if named is not None:
            kc = settings["kernel_cache_dir"]
            raise ConfigError(
                f"the daemon at {named[0]} serves {theirs}, but this command resolved "
                f"{ours} (from {kc.origin} {kc.source}".rstrip()
                + f"); {same_cache_hint(their_settings)}, else use --local"
            )
        return Route(
            "local",
            None,
            None,
            f"the daemon at the default socket {path} serves {theirs}",
            _passed_by(path, theirs, settings, their_settings),
        )
    origin = named[0].split("=")[0] if named else "the default socket"
    return Route("daemon", client, str(path), f"{origin}; it serves {ours}")


def _passed_by(path: Path, theirs: str, settings: Settings, their_settings: dict[str, Any]) -> str:
    """The line for a daemon on the default socket that serves another cache: the command
    runs in this process on its own cache, and says so — which daemon, which cache, how to
    reach it — instead of changing cache without a word."""
    kc = settings["kernel_cache_dir"]
    ours = f"{settings.layout.kernel_cache_dir} (from {kc.origin} {kc.source}".rstrip() + ")"
    config = _config_file_of(their_settings)
    reach = same_cache_hint(their_settings)
    if config:
        reach += f" or set CACHEMGR_CONFIG={config} (the daemon's config file)"
    return (
        f"the daemon at the default socket {path} serves {theirs}, not this command's {ours}: "
        f"running in this process; to use the daemon, {reach}; --local runs here without "
        "this line"
    )


def _config_file_of(their_settings: dict[str, Any]) -> str | None:
    """The config file a daemon took its cache folder from (its ``/config`` origin
    ``config FILE:LINE``), or None when the folder came from elsewhere."""
    for name in ("op_compiler_cache_dir", "kernel_cache_dir"):
        source = str((their_settings.get(name) or {}).get("source") or "")
        if source.startswith("config "):
            rest = source.removeprefix("config ")
            file, _, line = rest.rpartition(":")
            return file if file and line.isdigit() else rest
    return None


def same_folder(theirs: object, ours: str) -> bool:
    """Whether the daemon's kernel cache folder ``theirs`` (its ``/config`` answer's value) is
    this command's ``ours``: the same path, or two names (a link, a bind mount) of one folder
    (the same device and inode, as :func:`os.path.samefile` says)."""
    if not isinstance(theirs, str):
        return False
    if theirs == ours:
        return True
    try:
        return os.path.samefile(theirs, ours)
    except (OSError, ValueError):  # either is gone or unreadable here: not shown the same
        return False


def same_cache_hint(their_settings: dict[str, Any]) -> str:
    """What to add to this command so that it resolves the kernel cache a daemon serves, from
    the daemon's ``/config`` settings: ``pass --cache-dir D`` (D the daemon's cache root,
    absolute), or for a per-host ``kernel_cache_<id>`` under ``$ASCEND_CACHE_PATH`` (which no
    ``--cache-dir`` names) the variable and ``--host-id``."""
    kc = their_settings.get("kernel_cache_dir") or {}
    kernel_cache = Path(str(kc.get("value", "")))
    if kernel_cache.name != "kernel_cache":
        host_id = (their_settings.get("host_id") or {}).get("value") or ""
        return (
            f"set ASCEND_CACHE_PATH={kernel_cache.parent} and pass --host-id {host_id} "
            "(as the daemon has them)"
        )
    return f"pass --cache-dir {kernel_cache.parent} (as the daemon has it)"


def daemon_of_this_cache(settings: Settings, timeout_s: float = 1.0) -> tuple[Path, int] | None:
    """The socket of a daemon that serves this kernel cache (``$CACHEMGR_SOCKET``, else the
    default socket) and how often it saves its counters (seconds), or None when none answers
    there within ``timeout_s`` seconds, it serves another cache or is not trusted. Cheap: no
    socket file, no connection."""
    from cachemgr.client import Client, default_socket_path
    from cachemgr.config.configfile import DaemonConfig

    env_socket = os.environ.get("CACHEMGR_SOCKET")
    path = Path(env_socket) if env_socket else default_socket_path()
    if not os.path.lexists(path):
        return None
    daemon_user = settings.sections.get("daemon", {}).get("user") or None
    client = Client(
        path,
        timeout_s=timeout_s,
        local_hits=False,
        daemon_user=daemon_user if isinstance(daemon_user, str) else None,
    )
    try:
        answer = client.config(sections=True)
        theirs = answer["settings"]["kernel_cache_dir"]["value"]
        if not same_folder(theirs, str(settings.layout.kernel_cache_dir)):
            return None
        table = (answer.get("sections") or {}).get("daemon")
        interval_s = DaemonConfig.from_table(table).counters_save_interval_s
    except (CacheMgrError, OSError, KeyError, TypeError, AttributeError):
        return None
    return path, round(interval_s)


def find_daemon(socket_path: Path | None, settings: Settings) -> Client | None:
    """A client of the daemon :func:`route` chooses, or None to run in-process.

    :raises ConfigError: as :func:`route`.
    """
    return route(socket_path, False, settings).client
