"""The ``cachemgr`` command line (layer 9): the only place errors become messages and exit
codes. Exit codes: 0 ok, 1 operational failure, 2 bad input or configuration."""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

import click

from cachemgr.errors import CacheMgrError

log = logging.getLogger("cachemgr")


class _Group(click.Group):
    """A click group that loads subcommands lazily (:data:`COMMANDS`) and turns every error
    into one line on stderr — never a traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        command: click.Command = getattr(importlib.import_module(module), attr)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except CacheMgrError as exc:
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except OSError as exc:
            where = f": {exc.filename}" if exc.filename else ""
            _fail(f"{exc.strerror or exc}{where}", 1)
        except Exception as exc:  # a bug: still one line, details with -v
            log.debug("internal error", exc_info=True)
            _fail(f"internal error: {type(exc).__name__}: {exc} (rerun with -v for details)", 70)


def _fail(message: str, code: int) -> None:
    click.echo(f"cachemgr: error: {message}", err=True)
    sys.exit(code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.version_option(package_name="cachemgr")
def cli(verbose: int) -> None:
    """cachemgr: the kernel compile cache manager for Ascend CANN build hosts."""
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(
        level=max(level, logging.DEBUG), format="%(levelname)s %(name)s: %(message)s"
    )


#: Subcommands, imported only when used (a one-shot command must not pay for the daemon's
#: scheduler or the compilers' imports): name → "module:attribute".
COMMANDS = {
    "config": "cachemgr.cli.config_cmd:config_cmd",
    "ls": "cachemgr.cli.entries_cmd:ls_cmd",
    "verify": "cachemgr.cli.entries_cmd:verify_cmd",
    "compile": "cachemgr.cli.compile_cmd:compile_cmd",
    "pack": "cachemgr.cli.compile_cmd:pack_cmd",
    "gc": "cachemgr.cli.gc_cmd:gc_cmd",
    "stats": "cachemgr.cli.gc_cmd:stats_cmd",
    "purge": "cachemgr.cli.gc_cmd:purge_cmd",
    "serve": "cachemgr.cli.serve_cmd:serve_cmd",
    "status": "cachemgr.cli.serve_cmd:status_cmd",
}


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="cachemgr")
