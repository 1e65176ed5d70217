"""Storage tiers: one small interface over where entries live.

A tier answers five questions about an entry of one chip folder (``soc_version``) and one
kernel name: :meth:`Tier.lookup` (verified: is it there and whole?), :meth:`Tier.fetch` (its
files, as bytes by file name — the main json included), :meth:`Tier.put` (publish it),
:meth:`Tier.remove` and :meth:`Tier.stat` (what the tier holds). Tiers are composed in order:
the local CANN-format store (:class:`LocalTier`, this module) first, then each remote tier
(``cachemgr.remote``, later) in the order configured.

Remote data is untrusted: every tier's :meth:`~Tier.put` goes through the local store's
checks (names flat, every binary's ``sha256`` against its json) before anything is written.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from cachemgr.config.layout import CacheLayout
from cachemgr.errors import CacheMgrError, InvalidEntryError, InvalidInputError
from cachemgr.storage import entry, fsutil
from cachemgr.storage.events import Events
from cachemgr.storage.safedir import SafeDir
from cachemgr.storage.store import (
    DEFAULT_LOCK_TIMEOUT_S,
    EntryHold,
    LookupResult,
    PublishResult,
    Store,
    check_kernel_name,
)

log = logging.getLogger(__name__)

#: An entry travels to and from a remote tier in memory (a blob): one whose files are more
#: than this together (bytes) is not read into memory, so not shared (docs/remote.md,
#: "Caps"; docs/daemon.md, "Bounded memory"). CANN's kernels are KiB to a few MiB.
MAX_IN_MEMORY_BYTES = 64 << 20


def chip_store(
    chip_dir: Path,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    events: Events | None = None,
    *,
    dir_fd: int | None = None,
) -> Store:
    """The store of one chip folder: the one place a :class:`~cachemgr.storage.store.Store` is made
    (the compile path, eviction, the daemon and the CLI all come here, or
    through :meth:`LocalTier.store`).

    :param lock_timeout_s: how long publish/removal wait for an entry's lock (seconds).
    :param events: told of a publish that hit a full filesystem.
    :param dir_fd: the chip folder, already open (it must stay open while the store is used).
    """
    return Store(chip_dir, lock_timeout_s, events, dir_fd=dir_fd)


@dataclass(frozen=True)
class EntryFiles:
    """Every file of one entry, by flat file name (bytes); ``kernel + ".json"`` is the main
    json. The unit that tiers move."""

    soc_version: str
    kernel: str
    files: Mapping[str, bytes]

    @property
    def main_json(self) -> str:
        """The main json's file name, ``<kernel>.json`` (docs/design.md#files-of-an-entry)."""
        return self.kernel + ".json"

    @property
    def size(self) -> int:
        """Bytes of all files together."""
        return sum(len(b) for b in self.files.values())


@dataclass
class TierStat:
    """What :meth:`Tier.stat` reports: ``entries`` and ``bytes`` held (None when the tier
    cannot tell cheaply), and ``state`` (``ok`` / ``failing`` / ``disabled``)."""

    name: str
    state: str = "ok"
    entries: int | None = None
    bytes: int | None = None
    detail: dict[str, object] = field(default_factory=dict)


@runtime_checkable
class Tier(Protocol):
    """One storage tier."""

    name: str

    def lookup(self, soc_version: str, kernel: str) -> bool:
        """True when a whole, verified entry is there."""
        ...

    def fetch(self, soc_version: str, kernel: str) -> EntryFiles | None:
        """The entry's files, or None on a miss."""
        ...

    def put(self, entry_files: EntryFiles) -> bool:
        """Store the entry; True when written (False: a good one was there already)."""
        ...

    def remove(self, soc_version: str, kernel: str) -> bool:
        """Remove the entry; True when something was removed."""
        ...

    def stat(self) -> TierStat:
        """What the tier holds and its state."""
        ...


