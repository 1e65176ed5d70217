"""Clearing a chip folder (``cachemgr purge``, toolkit upgrades) and measuring it (``stats``).

Purge is the safe form of the seed's ``force`` (docs/design.md#cache-modes,
#size-limits-and-eviction): it waits for the eviction lock (so no gc or other purge runs), then
removes every entry under the entry's own lock, so a publish in progress finishes first. Writes in
progress (``*.temp`` younger than an hour) are left to their writers.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachemgr.config import layout
from cachemgr.errors import LockBusyError
from cachemgr.eviction.files import (
    DENIED_ERRNOS,
    denied_line,
    open_dir,
    reap_lock,
    remove_group,
    unlink_quiet,
)
from cachemgr.eviction.reclaim import TEMP_MAX_AGE_S
from cachemgr.eviction.usage import ChipUsage as ChipUsage  # one chip folder's use: apart,
from cachemgr.eviction.usage import chip_row as chip_row  # so that stats imports none of
from cachemgr.eviction.usage import chip_stats as chip_stats  # the eviction machinery
from cachemgr.eviction.usage import chip_usage as chip_usage
from cachemgr.storage import entry, fsutil, manifest

log = logging.getLogger(__name__)

#: How long purge waits for the eviction lock (a running gc) and for each entry lock (s).
PURGE_LOCK_WAIT_S = 60.0
ENTRY_LOCK_WAIT_S = 10.0


@dataclass
class PurgeReport:
    """What a purge removed from one chip folder.

    :ivar entries: entries removed; ``files``/``bytes`` count every file removed (entries,
        orphans, old temps, lock files); ``busy`` entries whose lock stayed held;
        ``denied`` ``"<name>: <reason>"`` for files we may not remove; ``left_temps`` writes
        in progress left alone.
    """

    chip_dir: Path
    entries: int = 0
    files: int = 0
    bytes: int = 0
    busy: list[str] = field(default_factory=list)
    denied: list[str] = field(default_factory=list)
    left_temps: list[str] = field(default_factory=list)
    missing: bool = False
    skipped: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (counts, bytes, names) for ``purge --json`` and ``gc --json``."""
        return {
            "chip_dir": str(self.chip_dir),
            "missing": self.missing,
            "skipped": self.skipped,
            "entries": self.entries,
            "files": self.files,
            "bytes": self.bytes,
            "busy": self.busy,
            "denied": self.denied,
            "left_temps": self.left_temps,
        }


def purge_chip(
    chip_dir: Path,
    lock_wait_s: float = PURGE_LOCK_WAIT_S,
    still_needed: Callable[[], bool] | None = None,
) -> PurgeReport:
    """Remove every entry, orphan and old temp of one chip folder (docs/design.md#cache-modes,
    #size-limits-and-eviction).

    Waits up to ``lock_wait_s`` seconds for ``op_cache_file_del.lock`` (held by a gc or
    another purge), then takes each entry's lock (up to 10 s each; still busy → reported and
    left). Lock files stay (a GE process may hold one; ``files.reap_lock`` removes dead ones
    after an hour). A missing folder is reported (``missing``), not an error.

    :param still_needed: called once the eviction lock is held (a toolkit purge re-reads the
        ini there); False → nothing is removed and ``skipped`` says why.

    :raises LockBusyError: the eviction lock stayed held for ``lock_wait_s`` seconds.
    :raises OSError: the folder cannot be listed or locked.
    """
    report = PurgeReport(Path(chip_dir))
    chip_fd = open_chip(report)
    if chip_fd is None:
        return report
    try:
        lock = fsutil.FcntlLock(report.chip_dir / layout.EVICT_LOCK_NAME, chip_fd)
        try:
            lock.acquire(timeout_s=lock_wait_s)
        except (IsADirectoryError, fsutil.NotRegularFileError) as exc:
            what = "is a folder" if isinstance(exc, IsADirectoryError) else "keeps changing"
            report.skipped = f"{layout.EVICT_LOCK_NAME} {what}"
            report.denied.append(
                f"{layout.EVICT_LOCK_NAME}: {what} where GE's eviction lock belongs; "
                "nothing purged here; remove it"
            )
            return report
        except PermissionError:  # a member's folder: that one is skipped, not the others
            report.skipped = "not lockable"
            report.denied.append(fsutil.lock_access_hint(lock.path))
            return report
        except LockBusyError as exc:
            raise LockBusyError(
                f"{report.chip_dir}: {layout.EVICT_LOCK_NAME} stayed held for {lock_wait_s:g} s "
                "(a gc or purge is running); nothing was purged"
            ) from exc
        try:
            if still_needed is not None and not still_needed():
                report.skipped = "op_cache.ini changed; purge no longer needed"
                log.info("%s: %s", report.chip_dir, report.skipped)
                return report
            _purge(chip_fd, report)
        finally:
            lock.release()
    finally:
        os.close(chip_fd)
    log.info("purged %s: %d entries, %d bytes", report.chip_dir, report.entries, report.bytes)
    return report


