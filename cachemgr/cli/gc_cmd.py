"""``cachemgr gc``, ``stats`` and ``purge`` (docs/design.md#size-limits-and-eviction): the eviction
engine's commands.

Limits with a problem: when ``Settings.problems`` is not empty (an invalid ``op_cache.ini``
or env value), ``gc`` prints every warning and then evicts with the fallback values, as GE
does — after one more warning line that names the limits it applies and where they came
from, so nothing is evicted against a misconfigured ini without saying so.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from cachemgr import localstats, stats_view
from cachemgr.cli import human
from cachemgr.cli.common import (
    VERBOSITY,
    chip_dirs,
    daemon_of_this_cache,
    emit_json,
    failure,
    int_option,
    load_settings,
    printable,
    refused_by_daemon,
    report_line,
    route,
    settings_options,
    socket_option,
    warn_if_no_kernel_cache,
    warning,
)
from cachemgr.cli.lockcheck import checked_for_writing
from cachemgr.compile.results import ChipGc, GcResult
from cachemgr.config import options
from cachemgr.config.options import Settings
from cachemgr.errors import ConfigError
from cachemgr.eviction import DryRun, gc, purge_chip
from cachemgr.storage import fsprobe
from cachemgr.storage.counters import CacheCounters


def _warn_about_limits(settings: Settings, force_ratio: int | None, via_daemon: bool) -> None:
    """Say which limits apply when this shell's would mislead: here, the fallback GE applies
    for a bad value (named above it); through the daemon, the daemon's own — limits set in
    this shell's environment are not (they bind one user: docs/configuration.md)."""
    names = ("max_op_cache_size", "remain_cache_size_ratio")
    if via_daemon:
        mine = [f"{settings[n].source}={settings.value(n)}" for n in names
                if settings[n].origin == options.ORIGIN_ENV]  # fmt: skip
        if mine:
            warning(
                f"the daemon's limits apply, not this shell's {', '.join(mine)}: "
                "run with --local to apply them"
            )
        return
    if settings.problems:
        max_res = settings["max_op_cache_size"]
        applied = settings.value("remain_cache_size_ratio") if force_ratio is None else force_ratio
        warning(
            f"gc applies the fallback limits max_op_cache_size={max_res.value} MiB "
            f"({max_res.origin}) and remain_cache_size_ratio={applied} % "
            "as GE would; fix the values above to apply yours"
        )


