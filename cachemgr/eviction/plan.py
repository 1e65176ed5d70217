"""The eviction plan: a pure function over one chip-folder snapshot
(docs/design.md#size-limits-and-eviction, [GE]).

Rules, as GE's ``TeCacheSpaceManager`` applies them and docs/design.md#size-limits-and-eviction
states them:

* used size = apparent bytes of every regular file in the chip folder (``ChipScan.used_bytes``);
* trigger: used ≥ max; target: used ≤ max × ratio / 100, MB = MiB = 2**20 bytes;
* order: least recently accessed first, by the main json's access time (ties by name, so the
  plan is deterministic);
* aging guard: an entry accessed less than ``min_age_s`` ago is never evicted (GE's
  ``MIN_CACHE_AGING_TIME`` = 1800 s); since the order is by access time, the first young entry
  ends the eviction, as in GE;
* ``max_op_cache_size == -1`` turns size eviction off.

Nothing here touches the disk: tests build a :class:`~cachemgr.storage.entry.ChipScan` and assert
exactly which entries go.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path

from cachemgr.constants import MIB, NEVER_EVICT
from cachemgr.errors import InvalidInputError
from cachemgr.storage.entry import ChipScan, EntryGroup

_KERNEL = attrgetter("kernel")
_ATIME = attrgetter("atime_ns")


@dataclass(frozen=True)
class EvictionPlan:
    """What an eviction of one chip folder would do, computed from a snapshot.

    :ivar used_bytes: apparent bytes of the chip folder's regular files when planned.
    :ivar max_bytes: the limit in bytes (``max_mb`` × 2**20), None when eviction is off (-1).
    :ivar target_bytes: ``max_bytes × ratio_pct // 100``, None when eviction is off.
    :ivar triggered: True when used ≥ max, or when ``force_ratio`` and used > target.
    :ivar candidates: entries to evict, least recently accessed first; together they bring
        the folder down to the target unless the aging guard stopped them.
    :ivar reserve: further evictable entries, in order, beyond the candidates: used only when
        a candidate is saved by a concurrent hit or vanishes, so the target is still met.
    :ivar kept_by_age: entries that the target needed but the aging guard kept, in order.
    """

    chip_dir: Path
    used_bytes: int
    max_bytes: int | None
    target_bytes: int | None
    triggered: bool
    candidates: tuple[EntryGroup, ...] = ()
    reserve: tuple[EntryGroup, ...] = ()
    kept_by_age: tuple[EntryGroup, ...] = ()
    #: entries whose access time lies more than the clock-skew tolerance in the future
    #: (a host whose clock runs ahead): ordered by when cachemgr first saw them instead;
    #: found whether or not the plan evicts (a folder under its limit reports them too)
    suspect: tuple[EntryGroup, ...] = ()

    @property
    def need_bytes(self) -> int:
        """Bytes to free to reach the target (0 when not triggered)."""
        if not self.triggered or self.target_bytes is None:
            return 0
        return max(0, self.used_bytes - self.target_bytes)

    @property
    def evict_bytes(self) -> int:
        """Bytes the candidates hold."""
        return sum(g.size for g in self.candidates)

    @property
    def kernels(self) -> list[str]:
        """The candidates' kernel names, in eviction order."""
        return [g.kernel for g in self.candidates]

    @property
    def kept_kernels(self) -> list[str]:
        """The names of the entries the aging guard kept, in order."""
        return [g.kernel for g in self.kept_by_age]

    def pending(self) -> Iterator[EntryGroup]:
        """The candidates, then the reserve: what an eviction removes, in order."""
        return iter(self.candidates + self.reserve)


def limits_of(
    used: int, max_mb: int, ratio_pct: int, force_ratio: bool, target_bytes: int | None
) -> tuple[int, int, bool]:
    """``(max_bytes, target_bytes, triggered)`` of a chip folder using ``used`` bytes
    (docs/design.md#size-limits-and-eviction): trigger at used ≥ max, or above the target
    with ``force_ratio`` or a ``target_bytes`` below the ratio's target. ``max_mb`` ≥ 1."""
    max_bytes = max_mb * MIB
    target = max_bytes * ratio_pct // 100
    triggered = used >= max_bytes or (force_ratio and used > target)
    if target_bytes is not None and target_bytes < target:
        target = max(0, target_bytes)
        triggered = triggered or used > target
    return max_bytes, target, triggered


def check_limits(max_mb: int, ratio_pct: int, min_age_s: float) -> None:
    """Check eviction parameters.

    :param max_mb: limit in MB (MiB) per chip folder, ≥ 1, or -1 = never evict.
    :param ratio_pct: percent of the limit kept, 0..100 (GE's env parsing accepts 0).
    :param min_age_s: seconds; entries accessed more recently are kept, ≥ 0.
    :raises InvalidInputError: naming the bad value.
    """
    if isinstance(max_mb, bool) or not isinstance(max_mb, int) or (max_mb < 1 and max_mb != -1):
        raise InvalidInputError(f"max_op_cache_size={max_mb!r} MB is invalid; accepted: ≥ 1 or -1")
    if isinstance(ratio_pct, bool) or not isinstance(ratio_pct, int) or not 0 <= ratio_pct <= 100:
        raise InvalidInputError(
            f"remain_cache_size_ratio={ratio_pct!r} is invalid; accepted: 0..100"
        )
    if not min_age_s >= 0:
        raise InvalidInputError(f"min_age_s={min_age_s!r} is invalid; accepted: seconds ≥ 0")


