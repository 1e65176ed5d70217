"""Eviction engine (layer 5; SPEC §5, [GE]): plan, then act.

* :func:`plan_eviction` — a pure function over a chip-folder snapshot: which entries go;
* :func:`gc_chip` — reclaim leftovers and apply the plan under ``op_cache_file_del.lock``;
* :func:`purge_chip` — clear a chip folder under the eviction lock and each entry's lock;
* :func:`chip_usage` / :func:`chip_stats` — entries, bytes, access-time range, fill % for
  ``stats``.

Sizes are apparent bytes; limits are in MB = MiB (2**20), as GE computes them.
"""

from cachemgr.constants import MIB, NEVER_EVICT
from cachemgr.eviction.collect import (
    DEFAULT_CLOCK_SKEW_S,
    DEFAULT_MIN_AGE_S,
    DryRun,
    GcReport,
    gc_chip,
)
from cachemgr.eviction.plan import EvictionPlan, check_limits, plan_eviction
from cachemgr.eviction.purge import (
    ChipUsage,
    PurgeReport,
    chip_row,
    chip_stats,
    chip_usage,
    purge_chip,
)
from cachemgr.eviction.reclaim import ORPHAN_MIN_AGE_S, TEMP_MAX_AGE_S, ReclaimResult

__all__ = [
    "DEFAULT_CLOCK_SKEW_S",
    "DEFAULT_MIN_AGE_S",
    "MIB",
    "NEVER_EVICT",
    "ORPHAN_MIN_AGE_S",
    "TEMP_MAX_AGE_S",
    "ChipUsage",
    "DryRun",
    "EvictionPlan",
    "GcReport",
    "PurgeReport",
    "ReclaimResult",
    "check_limits",
    "chip_row",
    "chip_stats",
    "chip_usage",
    "gc_chip",
    "plan_eviction",
    "purge_chip",
]
