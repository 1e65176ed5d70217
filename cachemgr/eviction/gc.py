"""Garbage collection of a whole kernel cache (docs/design.md#size-limits-and-eviction): the
toolkit-version check, then reclaim and eviction of each chip folder. One function serves
``cachemgr gc`` run locally and the daemon's ``/gc``, so both answer with the same
:class:`cachemgr.results.GcResult` (JSON: ``{"kernel_cache_dir", "limits": {name: {value, origin,
source}, "problems"},
"toolkit": {...}, "chip_folders": {soc: ChipGc}, "other_kernel_caches"}``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from cachemgr.config import options, versions
from cachemgr.config.options import Settings
from cachemgr.errors import CacheMgrError, InvalidInputError
from cachemgr.eviction import DryRun, gc_chip, purge_chip
from cachemgr.eviction.collect import GcReport
from cachemgr.eviction.purgeplan import purge_estimate
from cachemgr.eviction.report import ChipGc, GcResult
from cachemgr.storage import fsprobe, fsutil
from cachemgr.words import noun, plural, size

log = logging.getLogger(__name__)

#: ``skipped`` of a chip folder whose gc failed (e.g. a member's folder this user cannot
#: read): ``denied`` says why.
SKIP_ERROR = "error"


class CacheNotWritableError(CacheMgrError):
    """gc cannot act: the cache root is read-only or has vanished."""

    exit_code = 1


#: ``progress_for(soc)`` → a context manager yielding a ``progress(done, total)`` callback
#: (or None); the CLI passes a tqdm bar, the daemon nothing.
ProgressFor = Callable[[str], AbstractContextManager[Any]]


#: ``run_chip(chip_dir, max_mb, ratio_pct, min_age_s, **gc_chip's keywords)`` → the report
#: as JSON (``GcReport.to_json()``)
ChipRunner = Callable[..., dict[str, Any]]


def _in_process(chip_dir: Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`gc_chip` in this process (``cachemgr gc``)."""
    return gc_chip(chip_dir, *args, **kwargs).to_json()


def limits_json(settings: Settings) -> dict[str, Any]:
    """The limits in force with their origins (:meth:`Settings.limits_json`)."""
    return settings.limits_json()


def sync_toolkit(
    settings: Settings, dry_run: bool, env: Mapping[str, str] | None = None
) -> versions.VersionCheck:
    """docs/design.md#size-limits-and-eviction toolkit upgrade: purge every chip folder and restamp
    when versions changed."""
    installed = versions.installed_versions(os.environ if env is None else env, settings.sections)
    return versions.sync_toolkit(
        settings.layout, installed, purge_chip, dry_run=dry_run, estimate=purge_estimate
    )


def toolkit_lines(report: GcResult) -> Iterator[str]:
    """The toolkit check in words (``toolkit: <detail>``, the label left out when the detail
    starts with the word: ``toolkit version unknown (…)``), and one line per purged chip
    folder (reason, entries)."""
    toolkit = report.toolkit
    detail = str(toolkit["detail"])
    yield detail if detail.startswith("toolkit ") else f"toolkit: {detail}"
    lines = toolkit.get("stamp_lines_rewritten") or []
    if lines:
        verb = "would rewrite" if toolkit.get("dry_run") else "rewrote"
        yield (
            f"{Path(report.kernel_cache_dir) / 'op_cache.ini'}: {verb} "
            f"{noun(len(lines), 'stamp line')} "
            f"{', '.join(map(str, lines))} the way GE writes them (key=value from column 1): "
            "GE restamps only such lines and would purge the chip folders on every start"
        )
    verb = "would purge" if toolkit.get("dry_run") else "purged"
    for purged in toolkit.get("purged", []):
        soc = Path(purged["chip_dir"]).name
        if purged.get("skipped"):
            yield f"{soc}: not purged: {purged['skipped']}"
        else:
            yield (
                f"{soc}: {verb} {plural(int(purged['entries']), 'entry', 'entries')} "
                f"({size(int(purged['bytes']))}), reason: {toolkit['reason']}"
            )


