"""Usage of each chip folder, kept current from file events and periodic scans
(docs/design.md#size-limits-and-eviction, #sharing-and-locking).

Used bytes of a chip folder = sum of the apparent sizes of its regular files [GE], each with
one name as gc's scan counts them (docs/security.md item 2). The index
keeps one size per file name so that a delete event (which carries no size) can be
subtracted; names are kept as 64-bit xxhash digests, not strings. inotify sees only this
host's writes: the periodic :meth:`UsageIndex.reconcile` rescans each chip folder, which is
how other hosts' writes and any drift are caught (docs/design.md#sharing-and-locking).

Why SQLite: the daemon must hold 1,000,000 entries (about 2,000,000 files)
in at most 100 MB of resident memory. A Python ``dict[int, int]`` costs about 100 bytes per
file (two int objects and a hash slot): 200 MB for 2,000,000 files. An in-memory SQLite
table keyed by the digest (``INTEGER PRIMARY KEY``: the row id itself, so no second index)
stores a row in about 20 bytes, looks one up in a B-tree in microseconds, and is a
well-kept library in the standard library rather than a home-made packed structure. A
rescan updates the rows in place (``gen`` alternates between 0 and 1, which SQLite stores in
no payload byte), then deletes the rows it did not see: the table never exists twice, and
file events keep being applied while a rescan runs (each batch of rows holds the lock
briefly).

The index is the only per-file state the daemon keeps: a rescan streams (batches of
:data:`BATCH_ROWS` rows), and everything that needs a whole scan of a chip folder — reclaim,
eviction, ``/gc`` — runs in a child process (:mod:`cachemgr.daemon.gcchild`). Measured at
1,000,000 entries (2,000,000 files): the daemon's resident memory after its first scan is
81 MB, its peak 82 MB (``BENCHMARKS.md``, scaling).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import xxhash

from cachemgr.config.layout import is_chip_folder
from cachemgr.storage import fsutil
from cachemgr.storage.chipcount import counted, counted_file

log = logging.getLogger(__name__)

#: Rows written per transaction (and per hold of the lock) during a rescan.
BATCH_ROWS = 10_000
_SIGN = 1 << 63
#: Rescans of one chip folder tried when it is forgotten (removed, made again) meanwhile.
RESCAN_TRIES = 3


class UsageIndex:
    """Per chip folder: a table ``digest of file name → bytes``, the total and the entry count.

    :param kernel_cache_dir: the folder holding the chip folders.
    """

    def __init__(self, kernel_cache_dir: Path) -> None:
        self.kernel_cache_dir = kernel_cache_dir
        self._lock = threading.Lock()
        # one connection, used by every thread under self._lock; nothing to roll back to
        self._db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=OFF")
        self._tables: dict[str, str] = {}  # soc → table name
        self._gen: dict[str, int] = {}  # soc → generation rows written now carry (0 or 1)
        self._used: dict[str, int] = {}
        self._entries: dict[str, int] = {}
        self._made = 0
        #: soc → why its last rescan failed (one line); warned about once per change
        self.problems: dict[str, str] = {}

    def chips(self) -> list[str]:
        """soc versions currently indexed."""
        with self._lock:
            return sorted(self._tables)

    def used_bytes(self, soc: str) -> int:
        """Indexed used bytes of one chip folder (0 when unknown)."""
        with self._lock:
            return self._used.get(soc, 0)

    def entries(self, soc: str) -> int:
        """Number of main jsons indexed in one chip folder (an estimate of entries)."""
        with self._lock:
            return self._entries.get(soc, 0)

    def total_files(self) -> int:
        """Files indexed over every chip folder."""
        with self._lock:
            return sum(self._count(t) for t in self._tables.values())

    def size_of(self, path: Path) -> int | None:
        """The indexed size of one file in bytes (None when not indexed)."""
        soc = self._soc_of(path)
        with self._lock:
            table = self._tables.get(soc or "")
            if table is None:
                return None
            row = self._db.execute(
                f"SELECT size FROM {table} WHERE key = ?", (_key(path.name),)
            ).fetchone()
        return None if row is None else int(row[0])

    def reconcile(self, progress: Callable[[int, int, int], None] | None = None) -> dict[str, int]:
        """Rescan every chip folder (one ``scandir`` + ``lstat`` pass each); return used bytes.

        :param progress: called as ``progress(chip folders done, total, files so far)``.
        """
        try:
            with os.scandir(self.kernel_cache_dir) as it:
                chips = [e.name for e in it if is_chip_folder(e)]
        except OSError as exc:
            if not isinstance(exc, NotADirectoryError) and exc.errno not in fsutil.GONE_ERRNOS:
                raise
            chips = []
        for soc in set(self.chips()) - set(chips):
            self.forget(soc)
        files = 0
        for done, soc in enumerate(chips, 1):
            self.rescan_isolated(soc)  # one member's private folder does not stop the others
            if progress is not None:
                with self._lock:
                    files += self._count(self._tables[soc])
                progress(done, len(chips), files)
        with self._lock:
            return dict(self._used)

    def forget(self, soc: str) -> None:
        """Drop a chip folder that is gone."""
        with self._lock:
            table = self._tables.pop(soc, None)
            for figures in (self._gen, self._used, self._entries):
                figures.pop(soc, None)
            if table is not None:
                self._db.execute(f"DROP TABLE {table}")

    def reconcile_chip(self, soc: str) -> int:
        """Rescan one chip folder; return its used bytes.

        Rows are upserted in batches with the new generation, then the rows of the old one
        (files gone since the last scan) are deleted. A file event during the rescan writes
        the new generation too, so it is neither lost nor deleted. A chip folder forgotten
        during the rescan (removed and made again) is rescanned into its new table.
        """
        for _ in range(RESCAN_TRIES):
            used = self._rescan(soc)
            if used is not None:
                return used
        with self._lock:
            return self._used.get(soc, 0)

    def rescan_isolated(self, soc: str) -> bool:
        """:meth:`reconcile_chip`, its failure (e.g. a member's ``0700`` chip folder) logged
        as one warning naming the folder's owner and mode — once, not on every rescan: again
        only when the problem changes, and once when it is gone (docs/security.md item 3).

        :returns: False when the rescan failed (the folder's figures are kept as they were).
        """
        try:
            self.reconcile_chip(soc)
        except OSError as exc:
            self.note_problem(soc, exc)
            return False
        self.note_problem(soc, None)
        return True

    def note_problem(self, soc: str, exc: OSError | None) -> None:
        """Remember (and on a change, log once) why ``soc`` cannot be scanned, or that it can."""
        chip = self.kernel_cache_dir / soc
        if exc is None:
            if self.problems.pop(soc, None) is not None:
                log.warning("%s can be scanned again", chip)
            return
        why = fsutil.access_hint(chip, "readable") if isinstance(exc, PermissionError) else exc
        line = f"{why}; chip folder {soc} is skipped, the others are served"
        if self.problems.get(soc) != line:
            self.problems[soc] = line
            log.warning("%s", line)

    def _rescan(self, soc: str) -> int | None:
        """One rescan of ``soc``; None when its table was dropped meanwhile."""
        with self._lock:
            table = self._table(soc)
            gen = self._gen[soc] = 1 - self._gen[soc]
        entries = 0
        upsert = (
            f"INSERT INTO {table} (key, size, gen) VALUES (?, ?, {gen}) "
            "ON CONFLICT(key) DO UPDATE SET size = excluded.size, gen = excluded.gen"
        )
        for batch, mains in _scan_batches(self.kernel_cache_dir / soc):
            entries += mains
            with self._lock:
                if self._tables.get(soc) != table:
                    return None
                self._write(upsert, batch)
        with self._lock:
            if self._tables.get(soc) != table:
                return None
            self._db.execute(f"DELETE FROM {table} WHERE gen != {gen}")
            (used,) = self._db.execute(f"SELECT total(size) FROM {table}").fetchone()
            self._used[soc] = int(used)
            self._entries[soc] = entries
            return self._used[soc]

    def file_changed(self, path: Path) -> str | None:
        """Account a created/modified file; return its soc when inside a chip folder."""
        soc = self._soc_of(path)
        if soc is None:
            return None
        st = fsutil.lstat_or_none(path)
        # a hard link counts for nothing, as in gc's scan and stats (docs/security.md item 2):
        # a member's link to a large file of theirs cannot put a folder over its limit
        size = st.st_size if st is not None and counted_file(path.name, st) else None
        key = _key(path.name)
        with self._lock:
            table = self._table(soc)
            old = self._pop(table, key)
            if size is not None:
                self._db.execute(
                    f"INSERT INTO {table} (key, size, gen) VALUES (?, ?, ?)",
                    (key, size, self._gen[soc]),
                )
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
            table = self._tables.get(soc)
            old = None if table is None else self._pop(table, _key(path.name))
            self._used[soc] = self._used.get(soc, 0) - (old or 0)
            if old is not None and _is_main_json(path.name):
                self._entries[soc] = self._entries.get(soc, 0) - 1
        return soc

    def _soc_of(self, path: Path) -> str | None:
        if path.parent.parent != self.kernel_cache_dir:
            return None
        return path.parent.name

    def _table(self, soc: str) -> str:
        """The table of ``soc``, created empty on first use (caller holds the lock)."""
        table = self._tables.get(soc)
        if table is None:
            self._made += 1
            table = f"chip{self._made}"  # never the soc's own name: no quoting of untrusted text
            self._db.execute(
                f"CREATE TABLE {table} (key INTEGER PRIMARY KEY, size INTEGER NOT NULL, "
                "gen INTEGER NOT NULL)"
            )
            self._tables[soc] = table
            self._gen[soc] = 0
            self._used.setdefault(soc, 0)
            self._entries.setdefault(soc, 0)
        return table

    def _pop(self, table: str, key: int) -> int | None:
        """Delete one row; return its size (caller holds the lock)."""
        row = self._db.execute(f"DELETE FROM {table} WHERE key = ? RETURNING size", (key,))
        found = row.fetchone()
        return None if found is None else int(found[0])

    def _count(self, table: str) -> int:
        return int(self._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])

    def _write(self, sql: str, rows: list[tuple[int, int]]) -> None:
        self._db.execute("BEGIN")
        try:
            self._db.executemany(sql, rows)
        finally:
            self._db.execute("COMMIT")


def _key(name: str) -> int:
    """The file name's 64-bit xxh3 digest as SQLite's signed 64-bit integer."""
    digest = xxhash.xxh3_64_intdigest(name.encode("utf-8", "surrogateescape"))
    return digest - (1 << 64) if digest >= _SIGN else digest


def _is_main_json(name: str) -> bool:
    """Cheap by-name test used for the entry count (sub-jsons excluded; GE's ``_pre.json``
    pre-build entries count: they are entries, ``cachemgr.storage.entry`` rule R7)."""
    return name.endswith(".json") and "_mix_" not in name


def _scan_batches(chip_dir: Path) -> Iterator[tuple[list[tuple[int, int]], int]]:
    """The regular files of a chip folder as batches of ``(digest, bytes)`` rows, each with
    its count of main jsons; a folder that is gone (also ``ESTALE``) gives none."""
    batch: list[tuple[int, int]] = []
    mains = 0
    try:
        for name, st in fsutil.regular_files(chip_dir):
            if not counted(name, st):
                continue
            batch.append((_key(name), st.st_size))
            mains += _is_main_json(name)
            if len(batch) >= BATCH_ROWS:
                yield batch, mains
                batch, mains = [], 0
    except OSError as exc:  # gone, also removed by another NFS host (ESTALE): empty
        if not isinstance(exc, NotADirectoryError) and exc.errno not in fsutil.GONE_ERRNOS:
            raise
    if batch or mains:
        yield batch, mains
