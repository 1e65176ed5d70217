"""Usage of each chip folder, kept current from file events and periodic scans (SPEC §5, §9).

Used bytes of a chip folder = sum of the apparent sizes of its regular files [GE]. The index
keeps one size per file name so that a delete event (which carries no size) can be
subtracted; names are kept as 64-bit xxhash digests, not strings, which keeps 100,000 entries
(about 200,000 files) in a few tens of MB. inotify sees only this host's writes: the
periodic :meth:`UsageIndex.reconcile` replaces a chip's figures with a fresh scan, which is
how other hosts' writes and any drift are caught (SPEC §9).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import xxhash

from cachemgr.storage import fsutil

log = logging.getLogger(__name__)


class UsageIndex:
    """Per chip folder: ``{digest of file name: bytes}``, the total and the entry count.

    :param kernel_cache_dir: the folder holding the chip folders.
    """

    def __init__(self, kernel_cache_dir: Path) -> None:
        self.kernel_cache_dir = kernel_cache_dir
        self._lock = threading.Lock()
        self._files: dict[str, dict[int, int]] = {}
        self._used: dict[str, int] = {}
        self._entries: dict[str, int] = {}

    def chips(self) -> list[str]:
        """soc versions currently indexed."""
        with self._lock:
            return sorted(self._files)

    def used_bytes(self, soc: str) -> int:
        """Indexed used bytes of one chip folder (0 when unknown)."""
        with self._lock:
            return self._used.get(soc, 0)

    def entries(self, soc: str) -> int:
        """Number of main jsons indexed in one chip folder (an estimate of entries)."""
        with self._lock:
            return self._entries.get(soc, 0)

    def total_files(self) -> int:
        with self._lock:
            return sum(len(f) for f in self._files.values())

    def reconcile(self, progress: Callable[[int, int, int], None] | None = None) -> dict[str, int]:
        """Rescan every chip folder (one ``scandir`` + ``lstat`` pass each); return used bytes.

        :param progress: called as ``progress(chip folders done, total, files so far)``.
        """
        try:
            with os.scandir(self.kernel_cache_dir) as it:
                chips = [e.name for e in it if e.is_dir(follow_symlinks=False)]
        except OSError as exc:
            if not isinstance(exc, NotADirectoryError) and exc.errno not in fsutil.GONE_ERRNOS:
                raise
            chips = []
        for soc in set(self.chips()) - set(chips):
            with self._lock:
                for table in (self._files, self._used, self._entries):
                    table.pop(soc, None)
        files = 0
        for done, soc in enumerate(chips, 1):
            self.reconcile_chip(soc)
            if progress is not None:
                with self._lock:
                    files += len(self._files.get(soc, ()))
                progress(done, len(chips), files)
        with self._lock:
            return dict(self._used)

    def forget(self, soc: str) -> None:
        """Drop a chip folder that is gone."""
        with self._lock:
            for table in (self._files, self._used, self._entries):
                table.pop(soc, None)

    def reconcile_chip(self, soc: str) -> int:
        """Rescan one chip folder; return its used bytes."""
        sizes, entries = _scan_sizes(self.kernel_cache_dir / soc)
        with self._lock:
            self._files[soc] = sizes
            self._used[soc] = sum(sizes.values())
            self._entries[soc] = entries
            return self._used[soc]

    def file_changed(self, path: Path) -> str | None:
        """Account a created/modified file; return its soc when inside a chip folder."""
        soc = self._soc_of(path)
        if soc is None:
            return None
        st = fsutil.lstat_or_none(path)
        size = st.st_size if st is not None and stat.S_ISREG(st.st_mode) else None
        key = _key(path.name)
        with self._lock:
            files = self._files.setdefault(soc, {})
            old = files.pop(key, None)
            if size is not None:
                files[key] = size
            self._used[soc] = self._used.get(soc, 0) - (old or 0) + (size or 0)
            if _is_main_json(path.name) and (old is None) != (size is None):
                self._entries[soc] = self._entries.get(soc, 0) + (1 if old is None else -1)
        return soc

    def file_removed(self, path: Path) -> str | None:
        """Account a deleted file; return its soc when inside a chip folder."""
        soc = self._soc_of(path)
        if soc is None:
            return None
        with self._lock:
            old = self._files.get(soc, {}).pop(_key(path.name), None)
            self._used[soc] = self._used.get(soc, 0) - (old or 0)
            if old is not None and _is_main_json(path.name):
                self._entries[soc] = self._entries.get(soc, 0) - 1
        return soc

    def _soc_of(self, path: Path) -> str | None:
        if path.parent.parent != self.kernel_cache_dir:
            return None
        return path.parent.name


def _key(name: str) -> int:
    return xxhash.xxh3_64_intdigest(name.encode("utf-8", "surrogateescape"))


def _is_main_json(name: str) -> bool:
    """Cheap by-name test used for the entry count (sub-jsons excluded; GE's ``_pre.json``
    pre-build entries count: they are entries, ``cachemgr.storage.entry`` rule R7)."""
    return name.endswith(".json") and "_mix_" not in name


def _scan_sizes(chip_dir: Path) -> tuple[dict[int, int], int]:
    sizes: dict[int, int] = {}
    entries = 0
    try:
        for name, st in fsutil.regular_files(chip_dir):
            sizes[_key(name)] = st.st_size
            entries += _is_main_json(name)
    except OSError as exc:  # gone, also removed by another NFS host (ESTALE): empty
        if not isinstance(exc, NotADirectoryError) and exc.errno not in fsutil.GONE_ERRNOS:
            raise
    return sizes, entries
