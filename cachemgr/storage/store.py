"""The verified store over one chip folder (layer 4; docs/design.md#writing-and-reading-an-entry).

* **lookup**: a hit is an entry whose json parses and whose every binary matches its
  ``sha256``; on a hit the json's and binaries' access times become now (mtime kept) [GE].
  Anything else is a miss with a reason, and a bad entry is removed under its lock so the
  recompiled result can take its place (GE leaves such entries "sticky"; cachemgr must not).
* **publish**: every file goes to a unique ``*.temp`` name in the chip folder, then is renamed
  into place, the main json last — a visible json means a complete entry. The entry's
  ``<kernel>.lock`` (fcntl) is held throughout, so CANN processes see it too; an entry that
  already exists and verifies is not rewritten.
* **remove**: json first, then binaries, header, sub-parts; already-gone files are normal.

Readers take no lock: the json-last publish order is what keeps them from partial entries.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import functools
import json
import logging
import os
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachemgr.config import layout
from cachemgr.errors import (
    CachePermissionError,
    ConfigError,
    InvalidEntryError,
    InvalidInputError,
    NoSpaceError,
)
from cachemgr.memo import OnceSet
from cachemgr.storage import entry, fsutil, groupmodes, madeahead, manifest, optype, partcopy
from cachemgr.storage.events import Events, NoSpaceEvent
from cachemgr.storage.safedir import DirLock, SafeDir

log = logging.getLogger(__name__)

HIT = "hit"
MISS = "miss"
ABSENT = "absent"
PUBLISHED = "published"
EXISTS = "exists"

#: How long a publish or a bad-entry removal waits for an entry lock (seconds).
DEFAULT_LOCK_TIMEOUT_S = 120.0
#: errno values of a full filesystem: no space (``ENOSPC``) or quota spent (``EDQUOT``).
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})

#: One part of an entry to publish: its bytes, or a private file (a compiled binary in a
#: build folder) copied into the chip folder in chunks (docs/daemon.md, "Bounded memory").
Part = bytes | Path


def part_size(part: Part) -> int:
    """Bytes of ``part`` (a file's size by ``lstat``; 0 for a file that is gone)."""
    if isinstance(part, bytes):
        return len(part)
    try:
        return partcopy.source_size(part)
    except OSError:
        return 0


#: Fewer free inodes than this are named with the free bytes: an entry's files and their
#: temp names (the most a publish makes at once) may not fit.
FEW_INODES = 16


def free_words(folder: Path) -> str:
    """What is free on the filesystem of ``folder``, for an ``ENOSPC`` message: its bytes,
    and its inodes when fewer than :data:`FEW_INODES` are left — a filesystem out of files
    (tmpfs ``nr_inodes``, ext4's inode table) has bytes to spare, and ``16748544 bytes free``
    beside "entry needs 4918 bytes" read as a contradiction."""
    try:
        vfs = os.statvfs(folder)
    except OSError:
        return "free space unknown"
    free = f"{vfs.f_bavail * vfs.f_frsize} bytes free"
    if vfs.f_files and vfs.f_favail < FEW_INODES:  # 0 files in all: a filesystem without a count
        free += f", but {vfs.f_favail} of its {vfs.f_files} inodes: no room for more files"
    return free


def _no_space(
    chip_dir: Path, kernel: str, needed: int, exc: OSError, sink: Events | None
) -> NoSpaceError:
    """The one-line error for a publish that hit a full filesystem; a :class:`NoSpaceEvent`
    goes to ``sink`` (events are objects, not module-level listeners)."""
    free = free_words(chip_dir)
    what = "no space left" if exc.errno == errno.ENOSPC else "disk quota exceeded"
    err = NoSpaceError(
        f"{what} in {chip_dir} ({free}): entry {kernel} needs {needed} bytes; "
        "nothing was published (evict with 'cachemgr gc', or free space on that filesystem)",
        str(chip_dir),
        needed,
    )
    if sink is not None:
        sink.emit(NoSpaceEvent(chip_dir, needed))
    return err


@dataclass(frozen=True)
class LookupResult:
    """Outcome of :meth:`Store.lookup`. ``reason`` is ``""`` on a hit, else ``absent`` or a
    problem kind from :mod:`cachemgr.storage.entry`; ``removed`` tells a bad entry was removed."""

    status: str
    kernel: str
    reason: str = ""
    detail: str = ""
    desc: entry.EntryDesc | None = None
    files: tuple[Path, ...] = ()
    removed: bool = False

    @property
    def hit(self) -> bool:
        return self.status == HIT


@dataclass(frozen=True)
class PublishResult:
    """Outcome of :meth:`Store.publish`: ``published`` or ``exists`` (a good entry was there)."""

    status: str
    kernel: str
    files: tuple[Path, ...]
    bytes_written: int = 0
    #: ``published``: the SHA-256 of each part as written, by name (what an upload of this
    #: entry must still read: docs/remote.md#keys); empty for ``exists``
    digests: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Finding:
    """One thing ``verify`` found: an entry (or a loose file) and what is wrong with it."""

    name: str
    problems: list[entry.Problem]
    repaired: bool = False
    kind: str = "entry"  # "entry" | "file"


@dataclass
class VerifyReport:
    """Result of :meth:`Store.verify_all`: ``checked`` entries and the ``findings``."""

    chip_dir: Path
    checked: int = 0
    findings: list[Finding] = field(default_factory=list)
    #: entries not read: reading them would have changed their access time (docs/commands.md,
    #: ``verify``)
    not_checked: list[str] = field(default_factory=list)
    #: loose files (header manifests) not read, for the same reason; not entries
    not_checked_files: list[str] = field(default_factory=list)
    #: the uids owning what was not checked (the users who, with root, may check it)
    not_checked_owners: set[int] = field(default_factory=set)
    #: entries ``--repair`` removed
    removed: set[str] = field(default_factory=set)

    @property
    def bad(self) -> list[Finding]:
        """Findings that are still bad (not repaired)."""
        return [f for f in self.findings if not f.repaired]


#: Longest kernel name (bytes): ``<kernel>.json`` must fit a file name (255 bytes). A longer
#: one in ``/lookup`` was an ``ENAMETOOLONG`` internal error (500, a traceback in the log
#: for every such request).
MAX_KERNEL_NAME_BYTES = 255 - len(".json")


#: errno values meaning "not ours to remove now": skip the file, report it, go on (EBUSY:
#: an NFS server refusing to remove a file another host holds open,
#: docs/design.md#sharing-and-locking).
DENIED_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.EBUSY})


