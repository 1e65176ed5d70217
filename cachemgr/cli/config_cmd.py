"""``cachemgr config``: every resolved value with its origin (SPEC §1, like ``ccache -p``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from cachemgr.cli.common import emit_json, load_settings, remote_option, settings_options
from cachemgr.config import options, versions
from cachemgr.config.options import Settings
from cachemgr.errors import ConfigError
from cachemgr.remote import config as remote_config

#: The order ``config`` prints in (SPEC §1, §2, §5, §7), then anything else.
SHOWN = (
    "op_compiler_cache_mode",
    "op_compiler_cache_dir",
    "host_id",
    "kernel_cache_dir",
    "governed_kernel_caches",
    "ini_path",
    "max_op_cache_size",
    "remain_cache_size_ratio",
    "min_age_s",
    "soc_version",
    "jit_compile",
    "op_debug_level",
    "op_debug_config",
    "debug_dir",
    "kernel_meta_dir",
)


def _toolkit_rows(settings: Settings) -> dict[str, dict[str, Any]]:
    """The installed toolkit's versions and where they were found, GE's way (SPEC §5)."""
    installed = versions.installed_versions(os.environ, settings.sections)
    rows = {}
    for name, found in (("adk_version", installed.adk), ("ops_version", installed.ops)):
        origin = "toolkit" if found.value else "unknown"
        if found.source.startswith("config "):
            origin = "option"
        rows[f"installed_{name}"] = {"value": found.value, "origin": origin, "source": found.source}
    return rows


def _remote_row(settings: Settings, cli: tuple[str, ...] = ()) -> dict[str, Any]:
    """The remote tiers (issue 15 item 2), passwords redacted; a bad spec is one line, exit 2.

    :raises click.ClickException: never; a bad spec exits 2 with its (redacted) message.
    """
    try:
        remotes = remote_config.from_settings(settings, list(cli))
    except ConfigError as exc:
        click.echo(f"cachemgr: {exc}", err=True)
        sys.exit(2)
    source = "" if remotes.origin == "default" else remotes.origin
    origin = "default" if not source else ("env" if source == remote_config.ENV_VAR else "file")
    if source == "--remote":
        origin = "option"
    return {"value": remotes.display, "origin": origin, "source": source}


def _shown(value: Any) -> str:
    """A value as the config file would spell it (lists and tables as JSON), unset empty."""
    if value is None:
        return ""
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


@click.command("config")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object: {name: {value, origin, source}}; table settings as table.key.",
)
@settings_options
@remote_option
def config_cmd(
    as_json: bool,
    op_compiler_cache_dir: str | None,
    host_id: str | None,
    soc_version: str | None,
    config_file: Path | None,
    remotes: tuple[str, ...],
) -> None:
    """Show every setting of every table, its value and where it came from.

    The options first, then each table of the config file ([daemon], [sandbox], [compilers],
    [precompiled], [toolkit]) as table.key, set or default. Exits 2 when a value was invalid
    and a fallback was used (each is named on stderr), or when the config file has an unknown
    table or key or a bad value (one line naming file, line, key, value and what is accepted).
    """
    settings = load_settings(op_compiler_cache_dir, host_id, soc_version, config_file)
    data = settings.to_json()
    names = [n for n in SHOWN if n in data] + sorted(set(data) - set(SHOWN))
    data.update(_toolkit_rows(settings))
    names += ["installed_adk_version", "installed_ops_version"]
    data["remote_storage"] = _remote_row(settings, remotes)
    names.append("remote_storage")

    tables = settings.config.rows()
    data.update(tables)
    names += list(tables)
    data["kernel_cache_dir"]["why"] = options.kernel_cache_reason(settings)
    if as_json:
        emit_json({n: data[n] for n in names})
    else:
        click.echo(options.kernel_cache_why(settings))
        for name in names:
            item = data[name]
            value = _shown(item["value"])
            origin = item["origin"] + (f": {item['source']}" if item["source"] else "")
            click.echo(f"({origin}) {name} = {value}")
    if settings.problems:
        sys.exit(2)
