"""Counters that belong to a kernel cache, not to a user or a daemon
(docs/design.md#counters).

Design (ccache keeps one stats file per cache subfolder and sums them): one small JSON file
per chip folder, ``<kernel cache>/cachemgr_stats_<soc>.json`` (counts not tied to a chip — a
client's own hits — go to ``cachemgr_stats.json``). They sit beside ``op_cache.ini``, not in
the chip folder, so they never count toward its used size [GE: the used size is every
regular file of the chip folder]. Every process that works on the cache — each daemon, each
in-process CLI run — adds its own increments in memory and merges them into the files now and
then (:meth:`CacheCounters.flush`): under the fcntl lock ``cachemgr_stats.lock`` it reads a
file, adds, and replaces it atomically (temp + rename). So two daemons on one cache add up,
a restart loses nothing that was flushed, and a cache that does not exist has no counts.
``stats --zero`` rewrites every file with zeros under the same lock. On a root that cannot be
written (read-only, full) increments stay in memory and the next flush tries again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from cachemgr.errors import LockBusyError
from cachemgr.storage import counterfiles, fsutil
from cachemgr.storage.safedir import SafeDir, UnsafePathError

log = logging.getLogger(__name__)

# The names and the file-name rule live in counterfiles (os alone): a fast path shares them.
COUNTER_NAMES = counterfiles.COUNTER_NAMES
LOCK_NAME = "cachemgr_stats.lock"
PREFIX = counterfiles.PREFIX
#: Largest stats file read (bytes): a few dozen counters; anything bigger is not ours.
MAX_FILE_BYTES = 64 * 1024
#: Seconds a flush waits for the stats lock: a daemon's, and ``stats --zero``.
LOCK_WAIT_S = 30.0
#: Seconds a command's end-of-run flush waits for it (``compile``; direct mode's
#: ``STATS_LOCK_WAIT_S`` is the same): a flush holds it for one read and one write of a small
#: file, and any member may take and keep the ``0660`` lock — every user's every hit waited
#: 30 s (60 s with direct mode) behind one who did. Past it the counts are lost, one warning.
RUN_END_WAIT_S = 2.0


def stats_file(kernel_cache_dir: Path, soc: str = "") -> Path:
    """``<kernel cache>/cachemgr_stats_<soc>.json`` (``cachemgr_stats.json`` without a soc)."""
    return kernel_cache_dir / (f"{PREFIX}_{soc}.json" if soc else f"{PREFIX}.json")


class CacheCounters:
    """The counters of one kernel cache: files merged with this process's pending increments.

    :param kernel_cache_dir: the kernel cache whose counters these are.
    :param create: make the kernel cache folder at a flush when it does not exist yet (a
        compile run whose only answer was a precompiled binary made none; its count would
        otherwise be lost with a warning). Off for readers: a cache that does not exist has
        no counts.
    """

    def __init__(self, kernel_cache_dir: Path, create: bool = False) -> None:
        self.kernel_cache_dir = Path(kernel_cache_dir)
        self._create = create
        self._lock = threading.Lock()
        # held through a whole flush and a whole read, so a read never sees increments taken
        # out of ``_pending`` but not yet in the files (a snapshot then lacked them)
        self._flushing = threading.Lock()
        self._pending: dict[str, Counter[str]] = {}
        self._failing = False

    def add(self, name: str, amount: int = 1, soc: str = "") -> None:
        """Add ``amount`` to counter ``name`` of chip folder ``soc`` (in memory until
        :meth:`flush`)."""
        if amount:
            with self._lock:
                self._pending.setdefault(soc, Counter())[name] += amount

    def pending(self) -> bool:
        """True while increments wait for a flush."""
        with self._lock:
            return any(self._pending.values())

    def flush(self, wait_s: float = LOCK_WAIT_S) -> bool:
        """Merge the pending increments into the files (under the stats lock, waited for at
        most ``wait_s`` seconds); False when the cache cannot be written now (they stay
        pending, and one warning says why)."""
        with self._flushing:
            return self._flush(wait_s)

    def _flush(self, wait_s: float) -> bool:
        with self._lock:
            pending, self._pending = self._pending, {}
        if not any(pending.values()):
            return True
        try:
            if self._create:
                SafeDir.open_kernel_cache(self.kernel_cache_dir, create=True).close()
            with self._file_lock(wait_s):
                for soc, deltas in pending.items():
                    if deltas:
                        path = stats_file(self.kernel_cache_dir, soc)
                        merged = Counter(_read(path))
                        merged.update(deltas)
                        _write(path, merged)
        except (OSError, LockBusyError, UnsafePathError) as exc:
            with self._lock:  # keep them for the next flush
                for soc, deltas in pending.items():
                    self._pending.setdefault(soc, Counter()).update(deltas)
            if not self._failing:
                log.warning(
                    "cannot save the counters of %s (%s); keeping them in memory",
                    self.kernel_cache_dir,
                    getattr(exc, "strerror", None) or exc,
                )
            self._failing = True
            return False
        self._failing = False
        return True

    def per_chip(self) -> dict[str, dict[str, int]]:
        """``{soc: {name: value}}`` from the files plus pending increments (``""``: counts
        not tied to a chip folder)."""
        out: dict[str, Counter[str]] = {}
        with self._flushing:
            for soc, path in self._files():
                out[soc] = Counter(_read(path))
            with self._lock:
                for soc, deltas in self._pending.items():
                    out.setdefault(soc, Counter()).update(deltas)
        return {soc: _full(c) for soc, c in sorted(out.items())}

    def snapshot(self) -> dict[str, int]:
        """Every counter summed over the chip folders (the names of docs/design.md#counters
        first)."""
        return summed(self.per_chip())

    def zero(self) -> None:
        """Reset every counter of this cache (``stats --zero``): pending increments are
        dropped and each file rewritten with zeros, under the stats lock.

        :raises OSError: the cache cannot be written.
        """
        with self._lock:
            self._pending = {}
        with self._file_lock():
            for _, path in self._files():
                _write(path, Counter())

    def _files(self) -> list[tuple[str, Path]]:
        try:
            names = os.listdir(self.kernel_cache_dir)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            if exc.errno in fsutil.GONE_ERRNOS:
                return []
            raise
        found = []
        for name in names:
            soc = counterfiles.soc_of(name)
            if soc is not None:
                found.append((soc, self.kernel_cache_dir / name))
        return sorted(found)

    @contextlib.contextmanager
    def _file_lock(self, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
        """Hold ``cachemgr_stats.lock`` (fcntl: other processes and hosts) for a merge.

        :raises OSError: the lock file cannot be made (read-only root) or locked.
        :raises LockBusyError: it stayed held for ``wait_s`` seconds.
        """
        lock = fsutil.FcntlLock(self.kernel_cache_dir / LOCK_NAME)
        lock.acquire(timeout_s=wait_s)
        try:
            yield
        finally:
            lock.release()


def summed(per_chip: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """Every counter of ``per_chip`` (:meth:`CacheCounters.per_chip`) summed, the names of
    docs/design.md#counters first: a caller that has the rows sums them without reading
    the files again (each unreadable one would be warned of twice)."""
    total: Counter[str] = Counter()
    for values in per_chip.values():
        total.update(values)
    return _full(total)


def _full(values: Mapping[str, int]) -> dict[str, int]:
    return counterfiles.full(dict(values))


def _read(path: Path) -> dict[str, int]:
    """A stats file's counters; a damaged, foreign or oversized file counts as empty (it is
    untrusted input: docs/design.md#sharing-and-locking) and is replaced at the next flush."""
    try:
        raw = fsutil.read_bytes_noatime(path, max_bytes=MAX_FILE_BYTES)
    except fsutil.FileTooLargeError:
        log.warning("ignoring counters file %s: over %d bytes, not ours", path, MAX_FILE_BYTES)
        return {}
    except OSError as exc:
        if exc.errno not in fsutil.GONE_ERRNOS:
            log.warning("ignoring unreadable counters file %s: %s", path, exc.strerror or exc)
        return {}
    if len(raw) > MAX_FILE_BYTES:
        log.warning("ignoring counters file %s: %d bytes is not a counters file", path, len(raw))
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # [[[…]]]: RecursionError
        log.warning("ignoring damaged counters file %s: %s", path, exc)
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(k): v
        for k, v in data.items()
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63
    }