@dataclass
class Removal:
    """What one removal did: files and bytes removed by this call, files refused.

    ``denied`` holds ``"<name>: <reason>"`` lines; ``json_gone`` tells whether the entry's
    main json is gone afterwards (removed by us or by someone else); ``removed`` names the
    files this call removed, in order.
    """

    files: int = 0
    bytes: int = 0
    denied: list[str] = field(default_factory=list)
    json_gone: bool = True
    removed: list[str] = field(default_factory=list)
    #: the first refusal for lack of permission (``EACCES``/``EPERM``), for a caller that
    #: must turn it into an error
    permission_error: OSError | None = None


def removal_order(names: Iterable[str], json_name: str) -> list[str]:
    """An entry's file names in the deletion order of docs/design.md#size-limits-and-eviction — the
    one order every removal uses (the store's and eviction's): the main json first (a visible json
    means a complete entry, so it must go first), then binaries and header, then the sub-jsons and
    ``_pre.json``; each group by name."""
    rest = sorted({n for n in names if n != json_name})
    return [
        json_name,
        *(n for n in rest if not n.endswith(".json")),
        *(n for n in rest if n.endswith(".json")),
    ]


def remove_entry_files(
    chip_dir: Path,
    dir_fd: int | None,
    names: Iterable[str],
    json_name: str,
    sizes: Mapping[str, int] | None = None,
) -> Removal:
    """The one removal routine of an entry's files (docs/design.md#size-limits-and-eviction): in
    :func:`removal_order`, relative to the open chip folder (``unlinkat``, no link followed); files
    already gone are normal (``ENOENT``/``ESTALE``). A refused file (:data:`DENIED_ERRNOS`, or a
    folder under a part's name) is reported and the rest goes on — except a refused main json,
    which stops the removal so the entry stays whole. The caller holds the entry's lock.

    :param sizes: bytes of each file (for :attr:`Removal.bytes`).
    :raises OSError: any other error.
    """
    out = Removal()
    for name in removal_order(names, json_name):
        try:
            if fsutil.unlink_in(chip_dir, name, dir_fd):
                out.files += 1
                out.bytes += (sizes or {}).get(name, 0)
                out.removed.append(name)
        except OSError as exc:
            if exc.errno not in DENIED_ERRNOS and exc.errno != errno.EISDIR:
                raise
            out.denied.append(f"{name}: {exc.strerror or exc}")
            if exc.errno in (errno.EACCES, errno.EPERM) and out.permission_error is None:
                out.permission_error = exc
            if name == json_name:
                out.json_gone = False
                return out
    return out


def check_kernel_name(kernel: str) -> str:
    """A kernel name is one flat file stem: ``[A-Za-z0-9_.-]+``, no ``..``, at most
    :data:`MAX_KERNEL_NAME_BYTES`.

    :raises InvalidInputError: naming the value.
    """
    if len(kernel.encode("utf-8", "surrogateescape")) > MAX_KERNEL_NAME_BYTES:
        raise InvalidInputError(
            f"kernel name {kernel[:40]!r}… is invalid: {len(kernel)} characters, more than "
            f"{MAX_KERNEL_NAME_BYTES} bytes (a file name holds 255 with .json)"
        )
    try:
        layout.safe_file_name(kernel, "kernel")
        layout.validate_name(kernel, "kernel", "request")
    except (InvalidEntryError, ConfigError) as exc:
        raise InvalidInputError(f"kernel name {kernel!r} is invalid: {exc}") from exc
    return kernel


#: Chip folders already warned about as read-only (one warning per folder until it is
#: writable again); bounded like every memo.
_read_only_warned: OnceSet[Path] = OnceSet("read-only folders warned", 4096)


def forget_read_only(chip_dir: Path) -> None:
    """``chip_dir`` took access times again: warn again the next time it is read-only."""
    _read_only_warned.forget(chip_dir)


def _warn_read_only(chip_dir: Path, what: str) -> None:
    if _read_only_warned.first(chip_dir):
        log.warning("%s is on a read-only filesystem: hits are served, %s", chip_dir, what)