def _parse_min_age(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ConfigError(
            f"--min-age={raw!r} (from option) is invalid; accepted: a number of seconds ≥ 0"
        )
    return value


def _mib(n: int | None) -> str:
    """A size for people (``3.0 KiB``, ``12.0 MiB``); ``-`` for None."""
    return human.size(n)


@contextmanager
def _progress_bar(enabled: bool, label: str) -> Iterator[Any]:
    """A tqdm bar on stderr when stdout is a terminal; a no-op callback otherwise."""
    if not enabled:
        yield None
        return
    from tqdm import tqdm

    bar = tqdm(total=0, desc=label, unit="entry", file=sys.stderr, leave=False)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    try:
        yield update
    finally:
        bar.close()


def _gc_line(soc: str, report: ChipGc) -> str:
    """One line per chip folder of a gc run (local or daemon)."""
    if report.skipped == "busy":
        return f"{soc}: skipped: another evictor holds op_cache_file_del.lock (busy, not an error)"
    if report.skipped == "missing":
        return f"{soc}: no chip folder at {report.chip_dir}; nothing to do"
    if report.skipped:
        return f"{soc}: skipped: {'; '.join(report.denied) or report.skipped}"
    rec = report.reclaimed
    verb = "would evict" if report.dry_run else "evicted"
    limit = (
        "size eviction off (max_op_cache_size=-1)"
        if report.max_bytes is None
        else f"limit {_mib(report.max_bytes)}, target {_mib(report.target_bytes)}"
    )
    plural = human.plural
    purged = (
        f"{'would purge' if report.dry_run else 'purged'} "
        f"{plural(report.purged_entries, 'entry', 'entries')} "
        f"({_mib(report.purged_bytes)}, reason {report.purge_reason}); "
        if report.purged_entries or report.purged_bytes
        else ""
    )
    before = report.bytes_before + report.purged_bytes  # the folder as the run found it
    return (
        f"{soc}: {_mib(before)} -> {_mib(report.bytes_after)} ({limit}); {purged}"
        f"{verb} {plural(report.evicted_entries, 'entry', 'entries')} "
        f"({_mib(report.evicted_bytes)}); "
        f"kept by aging guard {report.kept_by_aging_guard}; "
        f"saved by a hit {len(report.saved_by_hit)}; "
        f"{'would reclaim' if report.dry_run else 'reclaimed'} "
        f"{plural(rec.orphans, 'orphan')}, {plural(rec.temps, 'temp file')}, "
        f"{plural(rec.locks, 'lock file')}, {plural(rec.manifests, 'header manifest')}, "
        f"{plural(rec.bad_entries, 'bad entry', 'bad entries')}, "
        f"{plural(rec.ge_fatal, 'entry', 'entries')} that abort GE ({_mib(rec.bytes)})"
    )


@click.command("gc", short_help="Reclaim leftovers and evict old entries down to the limit.")
@click.option(
    "--ratio",
    metavar="N",
    help="Keep N % of the limit, 0..100 (0: every entry past the aging guard goes); forces a "
    "run to that target.",
)
@click.option("--min-age", metavar="SECONDS", help="Aging guard (default: min_age_s, 1800).")
@click.option("--dry-run", is_flag=True, help="Report what would go; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object; chip folders by soc.")
@settings_options
@socket_option
def gc_cmd(
    ratio: str | None,
    min_age: str | None,
    dry_run: bool,
    as_json: bool,
    socket_path: Path | None,
    run_local: bool,
    **kw: Any,
) -> None:
    """Reclaim leftovers and evict least recently used entries down to the limit.

    Per chip folder: when the used size reaches max_op_cache_size, entries go, least
    recently accessed first, until ratio % of the limit is left; entries accessed in the
    last min_age_s seconds stay. Leftovers (binaries without json, old temp files, stale
    locks, entries that fail verification) are reclaimed every time. After a toolkit
    upgrade (the ini's version stamps differ) every chip folder is purged first.

    Runs through the daemon that serves this cache, else here (--json says which).

    Exit codes: 0 done, also when another evictor is running (that chip folder is
    skipped); 1 a file could not be removed, a chip folder stays over its limit because
    everything left was accessed too recently, or the root is read-only; 2 bad input or
    configuration.
    """
    force_ratio = int_option(ratio, "--ratio", 0, 100)
    min_age_s = _parse_min_age(min_age)
    settings = load_settings(**kw)
    mode = DryRun.YES if dry_run else DryRun.NO
    where = route(socket_path, run_local, settings)
    where.announce()
    client = where.client
    _warn_about_limits(settings, force_ratio, client is not None)
    if client is not None:
        report = client.gc(
            ratio=force_ratio,
            min_age_s=min_age_s,
            dry_run=dry_run,
            soc=settings.value("soc_version"),
        )
        via = "daemon"
    else:
        warn_if_no_kernel_cache(settings)
        settings = _writable(settings, kw)
        enabled = human.bars_enabled(as_json)
        chips = gc.chip_dirs(settings)
        with human.progress(enabled, "gc: chip folders", len(chips), "folder") as outer:

            @contextmanager
            def bars(soc: str) -> Iterator[Any]:
                """The scan and eviction of one chip folder: its own bar, then one step of
                the outer bar over chip folders."""
                with _progress_bar(enabled, soc) as update:
                    yield update
                outer.update(1)

            report = gc.collect(
                settings,
                force_ratio=force_ratio,
                min_age_s=min_age_s,
                dry_run=mode,
                progress_for=bars,
            )
        via = "local"
        _count_evictions(settings.layout.kernel_cache_dir, report)
    report = dataclasses.replace(report, via=via, route=where.to_json())
    _print_gc(report, as_json)
    denied = list(gc.denied_lines(report))
    for line in denied:
        failure(f"not removed (permission): {line}")
    skipped = list(gc.skipped_lines(report))
    stuck = list(gc.stuck_lines(report))
    for line in skipped + stuck:
        failure(line)
    if denied or skipped or stuck:
        sys.exit(1)


def _writable(settings: Settings, kw: dict[str, Any]) -> Settings:
    """The daemon's access and lock checks before this process writes."""
    values = {k: kw.get(k) for k in ("op_compiler_cache_dir", "host_id", "soc_version")}
    return checked_for_writing(settings, values, kw.get("config_file"))


def _count_evictions(kernel_cache_dir: Path, report: GcResult) -> None:
    """Add a local run's evictions to the cache's counters (docs/design.md#counters; the daemon
    counts its own runs)."""
    counters = CacheCounters(kernel_cache_dir)
    for soc, folder in report.chip_folders.items():
        if folder.dry_run or folder.skipped:
            continue
        counters.add("evicted_entries", folder.evicted_entries, soc)
        counters.add("evicted_bytes", folder.evicted_bytes, soc)
        counters.add("ge_fatal_removed", folder.reclaimed.ge_fatal, soc)
    counters.flush()


def _print_gc(report: GcResult, as_json: bool) -> None:
    if as_json:
        emit_json(report.to_json())
        return
    if VERBOSITY.level < 0:  # -q: errors only; what went wrong follows as error lines
        return
    for one in [report, *(report.other_kernel_caches or {}).values()]:
        # the other kernel caches under ASCEND_CACHE_PATH (docs/design.md#where-the-cache-lives)
        if one is not report:
            click.echo(f"== {one.kernel_cache_dir}")
        _print_gc_one(one)


def _print_gc_one(report: GcResult) -> None:
    """The text report of one kernel cache folder."""
    for line in gc.toolkit_lines(report):
        click.echo(line)
    folders = report.chip_folders
    for soc, folder in folders.items():
        click.echo(_gc_line(soc, folder))
        if VERBOSITY.level > 0:  # -v: every entry that goes (or would go), by name
            verb = "would evict" if folder.dry_run else "evicted"
            for name in folder.evicted:
                click.echo(printable(f"  {verb} {soc}/{name}"))
            for name in folder.reclaimed.bad:
                click.echo(
                    printable(
                        f"  {'would reclaim' if folder.dry_run else 'reclaimed'} "
                        f"{soc}/{name} (bad entry)"
                    )
                )
            for line in folder.reclaimed.fatal:
                verb = "would remove" if folder.dry_run else "removed"
                click.echo(printable(f"  {verb} {soc}/{line}"))
    if not folders:
        click.echo(f"no chip folders under {report.kernel_cache_dir}; nothing to do")
        return
    totals = report.totals()
    verb = "would free" if any(f.dry_run for f in folders.values()) else "freed"
    purged = totals["purged_entries"]
    click.echo(
        f"total: {verb} {_mib(totals['freed_bytes'])} in "
        f"{human.plural(len(folders), 'chip folder')}; "
        + (
            f"{'would purge' if verb == 'would free' else 'purged'} "
            f"{human.plural(purged, 'entry', 'entries')}, "
            if purged
            else ""
        )
        + f"{'would evict' if verb == 'would free' else 'evicted'} "
        f"{human.plural(totals['evicted_entries'], 'entry', 'entries')}"
    )


@click.command("stats", short_help="Show the hit rate, counters and fill of this cache.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object; chip folders by soc.")
@click.option("--zero", is_flag=True, help="Reset the counters of this kernel cache.")
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="Also every cache root the daemon governs ([daemon] govern), from the daemon at "
    "--socket (or CACHEMGR_SOCKET, or the default socket).",
)
@settings_options
@socket_option
def stats_cmd(
    as_json: bool,
    zero: bool,
    show_all: bool,
    socket_path: Path | None,
    run_local: bool,
    **kw: Any,
) -> None:
    """The hit rate (local and remote hits), misses, compiles, evictions and each chip
    folder's fill against its limit, like ccache -s; counters that are zero are left out.

    -v shows every counter, the limits' origin, each remote and each chip folder's oldest
    and newest access; --json gives every figure. The counters are this kernel cache's:
    every daemon's and every local run's, kept in the cache. From the daemon when one
    serves this cache; else measured here. --zero resets the counters. --all: the daemon's
    figures with every cache root it governs."""
    if show_all:
        _stats_all(socket_path, run_local, as_json)
        return
    settings = load_settings(writable=False, **kw)
    where = route(socket_path, run_local, settings)
    where.announce()
    client = where.client
    kcache = settings.layout.kernel_cache_dir
    if zero:
        if client is not None:
            _zero(client)
        else:
            problem = fsprobe.root_problem(kcache)
            if problem:
                raise gc.CacheNotWritableError(f"stats --zero: {problem}; counters unchanged")
            CacheCounters(kcache).zero()
        click.echo(f"counters of {kcache} set to zero")
        return
    if client is not None:
        data = client.stats(settings.value("soc_version"))
    else:
        data = localstats.measure(settings, warning)
    data = localstats.complete(data, where.via, where.to_json(), settings, warning)
    if as_json:
        emit_json(data.to_json())
        return
    verbose = VERBOSITY.level > 0
    why = options.kernel_cache_reason(settings) if verbose else ""
    for line in stats_view.render(stats_view.lines(data, why, verbose)):
        click.echo(line)
    if run_local:
        _note_daemon_counters(settings)


