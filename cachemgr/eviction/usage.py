"""One chip folder's use for ``cachemgr stats`` and ``limits``: entries, bytes, access-time
range and fill against the limit (docs/commands.md#what-stats-counts), counted as GE and
``entry.scan_chip`` group files (docs/design.md#files-of-an-entry), without opening a file or
moving an access time.

Apart from :mod:`cachemgr.eviction.purge` (which re-exports these names) so that ``stats``
counts a chip folder without importing the eviction and store machinery (start-up:
docs/performance.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cachemgr.storage import chipcount, fsutil
from cachemgr.storage.safedir import SafeDir

if TYPE_CHECKING:
    from cachemgr.config.options import Settings


@dataclass(frozen=True)
class ChipUsage:
    """One chip folder's use, by name grouping (no file opened, no access time changed).

    :ivar entries: number of entries; ``bytes``: apparent bytes of all regular files;
        ``oldest_atime_ns``/``newest_atime_ns``: main-json access times (ns since the
        epoch), None for an empty folder.
    """

    chip_dir: Path
    entries: int
    bytes: int
    oldest_atime_ns: int | None
    newest_atime_ns: int | None
    exists: bool = True


def chip_usage(chip_dir: Path) -> ChipUsage:
    """Measure one chip folder for ``cachemgr stats`` (a missing folder is empty).

    :raises OSError: when the folder cannot be listed (e.g. ``EACCES``).
    """
    chip_dir = Path(chip_dir)
    try:
        with SafeDir.open_chip(chip_dir) as folder:
            entries, used, oldest, newest = chipcount.usage_stream(folder.fd)
    except (FileNotFoundError, NotADirectoryError):
        return ChipUsage(chip_dir, 0, 0, None, None, exists=False)
    except OSError as exc:
        if exc.errno not in fsutil.GONE_ERRNOS:
            raise
        return ChipUsage(chip_dir, 0, 0, None, None, exists=chip_dir.is_dir())
    return ChipUsage(chip_dir, entries, used, oldest, newest, exists=True)


def chip_row(chip_dir: Path, settings: Settings) -> dict[str, Any]:
    """:func:`chip_stats`, or ``{"chip_dir", "error"}`` when the folder cannot be read (e.g.
    ``ESTALE`` on an NFS root, ``EACCES``): ``stats`` reports it and goes on with the other
    folders."""
    try:
        return chip_stats(chip_dir, settings)
    except OSError as exc:
        why = exc.strerror or str(exc)
        if isinstance(exc, PermissionError):  # name its owner and mode (docs/security.md 3a)
            why = fsutil.access_hint(chip_dir, "readable")
        return {"chip_dir": str(chip_dir), "error": why}


def chip_stats(chip_dir: Path, settings: Settings) -> dict[str, Any]:
    """One chip folder's figures for ``stats`` (CLI and daemon): entries, bytes, the limit in
    MB and bytes, the remain ratio, fill % of the limit (None when eviction is off), and the
    oldest/newest main-json access as ISO 8601 UTC.

    :raises OSError: when the folder cannot be listed.
    """
    usage = chip_usage(chip_dir)
    limits = settings.limits
    max_bytes = limits.max_bytes
    return {
        "chip_dir": str(chip_dir),
        "exists": usage.exists,
        "entries": usage.entries,
        "bytes": usage.bytes,
        "limit_mb": limits.max_op_cache_size,
        "limit_bytes": max_bytes,
        "never_evict": limits.never_evict,
        "ratio_pct": limits.remain_cache_size_ratio,
        "fill_pct": None if max_bytes is None else round(100 * usage.bytes / max_bytes, 1),
        "oldest_access": chipcount.iso(usage.oldest_atime_ns),
        "newest_access": chipcount.iso(usage.newest_atime_ns),
    }
