"""The ``cachemgr`` command line (layer 9): the only place errors become messages and exit
codes. Exit codes: 0 ok, 1 operational failure, 2 bad input or configuration."""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

import click

from cachemgr.console import VERBOSITY, printable, reader_gone
from cachemgr.errors import CacheMgrError

log = logging.getLogger("cachemgr")


class _Group(click.Group):
    """A click group that loads subcommands lazily (:data:`COMMANDS`) and turns every error
    into one line on stderr — never a traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands and their short helps (:data:`SUMMARIES`) without importing
        a command's module: click's LazyGroup pattern, so ``--help`` starts fast.
        ``tests/test_startup.py`` checks the summaries against the commands."""
        commands = [(n, click.Command(n, short_help=SUMMARIES[n])) for n in self.list_commands(ctx)]
        if commands:
            limit = formatter.width - 6 - max(len(name) for name, _ in commands)
            rows = [(name, cmd.get_short_help_str(limit)) for name, cmd in commands]
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        command: click.Command = getattr(importlib.import_module(module), attr)
        _add_verbosity_options(command)
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """click's, then refuse an option given another option's name as its value
        (:func:`_option_as_value`); a mistyped command gets the closest one suggested, as
        click does for a mistyped option (``No such command 'stast'. Did you mean 'stats'?``).

        :raises click.UsageError: no such command, or an option given as a value.
        """
        typed = args[0] if args else ""
        if typed and not typed.startswith("-") and typed not in COMMANDS:
            import difflib

            close = difflib.get_close_matches(typed, list(COMMANDS), n=1)
            if close and not ctx.resilient_parsing:
                ctx.fail(f"No such command {typed!r}. Did you mean {close[0]!r}?")
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None and name is not None and not ctx.resilient_parsing:
            _option_as_value(click.Context(command, info_name=name, parent=ctx), rest)
        return name, command, rest

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            _fail(_usage_line(exc), 2)
            raise  # not reached: _fail exits

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            _fail(_usage_line(exc, ctx), 2)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except CacheMgrError as exc:
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except BrokenPipeError:
            reader_gone()
        except OSError as exc:
            where = f": {exc.filename}" if exc.filename else ""
            _fail(f"{exc.strerror or exc}{where}", 1)
        except Exception as exc:  # a bug: still one line, the traceback with -vv (debug)
            log.debug("internal error", exc_info=True)
            name = type(exc).__name__
            _fail(f"internal error: {name}: {exc} (rerun with -vv for the traceback)", 70)


def _more_verbose(ctx: click.Context, param: click.Parameter, value: int) -> None:
    if value:
        VERBOSITY.set(max(VERBOSITY.level, 0) + value)