@dataclass
class EntryHold:
    """An entry lock (``<chip>/<kernel>.lock``, fcntl) that the caller holds: the explicit
    handle that :meth:`Store.publish`, :meth:`Store.remove` and :meth:`Store.lookup` take as
    ``held=`` instead of locking again (a POSIX lock must not be taken twice in a process:
    closing the second descriptor would drop the first)."""

    chip_dir: Path
    kernel: str
    lock: fsutil.FcntlLock

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        self.lock.release()

    @property
    def dir_fd(self) -> int | None:
        """The chip folder the lock is held in, open for as long as it is held (None once
        released): the lookup and publish under this lock work relative to it instead of
        opening the folder again (:meth:`Store.under`)."""
        return self.lock.dir_fd

    def __enter__(self) -> EntryHold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def touch_files(chip_dir: Path, dir_fd: int | None, files: tuple[Path, ...]) -> None:
    """Set each of ``files``' access time to now, as a hit does
    (docs/design.md#writing-and-reading-an-entry), relative to ``dir_fd`` (the chip folder
    ``chip_dir``, open; None: by path): another user's file is skipped (CANN skips it too), a
    read-only filesystem warned about once per folder; a file gone meanwhile is no error.

    :raises OSError: any other refusal.
    """
    for path in files:
        try:
            fsutil.touch_atime(path, None, dir_fd)  # the filesystem's now
        except PermissionError:
            # another user's file: atime needs ownership; CANN skips it too
            # (docs/design.md#sharing-and-locking)
            log.debug("cannot set atime of %s (not owner)", path)
        except OSError as exc:
            if exc.errno == errno.EROFS:  # a read-only root still serves hits
                _warn_read_only(chip_dir, "access times are not updated")
                return
            if exc.errno not in fsutil.GONE_ERRNOS:
                raise
    forget_read_only(chip_dir)