def chip_dirs(settings: Settings, soc: str | None = None) -> list[Path]:
    """The chip folders to act on: ``soc``'s, the settings' ``soc_version``'s, or all."""
    soc = soc or settings.value("soc_version")
    if soc:
        return [settings.layout.chip_dir(soc)]
    return settings.layout.chip_dirs()


def collect(
    settings: Settings,
    *,
    force_ratio: int | None = None,
    min_age_s: float | None = None,
    dry_run: DryRun = DryRun.NO,
    soc: str | None = None,
    progress_for: ProgressFor | None = None,
    include_others: bool = True,
    run_chip: ChipRunner | None = None,
) -> GcResult:
    """Run gc over the kernel cache of ``settings`` and return the JSON report; the other
    governed kernel caches (docs/design.md#where-the-cache-lives) are under ``other_kernel_caches``,
    by path, each with its own limits, toolkit check and chip folders.

    :param force_ratio: keep this percent of the limit, even below the trigger (``--ratio``).
    :param min_age_s: aging guard in seconds (default: the ``min_age_s`` setting).
    :param run_chip: runs one chip folder's :func:`gc_chip` and returns its report as JSON;
        in this process by default (the daemon runs it in a child process:
        ``cachemgr.daemon.gcchild``).
    :raises InvalidInputError: bad limits (nothing is touched).
    :raises CacheNotWritableError: the root is read-only or vanished (one line) — not
        with a dry run, which only reads.
    :raises OSError: a chip folder that cannot be listed or locked.
    """
    problem = fsprobe.root_problem(settings.layout.kernel_cache_dir)
    if problem and dry_run is DryRun.NO:
        raise CacheNotWritableError(
            f"gc: {problem}; nothing can be reclaimed or evicted until it is writable again "
            "(hits are still served; compiles return their kernel outside the cache)"
        )
    run = run_chip or _in_process
    report = _collect_one(settings, force_ratio, min_age_s, dry_run, soc, progress_for, run)
    others = {}
    # every kernel cache under ASCEND_CACHE_PATH (docs/design.md#where-the-cache-lives)
    for kc in settings.other_kernel_caches() if include_others else []:
        other = options.settings_for(settings, kc, os.environ)
        others[str(kc)] = _collect_one(
            other, force_ratio, min_age_s, dry_run, soc, progress_for, run
        )
    return dataclasses.replace(report, other_kernel_caches=others)


def _collect_one(
    settings: Settings,
    force_ratio: int | None,
    min_age_s: float | None,
    dry_run: DryRun,
    soc: str | None,
    progress_for: ProgressFor | None,
    run_chip: ChipRunner,
) -> GcResult:
    """gc of one kernel cache folder: its toolkit check, then each chip folder."""
    max_mb = int(settings.value("max_op_cache_size"))
    ratio = int(settings.value("remain_cache_size_ratio")) if force_ratio is None else force_ratio
    age = float(settings.value("min_age_s")) if min_age_s is None else min_age_s
    toolkit = sync_toolkit(settings, dry_run is DryRun.YES)
    folders = {}
    for chip in chip_dirs(settings, soc):
        context = progress_for(chip.name) if progress_for else nullcontext(None)
        try:
            with context as progress:
                report = run_chip(
                    chip,
                    max_mb,
                    ratio,
                    age,
                    force_ratio=force_ratio is not None,
                    dry_run=dry_run,
                    progress=progress,
                    clock_skew_s=float(settings.value("clock_skew_s")),
                )
        except InvalidInputError:
            raise
        except (OSError, CacheMgrError) as exc:  # one folder's failure is not the others'
            report = _failed(chip, dry_run, exc)
        folders[chip.name] = _with_purge(ChipGc.from_json(report), toolkit)
    return GcResult(
        str(settings.layout.kernel_cache_dir),
        limits_json(settings),
        toolkit.to_json(),
        folders,
    )


