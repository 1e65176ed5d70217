"""Which entries of a bounded-memory snapshot need the GE-fatal check in full
(docs/interop.md#entries-that-abort-ge, docs/eviction.md#cost).

``gc`` reads every entry's main json once per run for the shapes that make GE abort
(:mod:`cachemgr.storage.gefatal`). Almost every entry kept in columns
(:class:`~cachemgr.eviction.compact.CompactEntries`: one main json, one binary, a header)
passes, and through :func:`cachemgr.eviction.fatal.group_fatal` each pass cost ~40 µs of
Python around 4 system calls (a group made, ``Path`` objects, a reader per file): 4.5 s at
100,000 entries, more than the whole ``scandir`` + ``stat`` pass. Here the main json of
each such entry is read by :func:`read_plain` — the same defences in 4 system calls — and
judged by the same rules on the same bytes; only an entry that may be fatal, or whose
json the lean read will not take (another user's file, a link, too large, growing, any
error), goes through the full check (:func:`~cachemgr.eviction.reclaim.reclaim`), which
reads it again, under its lock before removing anything.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from typing import Protocol

from cachemgr.eviction.compact import CompactEntries
from cachemgr.storage import entry, fsutil, gefatal
from cachemgr.storage.entry import EntryGroup

#: ``open`` flags of :func:`read_plain`: never follows a link (``O_NOFOLLOW``), never blocks on
#: a FIFO planted under a json's name (``O_NONBLOCK``), never changes the access time
#: (``O_NOATIME``: the owner or ``CAP_FOWNER`` only, else ``EPERM``).
_FLAGS = (
    os.O_RDONLY
    | os.O_NOFOLLOW
    | os.O_NONBLOCK
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NOATIME", 0)
)
#: The deadline is looked at once per this many entries read...
_DEADLINE_EVERY = 256
#: ...or once this many bytes of json were judged since it was last looked at (a 4 MiB
#: json takes ~0.3 s to parse: a count alone would let a folder of big jsons overrun it).
_DEADLINE_BYTES = 1 << 20


def read_plain(chip_fd: int, name: str, max_bytes: int = entry.MAX_JSON_BYTES) -> bytes | None:
    """The bytes of ``name`` in the folder open as ``chip_fd`` when it is a regular file with
    one name, at most ``max_bytes`` bytes, readable without changing its access time, and
    read whole by one ``read`` (it did not grow since its ``fstat``); None otherwise — the
    caller then reads it with :func:`cachemgr.storage.fsutil.read_bytes_noatime`, which
    decides each of those cases (this function never raises for them, and never reads a
    byte it would refuse).

    The rules of ``read_bytes_noatime(..., single_link=True, max_bytes=...)`` inside
    ``reads_keep_atime()`` (docs/design.md#writing-and-reading-an-entry): no link followed,
    no blocking open, the type, link count and size checked on the descriptor.
    """
    try:
        fd = os.open(name, _FLAGS, dir_fd=chip_fd)
    except OSError:
        return None  # EPERM (not ours: O_NOATIME refused), ELOOP, ENOENT...: the full reader
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size > max_bytes:
            return None
        raw = os.read(fd, st.st_size + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return raw if len(raw) == st.st_size else None  # grew (or shrank) meanwhile: read again


def plainly_not_fatal(raw: bytes) -> bool:
    """Does :func:`cachemgr.storage.gefatal.entry_fatal` surely find nothing in an entry whose
    only json is the main json ``raw`` (not a pre-build entry)? True when the json GE reads
    from it has no shape of rules F1–F5 and names no sub-json (F6): the first, fast parse
    of ``entry_fatal`` finds nothing, so it never confirms on the exact one."""
    data = gefatal.parse_like_ge(raw, exact=False)
    if data is gefatal.TOO_DEEP:
        return False  # rule F0: GE reads what Python cannot; the full check removes it
    if not isinstance(data, dict):
        return True  # contains()/find() are false on a non-object: a clean miss in GE
    get = data.get
    if (  # what F1-F4 convert is absent or a string, and no jsonList (F5, F6): one test each
        get("jsonList") is None
        and type(get("binFileName", "")) is str
        and type(get("binFileSuffix", "")) is str
        and type(get("kernelName", "")) is str
        and type(get("headerFileSuffix", "")) is str
        and type(get("sha256", "")) is str
    ):
        return True
    return gefatal.main_fatal(data, "") is None and not gefatal.sub_json_names(data)


class Record(Protocol):
    """Main jsons judged before (:class:`cachemgr.eviction.judged.JudgedRecord`)."""

    def known(self, st: os.stat_result) -> bool:
        """Was the json ``st`` describes judged plainly not fatal, unchanged since?"""

    def keep(self, st: os.stat_result, seen_ns: int) -> None:
        """Record the json ``st`` describes, just judged plainly not fatal; ``seen_ns`` is
        the latest change stamp the scan saw before reading it."""


class PlainJudge:
    """:class:`cachemgr.eviction.compact.Judge` for gc's scan: a main json changed at or
    after ``since_ns`` (0 = every one) needs the full check unless :func:`read_plain` reads
    it and :func:`plainly_not_fatal` clears it; a pre-build entry's always does (rules
    F7/F8, rare). Judged as listed, under the eviction lock: the full check reads the
    marked ones again, under their lock before removing anything.

    :param deadline: ``time.monotonic()`` after which no more json is read (looked at every
        :data:`_DEADLINE_EVERY` jsons or :data:`_DEADLINE_BYTES` bytes judged): every json
        listed after it is marked unread for the full check, which stops at the same
        deadline (``ReclaimResult.stopped``: the run reports ``skipped="deadline"``); None =
        no deadline. ``late`` says it passed.
    :param record: main jsons judged before: one it knows is not read again, one read and
        cleared is kept in it (:mod:`cachemgr.eviction.judged`, its rules of trust).
    """

    def __init__(
        self,
        chip_fd: int,
        since_ns: int,
        deadline: float | None = None,
        record: Record | None = None,
    ) -> None:
        self.chip_fd = chip_fd
        self.since_ns = since_ns
        self.record = record
        self._clock = _Clock(deadline)
        folder = os.fstat(chip_fd)
        #: the latest change stamp seen in the folder so far (its clock: the file system's)
        self._seen_ns = max(folder.st_ctime_ns, folder.st_mtime_ns)

    @property
    def late(self) -> bool:
        """Did the deadline pass (no json read since)?"""
        return self._clock.late

    def __call__(self, name: str, st: os.stat_result) -> bool:
        if self.since_ns and max(st.st_ctime_ns, st.st_mtime_ns) < self.since_ns:
            return False
        if self._clock.late or entry.is_pre_entry(name[: -len(".json")]):
            return True  # past the deadline: not cleared, left to the full check
        record = self.record
        if record is not None:
            if st.st_ctime_ns > self._seen_ns:
                self._seen_ns = st.st_ctime_ns
            if record.known(st):
                return False
        raw = read_plain(self.chip_fd, name)
        self._clock.tick(st.st_size)
        if raw is None or not plainly_not_fatal(raw):
            return True
        if record is not None:
            record.keep(st, self._seen_ns)
        return False


class _Clock:
    """A deadline looked at every :data:`_DEADLINE_EVERY` jsons or :data:`_DEADLINE_BYTES`
    bytes judged (``time.monotonic()``; None: never late)."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.late = False
        self._count = 0
        self._bytes = 0

    def tick(self, size: int) -> bool:
        """Count one json of ``size`` bytes judged; is the deadline past?"""
        self._count += 1
        self._bytes += size
        if self.deadline is not None and (
            self._count >= _DEADLINE_EVERY or self._bytes >= _DEADLINE_BYTES
        ):
            self._count = self._bytes = 0
            self.late = time.monotonic() >= self.deadline
        return self.late