def _zero(client: Any) -> None:
    """``POST /stats/zero`` to the daemon serving the cache (a :class:`~cachemgr.client.Client`).

    :raises DaemonError: it refused (``403``: only its user and root may; the line says so
        as the CLI's other refusals) or failed.
    """
    from cachemgr.client import DaemonError

    try:
        client.request("POST", "/stats/zero", {})
    except DaemonError as exc:
        if exc.status != 403:
            raise
        line = refused_by_daemon(exc, "stats --zero", client.socket_path, "counters unchanged")
        raise DaemonError(line, exc.status) from exc


def _stats_all(socket_path: Path | None, run_local: bool, as_json: bool) -> None:
    """``stats --all``: the daemon's ``/stats`` with every governed root
    (docs/daemon.md#governing-every-cache-on-a-build-host).

    :raises ConfigError: with ``--local`` (only a daemon governs other roots).
    :raises DaemonUnavailable: no daemon answers at the socket.
    """
    from cachemgr.cli.governed import governed_lines
    from cachemgr.client import Client, default_socket_path

    if run_local:
        raise ConfigError("stats --all and --local exclude each other: a daemon governs roots")
    env_socket = os.environ.get("CACHEMGR_SOCKET")
    path = socket_path or (Path(env_socket) if env_socket else default_socket_path())
    data = Client(path, timeout_s=30, local_hits=False).request("GET", "/stats")
    if as_json:
        emit_json(data)
        return
    click.echo(f"daemon at {path}")
    governed = data.get("governed") if isinstance(data, dict) else None
    if not governed:
        click.echo("governed: no [daemon] govern roots")
        return
    for line in governed_lines(governed):
        click.echo(line)