class Store:
    """Verified lookup, atomic publish and removal in one chip folder.

    Every operation reaches the chip folder once, without following a link, and does all its
    reads, locks, writes, renames and removals relative to that descriptor
    (docs/security.md item 1; :mod:`cachemgr.storage.safedir`).

    :param chip_dir: ``<kernel cache>/<soc_version>``; created on first publish.
    :param lock_timeout_s: how long publish/removal wait for an entry's lock (seconds).
    :param events: the sink told of a publish that hit a full filesystem (a
        :class:`~cachemgr.storage.events.NoSpaceEvent`); None tells nobody.
    :param dir_fd: the chip folder, already open (e.g. by gc); it must stay open while the
        store is used. Without it each operation opens the folder itself.
    """

    def __init__(
        self,
        chip_dir: Path,
        lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
        events: Events | None = None,
        *,
        dir_fd: int | None = None,
    ) -> None:
        self.chip_dir = chip_dir if isinstance(chip_dir, Path) else Path(chip_dir)
        self.lock_timeout_s = lock_timeout_s
        self.events = events
        self.dir_fd = dir_fd

    @contextmanager
    def _opened(self, create: bool = False, held: EntryHold | None = None) -> Iterator[Store]:
        """This store bound to the chip folder's descriptor for one operation: its own, the
        one the caller's entry lock ``held`` is held in (:meth:`under`), or else the folder
        opened for it.

        :raises FileNotFoundError: the chip folder is missing (and ``create`` is off).
        :raises UnsafePathError: ``kernel_cache`` or the chip folder is a symbolic link.
        """
        bound = self if held is None else self.under(held)
        if bound.dir_fd is not None:
            yield bound
            return
        with SafeDir.open_chip(self.chip_dir, create=create) as folder:
            bound = copy.copy(self)
            bound.dir_fd = folder.fd
            yield bound

    def hold(
        self, kernel: str, timeout_s: float | None = None, folder: SafeDir | None = None
    ) -> EntryHold:
        """Take ``kernel``'s entry lock and return its handle (release it, or use ``with``).

        :param timeout_s: how long to wait (seconds); None waits ``lock_timeout_s``.
        :param folder: the chip folder, just opened by the caller (e.g. with ``create``):
            the lock takes it over (closed when the lock is released, or when it is not
            taken) instead of opening the folder again; a retry opens it afresh.
        A refusal for lack of permission (GE's ``0750`` chip folder, its ``0640`` lock
        file) is retried once after the modes were given back to the group, where this
        process may (:func:`~cachemgr.storage.groupmodes.retry_denied`).

        :raises LockBusyError: the lock stayed held for ``timeout_s``.
        :raises OSError: the lock file cannot be created or locked.
        """
        if folder is not None and self.dir_fd is None:
            given = [folder]  # the first acquisition takes it; a retry opens the folder again
            lock: fsutil.FcntlLock = DirLock(
                self.lock_path(kernel),
                lambda: given.pop() if given else SafeDir.open_chip(self.chip_dir),
            )
        else:
            lock = self.entry_lock(kernel)
        wait_s = self.lock_timeout_s if timeout_s is None else timeout_s
        groupmodes.retry_denied(
            lambda: lock.acquire(timeout_s=wait_s), self.chip_dir, [self.lock_path(kernel).name]
        )
        return EntryHold(self.chip_dir, kernel, lock)

    def _locked(self, kernel: str, held: EntryHold | None) -> Any:
        """The lock to enter for ``kernel``: nothing when the caller's ``held`` is it."""
        if held is not None:
            if held.kernel != kernel or held.chip_dir != self.chip_dir:
                raise ValueError(f"held lock is {held.kernel}'s, not {kernel}'s")
            return contextlib.nullcontext()
        return self.entry_lock(kernel)

    def under(self, held: EntryHold) -> Store:
        """This store working through the chip folder ``held`` is locked in (its descriptor,
        open while the lock is held: no second walk from the root), or this store itself
        when it has a descriptor already or ``held`` has none. What is looked up or
        published under an entry lock goes into the folder that lock lives in."""
        if self.dir_fd is not None or held.dir_fd is None or held.chip_dir != self.chip_dir:
            return self
        bound = copy.copy(self)
        bound.dir_fd = held.dir_fd
        return bound

    def lock_path(self, kernel: str) -> Path:
        """``<chip>/<kernel>.lock``: the entry's fcntl lock file
        (docs/design.md#files-of-an-entry)."""
        return self.chip_dir / f"{kernel}.lock"

    def entry_lock(self, kernel: str) -> fsutil.FcntlLock:
        """The entry's lock object (not yet taken), reached through the chip folder's
        descriptor (its own, held while the lock is, when the store has none)."""
        if self.dir_fd is not None:
            return fsutil.FcntlLock(self.lock_path(kernel), self.dir_fd)
        return DirLock(self.lock_path(kernel), lambda: SafeDir.open_chip(self.chip_dir))

    # --- lookup -------------------------------------------------------------------------

    def lookup(
        self, kernel: str, touch: bool = True, held: EntryHold | None = None
    ) -> LookupResult:
        """Verified lookup of ``kernel`` (docs/design.md#writing-and-reading-an-entry).

        A hit sets the json's and binaries' atime to now when ``touch`` (mtime kept). A bad
        entry is removed (under its lock — ``held`` when the caller holds it — after
        re-checking) and reported as a miss.

        :raises InvalidInputError: for an invalid kernel name.
        :raises UnsafePathError: ``kernel_cache`` or the chip folder is a symbolic link.
        """
        check_kernel_name(kernel)
        if self.dir_fd is None:
            try:
                with self._opened(held=held) as bound:
                    return bound.lookup(kernel, touch, held)
            except FileNotFoundError:
                return LookupResult(MISS, kernel, ABSENT)
        good = entry.plainly_good(self.chip_dir, kernel, self.dir_fd)
        if good is not None:
            return self._hit(kernel, good, touch)
        try:
            desc, problems = self._check_stable(kernel)
        except FileNotFoundError:
            return LookupResult(MISS, kernel, ABSENT)
        if not problems and desc is not None:
            return self._hit(kernel, desc, touch)
        try:
            removed = self.remove_if_bad(kernel, held)
        except OSError as exc:
            if exc.errno != errno.EROFS:
                raise
            _warn_read_only(self.chip_dir, "bad entries are not removed")
            first = problems[0]
            return LookupResult(MISS, kernel, first.kind, first.detail)
        if not removed:  # under the lock it was good (a publish finished) or gone: look again
            try:
                desc, problems = entry.check_entry(self.chip_dir, kernel, self.dir_fd)
            except FileNotFoundError:
                return LookupResult(MISS, kernel, ABSENT)
            if not problems and desc is not None:
                return self._hit(kernel, desc, touch)
        first = problems[0]
        if removed:
            log.warning("bad entry %s/%s removed: %s", self.chip_dir.name, kernel, first.detail)
        return LookupResult(MISS, kernel, first.kind, first.detail, removed=removed)

    def _hit(self, kernel: str, desc: entry.EntryDesc, touch: bool) -> LookupResult:
        files = _paths(self.chip_dir, tuple(self._present_parts(desc)))
        if touch:
            self.touch(files)
        return LookupResult(HIT, kernel, desc=desc, files=files)

    def _check_stable(self, kernel: str) -> tuple[entry.EntryDesc | None, list[entry.Problem]]:
        """``entry.check_entry``; an entry found bad is read again (twice at most) before it is
        judged: another process may have removed it and published it anew between our read
        of its json and of its binary, which is not damage. A hit costs one read, as before.

        :raises FileNotFoundError: when the entry is gone.
        """
        desc, problems = entry.check_entry(self.chip_dir, kernel, self.dir_fd)
        for _ in range(2):
            if not problems:
                break
            desc, problems = entry.check_entry(self.chip_dir, kernel, self.dir_fd)
        return desc, problems

    def _present_parts(self, desc: entry.EntryDesc) -> list[str]:
        names = [desc.json_name, *desc.sub_jsons, *(b.bin_name for b in desc.binaries)]
        header = desc.header
        if header and fsutil.lstat_or_none(self.chip_dir / header, self.dir_fd) is not None:
            names.append(header)  # optional (entry rule R6): served only when present
        return names

    def touch(self, files: tuple[Path, ...]) -> None:
        """Set each of ``files``' access time to now, as a hit does: :func:`touch_files` on
        this store's folder.

        :raises OSError: any refusal :func:`touch_files` does not handle.
        """
        touch_files(self.chip_dir, self.dir_fd, files)

    # --- removal ------------------------------------------------------------------------

    def remove_if_bad(
        self, kernel: str, held: EntryHold | None = None, *, manifests: bool = True
    ) -> bool:
        """Under the entry lock (``held``, or taken here), re-check ``kernel`` and remove it
        if it is still bad, with the header manifests whose last entry it was
        (``manifests``; ``verify`` passes False: its own pass over the manifests follows,
        one listing for every entry it removed instead of one each).

        :returns: True if it was removed.
        """
        if self.dir_fd is None:
            try:
                with self._opened(held=held) as bound:
                    return bound.remove_if_bad(kernel, held, manifests=manifests)
            except FileNotFoundError:
                return False
        lock = self._locked(kernel, held)
        if held is None and not lock.acquire(timeout_s=self.lock_timeout_s):
            return False
        try:
            try:
                desc, problems = entry.check_entry(self.chip_dir, kernel, self.dir_fd)
            except FileNotFoundError:
                return False
            if not problems:
                return False
            if any(p.kind == entry.UNREADABLE for p in problems):
                # a file this user may not read is a permission problem, not damage: another
                # user's good entry must not be deleted for it (docs/design.md#sharing-and-locking)
                log.warning(
                    "not removing %s/%s: %s", self.chip_dir.name, kernel, problems[0].detail
                )
                return False
            self._remove_files(kernel, self._names_for_removal(kernel, desc))
            if manifests:
                self._remove_manifests_of(kernel)
            return True
        finally:
            if held is None:
                lock.release()

    def _names_for_removal(self, kernel: str, desc: entry.EntryDesc | None) -> list[str]:
        if desc is not None:
            # a json may name any file: remove only what is this kernel's by name, so one bad
            # (or hostile) json can never take another entry's files with it
            owned = [n for n in desc.file_names() if entry.owned_by(n, kernel)]
            for name in set(desc.file_names()) - set(owned):
                log.warning(
                    "not removing %s with %s: it is not that kernel's by name", name, kernel
                )
            return owned
        # json unparsable: fall back to name grouping for its parts
        scan = entry.scan_chip(self.chip_dir, self.dir_fd)
        group = scan.entries.get(kernel)
        names = [kernel + ".json"]
        if group is not None:
            names += sorted(n for n in group.files if n != kernel + ".json")
        return names

    def remove(
        self,
        kernel: str,
        desc: entry.EntryDesc | None = None,
        held: EntryHold | None = None,
        *,
        manifests: bool = True,
    ) -> list[str]:
        """Remove an entry's files — json first — under its lock (``held``, or taken here),
        and the header manifests whose last entry it was (``manifests``; a caller that
        clears every manifest itself passes False). Returns the entry's file names removed.

        ``desc`` (if known) names the parts; otherwise the json is parsed, and name grouping
        is the fallback for an unparsable json.
        """
        if self.dir_fd is None:
            try:
                with self._opened(held=held) as bound:
                    return bound.remove(kernel, desc, held, manifests=manifests)
            except FileNotFoundError:
                return []
        with self._locked(kernel, held):
            if desc is None:
                try:
                    desc = entry.parse_entry(self.chip_dir, kernel, dir_fd=self.dir_fd)
                except (FileNotFoundError, InvalidEntryError):
                    desc = None
            removed = self._remove_files(kernel, self._names_for_removal(kernel, desc))
            if manifests and kernel + ".json" in removed:
                self._remove_manifests_of(kernel)
            return removed

    def _remove_manifests_of(self, kernel: str) -> None:
        """The header manifests whose last entry ``kernel`` was go with it
        (:func:`manifest.remove_unnamed`); a folder that cannot be listed now leaves them to
        gc's reclaim pass (logged): the entry's removal is done either way."""
        if self.dir_fd is None:  # callers run bound to the folder (``_opened``)
            return
        try:
            manifest.remove_unnamed(self.chip_dir, self.dir_fd, {kernel})
        except OSError as exc:
            log.warning(
                "%s: header manifests of %s left for gc: %s", self.chip_dir, kernel, exc.strerror
            )

    def _remove_files(self, kernel: str, names: list[str]) -> list[str]:
        """:func:`remove_entry_files` (the one removal routine); a file this user may not
        remove is an error here (a caller's lookup or publish cannot go on around it).

        :raises CachePermissionError: naming the file.
        """
        removal = remove_entry_files(self.chip_dir, self.dir_fd, names, kernel + ".json")
        for line in removal.denied:
            log.warning("not removing %s/%s", self.chip_dir.name, line)
        exc = removal.permission_error
        if exc is not None:
            raise CachePermissionError(
                f"cannot remove {exc.filename or self.chip_dir}: {exc.strerror}"
            ) from exc
        return removal.removed

    def remove_orphan(self, name: str) -> bool:
        """Remove a loose file (binary with no json) if its kernel still
        has no json, under that kernel's lock taken without waiting (a publish in progress
        holds it). Returns True if removed."""
        if self.dir_fd is None:
            try:
                with self._opened() as bound:
                    return bound.remove_orphan(name)
            except FileNotFoundError:
                return False
        stem = name.split(".", 1)[0]
        for suffix in entry.PART_STEM_SUFFIXES:
            if stem.endswith(suffix):
                stem = stem[: -len(suffix)]
                break
        lock = self.entry_lock(stem)
        if not lock.acquire(blocking=False):
            return False
        try:
            if fsutil.lstat_or_none(self.chip_dir / (stem + ".json"), self.dir_fd) is not None:
                return False
            return fsutil.safe_unlink(self.chip_dir / name, self.dir_fd)
        finally:
            lock.release()

    # --- publish ------------------------------------------------------------------------

    def publish(
        self,
        kernel: str,
        files: Mapping[str, Part],
        main_json: Mapping[str, Any],
        held: EntryHold | None = None,
        reserved: madeahead.Reserved | None = None,
    ) -> PublishResult:
        """Publish an entry atomically (docs/design.md#writing-and-reading-an-entry).

        :param files: every part but the main json, by file name (binaries, sub-jsons as
            bytes, header, ``_pre.json``); names are flat (no ``/``, no ``..``). A part given
            as a :class:`~pathlib.Path` (a private file, e.g. a compiled binary) is copied
            in chunks and hashed on the way: never read whole into memory.
        :param main_json: the kernel description; must name the given binaries with their
            correct ``sha256`` (checked before anything is written).
        :raises InvalidInputError: bad names, a json that does not match the files.
        :param held: the entry lock when the caller holds it (else it is taken here).
        :param reserved: files made ahead for these parts in the folder ``held`` is held in
            (:class:`cachemgr.storage.madeahead.Reserved`, made while the compiler ran): a
            part with one is written to it and named with its temp name, instead of a file
            made now; the rest as without it.
        :raises NoSpaceError: the filesystem is full (``ENOSPC``/``EDQUOT``): one line naming
            the chip folder and the bytes needed; ``events`` is told; no partial entry is
            left (docs/design.md#writing-and-reading-an-entry).
        :raises CachePermissionError: the chip folder or the entry's lock file is not
            writable by this user (names the path, user, group and the fix;
            docs/design.md#sharing-and-locking) — also after the one retry that follows giving GE's
            ``0750``/``0640`` modes back to the group where this process may
            (docs/shared-cache.md#ges-modes-given-back-on-sight).
        :raises OSError: any other write failure; no partial entry is left.
        """
        check_kernel_name(kernel)
        payload: dict[str, Part] = dict(files)
        payload[kernel + ".json"] = _dump_json(main_json)
        expected = self._check_payload(kernel, payload)
        op_type = optype.in_json(main_json, kernel)

        def write() -> PublishResult | tuple[int, dict[str, str]]:
            with self._opened(create=True, held=held) as bound, bound._locked(kernel, held):
                existing = bound._existing_good(kernel)
                if existing is not None:
                    return existing
                return bound._write_all(kernel, payload, expected, op_type, reserved)

        try:  # GE's 0750 folder: given back to the group (where we may), then once more
            done = groupmodes.retry_denied(write, self.chip_dir, [self.lock_path(kernel).name])
            if isinstance(done, PublishResult):
                return done
            written, digests = done
        except PermissionError as exc:
            where = Path(exc.filename) if exc.filename else self.chip_dir
            where = where if os.path.exists(where) else self.chip_dir
            if where.name.endswith(fsutil.TEMP_SUFFIX):
                where = self.chip_dir
            raise CachePermissionError(fsutil.access_hint(where)) from exc
        except OSError as exc:
            if exc.errno not in NO_SPACE_ERRNOS:
                raise
            needed = sum(part_size(b) for b in payload.values())
            raise _no_space(self.chip_dir, kernel, needed, exc, self.events) from exc
        log.info("published %s/%s (%d bytes)", self.chip_dir.name, kernel, written)
        paths = tuple(self.chip_dir / n for n in payload)
        return PublishResult(PUBLISHED, kernel, paths, written, digests)

    def _check_payload(self, kernel: str, payload: Mapping[str, Part]) -> dict[str, str]:
        """Check names, jsons and the binaries given as bytes; return the ``sha256`` each
        binary given as a file must have (checked while it is copied: :meth:`_write_all`).

        :raises InvalidInputError: a bad name or json, a binary missing or not matching.
        """
        for name in payload:
            try:
                layout.safe_file_name(name, "file name")
            except InvalidEntryError as exc:
                raise InvalidInputError(str(exc)) from exc

        def read(name: str) -> bytes:
            if name not in payload:
                raise FileNotFoundError(name)
            part = payload[name]
            if isinstance(part, bytes):
                return part
            return fsutil.read_bytes_noatime(part, max_bytes=entry.MAX_JSON_BYTES)

        try:
            desc = entry.parse_entry(self.chip_dir, kernel, read=read)
        except (InvalidEntryError, fsutil.FileTooLargeError) as exc:
            raise InvalidInputError(f"entry {kernel} is invalid: {exc}") from exc
        expected: dict[str, str] = {}
        for ref in desc.binaries:
            if ref.bin_name not in payload:
                raise InvalidInputError(f"entry {kernel}: binary {ref.bin_name} not given")
            part = payload[ref.bin_name]
            if not isinstance(part, bytes):
                expected[ref.bin_name] = ref.sha256
            elif entry.sha256_hex(part) != ref.sha256:
                raise InvalidInputError(f"entry {kernel}: {ref.bin_name} does not match sha256")
        return expected

    def _existing_good(self, kernel: str) -> PublishResult | None:
        try:
            desc, problems = entry.check_entry(self.chip_dir, kernel, self.dir_fd)
        except FileNotFoundError:
            return None
        if desc is not None and not problems:
            paths = tuple(self.chip_dir / n for n in self._present_parts(desc))
            return PublishResult(EXISTS, kernel, paths)
        log.info("replacing bad entry %s/%s", self.chip_dir.name, kernel)
        self._remove_files(kernel, self._names_for_removal(kernel, desc))
        return None

    def _write_all(
        self,
        kernel: str,
        payload: Mapping[str, Part],
        expected: Mapping[str, str],
        op_type: str | None = None,
        reserved: madeahead.Reserved | None = None,
    ) -> tuple[int, dict[str, str]]:
        """Write every part to a temp name, then rename them into place, the main json last;
        a part given as a file must hash to ``expected[name]``. Returns the bytes written and
        each part's SHA-256 as written, by name.
        ``op_type`` (the json's, when the name lower-cases it) is kept on the main json
        (:mod:`cachemgr.storage.optype`: every user's ``ls`` shows it). A part with a file
        in ``reserved`` is written to that file (see :meth:`publish`).

        :raises InvalidInputError: a file part changed since its json was made.
        :raises OSError: a write failed; no temp file is left.
        """
        main = kernel + ".json"
        # binaries and other parts first, then sub-jsons, the main json last
        # (docs/design.md#writing-and-reading-an-entry)
        order = sorted(payload, key=lambda n: (n == main, n.endswith(".json")))
        temps: list[tuple[Path, Path]] = []
        written = 0
        digests: dict[str, str] = {}
        try:
            for name in order:
                dest = self.chip_dir / name
                # no fsync: a hit verifies every binary's sha256 and parses the json, so what
                # a power loss tears is a miss, never served (docs/compiling.md
                # "Durability")
                made = reserved.take(name, self.dir_fd) if reserved is not None else None
                tmp, size, digests[name] = self._write_part(
                    kernel, dest, payload[name], expected.get(name), made
                )
                temps.append((tmp, dest))
                if name == main:
                    optype.attach(self.dir_fd, tmp.name, op_type)
                written += size
        except BaseException:
            for tmp, _ in temps:
                fsutil.safe_unlink(tmp, self.dir_fd)
            raise
        for i, (tmp, dest) in enumerate(temps):
            try:
                os.rename(tmp.name, dest.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
            except BaseException:
                for rest, _ in temps[i:]:
                    fsutil.safe_unlink(rest, self.dir_fd)
                raise
        return written, digests

    def _write_part(
        self, kernel: str, dest: Path, part: Part, sha256: str | None, made: int | None = None
    ) -> tuple[Path, int, str]:
        """One part to a temp name beside ``dest`` (through ``made``, a file made ahead,
        when given: taken over): its path, bytes written and SHA-256.

        :raises InvalidInputError: a file part that does not hash to ``sha256``.
        """
        if isinstance(part, bytes):
            tmp = fsutil.write_temp(dest, part, dir_fd=self.dir_fd, sync=False, made=made)
            return tmp, len(part), entry.sha256_hex(part)
        copied = partcopy.copy_temp(dest, part, dir_fd=self.dir_fd, made=made)
        if sha256 is not None and copied.sha256 != sha256:
            fsutil.safe_unlink(copied.tmp, self.dir_fd)
            raise InvalidInputError(
                f"entry {kernel}: {dest.name} does not match sha256 (it changed after it "
                "was compiled); nothing was published"
            )
        return copied.tmp, copied.size, copied.sha256

    # --- verify -------------------------------------------------------------------------

    def verify_all(self, repair: bool = False) -> VerifyReport:
        """Check every entry and loose file of the chip folder (``cachemgr verify``).

        Reads without changing access times. With ``repair``, bad entries and orphans are
        removed (under their locks). Orphans are binaries with no json; GE's ``_pre.json``
        files are entries (``cachemgr.storage.entry`` rule R7), never orphans.

        :raises UnsafePathError: ``kernel_cache`` or the chip folder is a symbolic link.
        """
        with fsutil.reads_keep_atime():
            try:
                with self._opened() as bound:
                    return bound._verify_all(repair)
            except FileNotFoundError:
                return VerifyReport(self.chip_dir)

    def _verify_all(self, repair: bool) -> VerifyReport:
        report = VerifyReport(self.chip_dir)
        scan = entry.scan_chip(self.chip_dir, self.dir_fd)
        for group in scan.entries.values():
            if not group.resolved:
                entry.resolve_group(scan, group)
        for kernel in sorted(scan.entries):
            self._verify_one(kernel, report, repair)
        for name in sorted(scan.orphans):
            kind = entry.ORPHAN_FILE if name.endswith(".json") else entry.ORPHAN_BINARY
            problem = entry.Problem(kind, f"{name} belongs to no entry")
            finding = Finding(name, [problem], kind="file")
            if repair:
                finding.repaired = self._repair(finding, self.remove_orphan, name)
            report.findings.append(finding)
        for name in sorted(scan.manifests):
            self._verify_manifest(scan, name, report, repair)
        for name, why in sorted(scan.odd.items()):
            problem = entry.Problem(entry.NOT_A_FILE, f"{name}: {why}")
            finding = Finding(name, [problem], kind="file")
            if repair:
                finding.repaired = self._repair(finding, self.remove_planted, name)
            report.findings.append(finding)
        return report

    def remove_planted(self, name: str) -> bool:
        """Remove a link, FIFO, socket, device or hard-linked file from the chip folder: only
        its name goes (``unlinkat``; a link's target and a hard link's other names are not
        touched), so this is safe for any of them (docs/security.md item 2). Folders and
        plain files (the name changed meanwhile) are left. Returns True if removed."""
        st = fsutil.lstat_or_none(self.chip_dir / name, self.dir_fd)
        if st is None or stat.S_ISDIR(st.st_mode) or fsutil.plain_file(st):
            return False
        removed = fsutil.safe_unlink(self.chip_dir / name, self.dir_fd)
        if removed:
            log.warning("removed %s/%s: %s", self.chip_dir.name, name, fsutil.kind_of(st))
        return removed

    def _verify_manifest(
        self, scan: entry.ChipScan, name: str, report: VerifyReport, repair: bool
    ) -> None:
        """A header manifest must parse and name at least one entry present — present now:
        one whose last entry ``--repair`` removed above goes too (reported ``REPAIRED``),
        one that names another entry still there stays. Another member's
        manifest that a read would change the access time of is not read
        (``not_checked_files``): it was reported bad, and ``--repair`` removed it."""
        if fsutil.lstat_or_none(self.chip_dir / name, self.dir_fd) is None:
            return  # removed meanwhile (with its last entry, by another process)
        try:
            kernels = manifest.kernels(self.chip_dir / name, self.dir_fd)
        except fsutil.AtimeWouldChange:
            report.not_checked_files.append(name)
            self._note_owner(name, report)
            return
        if kernels is None:
            problem = entry.Problem("bad_manifest", f"{name} is not a valid header manifest")
        elif not any(k in scan.entries and k not in report.removed for k in kernels):
            problem = entry.Problem(entry.ORPHAN_FILE, f"{name} names no entry present")
        else:
            return
        finding = Finding(name, [problem], kind="file")
        if repair:
            finding.repaired = self._repair(finding, self._remove_manifest, name)
        report.findings.append(finding)

    def _note_owner(self, name: str, report: VerifyReport) -> None:
        """Add the owner of ``name`` (a file not checked) to ``report.not_checked_owners``:
        the line that counts them says whom to ask (one ``lstat``; gone meanwhile: none)."""
        st = fsutil.lstat_or_none(self.chip_dir / name, self.dir_fd)
        if st is not None:
            report.not_checked_owners.add(st.st_uid)

    def _remove_manifest(self, name: str) -> bool:
        return fsutil.safe_unlink(self.chip_dir / name, self.dir_fd)

    @staticmethod
    def _repair(finding: Finding, remove: Callable[[str], bool], name: str) -> bool:
        """Run one repair; a file we may not remove is reported on the finding and the run
        goes on (like gc and purge), instead of ending the whole repair."""
        try:
            return remove(name)
        except (CachePermissionError, PermissionError) as exc:
            finding.problems.append(entry.Problem("not_removed", f"{name}: {exc}"))
            return False

    def _remove_bad_entry(self, kernel: str) -> bool:
        """``--repair`` of one entry; its manifests are judged by the pass over them that
        follows (:meth:`_verify_manifest`), which removes those it was the last entry of."""
        return self.remove_if_bad(kernel, manifests=False)

    def _verify_one(self, kernel: str, report: VerifyReport, repair: bool) -> None:
        try:
            _, problems = entry.check_entry(self.chip_dir, kernel, self.dir_fd)
        except FileNotFoundError:
            return  # removed by someone else meanwhile: normal
        if problems and all(p.kind == entry.NOT_CHECKED for p in problems):
            report.not_checked.append(kernel)
            self._note_owner(f"{kernel}.json", report)
            return
        report.checked += 1
        if problems:
            finding = Finding(kernel, problems)
            if repair:
                finding.repaired = self._repair(finding, self._remove_bad_entry, kernel)
                if finding.repaired:
                    report.removed.add(kernel)
            report.findings.append(finding)


@functools.lru_cache(maxsize=1024)
def _paths(chip_dir: Path, names: tuple[str, ...]) -> tuple[Path, ...]:
    """``chip_dir / name`` of each of ``names``: the files of a hit, joined once per entry
    (each pathlib join parses its parts again)."""
    return tuple(chip_dir / n for n in names)


def _dump_json(data: Mapping[str, Any]) -> bytes:
    """``data`` as GE writes a kernel json (``json.dumps`` with ``indent=4``, UTF-8, one
    newline after), spelt by :mod:`cachemgr.plainjson`: the same text in 56 µs instead of
    131 (``json`` runs its pure-Python encoder whenever an indent is given); anything but
    plain data goes to ``json.dumps`` itself."""
    from cachemgr import plainjson  # a publish: not on the hit path

    try:
        text = plainjson.dumps(dict(data), indent=4, ensure_ascii=False)
    except TypeError:
        text = json.dumps(dict(data), indent=4, ensure_ascii=False)
    return (text + "\n").encode("utf-8")