def open_chip(report: PurgeReport) -> int | None:
    """The chip folder of ``report``, open for ``*at()`` calls (the caller closes it), or
    None with ``report`` saying why: ``missing``, or ``skipped`` "not readable" for a
    member's private folder (that one is skipped, not the others).

    :raises OSError: the folder cannot be opened for another reason.
    """
    try:
        return open_dir(report.chip_dir)
    except (FileNotFoundError, NotADirectoryError):
        report.missing = True
    except PermissionError:
        report.skipped = "not readable"
        report.denied.append(fsutil.access_hint(report.chip_dir, "readable"))
    return None


def _purge(chip_fd: int, report: PurgeReport) -> None:
    scan = entry.scan_chip(report.chip_dir, chip_fd)
    for group in scan.entries.values():
        _purge_entry(chip_fd, scan, group, report)
    now = time.time_ns()
    for name, fst in scan.temps.items():
        if now - fst.mtime_ns < TEMP_MAX_AGE_S * 1_000_000_000:
            report.left_temps.append(name)
        else:
            _remove_loose(chip_fd, name, fst.size, report)
    for name, fst in scan.orphans.items():
        _remove_loose(chip_fd, name, fst.size, report)
    for name, fst in scan.manifests.items():  # each goes with the last entry it names
        if manifest.stale(report.chip_dir / name, chip_fd):
            _remove_loose(chip_fd, name, fst.size, report)
    for name in scan.locks:
        try:
            kernel_json = report.chip_dir / (name[: -len(".lock")] + ".json")
            if reap_lock(report.chip_dir / name, kernel_json, chip_fd=chip_fd):
                report.files += 1
        except OSError as exc:
            if exc.errno not in DENIED_ERRNOS:
                raise
            report.denied.append(denied_line(name, exc))


def _purge_entry(
    chip_fd: int, scan: entry.ChipScan, group: entry.EntryGroup, report: PurgeReport
) -> None:
    lock_name = group.kernel + ".lock"
    lock = fsutil.FcntlLock(report.chip_dir / lock_name, chip_fd)
    try:
        lock.acquire(timeout_s=ENTRY_LOCK_WAIT_S)
    except LockBusyError:
        report.busy.append(group.kernel)
        return
    except OSError as exc:
        if exc.errno not in DENIED_ERRNOS:
            raise
        report.denied.append(denied_line(lock_name, exc))
        return
    try:
        removal = remove_group(chip_fd, group)
    finally:
        lock.release()  # the lock file stays: a GE process may hold it (files.reap_lock)
    scan.locks.setdefault(lock_name, entry.FileStat(0, 0, 0))  # reaped below once dead+old
    report.files += removal.files
    report.bytes += removal.bytes
    report.denied += removal.denied
    if removal.json_gone:
        report.entries += 1


def _remove_loose(chip_fd: int, name: str, size: int, report: PurgeReport) -> None:
    try:
        if unlink_quiet(chip_fd, name):
            report.files += 1
            report.bytes += size
    except OSError as exc:
        if exc.errno not in DENIED_ERRNOS:
            raise
        report.denied.append(denied_line(name, exc))
