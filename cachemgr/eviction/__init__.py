"""Eviction engine (layer 5; docs/design.md#size-limits-and-eviction, [GE]): plan, then act.

* :func:`plan_eviction` — a pure function over a chip-folder snapshot: which entries go;
* :func:`gc_chip` — reclaim leftovers and apply the plan under ``op_cache_file_del.lock``;
* :func:`purge_chip` — clear a chip folder under the eviction lock and each entry's lock;
* :func:`chip_usage` / :func:`chip_stats` — entries, bytes, access-time range, fill % for
  ``stats``.

Sizes are apparent bytes; limits are in MB = MiB (2**20), as GE computes them.

The names below are loaded on first use (PEP 562 ``__getattr__``), not when the package is:
importing :mod:`cachemgr.eviction.report` (the gc result types, which the compile path's
typed results re-export) must not load the eviction machinery on a CLI hit
(``tests/test_startup.py``).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, for type checkers and import-linter
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

#: Each public name and the module that defines it.
_WHERE = {
    "MIB": "cachemgr.constants",
    "NEVER_EVICT": "cachemgr.constants",
    "DEFAULT_CLOCK_SKEW_S": "cachemgr.eviction.collect",
    "DEFAULT_MIN_AGE_S": "cachemgr.eviction.collect",
    "DryRun": "cachemgr.eviction.collect",
    "GcReport": "cachemgr.eviction.collect",
    "gc_chip": "cachemgr.eviction.collect",
    "EvictionPlan": "cachemgr.eviction.plan",
    "check_limits": "cachemgr.eviction.plan",
    "plan_eviction": "cachemgr.eviction.plan",
    "ChipUsage": "cachemgr.eviction.purge",
    "PurgeReport": "cachemgr.eviction.purge",
    "chip_row": "cachemgr.eviction.purge",
    "chip_stats": "cachemgr.eviction.purge",
    "chip_usage": "cachemgr.eviction.purge",
    "purge_chip": "cachemgr.eviction.purge",
    "ORPHAN_MIN_AGE_S": "cachemgr.eviction.reclaim",
    "TEMP_MAX_AGE_S": "cachemgr.eviction.reclaim",
    "ReclaimResult": "cachemgr.eviction.reclaim",
}

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


def __getattr__(name: str) -> Any:
    """Load a public name's module on first use and keep the name here.

    :raises AttributeError: not a public name (``from cachemgr.eviction import gc`` then
        imports the submodule, as for any package).
    """
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