class LocalTier:
    """The local CANN-format kernel cache (``<kernel_cache>/<soc_version>/``) as a tier: a
    :class:`~cachemgr.storage.store.Store` per chip folder, all sharing one event sink.

    :param kernel_cache_dir: the kernel cache folder holding the chip folders.
    :param lock_timeout_s: how long publish/removal wait for an entry's lock (seconds).
    :param events: where a full disk is reported (:class:`~cachemgr.storage.events.NoSpaceEvent`).
    """

    name = "local"

    def __init__(
        self,
        kernel_cache_dir: Path,
        lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
        events: Events | None = None,
    ) -> None:
        self.kernel_cache_dir = Path(kernel_cache_dir)
        self.lock_timeout_s = lock_timeout_s
        self.events = events

    def store(self, soc_version: str) -> Store:
        """The store of one chip folder.

        :raises InvalidInputError: ``soc_version`` is not a flat folder name.
        """
        check_kernel_name(soc_version)  # same rule: one flat name, no ``..``
        return chip_store(self.kernel_cache_dir / soc_version, self.lock_timeout_s, self.events)

    def hold(self, soc_version: str, kernel: str, timeout_s: float | None = None) -> EntryHold:
        """Take the entry's lock (``<kernel>.lock``, the lock CANN takes) and return its
        explicit handle, to pass as ``held=`` (:class:`~cachemgr.storage.store.EntryHold`).

        :raises LockBusyError: still held after ``timeout_s`` (default ``lock_timeout_s``).
        """
        store = self.store(soc_version)
        SafeDir.open_chip(store.chip_dir, create=True).close()  # no link followed (security.md)
        return store.hold(kernel, timeout_s)

    def check(
        self, soc_version: str, kernel: str, held: EntryHold | None = None, touch: bool = True
    ) -> LookupResult:
        """The store's verified lookup with its reason (a bad entry is removed)."""
        return self.store(soc_version).lookup(kernel, touch=touch, held=held)

    def lookup(self, soc_version: str, kernel: str) -> bool:
        """True on a verified hit (access times set to now, as for any hit;
        docs/design.md#writing-and-reading-an-entry)."""
        return self.check(soc_version, kernel).hit

    def fetch(
        self, soc_version: str, kernel: str, max_bytes: int = MAX_IN_MEMORY_BYTES
    ) -> EntryFiles | None:
        """The verified entry's files read into memory, or None on a miss — or when its
        files are more than ``max_bytes`` together (their sizes are checked before they are
        read). The bytes read are checked once more against the json's ``sha256`` (a file
        replaced between the lookup and the read is a miss, not a wrong entry)."""
        found = self.check(soc_version, kernel, touch=False)
        if not found.hit or found.desc is None:
            return None
        files: dict[str, bytes] = {}
        left = max_bytes
        for path in found.files:
            try:
                files[path.name] = data = fsutil.read_bytes_noatime(path, max_bytes=left)
            except FileNotFoundError:
                return None
            except fsutil.FileTooLargeError as exc:
                log.info("%s/%s is not read into memory: %s", soc_version, kernel, exc)
                return None
            left -= len(data)
        for ref in found.desc.binaries:
            if entry.sha256_hex(files.get(ref.bin_name, b"")) != ref.sha256:
                return None
        return EntryFiles(soc_version, kernel, files)

    def read(
        self,
        soc_version: str,
        kernel: str,
        max_bytes: int = MAX_IN_MEMORY_BYTES,
        writers: set[int] | None = None,
    ) -> EntryFiles | None:
        """The entry's files if it is complete, verifies (entry.py's rules: the json
        parses, every binary and sub-part named is there and matches its ``sha256``) and
        its files are at most ``max_bytes`` together (sizes checked before anything is read
        into memory, nor hashed), else None — without side effects: a bad entry is left
        for the reaper (it may be a CANN process's write in progress on another host), and
        no access time changes (an upload is not a use: it must not reorder eviction,
        docs/design.md#size-limits-and-eviction). The bytes read are checked once more against the
        json (a file replaced meanwhile is not uploaded).

        :param writers: when given, who may have written each file read is added to it (its
            owner's uid, :data:`~cachemgr.storage.noatime.SHARED_WRITER` for a file its group
            or others may write; from the descriptor read), for the upload's writer check
            (docs/remote.md#keys).
        :raises fsutil.FileTooLargeError: the entry's files are over ``max_bytes`` together
            (sizes checked first: nothing is read).
        """
        try:
            check_kernel_name(soc_version)
            check_kernel_name(kernel)
            chip = self.kernel_cache_dir / soc_version
            with fsutil.reads_keep_atime(), SafeDir.open_chip(chip) as folder:
                desc = entry.parse_entry(chip, kernel, dir_fd=folder.fd)
                names = [desc.json_name, *desc.sub_jsons, *(b.bin_name for b in desc.binaries)]
                if desc.header and fsutil.lstat_or_none(chip / desc.header, folder.fd):
                    names.append(desc.header)
                sizes = [fsutil.lstat_or_none(chip / n, folder.fd) for n in names]
                total = sum(st.st_size for st in sizes if st is not None)
                if total > max_bytes:
                    raise fsutil.FileTooLargeError(
                        f"{soc_version}/{kernel}: {total} bytes, over the {max_bytes}-byte cap"
                    )
                if entry.verify_entry(chip, desc, folder.fd):
                    return None
                files: dict[str, bytes] = {}
                left = max_bytes
                for n in names:
                    data = fsutil.read_bytes_noatime(
                        chip / n, folder.fd, single_link=True, max_bytes=left, writers=writers
                    )
                    files[n] = data
                    left -= len(data)
        except fsutil.FileTooLargeError:
            raise
        except (OSError, CacheMgrError):
            return None
        for ref in desc.binaries:
            if entry.sha256_hex(files.get(ref.bin_name, b"")) != ref.sha256:
                return None
        return EntryFiles(soc_version, kernel, files)

    def put(self, entry_files: EntryFiles, held: EntryHold | None = None) -> bool:
        """Publish the entry (json last, under its lock;
        docs/design.md#writing-and-reading-an-entry) after checking it.

        :raises InvalidInputError: bad names, no or bad main json, a ``sha256`` mismatch.
        :raises NoSpaceError: the filesystem is full (the sink is told).
        """
        files = dict(entry_files.files)
        raw = files.pop(entry_files.main_json, None)
        if raw is None:
            raise InvalidInputError(f"entry {entry_files.kernel}: no {entry_files.main_json}")
        try:
            main = entry.load_json_object(raw, entry_files.main_json)
        except InvalidEntryError as exc:
            raise InvalidInputError(f"entry {entry_files.kernel}: {exc}") from exc
        result: PublishResult = self.store(entry_files.soc_version).publish(
            entry_files.kernel, files, main, held=held
        )
        return result.status == "published"

    def remove(self, soc_version: str, kernel: str, held: EntryHold | None = None) -> bool:
        """Remove the entry, json first, under its lock
        (docs/design.md#size-limits-and-eviction)."""
        return bool(self.store(soc_version).remove(kernel, held=held))

    def stat(self) -> TierStat:
        """Entries and bytes of every chip folder (a scan; no access time changes)."""
        entries = size = 0
        with fsutil.reads_keep_atime():
            for chip in CacheLayout(self.kernel_cache_dir).chip_dirs() if self._exists() else ():
                scan = entry.scan_chip(chip)
                entries += len(scan.entries)
                for group in scan.entries.values():
                    for name in group.files:
                        st = fsutil.lstat_or_none(chip / name)
                        size += st.st_size if st is not None else 0
        return TierStat(self.name, entries=entries, bytes=size)

    def _exists(self) -> bool:
        return fsutil.lstat_or_none(self.kernel_cache_dir) is not None
