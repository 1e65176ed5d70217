"""The counters' names and their files' names on the standard library's ``os`` alone
(docs/design.md#counters): :mod:`cachemgr.storage.counters` (the full CLI, the daemon) takes
both from here, so that a start-up fast path of ``stats`` finds and orders the same counters
without importing ``re``, ``json``, ``logging`` or ``pathlib``.
"""

from __future__ import annotations

#: The counters of docs/design.md#counters, in the order ``stats`` shows them (same names in
#: ``/metrics``).
COUNTER_NAMES = (
    "hits",
    "hits_from_remote",
    "misses",
    "compiles",
    "coalesced",
    "binaries",
    "debug_compiles",
    "failures",
    "uncached",
    "evicted_entries",
    "evicted_bytes",
    "no_space",
    #: entries removed because their json makes GE abort (docs/interop.md#entries-that-abort-ge)
    "ge_fatal_removed",
)
#: ``<kernel cache>/cachemgr_stats_<soc>.json`` (``cachemgr_stats.json`` without a soc).
PREFIX = "cachemgr_stats"
_SUFFIX = ".json"
_SOC_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")


def soc_of(name: str) -> str | None:
    """The chip folder whose counters the kernel cache's file ``name`` holds: ``""`` for
    ``cachemgr_stats.json``, ``<soc>`` for ``cachemgr_stats_<soc>.json`` (a soc of letters,
    digits, ``_``, ``-`` and ``.``); None for any other name."""
    if not (name.startswith(PREFIX) and name.endswith(_SUFFIX)):
        return None
    middle = name[len(PREFIX) : len(name) - len(_SUFFIX)]
    if middle == "":
        return ""
    soc = middle[1:]
    if middle[0] != "_" or not soc or not all(c in _SOC_CHARS for c in soc):
        return None
    return soc


def full(values: dict[str, int]) -> dict[str, int]:
    """Every counter of :data:`COUNTER_NAMES` (0 when absent), in that order, then the other
    names of ``values`` as they come."""
    out = dict.fromkeys(COUNTER_NAMES, 0)
    out.update({k: int(v) for k, v in values.items()})
    return out
