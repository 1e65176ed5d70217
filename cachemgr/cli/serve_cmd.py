"""``cachemgr serve``: run the daemon (systemd ``Type=notify`` service or in a terminal)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from cachemgr.daemon import main as daemon_main


@click.command("serve")
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
    help="Unix socket (default $RUNTIME_DIRECTORY or $XDG_RUNTIME_DIR/cachemgr).",
)
@click.option(
    "--tcp-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Also listen on 127.0.0.1:PORT (0 = pick a free port).",
)
def serve_cmd(
    config_file: Path | None,
    op_compiler_cache_dir: str | None,
    host_id: str | None,
    socket_path: Path | None,
    tcp_port: int | None,
) -> None:
    """Run the cache daemon until SIGTERM (exit 0 after running compiles finish)."""
    root = logging.getLogger()
    if root.level > logging.INFO:
        root.setLevel(logging.INFO)
    cli_values = {"op_compiler_cache_dir": op_compiler_cache_dir, "host_id": host_id}
    sys.exit(daemon_main.serve(cli_values, config_file, socket_path, tcp_port))
