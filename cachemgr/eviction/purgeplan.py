"""What a toolkit purge would remove from a chip folder, measured without removing or locking
anything: ``gc --dry-run`` reports it so that its totals are what a real ``gc`` then does
(docs/eviction.md#toolkit-purges-in-the-report).

A real purge (:func:`cachemgr.eviction.purge.purge_chip`) removes every entry, every orphan,
every temp file older than an hour and every header manifest (each names only entries that are
then gone); it leaves young temps (writes in progress) and lock files of live entries.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from cachemgr.eviction.purge import PurgeReport, open_chip
from cachemgr.eviction.reclaim import TEMP_MAX_AGE_S
from cachemgr.storage import entry


def purge_estimate(chip_dir: Path) -> PurgeReport:
    """The :class:`PurgeReport` a purge of ``chip_dir`` would give now (entries, files,
    apparent bytes, young temps left); a missing folder is ``missing``, one this user may
    not read ``skipped`` (as :func:`~cachemgr.eviction.purge.purge_chip` reports them).

    :raises OSError: the folder cannot be listed for another reason.
    """
    report = PurgeReport(Path(chip_dir))
    chip_fd = open_chip(report)
    if chip_fd is None:
        return report
    try:
        scan = entry.scan_chip(report.chip_dir, chip_fd)
    finally:
        os.close(chip_fd)
    for group in scan.entries.values():
        report.entries += 1
        report.files += len(group.files)
        report.bytes += group.size
    now = time.time_ns()
    for name, fst in scan.temps.items():
        if now - fst.mtime_ns < TEMP_MAX_AGE_S * 1_000_000_000:
            report.left_temps.append(name)
        else:
            _count(report, fst)
    for fst in [*scan.orphans.values(), *scan.manifests.values()]:
        _count(report, fst)
    return report


def _count(report: PurgeReport, fst: entry.FileStat) -> None:
    report.files += 1
    report.bytes += fst.size