def _write(path: Path, values: Mapping[str, int]) -> None:
    data = json.dumps(dict(sorted(values.items())), sort_keys=True).encode()
    # no fsync: counters are statistics, and a damaged file is read as empty
    fsutil.atomic_write_bytes(path, data, sync=False)  # the folder's shared mode


class CounterBook:
    """The counters of every kernel cache a process works on (a reload may move the cache;
    a CLI run may compile for several): :class:`CacheCounters` by kernel cache folder.

    :param default: the current kernel cache (counts given no chip folder go there).
    :param create: make a kernel cache folder missing at a flush (:class:`CacheCounters`).
    """

    def __init__(self, default: Callable[[], Path], create: bool = False) -> None:
        self._default = default
        self._create = create
        self._lock = threading.Lock()
        self._caches: dict[Path, CacheCounters] = {}

    def cache(self, kernel_cache_dir: Path | None = None) -> CacheCounters:
        """The counters of ``kernel_cache_dir`` (default: the current kernel cache)."""
        path = Path(kernel_cache_dir) if kernel_cache_dir is not None else self._default()
        with self._lock:
            found = self._caches.get(path)
            if found is None:
                found = self._caches[path] = CacheCounters(path, self._create)
            return found

    def add(self, name: str, amount: int = 1, chip_dir: Path | None = None) -> None:
        """Count ``amount`` of ``name`` for ``chip_dir`` (``<kernel cache>/<soc>``), or for
        the current kernel cache as a whole when None."""
        if chip_dir is None:
            self.cache().add(name, amount)
        else:
            chip_dir = Path(chip_dir)
            self.cache(chip_dir.parent).add(name, amount, chip_dir.name)

    def tally(self, chip_dir: Path | None, name: str, amount: int) -> None:
        """:meth:`add` in the argument order of :class:`cachemgr.compile.queue.CompileQueue`'s
        ``tally`` hook."""
        self.add(name, amount, chip_dir)

    def snapshot(self) -> dict[str, int]:
        """The current kernel cache's counters."""
        return self.cache().snapshot()

    def save(self, wait_s: float = LOCK_WAIT_S) -> bool:
        """Flush every cache's pending increments (each waiting at most ``wait_s`` seconds
        for its stats lock); False if one could not be written."""
        with self._lock:
            caches = list(self._caches.values())
        return all([c.flush(wait_s) for c in caches])