def plan_eviction(
    scan: ChipScan,
    max_mb: int,
    ratio_pct: int,
    min_age_s: float,
    now_ns: int,
    force_ratio: bool = False,
    target_bytes: int | None = None,
    clock_skew_s: float | None = None,
    first_seen: Mapping[str, int] | None = None,
) -> EvictionPlan:
    """Plan the eviction of one chip folder from a snapshot; pure
    (docs/design.md#size-limits-and-eviction, [GE]).

    :param scan: the chip folder's snapshot (``entry.scan_chip``), after reclaim.
    :param max_mb: limit in MB (MiB, 2**20 bytes), or -1 = never evict (empty plan).
    :param ratio_pct: percent of the limit kept after eviction (target = max × ratio / 100).
    :param min_age_s: aging guard in seconds (GE: 1800); ``now_ns - atime < min_age_s`` keeps.
    :param now_ns: the clock, in ns since the epoch (passed in: the function is pure).
    :param force_ratio: evict down to the target even below the trigger (``gc --ratio``).
    :param target_bytes: evict down to this many bytes (when lower than the ratio's target)
        even below the trigger: after ``ENOSPC`` the daemon's target is a number of bytes,
        never a percent rounded down to 0.
    :param clock_skew_s: an access time more than this many seconds after ``now_ns`` is
        suspect (written or hit by a host whose clock runs ahead, common on NFS): it is not
        trusted but replaced by ``first_seen[kernel]`` (ns; default ``now_ns``), the time
        cachemgr first saw it. None trusts every access time.
    :raises InvalidInputError: for a bad ``max_mb``, ``ratio_pct`` or ``min_age_s``.
    """
    check_limits(max_mb, ratio_pct, min_age_s)
    used = scan.used_bytes
    if max_mb == NEVER_EVICT:
        return EvictionPlan(scan.chip_dir, used, None, None, triggered=False)
    max_bytes, target, triggered = limits_of(used, max_mb, ratio_pct, force_ratio, target_bytes)
    groups = list(scan.entries.values())
    # suspects are counted on every run, not only when it evicts: a run with nothing to do
    # must not report "0 in the future" for a folder that holds them (stats, the gauge)
    times, suspect = _effective_times(groups, now_ns, clock_skew_s, first_seen or {})
    if not triggered:
        return EvictionPlan(
            scan.chip_dir, used, max_bytes, target, triggered=False, suspect=suspect
        )
    need = used - target
    cutoff_ns = now_ns - int(min_age_s * 1e9)
    order, atimes = _lru_order(groups, times)
    candidates: list[EntryGroup] = []
    kept: list[EntryGroup] = []
    freed = 0
    split = len(order)
    for i, group in enumerate(order):
        if freed >= need:
            split = i
            break
        if atimes[i] > cutoff_ns:  # accessed within min_age_s: this and all after are young
            kept.append(group)
        else:
            candidates.append(group)
        freed += group.size
    old_end = bisect_right(atimes, cutoff_ns)  # entries before it are old enough to go
    reserve = () if kept else tuple(order[split:old_end])
    return EvictionPlan(
        scan.chip_dir,
        used,
        max_bytes,
        target,
        triggered=True,
        candidates=tuple(candidates),
        reserve=reserve,
        kept_by_age=tuple(kept),
        suspect=suspect,
    )


def _effective_times(
    groups: list[EntryGroup],
    now_ns: int,
    clock_skew_s: float | None,
    first_seen: Mapping[str, int],
) -> tuple[list[int], tuple[EntryGroup, ...]]:
    """Each entry's access time (ns) for ordering, and the suspect entries: an access time
    beyond ``now + clock_skew_s`` is replaced by when cachemgr first saw the entry."""
    times = list(map(_ATIME, groups))
    if clock_skew_s is None or not times:
        return times, ()
    limit = now_ns + int(clock_skew_s * 1e9)
    if max(times) <= limit:
        return times, ()
    suspect = []
    for i, group in enumerate(groups):
        if times[i] > limit:
            suspect.append(group)
            times[i] = first_seen.get(group.kernel, now_ns)
    return times, tuple(suspect)


def _lru_order(
    groups: list[EntryGroup], keys: list[int] | None = None
) -> tuple[list[EntryGroup], list[int]]:
    """Least recently accessed first, with their access times (ns); equal times in name
    order, so the plan is deterministic. Each main json's time is read once: on 100,000
    entries the lookups, not the sort, are the cost."""
    if keys is None:
        keys = list(map(_ATIME, groups))
    idx = sorted(range(len(groups)), key=keys.__getitem__)
    order = [groups[i] for i in idx]
    atimes = [keys[i] for i in idx]
    if len(set(atimes)) == len(atimes):
        return order, atimes
    start = 0
    for i in range(1, len(order) + 1):
        if i == len(order) or atimes[i] != atimes[start]:
            if i - start > 1:
                order[start:i] = sorted(order[start:i], key=_KERNEL)
            start = i
    return order, atimes
