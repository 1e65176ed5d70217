"""``cachemgr config``: every resolved value with its origin
(docs/design.md#options-and-their-origins, like ``ccache -p``)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from cachemgr.cli.common import load_settings, remote_option, settings_options
from cachemgr.console import config_report


@click.command("config", short_help="Show every setting, its value and where it came from.")
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
    [precompiled], [toolkit], [remote]) as table.key, set or default.

    Exit codes: 0 every value valid; 2 a value was invalid and a fallback was used (each is
    named on stderr), or the config file has an unknown table or key or a bad value (one
    line naming file, line, key, value and what is accepted).
    """
    settings = load_settings(op_compiler_cache_dir, host_id, soc_version, config_file)
    lines, code = config_report(settings, as_json, remotes)  # shared with cachemgr.main
    for to_stderr, line in lines:
        click.echo(line, err=to_stderr)
    if code:
        sys.exit(code)
