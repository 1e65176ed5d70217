"""``cachemgr limits show|set``: the size limits of a kernel cache, and writing them to
``op_cache.ini`` — the counterpart of ``ccache -M``.

``limits set`` writes GE's file exactly as GE reads it (section ``[op_compiler_cache]``,
keys ``max_op_cache_size`` and ``remain_cache_size_ratio``) and always with the installed
toolkit's ``adk_version``/``ops_version`` stamps, found by :mod:`cachemgr.config.versions`: GE
ignores an ini without them (``te_cache_space_manager.cc``), so an unstamped file would
silently change nothing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from cachemgr.cli import human
from cachemgr.cli.common import (
    cache_options,
    emit_json,
    int_option,
    load_settings,
    report_line,
    route,
    socket_option,
)
from cachemgr.cli.subgroup import SubcommandFirst
from cachemgr.client import Client, DaemonError
from cachemgr.config import ini, versions
from cachemgr.config.layout import CacheLayout
from cachemgr.config.options import Settings
from cachemgr.constants import NEVER_EVICT
from cachemgr.errors import CacheMgrError, ConfigError
from cachemgr.eviction.purge import chip_usage
from cachemgr.storage import fsutil

_MAX_ACCEPTED = f"-1 or 1..{ini.MAX_MB_LIMIT} (MiB per chip folder; -1 = never evict)"
_RATIO_ACCEPTED = f"{ini.RATIO_MIN_PCT}..{ini.RATIO_MAX_PCT} (percent of the limit)"


def _parse(raw: str | None, option: str, low: int, high: int, accepted: str) -> int | None:
    """:func:`int_option`, and ``--max-size 0`` refused (``low`` is -1 there: never evict).

    :raises ConfigError: not an integer, outside ``low..high``, or ``--max-size 0``.
    """
    value = int_option(raw, option, low, high, accepted)
    if option == "--max-size" and value == 0:
        raise ConfigError(f"{option}={raw!r} (from option) is invalid; accepted: {accepted}")
    return value


@click.group(
    "limits", cls=SubcommandFirst, short_help="Show or set the size limits of the kernel cache."
)
def limits_group() -> None:
    """Show or set the size limits (max_op_cache_size, remain_cache_size_ratio)."""


@limits_group.command(
    "show", short_help="Show the limits in force, their origin, the ini's stamps."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@cache_options
def show_cmd(as_json: bool, **kw: Any) -> None:
    """The limits in force, where they come from, and the ini's version stamps."""
    settings = load_settings(soc_version=None, writable=False, **kw)
    data = _limits_json(settings)
    if as_json:
        emit_json(data)
        return
    mx, ratio = data["max_op_cache_size"], data["remain_cache_size_ratio"]
    size = "never evict (-1)" if mx["value"] == NEVER_EVICT else f"{mx['value']} MiB"
    click.echo(f"max_op_cache_size       {size}  ({mx['origin']})")
    click.echo(f"remain_cache_size_ratio {ratio['value']} %  ({ratio['origin']})")
    stamps = data["ini_stamps"]
    if not os.path.lexists(data["ini_path"]):  # not a file with empty stamps: none at all
        click.echo(
            f"{data['ini_path']} does not exist: the limits above are "
            "ASCEND_MAX_OP_CACHE_SIZE / ASCEND_REMAIN_CACHE_SIZE_RATIO where set, else the "
            "defaults"
        )
        return
    click.echo(
        f"{data['ini_path']}: adk_version={stamps['adk_version'] or '-'}, "
        f"ops_version={stamps['ops_version'] or '-'}"
    )


def _limits_json(settings: Settings) -> dict[str, Any]:
    current = ini.OpCacheIni.load(settings.layout.ini_path)
    data: dict[str, Any] = {"ini_path": str(settings.layout.ini_path)}
    for key in (ini.MAX_KEY, ini.RATIO_KEY):
        res = settings[key]
        data[key] = {"value": res.value, "origin": f"{res.origin} {res.source}".strip()}
    data["ini_stamps"] = {"adk_version": current.adk_version, "ops_version": current.ops_version}
    return data


