"""``cachemgr warm``: fill this host's chip folders from the remote tiers."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from cachemgr.cli import human
from cachemgr.cli.common import (
    emit_json,
    load_settings,
    remote_option,
    report_line,
    settings_options,
)
from cachemgr.cli.lockcheck import checked_for_writing
from cachemgr.daemon.state import remotes_state_dir
from cachemgr.errors import ConfigError
from cachemgr.remote import config as remote_config
from cachemgr.remote import warm
from cachemgr.remote.tierset import RemoteTiers


@click.command("warm", short_help="Download the most used entries from the remote tiers.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    help=f"Entries per chip, most recently used anywhere first (default {warm.DEFAULT_LIMIT}).",
)
@click.option(
    "--list",
    "list_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Fetch these kernels instead (a file: one kernel name a line, # comments).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per chip folder.")
@settings_options
@remote_option
def warm_cmd(
    limit: int | None,
    list_file: Path | None,
    as_json: bool,
    remotes: tuple[str, ...],
    **kw: Any,
) -> None:
    """Download the entries most recently used anywhere for this host's chips from the
    remote tiers into the local chip folders, verified and written the way CANN GE writes
    them, so that CANN processes (ATC, torch_npu) hit them without any change.

    \b
    Chips: --soc, else the chip folders present (and soc_version). The chip folder stays at
    or under its eviction target (max_op_cache_size x remain_cache_size_ratio / 100): warming
    never triggers an eviction. Exit 1 when a remote could not list or deliver anything
    asked for, 2 for bad input.
    """
    if limit is not None and list_file is not None:
        raise ConfigError("--limit and --list exclude each other; give one")
    settings = load_settings(**kw)
    values = {k: kw.get(k) for k in ("op_compiler_cache_dir", "host_id", "soc_version")}
    settings = checked_for_writing(settings, values, kw.get("config_file"))
    names = warm.read_list(list_file) if list_file is not None else None
    config = remote_config.from_settings(settings, list(remotes))
    tiers = RemoteTiers.from_config(config, remotes_state_dir())
    if tiers is None:
        raise ConfigError(
            "no remote tier configured: give --remote URL, CACHEMGR_REMOTE_STORAGE or "
            "[remote] storage"
        )
    socs = _socs(settings, config)
    try:
        reports = [
            warm.warm_chip(
                tiers,
                settings.layout.kernel_cache_dir,
                soc,
                names,
                limit or warm.DEFAULT_LIMIT,
                settings.limits.target_bytes,
                settings.sections,
            )
            for soc in socs
        ]
        states = tiers.stats()
    finally:
        tiers.close()
    if as_json:
        emit_json({"chip_folders": [r.to_json() for r in reports], "remotes": states})
    else:
        for r in reports:
            cap = "no cap" if r.cap_bytes is None else f"cap {human.size(r.cap_bytes)}"
            gone = f" ({len(r.dropped_rows)} gone from the index)" if r.dropped_rows else ""
            line = (
                f"{r.soc_version}: {len(r.fetched)} fetched ({human.size(r.bytes)}), "
                f"{len(r.present)} present, {len(r.missing)} missing{gone}, "
                f"{len(r.over_limit)} over the limit ({cap}), {len(r.busy)} busy, "
                f"{len(r.not_stored)} not stored; from {r.source} in {r.seconds:.1f} s"
            )
            failed = bool(r.error or r.not_stored or (names is not None and r.missing))
            report_line(line + (f" — {r.error}" if r.error else ""), failed=failed)
    if any(r.error or r.not_stored or (names is not None and r.missing) for r in reports):
        sys.exit(1)


def _socs(settings: Any, config: remote_config.RemoteConfig) -> list[str]:
    """This host's chips: ``--soc``, else the chip folders present, ``soc_version`` and
    ``[remote] prefetch_socs``.

    :raises ConfigError: none is known (a fresh host: name one with ``--soc``).
    """
    soc = settings.value("soc_version")
    if soc:
        return [str(soc)]
    found = {c.name for c in settings.layout.chip_dirs()} | set(config.prefetch_socs)
    if not found:
        raise ConfigError(
            f"no chip folder in {settings.layout.kernel_cache_dir} yet: name this host's "
            "chip with --soc SOC (e.g. --soc Ascend910B1) or [remote] prefetch_socs"
        )
    return sorted(found)
