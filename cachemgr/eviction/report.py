"""The result of a ``gc`` run (docs/design.md#size-limits-and-eviction): :class:`GcResult` for a
kernel cache and :class:`ChipGc` for each of its chip folders, with ``to_json``/``from_json``. The
same type crosses the library (:func:`cachemgr.eviction.gc.collect`), the daemon (``POST
/gc``), ``Client.gc`` and ``cachemgr gc --json``; ``to_json`` writes that JSON key for key and
in the same order. Re-exported by :mod:`cachemgr.compile.results` with the other results."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Reclaimed:
    """What the reclaim pass of one chip folder removed (docs/design.md#size-limits-and-eviction):
    counts, bytes (apparent) and ``"<kernel>: <problem>"`` per bad entry; ``ge_fatal``/``fatal`` the
    entries whose json makes GE abort (docs/interop.md#entries-that-abort-ge), with the offending
    field."""

    orphans: int
    temps: int
    locks: int
    manifests: int
    bad_entries: int
    ge_fatal: int
    bytes: int
    bad: list[str]
    fatal: list[str]


@dataclass(frozen=True)
class ChipGc:
    """What ``gc`` did (with a dry run: would do) to one chip folder: the JSON of one
    ``chip_folders`` member of ``gc --json`` and ``POST /gc``. Sizes in bytes (apparent);
    ``max_bytes``/``target_bytes`` null when eviction is off (``max_op_cache_size=-1``);
    ``skipped`` is ``""``, ``busy`` (another evictor), ``missing`` (no folder) or ``blocked``
    (a folder planted as GE's eviction lock: ``denied`` says so). ``purged_entries`` /
    ``purged_bytes`` / ``purge_reason``: what the toolkit check purged from it just before
    (``bytes_before`` is measured after that purge;
    docs/eviction.md#toolkit-purges-in-the-report)."""

    chip_dir: str
    dry_run: bool
    skipped: str
    max_bytes: int | None
    target_bytes: int | None
    triggered: bool
    entries_before: int
    bytes_before: int
    bytes_after: int
    evicted_entries: int
    evicted_bytes: int
    evicted: list[str]
    kept_by_aging_guard: int
    kept: list[str]
    saved_by_hit: list[str]
    gone: list[str]
    busy: list[str]
    denied: list[str]
    reclaimed: Reclaimed
    not_files: dict[str, str]
    seconds: float
    future_atimes: int
    max_skew_s: float
    stuck_over_limit: bool
    purged_entries: int = 0
    purged_bytes: int = 0
    purge_reason: str = ""

    @property
    def freed_bytes(self) -> int:
        """Bytes this run removed from the folder: purged, evicted and reclaimed."""
        return self.purged_bytes + self.evicted_bytes + self.reclaimed.bytes

    def to_json(self) -> dict[str, Any]:
        """The fields in order, ``reclaimed`` as an object."""
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc["reclaimed"] = {f.name: getattr(self.reclaimed, f.name) for f in fields(Reclaimed)}
        return doc

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChipGc:
        """The inverse of :meth:`to_json`; the purge fields may be absent (one chip
        folder's eviction report, before the toolkit check's purge is added to it).

        :raises KeyError: a field is missing.
        """
        values = {
            f.name: data[f.name] for f in fields(cls) if f.name in data or f.default is MISSING
        }
        rec = data["reclaimed"]
        values["reclaimed"] = Reclaimed(**{f.name: rec[f.name] for f in fields(Reclaimed)})
        return cls(**values)


@dataclass(frozen=True)
class GcResult:
    """A ``gc`` run over one kernel cache (docs/design.md#size-limits-and-eviction): the limits
    applied with their origins (and the problems that made any fall back), the toolkit check
    (docs/design.md#size-limits-and-eviction upgrades), each chip folder by soc and — for the kernel
    cache asked about — the other governed kernel caches under ``ASCEND_CACHE_PATH``
    (docs/design.md#where-the-cache-lives), by path. ``via`` and ``route`` are the CLI's (where it
    ran)."""

    kernel_cache_dir: str
    limits: dict[str, Any]
    toolkit: dict[str, Any]
    chip_folders: dict[str, ChipGc]
    other_kernel_caches: dict[str, GcResult] | None = None
    via: str | None = None
    route: dict[str, Any] | None = None

    def all_chip_folders(self) -> list[tuple[str, ChipGc]]:
        """``(name, report)`` of every chip folder: this cache's by soc, the other kernel
        caches' as ``<kernel cache>/<soc>``."""
        out = list(self.chip_folders.items())
        for kc, other in (self.other_kernel_caches or {}).items():
            out += [(f"{kc}/{soc}", chip) for soc, chip in other.chip_folders.items()]
        return out

    def totals(self) -> dict[str, Any]:
        """This kernel cache's chip folders summed: ``chip_folders``, ``freed_bytes`` (purged +
        evicted + reclaimed), ``purged_entries``/``purged_bytes`` (the toolkit check's),
        ``evicted_entries``/``evicted_bytes``, ``reclaimed_bytes``; sizes in bytes."""
        folders = self.chip_folders.values()
        return {
            "chip_folders": len(self.chip_folders),
            "freed_bytes": sum(f.freed_bytes for f in folders),
            "purged_entries": sum(f.purged_entries for f in folders),
            "purged_bytes": sum(f.purged_bytes for f in folders),
            "evicted_entries": sum(f.evicted_entries for f in folders),
            "evicted_bytes": sum(f.evicted_bytes for f in folders),
            "reclaimed_bytes": sum(f.reclaimed.bytes for f in folders),
        }

    def to_json(self) -> dict[str, Any]:
        """The object of ``gc --json`` and ``POST /gc`` (``totals``: :meth:`totals`)."""
        doc: dict[str, Any] = {
            "kernel_cache_dir": self.kernel_cache_dir,
            "limits": self.limits,
            "toolkit": self.toolkit,
            "chip_folders": {soc: c.to_json() for soc, c in self.chip_folders.items()},
            "totals": self.totals(),
        }
        if self.other_kernel_caches is not None:
            doc["other_kernel_caches"] = {
                kc: o.to_json() for kc, o in self.other_kernel_caches.items()
            }
        if self.via is not None:
            doc["via"] = self.via
        if self.route is not None:
            doc["route"] = self.route
        return doc

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GcResult:
        """The inverse of :meth:`to_json`.

        :raises KeyError: a field is missing.
        """
        others = data.get("other_kernel_caches")
        return cls(
            str(data["kernel_cache_dir"]),
            dict(data["limits"]),
            dict(data["toolkit"]),
            {soc: ChipGc.from_json(c) for soc, c in data["chip_folders"].items()},
            None if others is None else {kc: cls.from_json(o) for kc, o in others.items()},
            data.get("via"),
            data.get("route"),
        )
