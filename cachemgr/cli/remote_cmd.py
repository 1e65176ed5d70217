"""``cachemgr remote keygen NAME``: this site's signing key for the remote tiers
(docs/remote.md#keys)."""

from __future__ import annotations

from pathlib import Path

import click

from cachemgr.cli.subgroup import SubcommandFirst
from cachemgr.daemon.state import state_dir
from cachemgr.errors import ConfigError
from cachemgr.remote import signing


@click.group(
    "remote", cls=SubcommandFirst, short_help="Make this site's signing key for the remote tiers."
)
def remote_group() -> None:
    """The remote tiers' keys: a site signs what it uploads with its own key, and accepts
    from a remote only what a key in its [remote] trusted_keys signed (docs/remote.md)."""


@remote_group.command("keygen", short_help="Make a new private key; print its public key.")
@click.argument("name")
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The private key file to create (default: <state dir>/NAME.key, e.g. "
    "/var/lib/cachemgr under systemd). Never overwritten.",
)
def keygen_cmd(name: str, out: Path | None) -> None:
    """Create a new ed25519 private key named NAME in a new file readable by this user only
    (mode 0600), and print its public key as one line, NAME:BASE64.

    \b
    Run it as the daemon's user. Then:
      this site:    [remote] signing_key = "FILE"
      every site:   [remote] trusted_keys = ["NAME:BASE64", ...]  (the printed line)
    A new name per key (site-a-2025, site-a-2026) lets two keys be trusted at once while
    the sites move to the new one. The private key is never printed. Exit 2 when FILE
    exists or NAME is not a key name.
    """
    signing.check_name(name, "keygen NAME")
    path = out if out is not None else state_dir() / f"{name}.key"
    if out is None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        public = signing.create_key_file(path, name)
    except FileExistsError:
        hint = "choose another --out FILE" if out is not None else "give --out FILE"
        raise ConfigError(f"{path} exists: a key file is never overwritten ({hint})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be created ({exc.strerror})") from exc
    click.echo(public.line)
    click.echo(
        f"cachemgr: wrote the private key to {path} (mode 0600); set [remote] signing_key = "
        f'"{path}" on this site and paste the line above into [remote] trusted_keys of every '
        "site that reads what it uploads",
        err=True,
    )
