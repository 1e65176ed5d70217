"""``cachemgr completion bash|zsh|fish``: the shell completion script (click's own)."""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

#: The shells click completes, and where each script goes.
INSTALL = {
    "bash": 'eval "$(cachemgr completion bash)"   # in ~/.bashrc',
    "zsh": 'eval "$(cachemgr completion zsh)"    # in ~/.zshrc',
    "fish": "cachemgr completion fish > ~/.config/fish/completions/cachemgr.fish",
}


@click.command("completion", short_help="Print the shell completion script (bash, zsh or fish).")
@click.argument("shell", type=click.Choice(sorted(INSTALL)))
def completion_cmd(shell: str) -> None:
    """Print the completion script for SHELL (bash, zsh or fish).

    \b
    Install it once:
      bash: eval "$(cachemgr completion bash)"   in ~/.bashrc
      zsh:  eval "$(cachemgr completion zsh)"    in ~/.zshrc
      fish: cachemgr completion fish > ~/.config/fish/completions/cachemgr.fish

    Commands, options and choices then complete with TAB.
    """
    from cachemgr.cli import cli

    cls = get_completion_class(shell)
    if cls is None:  # click knows all three; a Choice keeps others out
        raise click.BadParameter(f"no completion for {shell}")
    click.echo(cls(cli, {}, "cachemgr", "_CACHEMGR_COMPLETE").source())
