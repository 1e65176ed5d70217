"""Shared pieces of the CLI (layer 9): common options, settings loading, output helpers."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from cachemgr import options
from cachemgr.client import Client, default_socket_path
from cachemgr.errors import CacheMgrError
from cachemgr.options import Settings

F = TypeVar("F", bound=Callable[..., Any])


def settings_options(func: F) -> F:
    """Add ``--cache-dir``, ``--host-id``, ``--soc`` and ``--config`` to a command."""
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
        click.option("--soc", "soc_version", metavar="SOC", help="Only this chip folder."),
        click.option(
            "--config",
            "config_file",
            type=click.Path(dir_okay=False, path_type=Path),
            help="TOML config file (env CACHEMGR_CONFIG).",
        ),
    ]
    for deco in reversed(decorators):
        func = deco(func)
    return func


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
    warning line on stderr (SPEC §1)."""
    cli = {
        "op_compiler_cache_dir": op_compiler_cache_dir,
        "host_id": host_id,
        "soc_version": soc_version,
        **extra,
    }
    settings = options.resolve(cli=cli, config_file=config_file, writable=writable)
    if warn:
        for problem in settings.problems:
            warning(problem)
    return settings


def chip_dirs(settings: Settings) -> list[Path]:
    """The chip folders to act on: the one of ``--soc`` or every existing one."""
    soc = settings.value("soc_version")
    kcache = settings.layout.kernel_cache_dir
    if soc:
        chip = settings.layout.chip_dir(soc)
        if not chip.is_dir():
            warning(f"no chip folder {soc} at {chip} (from --soc); nothing there")
        return [chip]
    if not kcache.is_dir():
        origin = settings["kernel_cache_dir"]
        warning(f"no kernel cache at {kcache} (from {origin.origin} {origin.source}) yet")
    return settings.layout.chip_dirs()


def warning(message: str) -> None:
    """One warning line on stderr."""
    click.echo(f"cachemgr: warning: {message}", err=True)


def emit_json(data: Any) -> None:
    """Print ``data`` as one JSON document on stdout."""
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def stdout_is_tty() -> bool:
    """True when stdout is a terminal (progress bars and prompts only then)."""
    return sys.stdout.isatty()


def socket_option(func: F) -> F:
    """Add ``--socket PATH``: the daemon to route to (env ``CACHEMGR_SOCKET``, else default)."""
    return click.option(
        "--socket",
        "socket_path",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Daemon socket (env CACHEMGR_SOCKET, else the default); used when it answers.",
    )(func)


def find_daemon(socket_path: Path | None, settings: Settings) -> Client | None:
    """A client of the daemon that serves this cache, or None to run in-process.

    None when nothing answers on the socket, or when the daemon serves another kernel cache
    than the one these settings name (e.g. ``--cache-dir`` points elsewhere).
    """
    # one-shot commands send everything to the daemon, which counts each hit itself
    daemon_user = settings.sections.get("daemon", {}).get("user") or None
    client = Client(
        socket_path or default_socket_path(),
        timeout_s=3600,
        local_hits=False,
        daemon_user=daemon_user if isinstance(daemon_user, str) else None,
    )
    if not client.available():  # raises UntrustedDaemon (exit 2) for a socket of a stranger
        return None
    try:
        theirs = client.config()["kernel_cache_dir"]["value"]
    except (CacheMgrError, KeyError, TypeError):
        return None
    ours = str(settings.layout.kernel_cache_dir)
    if theirs != ours:
        logging.getLogger(__name__).info("daemon serves %s, not %s: running here", theirs, ours)
        return None
    return client
