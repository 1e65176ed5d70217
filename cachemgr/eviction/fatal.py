"""Remove, on sight, the entries whose json makes CANN GE abort (rules F1–F8 of
:mod:`cachemgr.storage.gefatal`; docs/interop.md#entries-that-abort-ge).

Such an entry kills every CANN process that looks its kernel up or evicts its chip folder,
and GE never serves it, so it goes at once: no aging guard. It goes whole (json first, then
its parts) under its ``<kernel>.lock`` (a writer holds that lock until the json is in place:
``TeCacheManager::SetCompileResult``), after the shape was seen again under the lock — never
while a json is being written. ``gc``'s reclaim calls :func:`remove_fatal_group` for the
entries of its scan; the daemon calls :func:`remove_if_fatal` for a json that just appeared
(one entry, no scan of the folder).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from cachemgr.errors import LockBusyError
from cachemgr.eviction import files
from cachemgr.storage import entry, fsutil, gefatal
from cachemgr.storage.entry import EntryGroup, FileStat
from cachemgr.storage.gefatal import Fatal
from cachemgr.storage.safedir import SafeDir
from cachemgr.storage.store import Store
from cachemgr.storage.tiers import chip_store

log = logging.getLogger(__name__)


@dataclass
class FatalOutcome:
    """What became of one entry found GE-fatal: ``fatal`` is None when it was not (or no
    longer, under the lock); ``removal`` is None for a dry run."""

    kernel: str
    fatal: Fatal | None = None
    removal: files.Removal | None = None

    @property
    def removed(self) -> bool:
        """The entry is gone (or, for a dry run, would go)."""
        return self.fatal is not None and (self.removal is None or self.removal.json_gone)


def group_fatal(chip_dir: Path, chip_fd: int, group: EntryGroup) -> Fatal | None:
    """The first GE-fatal shape among the jsons of ``group`` (read without changing access
    times), or None."""
    names = [n for n in group.files if n.endswith(".json")]
    return gefatal.entry_fatal(group.kernel, names, gefatal.chip_reader(chip_dir, chip_fd))


def changed_since(chip_fd: int, group: EntryGroup, since_ns: int) -> bool:
    """Did a json of ``group`` change (content or name: ``st_ctime``, which no one but the
    clock sets back) at or after ``since_ns`` (ns since the epoch)?"""
    for name in group.files:
        if name.endswith(".json"):
            st = fsutil.lstat_or_none(Path(name), chip_fd)
            if st is not None and max(st.st_ctime_ns, st.st_mtime_ns) >= since_ns:
                return True
    return False


def remove_fatal_group(
    store: Store,
    chip_fd: int,
    group: EntryGroup,
    dry_run: bool,
    lock_wait_s: float,
) -> FatalOutcome:
    """Check ``group``; if GE-fatal, take its entry lock (waiting up to ``lock_wait_s``
    seconds), check again under it, and remove the entry whole.

    :raises LockBusyError: the entry's lock stayed held (a writer: try again later).
    :raises OSError: the lock cannot be taken (permission problems of files are in
        ``removal.denied``).
    """
    chip_dir = store.chip_dir
    out = FatalOutcome(group.kernel, group_fatal(chip_dir, chip_fd, group))
    if out.fatal is None or dry_run:
        return out
    lock = store.entry_lock(group.kernel)
    if not lock.acquire(timeout_s=lock_wait_s):
        raise LockBusyError(f"{group.kernel}.lock is held")
    try:
        out.fatal = group_fatal(chip_dir, chip_fd, group)  # seen again, under the lock
        if out.fatal is None:
            return out
        out.removal = files.remove_group(chip_fd, group)
        if out.removal.json_gone:  # its lock file too, once old enough
            files.release_removed(lock, group.json_name, chip_fd)
    finally:
        if lock.held:
            lock.release()  # the lock file stays: a GE process may hold it (files.reap_lock)
    if out.removal.json_gone:
        log.warning("%s: removed entry %s: %s", chip_dir, group.kernel, out.fatal.line())
    return out


def remove_if_fatal(chip_dir: Path, kernel: str, lock_wait_s: float = 0.0) -> FatalOutcome:
    """:func:`remove_fatal_group` for one entry named ``kernel``, its files found by name
    (``entry.owned_by``) and by what its jsons name — no scan of the chip folder is kept.
    A chip folder or entry that is gone is not fatal.

    :raises LockBusyError: the entry's lock stayed held.
    :raises OSError: the chip folder cannot be opened or listed.
    """
    try:
        folder = SafeDir.open_chip(chip_dir)
    except (FileNotFoundError, NotADirectoryError):
        return FatalOutcome(kernel)
    with folder:
        group = named_group(chip_dir, folder.fd, kernel)
        if group is None:
            return FatalOutcome(kernel)
        if group_fatal(chip_dir, folder.fd, group) is None:
            return FatalOutcome(kernel)  # the common case: one or two small reads
        store = chip_store(chip_dir, lock_wait_s, dir_fd=folder.fd)
        return remove_fatal_group(
            store, folder.fd, _with_named_parts(chip_dir, folder.fd, group), False, lock_wait_s
        )


def named_group(chip_dir: Path, chip_fd: int, kernel: str) -> EntryGroup | None:
    """The entry ``kernel`` by the names its main json and parts would have (one ``lstat``
    each): ``<kernel>.json`` and ``<kernel><part suffix>.json``; None without a main json."""
    group = EntryGroup(kernel)
    for name in [kernel + ".json", *(kernel + s + ".json" for s in entry.PART_STEM_SUFFIXES)]:
        _add(group, chip_fd, name)
    if kernel + ".json" not in group.files:
        return None
    group.atime_ns = group.files[kernel + ".json"].atime_ns
    return group


def _with_named_parts(chip_dir: Path, chip_fd: int, group: EntryGroup) -> EntryGroup:
    """Add every other file of the entry: those owned by its name (one listing of the
    folder's names: only for an entry about to be removed) and the sub-jsons its
    ``jsonList`` names that it owns by name too (``entry.owned_by``): a json may name any
    file, e.g. another, valid entry's main json, which is never removed with it (and never
    without that entry's lock; docs/design.md#files-of-an-entry)."""
    with os.scandir(chip_fd) as it:
        names = [de.name for de in it if de.name.startswith(group.kernel)]
    for name in names:
        if entry.owned_by(name, group.kernel) and not name.endswith((".lock", ".temp")):
            _add(group, chip_fd, name)
    read = gefatal.chip_reader(chip_dir, chip_fd)
    try:
        main = gefatal.parse_like_ge(read(group.json_name))
    except OSError:
        main = None
    for name in gefatal.sub_json_names(main):
        if entry.owned_by(name, group.kernel):
            _add(group, chip_fd, name)
    return group


def _add(group: EntryGroup, chip_fd: int, name: str) -> None:
    st = fsutil.lstat_or_none(Path(name), chip_fd)
    if st is not None and fsutil.plain_file(st):
        group.files[name] = FileStat(st.st_size, st.st_atime_ns, st.st_mtime_ns)
