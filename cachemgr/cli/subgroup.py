"""A command group whose subcommand comes first (``cachemgr limits show --cache-dir D``):
an option given to the group itself (``cachemgr limits --cache-dir D``) is answered with
the subcommands to give and an example, not click's bare ``No such option``
(docs/commands.md#options-every-command-shares)."""

from __future__ import annotations

import shlex

import click


class SubcommandFirst(click.Group):
    """A :class:`click.Group` that names its subcommands when given one of their options."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """click's, with an option the group does not take reworded.

        :raises click.UsageError: ``cachemgr limits takes no --cache-dir: give a subcommand:
            show or set (e.g. `cachemgr limits show --cache-dir D`)``, naming the
            subcommands that take that option (all of them when none does).
        """
        given = list(args)  # click's parser consumes ``args``
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            raise click.UsageError(self._advice(ctx, exc.option_name, given), ctx=ctx) from None

    def _advice(self, ctx: click.Context, option: str, args: list[str]) -> str:
        names = list(self.commands)  # as defined: show before set
        taking = [n for n in names if _takes(self.commands[n], ctx, option)] or names
        said = " or ".join(taking) if len(taking) <= 2 else ", ".join(taking)
        named = [a for a in args if a in self.commands]  # given after the option
        sub = named[0] if named else taking[0]
        rest = list(args)
        if named:
            rest.remove(sub)
        example = shlex.join([*ctx.command_path.split(), sub, *rest])
        return f"{ctx.command_path} takes no {option}: give a subcommand: {said} (e.g. `{example}`)"


def _takes(command: click.Command, ctx: click.Context, option: str) -> bool:
    """True when ``command`` has an option named ``option`` (``--name`` or ``--name=…``)."""
    name = option.partition("=")[0]
    return any(name in (*p.opts, *p.secondary_opts) for p in command.get_params(ctx))
