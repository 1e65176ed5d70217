"""Shared pieces of the CLI (layer 9): common options, settings loading, output helpers."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from cachemgr import options
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
    if soc:
        return [settings.layout.chip_dir(soc)]
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