@limits_group.command("set", short_help="Write the limits to op_cache.ini (like ccache -M).")
@click.option(
    "--max-size",
    "max_size",
    metavar="MIB",
    help=f"max_op_cache_size: {_MAX_ACCEPTED}.",
)
@click.option(
    "--ratio",
    metavar="PCT",
    help=f"remain_cache_size_ratio: what eviction keeps, {_RATIO_ACCEPTED}.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@cache_options
@socket_option
def set_cmd(
    max_size: str | None,
    ratio: str | None,
    as_json: bool,
    socket_path: Path | None,
    run_local: bool,
    **kw: Any,
) -> None:
    """Write the limits to <kernel cache>/op_cache.ini (like ccache -M).

    The file binds every user and host of the cache, CANN's own processes included. It is
    written atomically, keeps its other lines, and always carries the installed toolkit's
    adk_version/ops_version stamps (CANN ignores an ini without them); without a toolkit
    found (ASCEND_HOME_PATH, ASCEND_OPP_PATH or the config's [toolkit] table) nothing is
    written. A value not given is kept from the ini, else the one in force now. A daemon
    serving this cache reloads it. Sizes are in MiB (GE's MB is a MiB, 1,048,576 bytes).

    Exit codes: 0 written; 1 the ini carries another toolkit's stamps (run cachemgr gc
    first), or the daemon refused to reload it; 2 a bad value, or no toolkit found.

    \b
    Example:  cachemgr limits set --max-size 2000 --ratio 80
    """
    max_mb = _parse(max_size, "--max-size", NEVER_EVICT, ini.MAX_MB_LIMIT, _MAX_ACCEPTED)
    ratio_pct = _parse(ratio, "--ratio", ini.RATIO_MIN_PCT, ini.RATIO_MAX_PCT, _RATIO_ACCEPTED)
    if max_mb is None and ratio_pct is None:
        raise ConfigError("limits set needs --max-size MIB, --ratio PCT or both")
    settings = load_settings(soc_version=None, **kw)
    installed = versions.installed_versions(os.environ, settings.sections)
    if not installed.complete:
        missing = "; ".join(f.source for f in (installed.adk, installed.ops) if not f.value)
        raise ConfigError(
            "limits set writes op_cache.ini only with the installed toolkit's version stamps "
            f"(CANN ignores an ini without them); {missing}; "
            "source CANN's set_env.sh, or set adk_version and ops_version in the config "
            "file's [toolkit] table"
        )
    cache = settings.layout
    check = versions.compare(cache, installed)
    if check.needs_purge and cache.chip_dirs():
        raise CacheMgrError(_purge_first(cache, check))
    current = ini.OpCacheIni.load(cache.ini_path)
    if max_mb is None:
        max_mb = current.max_op_cache_size or int(settings.value(ini.MAX_KEY))
    if ratio_pct is None:
        ratio_pct = current.remain_cache_size_ratio or int(settings.value(ini.RATIO_KEY))
    fsutil.ensure_dir(cache.kernel_cache_dir)
    written = ini.OpCacheIni.create(
        cache.ini_path, max_mb, ratio_pct, str(installed.adk.value), str(installed.ops.value)
    )
    where = route(socket_path, run_local, settings)
    where.announce()
    reloaded, refused = _reload(where.client)
    data = {
        "ini_path": str(written.path),
        ini.MAX_KEY: max_mb,
        ini.RATIO_KEY: ratio_pct,
        ini.ADK_KEY: written.adk_version,
        ini.OPS_KEY: written.ops_version,
        "daemon_reloaded": reloaded,
        "daemon_reload_refused": refused or None,
        "route": where.to_json(),
    }
    if as_json:
        emit_json(data)
    else:
        size = "never evict" if max_mb == NEVER_EVICT else f"{max_mb} MiB"
        report_line(
            f"wrote {written.path}: max_op_cache_size={size}, remain_cache_size_ratio="
            f"{ratio_pct} %, adk_version={written.adk_version}, "
            f"ops_version={written.ops_version}"
        )
        if reloaded is not None:
            report_line(f"the daemon at {where.socket} reloaded it")
        if refused:
            report_line(
                f"the daemon at {where.socket} follows it at its next reconciliation "
                f"(only its user or root may reload it now: {refused})"
            )
    if reloaded is not None and not reloaded.get("reloaded", True):
        sys.exit(1)


def _purge_first(cache: CacheLayout, check: versions.VersionCheck) -> str:
    """Why ``limits set`` writes nothing yet: GE's rule (``te_cache_space_manager.cc``
    ``DelCachedFiles``) purges the chip folders at the next CANN start — without an ini, or
    with stamps of another toolkit — and how many entries that is, per chip folder; ``gc``
    applies the same rule now and stamps the ini (docs/eviction.md)."""
    counts = []
    total = 0
    for chip in cache.chip_dirs():
        try:
            n = chip_usage(chip).entries
        except OSError:  # a member's private folder: not counted, still purged by GE
            counts.append(f"{chip.name} unreadable")
            continue
        total += n
        counts.append(f"{chip.name} {n}")
    why = "without one" if check.status is versions.VersionStatus.NO_INI else "after an upgrade"
    return (
        f"{check.detail}; nothing written: GE's rule purges the chip folders {why} — "
        f"{human.plural(len(counts), 'chip folder')} holding "
        f"{human.plural(total, 'entry', 'entries')} here ({', '.join(counts)}), and they go "
        "at the next CANN start whatever is set; run `cachemgr gc` first (it purges them now, "
        "as GE would, and stamps the ini), then set the limits"
    )


def _reload(client: Client | None) -> tuple[dict[str, Any] | None, str]:
    """Ask the daemon serving the cache to reload: ``(its answer, "")``, or ``(None, why)``
    when it refused because ``/reload`` is for its own user and root (``403``): the ini is
    written all the same and the daemon re-reads an edited ``op_cache.ini`` on its own."""
    if client is None:
        return None, ""
    try:
        return client.reload(), ""
    except DaemonError as exc:
        if exc.status != 403:
            raise
        return None, str(exc)
