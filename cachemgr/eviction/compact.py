"""A chip folder's snapshot for ``gc`` in bounded memory (docs/eviction.md#memory).

:func:`scan_compact` groups a chip folder's files exactly as
:func:`cachemgr.storage.entry.scan_chip` does — one ``scandir`` and one ``lstat`` per file, no
json opened — but keeps the entries shaped like CANN's (``<stem>.json``, at most one binary
``<stem>.<ext>`` and a ``<stem>.h``; a stem without a dot or a part suffix) as ~46 bytes in
columns of the :mod:`array` module, without their names: a Python string of a 71-character
kernel name alone costs 120 bytes, and the per-file dictionaries of ``scan_chip`` ~1.1 KiB an
entry (1.2 GB at 1,000,000 entries). An entry is found by its name's hash (two independent
64-bit hashes: an entry whose files disagree on the second, or two files of one kind under
one key, raise :class:`HashCollision` and the caller scans the old way); its name comes back
from the folder itself, by a listing of names (no ``stat``) when the run needs names: the
reclaim pass, the entries the plan selects, the entries beyond the access time the plan needs.

Every other entry (parts of mix kernels, names with dots, an entry a json names files for)
is an :class:`~cachemgr.storage.entry.EntryGroup` as in ``scan_chip``: taking one by
``entries[kernel]`` keeps it that way, so changes to it stay (as with a dict).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Protocol

from cachemgr.storage import entry, fsutil
from cachemgr.storage.entry import ChipScan, EntryGroup, FileStat

#: flags of a compact entry (``_CHECK``: its main json needs the full GE-fatal check)
_JSON, _BIN, _HEADER, _DEAD, _EXTRA, _CHECK = 1, 2, 4, 8, 16, 32
#: the largest size a compact column holds (bytes); a larger file's entry is kept the old way
_MAX_SIZE = 2**32 - 1
_JSON_EXT, _HEADER_EXT = "json", "h"
#: extensions that never belong to an entry by name (``scan_chip``'s rule)
_NOT_PARTS = frozenset({"lock", "temp", ""})
_PARTS = entry.PART_STEM_SUFFIXES


class Judge(Protocol):
    """Judges each main json of an entry kept in columns as the scan lists it
    (:class:`cachemgr.eviction.fatalscan.PlainJudge`)."""

    #: the jsons changed (``st_ctime``/``st_mtime``) at or after this time (ns since the
    #: epoch) are judged; 0 = all
    since_ns: int

    def __call__(self, name: str, st: os.stat_result) -> bool:
        """True when the json ``name`` (its ``lstat``: ``st``) needs the full check."""


class HashCollision(Exception):
    """Two names met under one key: the caller scans with ``entry.scan_chip`` instead."""


def simple_stem(stem: str) -> bool:
    """True for a stem whose entry may be kept in columns: not empty, no dot, no part suffix
    (such a name can own no other entry's files and belong to none)."""
    return bool(stem) and "." not in stem and not stem.endswith(_PARTS)


def _check(stem: str) -> int:
    """The second, independent hash of a stem (the first is ``hash(stem)``)."""
    return hash(stem[::-1])


class CompactEntries(MutableMapping[str, EntryGroup]):
    """The entries of one chip-folder scan, by kernel name (a mapping, as ``ChipScan.entries``).

    Entries kept in columns are made into an :class:`EntryGroup` when asked for:
    ``entries[kernel]`` (and ``get``) moves it out of the columns, so changes to it stay;
    :meth:`transient` and :meth:`groups` make one that is not kept. Iteration lists the
    chip folder's names (no ``stat``): entries removed meanwhile are not named.
    """

    def __init__(self, dir_fd: int) -> None:
        self._fd = dir_fd
        self._dict: dict[str, EntryGroup] = {}
        self.keys_ = array("q")
        self._chk = array("q")
        self.atimes = array("q")
        self.sizes = array("q")
        self._jsize = array("I")
        self._bsize = array("I")
        self._hsize = array("I")
        self._ext = array("H")
        self.flags = array("B")
        self._ext_names: list[str] = []
        self._ext_ids: dict[str, int] = {}
        self._index = array("i", [-1]) * 1024
        self._mask = 1023
        self._extras: dict[int, dict[str, FileStat]] = {}
        self.alive = 0  # compact entries with a json, not removed
        self.unresolved = 0  # of which no binary is known by name (pre-build ones too)
        self.without_json = 0  # compact stems without a json (orphans, found by name later)
        #: stems with a json among the files kept the old way (``scan_chip``'s json stems)
        self.legacy_jsons: set[str] = set()
        #: the ``Judge.since_ns`` the scan judged main jsons with (None: not judged), and
        #: how many rows it marked for the full check
        self.judged_since: int | None = None
        self.to_check = 0

    # --- building (the scan) -----------------------------------------------------------------

    def _find(self, stem: str, key: int) -> int:
        """The row of ``stem`` (-1 when absent).

        :raises HashCollision: a row has the key and another second hash.
        """
        index, keys, mask = self._index, self.keys_, self._mask
        i = key & mask
        while True:
            j = index[i]
            if j < 0:
                return -1
            if keys[j] == key:
                if self._chk[j] != _check(stem):
                    raise HashCollision(stem)
                return j
            i = (i + 1) & mask

    def _insert(self, key: int, j: int) -> None:
        index, mask = self._index, self._mask
        i = key & mask
        while index[i] >= 0:
            i = (i + 1) & mask
        index[i] = j

    def _grow(self) -> None:
        size = len(self._index) * 2
        self._index = array("i", [-1]) * size
        self._mask = size - 1
        for j, key in enumerate(self.keys_):
            self._insert(key, j)

    def add(self, stem: str, ext: str, st: os.stat_result) -> bool:
        """Record the file ``<stem>.<ext>`` from its ``lstat``; False when its entry cannot be
        kept in columns (a second binary, a size over 4 GiB): the caller keeps the stem's
        files the old way (:meth:`spill` gives back what was recorded).

        :raises HashCollision: two files of one kind under one key, or the second hash differs.
        """
        key = hash(stem)
        index, keys, mask = self._index, self.keys_, self._mask
        i = key & mask
        while (j := index[i]) >= 0 and keys[j] != key:  # _find() inlined: once per file
            i = (i + 1) & mask
        size = st.st_size
        if j < 0:
            j = index[i] = len(keys)
            keys.append(key)
            self._chk.append(_check(stem))
            self.atimes.append(0)
            self.sizes.append(0)
            self._jsize.append(0)
            self._bsize.append(0)
            self._hsize.append(0)
            self._ext.append(0)
            self.flags.append(0)
            self.without_json += 1
            if 2 * len(keys) > len(index):
                self._grow()
        elif self._chk[j] != _check(stem):
            raise HashCollision(stem)
        flags = self.flags[j]
        if flags & _DEAD or size > _MAX_SIZE:
            return False
        if ext == _JSON_EXT:
            if flags & _JSON:
                raise HashCollision(stem)
            self._jsize[j] = size
            self.atimes[j] = st.st_atime_ns
            self.flags[j] = flags | _JSON
            self.without_json -= 1
        elif ext == _HEADER_EXT:
            if flags & _HEADER:
                raise HashCollision(stem)
            self._hsize[j] = size
            self.flags[j] = flags | _HEADER
        else:
            ext_id = self._ext_id(ext)
            if flags & _BIN:
                if self._ext[j] == ext_id:
                    raise HashCollision(stem)
                return False
            self._bsize[j] = size
            self._ext[j] = ext_id
            self.flags[j] = flags | _BIN
        self.sizes[j] += size
        return True

    def mark_check(self, stem: str) -> None:
        """Mark ``stem``'s row: its main json needs the full GE-fatal check."""
        j = self._find(stem, hash(stem))
        if j >= 0 and not self.flags[j] & _CHECK:
            self.flags[j] |= _CHECK
            self.to_check += 1

    def marked(self) -> Iterator[tuple[str, int]]:
        """``(kernel, row)`` of the live rows :meth:`mark_check` marked (one listing; none
        when no row is marked)."""
        if self.to_check:
            flags = self.flags
            yield from ((k, j) for k, j in self.names() if flags[j] & _CHECK)

    def _ext_id(self, ext: str) -> int:
        ext_id = self._ext_ids.get(ext)
        if ext_id is None:
            ext_id = self._ext_ids[ext] = len(self._ext_names)
            self._ext_names.append(ext)
        return ext_id

    def spill(self, stem: str) -> dict[str, FileStat]:
        """Take ``stem`` out of the columns: its files as recorded, sizes from the scan and
        times from a new ``lstat`` (its json's access time as the scan saw it)."""
        j = self._find(stem, hash(stem))
        files: dict[str, FileStat] = {}
        if j < 0:
            return files
        flags = self.flags[j]
        for name, size in self._named_files(stem, j):
            st = fsutil.lstat_or_none(Path(name), self._fd)
            if st is not None:
                atime = self.atimes[j] if name.endswith(".json") else st.st_atime_ns
                files[name] = FileStat(size, atime, st.st_mtime_ns)
        if not flags & _JSON:
            self.without_json -= 1
        self.flags[j] = flags | _DEAD
        return files

    def finish(self) -> None:
        """Count the entries (after the listing): every row with a json is one."""
        alive = unresolved = 0
        for stem_flags in self.flags:
            if stem_flags & (_JSON | _DEAD) == _JSON:
                alive += 1
                if not stem_flags & _BIN:
                    unresolved += 1
        self.alive, self.unresolved = alive, unresolved

    def has_json(self, stem: str) -> bool:
        """Is ``<stem>.json`` a main json kept in columns or by the old way."""
        return stem in self

    def attach(self, kernel: str, name: str, fst: FileStat) -> None:
        """Add a file placed by name (a part, ``<kernel>.tar.gz``) to ``kernel``'s entry."""
        group = self._dict.get(kernel)
        if group is None:
            group = self[kernel]  # out of the columns: an entry with parts is kept whole
        group.files[name] = fst
        if name.rpartition(".")[2] != "json" and name != kernel + ".h":
            group.resolved = True

    # --- reading ---------------------------------------------------------------------------

    def row(self, kernel: str) -> int:
        """The row of ``kernel``'s entry in the columns; -1 when it is not kept there."""
        if not simple_stem(kernel):
            return -1
        j = self._find(kernel, hash(kernel))
        if j < 0 or self.flags[j] & (_JSON | _DEAD) != _JSON:
            return -1
        return j

    def _named_files(self, stem: str, j: int) -> Iterator[tuple[str, int]]:
        flags = self.flags[j]
        if flags & _JSON:
            yield stem + ".json", self._jsize[j]
        if flags & _BIN:
            yield f"{stem}.{self._ext_names[self._ext[j]]}", self._bsize[j]
        if flags & _HEADER:
            yield stem + ".h", self._hsize[j]

    def group_at(self, j: int, kernel: str) -> EntryGroup:
        """The entry in row ``j`` as an :class:`EntryGroup` named ``kernel`` (not kept)."""
        atime = self.atimes[j]
        files = {}
        for name, size in self._named_files(kernel, j):
            files[name] = FileStat(size, atime if name.endswith(".json") else 0, 0)
        resolved = bool(self.flags[j] & _BIN) or entry.is_pre_entry(kernel)
        return EntryGroup(kernel, files, resolved, atime)

    def transient(self, kernel: str) -> EntryGroup | None:
        """``kernel``'s entry, not kept (changes to it are lost); None when absent."""
        group = self._dict.get(kernel)
        if group is not None:
            return group
        j = self.row(kernel)
        return None if j < 0 else self.group_at(j, kernel)

    def listed_bytes(self, other: Callable[[os.DirEntry[str]], int]) -> int:
        """The bytes of the files the folder lists now (one listing, no ``stat``): a file
        of an entry counts the size the scan saw (its row found as :meth:`row` finds it,
        inlined: this runs once per listed file after a gc's removal, and makes no object
        per file) while it is still a regular file — a FIFO, link or folder renamed over it
        since counts nothing, as the scan counts it (the listing's file type, no ``stat``:
        docs/eviction.md#what-a-gc-leaves); every other name counts what ``other`` gives for
        its directory entry (bytes; 0 for a file that does not count)."""
        index, keys, checks, flags = self._index, self.keys_, self._chk, self.flags
        mask, whole = self._mask, self._dict
        total = 0
        with os.scandir(self._fd) as it:
            for de in it:
                name = de.name
                stem, _, ext = name.rpartition(".")
                group = whole.get(stem)
                if group is not None or not stem:
                    fst = None if group is None else group.files.get(name)
                    if fst is None:
                        total += other(de)
                    elif de.is_file(follow_symlinks=False):
                        total += fst.size
                    continue
                key = hash(stem)
                i = key & mask
                while (j := index[i]) >= 0 and keys[j] != key:
                    i = (i + 1) & mask
                size = -1
                if (
                    j >= 0
                    and flags[j] & (_JSON | _DEAD) == _JSON
                    and checks[j] == _check(stem)
                    and simple_stem(stem)
                ):
                    size = self._file_size(j, ext)
                if size < 0:
                    total += other(de)
                elif de.is_file(follow_symlinks=False):  # d_type: no stat
                    total += size
        return total

    def _file_size(self, j: int, ext: str) -> int:
        """The size the scan saw of row ``j``'s file with extension ``ext``; -1: no such file."""
        flags = self.flags[j]
        if ext == _JSON_EXT:
            return self._jsize[j]
        if ext == _HEADER_EXT:
            return self._hsize[j] if flags & _HEADER else -1
        if flags & _BIN and self._ext_names[self._ext[j]] == ext:
            return self._bsize[j]
        return -1

    def names(
        self, unresolved_only: bool = False, rows: bytes | None = None
    ) -> Iterator[tuple[str, int]]:
        """``(kernel, row)`` of every entry kept in columns (only rows ``j`` with
        ``rows[j]`` true, when given), by one listing of the folder's names (no ``stat``);
        entries removed meanwhile are skipped."""
        index, keys, checks, flags = self._index, self.keys_, self._chk, self.flags
        mask = self._mask
        with os.scandir(self._fd) as it:
            for de in it:
                name = de.name
                if not name.endswith(".json"):
                    continue
                stem = name[:-5]
                key = hash(stem)
                i = key & mask
                while (j := index[i]) >= 0 and keys[j] != key:  # row() inlined: 2 per entry
                    i = (i + 1) & mask
                if (
                    j < 0
                    or flags[j] & (_JSON | _DEAD) != _JSON
                    or (rows is not None and not rows[j])
                ):
                    continue
                if not simple_stem(stem) or checks[j] != _check(stem):
                    continue
                if not unresolved_only or not (flags[j] & _BIN or entry.is_pre_entry(stem)):
                    yield stem, j

    def no_json_files(self) -> Iterator[str]:
        """The names of files recorded under a stem without a json (orphans to place), by
        one listing; each stem is then dropped from the columns."""
        if not self.without_json:
            return
        with os.scandir(self._fd) as it:
            for de in it:
                stem, _, ext = de.name.rpartition(".")
                if ext in _NOT_PARTS or not simple_stem(stem):
                    continue
                j = self._find(stem, hash(stem))
                if j >= 0 and not self.flags[j] & (_JSON | _DEAD):
                    yield de.name

    def drop_without_json(self) -> None:
        """Mark every stem without a json as not an entry (after :meth:`no_json_files`)."""
        flags = self.flags
        for j, f in enumerate(flags):
            if not f & (_JSON | _DEAD):
                flags[j] = f | _DEAD
        self.without_json = 0

    def groups(self) -> Iterator[EntryGroup]:
        """Every entry (those kept whole first), made one at a time and not kept; safe while
        entries are removed."""
        yield from list(self._dict.values())
        for kernel, j in self.names():
            yield self.group_at(j, kernel)

    def unresolved_groups(self) -> list[EntryGroup]:
        """The entries without a binary known by name, kept whole (their json is opened
        and the files it names are added to them)."""
        found = [g for g in self._dict.values() if not g.resolved]
        if self.unresolved:
            found += [self[k] for k, _ in list(self.names(unresolved_only=True))]
        return found

    def whole(self) -> dict[str, EntryGroup]:
        """The entries kept whole (not in columns), by kernel."""
        return self._dict

    # --- the mapping -------------------------------------------------------------------------

    def __getitem__(self, kernel: str) -> EntryGroup:
        group = self._dict.get(kernel)
        if group is not None:
            return group
        j = self.row(kernel)
        if j < 0:
            raise KeyError(kernel)
        group = self._dict[kernel] = self.group_at(j, kernel)
        self._kill(j)
        return group

    def _kill(self, j: int) -> None:
        self.flags[j] |= _DEAD
        self.alive -= 1
        if not self.flags[j] & _BIN:
            self.unresolved -= 1

    def __setitem__(self, kernel: str, group: EntryGroup) -> None:
        j = self.row(kernel)
        if j >= 0:
            self._kill(j)
        self._dict[kernel] = group

    def __delitem__(self, kernel: str) -> None:
        if self._dict.pop(kernel, None) is not None:
            return
        j = self.row(kernel)
        if j < 0:
            raise KeyError(kernel)
        self._kill(j)

    def __contains__(self, kernel: object) -> bool:
        if not isinstance(kernel, str):
            return False
        return kernel in self._dict or self.row(kernel) >= 0

    def __iter__(self) -> Iterator[str]:
        yield from list(self._dict)
        for kernel, _ in self.names():
            yield kernel

    def __len__(self) -> int:
        return len(self._dict) + self.alive


def scan_compact(chip_dir: Path, dir_fd: int, judge: Judge | None = None) -> ChipScan:
    """:func:`cachemgr.storage.entry.scan_chip` of the chip folder open as ``dir_fd``, with
    its entries in a :class:`CompactEntries` (the same grouping; docs/eviction.md#memory).

    :param judge: called with each main json of an entry kept in columns as it is listed
        (the file is hot then, and no second listing is needed); rows it returns True for
        are marked (:meth:`CompactEntries.marked`) — docs/eviction.md#cost.

    :raises HashCollision: two names under one key (scan with ``scan_chip`` instead).
    :raises OSError: when the folder cannot be listed (e.g. ``EACCES``).
    """
    scan = ChipScan(chip_dir, dir_fd=dir_fd)
    entries = CompactEntries(dir_fd)
    scan.entries = entries
    by_stem: dict[str, dict[str, FileStat]] = {}
    loose: dict[str, FileStat] = {}
    entries.judged_since = None if judge is None else judge.since_ns
    try:
        _list(scan, dir_fd, entries, by_stem, loose, judge)
    except OSError as exc:
        if exc.errno in fsutil.GONE_ERRNOS or isinstance(exc, NotADirectoryError):
            return ChipScan(chip_dir, dir_fd=dir_fd)
        raise
    entries.finish()
    entries.legacy_jsons = {stem for stem, files in by_stem.items() if stem + ".json" in files}
    whole = entries.whole()
    for stem, files in by_stem.items():
        if stem + ".json" in files and _is_main_json(stem, entries):
            resolved = len(files) > (2 if stem + ".h" in files else 1) or entry.is_pre_entry(stem)
            whole[stem] = EntryGroup(stem, files, resolved, files[stem + ".json"][1])
    for name in list(entries.no_json_files()):
        st = fsutil.lstat_or_none(Path(name), dir_fd)
        if st is not None:
            _place(scan, entries, name, FileStat(st.st_size, st.st_atime_ns, st.st_mtime_ns))
    entries.drop_without_json()
    for stem, files in by_stem.items():  # stems without a main json: parts, orphans
        if stem not in whole:
            for name, fst in files.items():
                _place(scan, entries, name, fst)
    for name, fst in loose.items():
        _place(scan, entries, name, fst)
    return scan


def _is_main_json(stem: str, entries: CompactEntries) -> bool:
    """``scan_chip``'s rule: a ``<kernel><part suffix>.json`` beside ``<kernel>.json`` is a part."""
    if not stem.endswith(_PARTS):
        return True
    return not any(stem.endswith(sfx) and _json_stem(stem[: -len(sfx)], entries) for sfx in _PARTS)


def _json_stem(stem: str, entries: CompactEntries) -> bool:
    """Has ``stem`` a ``<stem>.json`` (kept in columns, or the old way)?"""
    return entries.row(stem) >= 0 or stem in entries.legacy_jsons


def _place(scan: ChipScan, entries: CompactEntries, name: str, fst: FileStat) -> None:
    """Place a file that is not an entry's by its stem: ``scan_chip``'s rules
    (``entry.place_file``), with parts added through :meth:`CompactEntries.attach`."""
    owner = entry.place_file(scan, name, fst)
    if owner is not None:
        entries.attach(owner, name, fst)


def _list(
    scan: ChipScan,
    dir_fd: int,
    entries: CompactEntries,
    by_stem: dict[str, dict[str, FileStat]],
    loose: dict[str, FileStat],
    judge: Judge | None = None,
) -> None:
    """The listing: one ``scandir`` + one ``lstat`` per regular file, as ``scan_chip``'s."""
    spilled: set[str] = set()
    used = 0
    new_stat = FileStat
    with os.scandir(dir_fd) as it:
        for de in it:
            st = entry.listed_file(scan, de)
            if st is None:
                continue
            name = de.name
            used += st.st_size
            stem, _, ext = name.rpartition(".")
            if ext in _NOT_PARTS:
                loose[name] = new_stat(st.st_size, st.st_atime_ns, st.st_mtime_ns)
                continue
            if simple_stem(stem) and stem not in spilled:
                if entries.add(stem, ext, st):
                    if judge is not None and ext == _JSON_EXT and judge(name, st):
                        entries.mark_check(stem)
                    continue
                spilled.add(stem)
                by_stem[stem] = entries.spill(stem)
            fst = new_stat(st.st_size, st.st_atime_ns, st.st_mtime_ns)
            bucket = by_stem.get(stem)
            if bucket is None:
                by_stem[stem] = {name: fst}
            else:
                bucket[name] = fst
    scan.used_bytes += used