class FatalCandidates:
    """The entries of a compact snapshot the GE-fatal check must see in full, one at a time:
    those kept whole, then each row whose main json may be fatal or was not read plainly —
    the rows the scan's :class:`PlainJudge` marked, or (a scan without one) judged here.

    :param since_ns: only entries whose main json changed (``st_ctime`` or ``st_mtime``) at or
        after this time (ns since the epoch); 0 = every entry.
    :param deadline: ``time.monotonic()`` after which no more is read: ``stopped`` is set.
    """

    def __init__(
        self, entries: CompactEntries, chip_fd: int, since_ns: int, deadline: float | None
    ) -> None:
        self.entries = entries
        self.chip_fd = chip_fd
        self.since_ns = since_ns
        self.deadline = deadline
        self.stopped = False
        self._clock = _Clock(deadline)
        self._read = 0  # bytes the last row's plain read took

    def __iter__(self) -> Iterator[EntryGroup]:
        yield from list(self.entries.whole().values())  # their own change check: the caller's
        if self._judged_by_scan():
            for kernel, j in list(self.entries.marked()):
                yield self.entries.group_at(j, kernel)
            return
        for kernel, j in self.entries.names():
            if self._clock.tick(self._read):
                self.stopped = True
                return
            self._read = 0
            if self._needs_check(kernel):
                yield self.entries.group_at(j, kernel)

    def _judged_by_scan(self) -> bool:
        """Did the scan judge every row this pass would (:class:`PlainJudge`, from a time at
        or before ``since_ns``)?"""
        judged = self.entries.judged_since
        return judged is not None and (judged == 0 or 0 < judged <= self.since_ns)

    def _needs_check(self, kernel: str) -> bool:
        name = kernel + ".json"
        if self.since_ns and not self._changed(name):
            return False
        if entry.is_pre_entry(kernel):
            return True  # rules F7/F8: the full check (rare)
        raw = read_plain(self.chip_fd, name)
        self._read = 0 if raw is None else len(raw)
        return raw is None or not plainly_not_fatal(raw)

    def _changed(self, name: str) -> bool:
        """:func:`cachemgr.eviction.fatal.changed_since` of a one-json entry; a json gone
        meanwhile has not changed.

        :raises OSError: anything but ``ENOENT``/``ESTALE`` (as ``changed_since``)."""
        try:
            st = os.lstat(name, dir_fd=self.chip_fd)
        except OSError as exc:
            if exc.errno in fsutil.GONE_ERRNOS:
                return False
            raise
        return max(st.st_ctime_ns, st.st_mtime_ns) >= self.since_ns