def _quiet(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        VERBOSITY.set(-1)


def _verbosity_options() -> list[click.Option]:
    """``-v``/``-q``, accepted before and after the subcommand (``cachemgr gc -v``)."""
    return [
        click.Option(
            ["-v", "--verbose"],
            count=True,
            expose_value=False,
            callback=_more_verbose,
            help="Say more: -v the route taken and each step, -vv debug output.",
        ),
        click.Option(
            ["-q", "--quiet"],
            is_flag=True,
            expose_value=False,
            callback=_quiet,
            help="Errors only: no warnings, no progress bars.",
        ),
    ]


def _add_verbosity_options(command: click.Command) -> None:
    names = {name for p in command.params for name in getattr(p, "opts", [])}
    if "--verbose" not in names and "--quiet" not in names:
        command.params.extend(_verbosity_options())
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _add_verbosity_options(sub)


def _option_as_value(ctx: click.Context, args: list[str]) -> None:
    """Refuse ``gc --ratio --cache-dir D``: click takes ``--cache-dir`` as the ratio and then
    blames ``D`` as an unexpected extra argument (or, for ``ls --cache-dir --json``, silently
    uses a folder named ``--json``). An option that takes a value, written apart from it,
    followed by one of the command's option names, is an option missing its value. Also in
    a subcommand's subcommand (``limits set``); stops at ``--``.

    :raises click.UsageError: names the option and the option name it got as its value.
    """
    command = ctx.command
    params = command.get_params(ctx)
    names = {opt for p in params for opt in (*p.opts, *p.secondary_opts)}
    takes_value = {
        opt: p
        for p in params
        if isinstance(p, click.Option) and not p.is_flag and not p.count
        for opt in p.opts
    }
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return
        option = takes_value.get(arg)
        if option is not None:
            for value in args[i + 1 : i + 1 + max(option.nargs, 1)]:
                if value.partition("=")[0] in names:
                    raise click.UsageError(
                        f"{arg} got {value!r} (an option name) as its value; give {arg} its "
                        f"value ({option.metavar or 'VALUE'}) right after it",
                        ctx=ctx,
                    )
            i += 1 + max(option.nargs, 1)
            continue
        if isinstance(command, click.Group) and arg in command.commands:
            sub = command.commands[arg]
            _option_as_value(click.Context(sub, info_name=arg, parent=ctx), args[i + 1 :])
            return
        i += 1


def _usage_line(exc: click.UsageError, group: click.Context | None = None) -> str:
    """A usage error as one line naming the command and where its help is: the subcommand's
    help also for an error click raises without a context (an option missing its value,
    ``gc --ratio``), found through ``group`` (the group's context, whose
    ``invoked_subcommand`` is set before the subcommand parses its arguments). click words a
    missing choice over several lines (``Choose from:\n\tbash,\n\tfish``): they are joined
    into one (its text holds no value of the user's that a newline could belong to)."""
    message = exc.format_message()
    if isinstance(exc, click.MissingParameter):
        message = " ".join(message.split())
    if exc.ctx is not None:
        path = exc.ctx.command_path
    elif group is not None and group.invoked_subcommand:
        path = f"{group.command_path} {group.invoked_subcommand}"
    else:
        path = group.command_path if group is not None else "cachemgr"
    return f"{message} (see `{path} --help`)"


def _fail(message: str, code: int) -> None:
    click.echo(printable(f"cachemgr: error: {message}"), err=True)
    sys.exit(code)


@click.group(
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"]},
    short_help="the kernel compile cache manager for Ascend CANN build hosts",  # man's NAME
)
@click.version_option(package_name="cachemgr")
def cli() -> None:
    """cachemgr: the kernel compile cache manager for Ascend CANN build hosts.

    It finds the kernel cache CANN uses (op_compiler_cache_dir, else
    $ASCEND_CACHE_PATH, else $HOME/atc_data), keeps it within its size limits,
    verifies what it serves and compiles kernels once. cachemgr COMMAND --help
    explains each command; -v/-q go before or after the command.
    """


cli.params.extend(_verbosity_options())


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
    "stop": "cachemgr.cli.serve_cmd:stop_cmd",
    "limits": "cachemgr.cli.limits_cmd:limits_group",
    "warm": "cachemgr.cli.warm_cmd:warm_cmd",
    "remote": "cachemgr.cli.remote_cmd:remote_group",
    "completion": "cachemgr.cli.completion_cmd:completion_cmd",
}

#: Each command's ``short_help``, for ``cachemgr --help`` (the modules stay unimported;
#: ``tests/test_startup.py`` fails when one differs from its command's).
SUMMARIES = {
    "compile": "Compile the kernels of REQUEST.json files, each only once.",
    "completion": "Print the shell completion script (bash, zsh or fish).",
    "config": "Show every setting, its value and where it came from.",
    "gc": "Reclaim leftovers and evict old entries down to the limit.",
    "limits": "Show or set the size limits of the kernel cache.",
    "ls": "List the entries: chip, kernel, op type, size, access.",
    "pack": "Build a package of precompiled kernels from cache entries.",
    "purge": "Clear chip folders (needs --soc or --all).",
    "remote": "Make this site's signing key for the remote tiers.",
    "serve": "Run the cache daemon until SIGTERM.",
    "stats": "Show the hit rate, counters and fill of this cache.",
    "status": "Tell whether a daemon answers, with its pid and uptime.",
    "stop": "Stop the daemon and wait until it has exited.",
    "verify": "Check every entry; exit 1 if anything bad remains.",
    "warm": "Download the most used entries from the remote tiers.",
}


def main() -> None:
    """Console-script entry point."""
    VERBOSITY.set(0)
    cli(prog_name="cachemgr")


def top_help() -> str:
    """``cachemgr --help`` as click renders it at its full width (78 columns): what
    ``scripts/manpages.py`` stores in :mod:`cachemgr.helptext` for the start-up fast path
    (:mod:`cachemgr.main`; ``tests/test_startup.py`` compares the two)."""
    ctx = click.Context(cli, info_name="cachemgr", terminal_width=78, **cli.context_settings)
    return cli.get_help(ctx)