def _note_daemon_counters(settings: Settings) -> None:
    """``stats --local`` while a daemon serves this cache: one line saying that its counters
    since its last save are not in the figures (it saves every counters_save_interval_s)."""
    found = daemon_of_this_cache(settings)
    if found is not None:
        click.echo(
            f"note: a daemon serves this cache ({found[0]}); its counters since its last "
            f"save (every {found[1]} s) are not included: run without --local"
        )


@click.command("purge", short_help="Clear chip folders (needs --soc or --all).")
@click.option("--all", "purge_all", is_flag=True, help="Every chip folder.")
@click.option("--yes", is_flag=True, help="Do not ask (required when stdin is not a terminal).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object; chip folders by soc.")
@settings_options
def purge_cmd(purge_all: bool, yes: bool, as_json: bool, **kw: Any) -> None:
    """Clear chip folders under the eviction lock and each entry's lock (needs --soc or --all)."""
    soc = kw.get("soc_version")
    if bool(soc) == purge_all:
        raise ConfigError("purge needs exactly one of --soc SOC or --all")
    settings = _writable(load_settings(**kw), kw)
    problem = fsprobe.root_problem(settings.layout.kernel_cache_dir)
    if problem:  # one line like gc's, not the lock file's EROFS (nothing is removed)
        raise gc.CacheNotWritableError(f"purge: {problem}; nothing was removed")
    chips = chip_dirs(settings)
    if not yes:
        if not sys.stdin.isatty():
            raise ConfigError("purge refuses to run without --yes when stdin is not a terminal")
        names = ", ".join(c.name for c in chips) or "(none)"
        click.confirm(
            f"Remove every entry of {names} under {settings.layout.kernel_cache_dir}?", abort=True
        )
    reports = []
    with human.progress(human.bars_enabled(as_json), "purge", len(chips), "folder") as bar:
        for chip in chips:
            reports.append(purge_chip(chip))
            bar.update(1)
    if as_json:
        emit_json({"chip_folders": {Path(r.chip_dir).name: r.to_json() for r in reports}})
    else:
        for r in reports:
            if r.missing:
                report_line(f"{r.chip_dir.name}: no chip folder at {r.chip_dir}; nothing to do")
                continue
            if r.skipped:
                report_line(f"{r.chip_dir.name}: skipped: {r.skipped}")
                continue
            report_line(
                f"{r.chip_dir.name}: removed {human.plural(r.entries, 'entry', 'entries')}, "
                f"{human.plural(r.files, 'file')} "
                f"({_mib(r.bytes)}); busy {len(r.busy)}; "
                f"writes in progress left {len(r.left_temps)}",
                failed=bool(r.busy),
            )
    denied = [f"{r.chip_dir.name}/{line}" for r in reports for line in r.denied]
    for line in denied:
        failure(f"not removed (permission): {line}")
    if denied or any(r.busy for r in reports):
        sys.exit(1)