def _with_purge(folder: ChipGc, toolkit: versions.VersionCheck) -> ChipGc:
    """``folder``'s report with what the toolkit check purged from it (entries, bytes,
    reason), so a purge counts in the folder's and the run's totals
    (docs/eviction.md#toolkit-purges-in-the-report). In a dry run nothing was purged yet, so
    the folder's eviction report counts the entries the purge would remove: it is replaced
    by what gc finds after the purge — nothing left to evict or reclaim — and the dry run's
    totals are the real run's."""
    for purged in toolkit.purged:
        done = purged.to_json()
        if Path(done["chip_dir"]) == Path(folder.chip_dir) and not done.get("skipped"):
            if toolkit.dry_run:
                folder = _after_purge(folder, int(done["bytes"]))
            return dataclasses.replace(
                folder,
                purged_entries=int(done["entries"]),
                purged_bytes=int(done["bytes"]),
                purge_reason=toolkit.status.value,
            )
    return folder


def _after_purge(folder: ChipGc, purged_bytes: int) -> ChipGc:
    """A dry run's report of ``folder`` as gc would find it after the toolkit purge removed
    ``purged_bytes``: entries, orphans and old temps gone, so nothing evicted or reclaimed."""
    left = max(folder.bytes_before - purged_bytes, 0)
    nothing = dataclasses.replace(
        folder.reclaimed, orphans=0, temps=0, manifests=0, bad_entries=0, ge_fatal=0, bytes=0,
        bad=[], fatal=[],
    )  # fmt: skip
    return dataclasses.replace(
        folder, entries_before=0, bytes_before=left, bytes_after=left, triggered=False,
        evicted_entries=0, evicted_bytes=0, evicted=[], kept_by_aging_guard=0, kept=[],
        saved_by_hit=[], reclaimed=nothing, stuck_over_limit=False,
    )  # fmt: skip


def _failed(chip: Path, dry_run: DryRun, exc: BaseException) -> dict[str, Any]:
    """The report of a chip folder whose gc failed: skipped ``error``, the failure in
    ``denied`` (so ``cachemgr gc`` exits 1), logged once; the other chip folders are still
    collected (docs/security.md item 3)."""
    why = fsutil.access_hint(chip, "readable") if isinstance(exc, PermissionError) else str(exc)
    log.info("%s: gc failed: %s; the other chip folders are collected", chip, why)  # reported
    report = GcReport(chip, dry_run=dry_run is DryRun.YES, skipped=SKIP_ERROR, denied=[why])
    return report.to_json()


def stuck_lines(report: GcResult) -> Iterator[str]:
    """One line per chip folder left over its limit because everything left is young
    (reported, never hidden)."""
    for soc, folder in report.all_chip_folders():
        if folder.stuck_over_limit:
            future = folder.future_atimes
            why = (
                f"; {future} of them have access times in the future (clock skew, up to "
                f"{folder.max_skew_s:.0f} s)"
                if future
                else ""
            )
            yield (
                f"{soc}: still over its limit ({size(folder.bytes_after)} of "
                f"{size(folder.max_bytes)}): the aging guard kept "
                f"{plural(folder.kept_by_aging_guard, 'entry', 'entries')} accessed too "
                f"recently{why}"
            )


def denied_lines(report: GcResult) -> Iterator[str]:
    """``soc/file: why`` for every file gc could not remove (permission); a chip folder gc
    skipped as a whole (``skipped`` with its reason in ``denied``) is
    :func:`skipped_lines`'."""
    for soc, folder in report.all_chip_folders():
        if not folder.skipped:
            for line in folder.denied:
                yield f"{soc}/{line}"


def skipped_lines(report: GcResult) -> Iterator[str]:
    """``chip folder soc skipped (kind): why`` for every chip folder gc skipped as a whole
    with a reason: one it may not list or lock, an error, the run's deadline."""
    for soc, folder in report.all_chip_folders():
        if folder.skipped:
            for line in folder.denied:
                yield f"chip folder {soc} skipped ({folder.skipped}): {line}"
