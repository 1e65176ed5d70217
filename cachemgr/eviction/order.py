"""The eviction plan over a bounded-memory snapshot (:mod:`cachemgr.eviction.compact`): the
same entries, in the same order, as :func:`cachemgr.eviction.plan.plan_eviction` over
``entry.scan_chip`` of the same folder (docs/eviction.md#memory; ``tests/test_gc_memory.py``
compares them), without sorting — or naming — every entry.

The order is plan.py's: access time (a suspect time replaced by when cachemgr first saw the
entry), then name. It is walked in chunks: the access time ``T`` up to which entries weigh
enough (the bytes the plan still needs, at most :data:`CHUNK` entries) is found from the
columns alone by a histogram of access times, then one listing of the folder's names gives
the names of the entries up to ``T``, which are sorted by ``(time, name)``: only the entries
the plan walks through are ever named.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cachemgr.constants import NEVER_EVICT
from cachemgr.eviction.compact import CompactEntries
from cachemgr.eviction.plan import check_limits, limits_of
from cachemgr.storage.entry import ChipScan, EntryGroup

#: Entries named per chunk of the reserve (beyond the candidates).
CHUNK = 65536
#: Buckets of one histogram pass over the access times.
BUCKETS = 4096
#: A range of access times holding at most this many entries is sorted, not bucketed.
SORT_AT = 8192
_EARLIEST, _LATEST = -(1 << 63), (1 << 63) - 1
#: ``flags`` byte → 1 for a live entry in the columns (a json, not removed), else 0
_LIVE_TABLE = bytes(1 if f & (1 | 8) == 1 else 0 for f in range(256))

#: One entry in the order: (access time in ns, kernel, row in the columns or -1)
Item = tuple[int, str, int]


@dataclass(frozen=True)
class CompactPlan:
    """:class:`cachemgr.eviction.plan.EvictionPlan` of a compact snapshot: candidates by
    name (made into groups when removed), the reserve walked only when needed.

    :ivar kernels: the candidates' names, least recently accessed first.
    :ivar evict_bytes: bytes the candidates hold.
    :ivar kept_kernels: entries the target needed but the aging guard kept, in order.
    """

    chip_dir: Path
    used_bytes: int
    max_bytes: int | None
    target_bytes: int | None
    triggered: bool
    kernels: tuple[str, ...] = ()
    evict_bytes: int = 0
    kept_kernels: tuple[str, ...] = ()
    suspect: tuple[EntryGroup, ...] = ()
    rows: array[int] = field(default_factory=lambda: array("i"))
    entries: CompactEntries | None = None
    reserve_items: Iterator[Item] = field(default_factory=lambda: iter(()))

    @property
    def need_bytes(self) -> int:
        """Bytes to free to reach the target (0 when not triggered)."""
        if not self.triggered or self.target_bytes is None:
            return 0
        return max(0, self.used_bytes - self.target_bytes)

    @property
    def candidates(self) -> tuple[EntryGroup, ...]:
        """The candidates as groups (made on each call)."""
        return tuple(self._groups(zip(self.kernels, self.rows, strict=True)))

    def pending(self) -> Iterator[EntryGroup]:
        """The candidates, then the reserve (walked as far as it is consumed), in order."""
        yield from self._groups(zip(self.kernels, self.rows, strict=True))
        yield from self._groups((kernel, j) for _, kernel, j in self.reserve_items)

    def _groups(self, items: Iterator[tuple[str, int]]) -> Iterator[EntryGroup]:
        entries = self.entries
        assert entries is not None
        for kernel, j in items:
            group = entries.group_at(j, kernel) if j >= 0 else entries.transient(kernel)
            if group is not None:
                yield group


def plan_compact(
    scan: ChipScan,
    max_mb: int,
    ratio_pct: int,
    min_age_s: float,
    now_ns: int,
    force_ratio: bool = False,
    target_bytes: int | None = None,
    clock_skew_s: float | None = None,
    first_seen: Mapping[str, int] | None = None,
) -> CompactPlan:
    """:func:`cachemgr.eviction.plan.plan_eviction` of a snapshot made by
    :func:`cachemgr.eviction.compact.scan_compact`: the same parameters, rules and result
    (docs/design.md#size-limits-and-eviction).

    :raises InvalidInputError: for a bad ``max_mb``, ``ratio_pct`` or ``min_age_s``.
    """
    check_limits(max_mb, ratio_pct, min_age_s)
    entries = scan.entries
    assert isinstance(entries, CompactEntries)
    used = scan.used_bytes
    if max_mb == NEVER_EVICT:
        return CompactPlan(scan.chip_dir, used, None, None, False, entries=entries)
    max_bytes, target, triggered = limits_of(used, max_mb, ratio_pct, force_ratio, target_bytes)
    times = _Times(entries, now_ns, clock_skew_s, first_seen or {})
    if not triggered:
        return CompactPlan(
            scan.chip_dir, used, max_bytes, target, False, suspect=times.suspect, entries=entries
        )
    need = used - target
    cutoff_ns = now_ns - int(min_age_s * 1e9)
    order = times.ordered(need)
    kernels: list[str] = []
    rows = array("i")
    kept: list[str] = []
    freed = 0
    # plan.py's walk, stopping right after the entry that reaches the target: the next one
    # is not asked for, so the reserve's first chunk is named only if it is used
    for t, kernel, j in order if need > 0 else ():
        if t > cutoff_ns:  # accessed within min_age_s: this and all after are young
            kept.append(kernel)
        else:
            kernels.append(kernel)
            rows.append(j)
        freed += times.size(kernel, j)
        if freed >= need:
            break
    reserve = iter(()) if kept else itertools.takewhile(lambda it: it[0] <= cutoff_ns, order)
    return CompactPlan(
        scan.chip_dir,
        used,
        max_bytes,
        target,
        True,
        kernels=tuple(kernels),
        evict_bytes=sum(times.size(k, j) for k, j in zip(kernels, rows, strict=True)),
        kept_kernels=tuple(kept),
        suspect=times.suspect,
        rows=rows,
        entries=entries,
        reserve_items=reserve,
    )


class _Times:
    """Each entry's access time for ordering (ns): the columns', a suspect one (beyond
    ``now + clock_skew_s``) replaced by ``first_seen[kernel]`` (default ``now_ns``)."""

    def __init__(
        self,
        entries: CompactEntries,
        now_ns: int,
        clock_skew_s: float | None,
        first_seen: Mapping[str, int],
    ) -> None:
        self.entries = entries
        self.times = entries.atimes
        self.whole = [(g.atime_ns, g.kernel, g) for g in entries.whole().values()]
        suspect: list[EntryGroup] = []
        if clock_skew_s is not None:
            limit = now_ns + int(clock_skew_s * 1e9)
            suspect = self._replace_future(limit, now_ns, first_seen)
        self.suspect = tuple(suspect)

    def _replace_future(
        self, limit: int, now_ns: int, first_seen: Mapping[str, int]
    ) -> list[EntryGroup]:
        found = []
        whole = []
        for t, kernel, group in self.whole:
            if t > limit:
                found.append(group)
                t = first_seen.get(kernel, now_ns)
            whole.append((t, kernel, group))
        self.whole = whole
        if self.times and max(self.times) > limit:
            times = array("q", self.times)
            for kernel, j in self.entries.names():
                if times[j] > limit:
                    found.append(self.entries.group_at(j, kernel))
                    times[j] = first_seen.get(kernel, now_ns)
            self.times = times
        return found

    def size(self, kernel: str, j: int) -> int:
        """Bytes of the entry (row ``j``, or kept whole when -1)."""
        if j >= 0:
            return self.entries.sizes[j]
        return self.entries.whole()[kernel].size

    def _live(self, lo: int, hi: int, by_size: bool) -> Iterator[tuple[int, int]]:
        """``(time, weight)`` of every entry with ``lo <= time <= hi``."""
        times, sizes = self._columns(by_size)
        for t, w in zip(times, sizes, strict=True):
            if lo <= t <= hi:
                yield t, w
        for t, _, group in self.whole:
            if lo <= t <= hi:
                yield t, (group.size if by_size else 1)

    def _columns(self, by_size: bool) -> tuple[Iterator[int], Iterator[int]]:
        """The live rows' times and weights, filtered in C (``itertools.compress``)."""
        live = self.entries.flags.tobytes().translate(_LIVE_TABLE)
        times = itertools.compress(self.times, live)
        if by_size:
            return times, itertools.compress(self.entries.sizes, live)
        return times, itertools.repeat(1, live.count(1))

    def _span(self, lo: int, by_size: bool) -> tuple[int, int, int, int] | None:
        """``(first, last, count, weight)`` of the entries timed at or after ``lo``; None
        when there are none. From the start, the columns are summed in C."""
        if lo == _EARLIEST:
            times, weights = self._columns(by_size)
            count = self.entries.flags.tobytes().translate(_LIVE_TABLE).count(1)
            stats = [min(times, default=None), max(self._columns(by_size)[0], default=None)]
            total = sum(weights)
            for t, _, group in self.whole:
                stats += [t]
                count += 1
                total += group.size if by_size else 1
            known = [t for t in stats if t is not None]
            return (min(known), max(known), count, total) if known else None
        first = last = None
        count = total = 0
        for t, w in self._live(lo, _LATEST, by_size):
            count += 1
            total += w
            first = t if first is None or t < first else first
            last = t if last is None or t > last else last
        if first is None or last is None:
            return None
        return first, last, count, total

    def threshold(self, lo: int, quota: int, by_size: bool) -> int | None:
        """The least ``T`` with the weight (bytes, or 1 an entry) of the entries timed in
        ``[lo, T]`` ≥ ``quota``; the latest time when they all weigh less; None when no
        entry is timed at or after ``lo``."""
        found = self._span(lo, by_size)
        if found is None:
            return None
        first, last, count, total = found
        if total < quota:
            return last
        lo, hi, acc = first, last, 0
        while count > SORT_AT and hi > lo:
            width = (hi - lo) // BUCKETS + 1
            sums = [0] * BUCKETS
            counts = [0] * BUCKETS
            for t, w in self._live(lo, hi, by_size):
                b = (t - lo) // width
                sums[b] += w
                counts[b] += 1
            for b in range(BUCKETS):
                if acc + sums[b] >= quota:
                    lo, hi, count = lo + b * width, min(hi, lo + (b + 1) * width - 1), counts[b]
                    break
                acc += sums[b]
            else:  # not reached: the weights in [lo, hi] reach the quota
                break
        for t, w in sorted(self._live(lo, hi, by_size)):
            acc += w
            if acc >= quota:
                return t
        return hi  # not reached: the weights in [lo, hi] reach the quota

    def named(self, lo: int, hi: int) -> list[Item]:
        """The entries timed in ``[lo, hi]``, named (one listing), in ``(time, name)`` order."""
        times = self.times
        wanted = bytes(lo <= t <= hi for t in times)  # only these rows are named and checked
        out = [(times[j], kernel, j) for kernel, j in self.entries.names(rows=wanted)]
        out += [(t, kernel, -1) for t, kernel, _ in self.whole if lo <= t <= hi]
        out.sort()
        return out

    def ordered(self, need: int) -> Iterator[Item]:
        """Every entry in eviction order, a chunk at a time: each chunk is the entries up to
        the time that reaches the bytes still needed (``need`` less what was walked) or
        :data:`CHUNK` entries, whichever comes first (the candidates of a large folder take
        several chunks: their tuples, not only their names, would be ~27 MB at 200,000)."""
        lo = _EARLIEST
        left = need
        while True:
            t = self.threshold(lo, CHUNK, False)
            if t is not None and left > 0:
                by_bytes = self.threshold(lo, left, True)
                t = t if by_bytes is None else min(t, by_bytes)
            if t is None:
                return
            chunk = self.named(lo, t)
            chunk.reverse()
            while chunk:  # popped, not iterated: an entry walked past is freed (200,000 at 1M)
                item = chunk.pop()
                left -= self.size(item[1], item[2])
                yield item
            lo = t + 1
