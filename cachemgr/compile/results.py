"""The results that cross the library, the daemon, ``Client`` and the CLI:
one type per kind, each with ``to_json``/``from_json`` — :class:`CompileOutcome` (one compile
request), :class:`GcResult` (a ``gc`` run over a kernel cache; defined in
:mod:`cachemgr.eviction.report`, below the compile path, and re-exported here) and
:class:`StatsResult` (the counters and chip folders ``stats`` shows) — and one
:class:`Status` enum for the answer to a compile request. ``to_json`` writes the JSON of
``--json`` and of the HTTP API, key for key and in the same order;
``from_json(x).to_json() == x`` for every answer a daemon gives.

The compile status strings (``hit``, ``compiled``, ``binary``, ``debug``, ``failed``) are
spelled here only; ``tests/test_results.py`` checks the package for others."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

# the gc report's types live with eviction (below the compile path, which may import them)
from cachemgr.eviction.report import ChipGc, GcResult, Reclaimed

__all__ = [
    "ChipGc",
    "ChipStats",
    "CompileOutcome",
    "GcResult",
    "JobState",
    "Policy",
    "Reclaimed",
    "ScanState",
    "StatsResult",
    "Status",
]


class Status(StrEnum):
    """What answered a compile request. A ``StrEnum``: equal to its JSON string."""

    HIT = "hit"  # a verified entry of the cache (docs/design.md#writing-and-reading-an-entry)
    COMPILED = "compiled"  # a compiler run (this request's or one it shared)
    BINARY = "binary"  # a precompiled package's binary (docs/design.md#precompiled-binaries)
    #: compiled for debugging in kernel_meta, bypassing the cache
    #: (docs/design.md#debug-compiles-and-kernel_meta)
    DEBUG = "debug"
    FAILED = "failed"  # no kernel: the compiler's message says why


class JobState(StrEnum):
    """The state of a ``/compile`` job polled with ``GET /jobs/{id}``."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"  # answered: its ``status`` says how
    FAILED = "failed"  # no answer (a bad request, a cancelled job): ``error`` says why


class ScanState(StrEnum):
    """The state of the daemon's first scan of its kernel cache (``stats`` → ``scan``)."""

    PENDING = "pending"
    INDEXING = "indexing"
    DONE = "done"
    FAILED = "failed"


#: ``why_not_cached`` of a request that failed before its policy was decided starts so.
UNRESOLVED = "unresolved"


@dataclass(frozen=True)
class Policy:
    """The policy in force for one compile result.

    :ivar jit_compile: the ``jit_compile`` value applied (``auto``, ``true``, ``false``);
        None when the request failed before its options were resolved.
    :ivar binary_first: True when a precompiled binary was looked for before compiling
        (``jit_compile`` false, or auto for a dynamic shape: docs/design.md#precompiled-binaries);
        None when unresolved.
    :ivar cache_mode: the ``op_compiler_cache_mode`` applied (``enable``, ``disable``,
        ``force``; docs/design.md#cache-modes); None when unresolved.
    :ivar cached: True when the kernel answered is an entry of the cache.
    :ivar why_not_cached: one line saying why not, when ``cached`` is False
        (``unresolved: <the error>`` for a request that failed before its policy was decided).
    """

    jit_compile: str | None
    binary_first: bool | None
    cache_mode: str | None
    cached: bool
    why_not_cached: str | None = None

    @classmethod
    def unresolved(cls, reason: str) -> Policy:
        """The policy of a request that failed before its options were resolved or its rules
        applied (a bad request, a missing header, a compiler not installed): every field null
        but ``cached`` (False) and ``why_not_cached`` = ``unresolved: <reason>``."""
        return cls(None, None, None, False, f"{UNRESOLVED}: {reason}")

    @property
    def resolved(self) -> bool:
        """False for :meth:`unresolved`'s policy."""
        return self.cache_mode is not None

    def to_json(self) -> dict[str, Any]:
        """The fields as a JSON object (``why_not_cached`` null when cached)."""
        return {
            "jit_compile": self.jit_compile,
            "binary_first": self.binary_first,
            "cache_mode": self.cache_mode,
            "cached": self.cached,
            "why_not_cached": self.why_not_cached,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Policy:
        """The inverse of :meth:`to_json`.

        :raises KeyError: a field is missing. :raises TypeError: ``data`` is not a mapping.
        """
        return cls(
            _opt_str(data["jit_compile"]),
            None if data["binary_first"] is None else bool(data["binary_first"]),
            _opt_str(data["cache_mode"]),
            bool(data["cached"]),
            _opt_str(data.get("why_not_cached")),
        )

    def describe(self) -> str:
        """One phrase for a log line: ``jit auto, cache enable, cached`` (or ``not cached:
        why``; ``policy unresolved: why`` for a request that failed before it)."""
        if not self.resolved:
            return f"policy {self.why_not_cached}"
        cached = "cached" if self.cached else f"not cached: {self.why_not_cached}"
        return f"jit {self.jit_compile}, cache {self.cache_mode}, {cached}"


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class CompileOutcome:
    """The answer to one compile request.

    :ivar status: what answered it (:class:`Status`).
    :ivar files: the kernel's files (json and binary; in kernel_meta: every artefact kept).
    :ivar seconds: wall time from submit to answer.
    :ivar error: one line (the compiler's message) when ``failed``.
    """

    kernel_name: str
    status: Status
    files: tuple[Path, ...] = ()
    seconds: float = 0.0
    error: str | None = None
    request: str = ""
    #: for ``compiled``: True when the kernel was stored in the cache, False when it was
    #: compiled outside it (a read-only or full root, a lock never released)
    cached: bool | None = None
    #: one line for the caller: why a compiled kernel was not cached
    warning: str | None = None
    #: True when another process or host compiled this kernel while this request waited for
    #: its entry lock: counted as ``coalesced`` (and a miss), not as a hit
    coalesced: bool = False
    #: the policy that produced it; :meth:`Policy.unresolved` for a
    #: request that failed before its options were resolved
    policy: Policy | None = None
    #: for a ``hit`` served from a remote tier: ``remote:<name>``
    tier: str | None = None
    #: who answered, for ``Client.compile``: ``client`` (a hit served in the caller's
    #: process) or ``daemon``; None inside a daemon or an in-process queue
    via: str | None = None
    #: one line for the caller about what the request did besides its kernel, e.g. the
    #: ``force`` that cleared the local chip folder only (remote tiers untouched)
    note: str | None = None

    @property
    def ok(self) -> bool:
        """False only for ``failed``."""
        return self.status != Status.FAILED

    def answered_again(self, files: tuple[Path, ...], seconds: float) -> CompileOutcome:
        """This outcome with other ``files`` and ``seconds`` (wall time): the same answer
        given again (a remembered hit). A copy of its fields, nothing checked again — what
        :func:`dataclasses.replace` does, without running ``__init__`` field by field."""
        again = object.__new__(CompileOutcome)
        again.__dict__.update(self.__dict__, files=files, seconds=seconds)
        return again

    def to_json(self) -> dict[str, Any]:
        """``{request, kernel_name, status, files, seconds[, error, cached, warning,
        coalesced], policy[, tier, via, note]}``: the object of ``compile --json`` and
        ``POST /compile``."""
        doc: dict[str, Any] = {
            "request": self.request,
            "kernel_name": self.kernel_name,
            "status": self.status,
            "files": [str(f) for f in self.files],
            "seconds": round(self.seconds, 6),
        }
        if self.error is not None:
            doc["error"] = self.error
        if self.cached is not None:
            doc["cached"] = self.cached
        if self.warning is not None:
            doc["warning"] = self.warning
        if self.coalesced:
            doc["coalesced"] = True
        if self.policy is not None:
            doc["policy"] = self.policy.to_json()
        if self.tier is not None:
            doc["tier"] = self.tier
        if self.via is not None:
            doc["via"] = self.via
        if self.note is not None:
            doc["note"] = self.note
        return doc

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CompileOutcome:
        """The inverse of :meth:`to_json` (a daemon's answer read by ``Client`` and the CLI).

        :raises ValueError: an unknown ``status``.
        """
        policy = data.get("policy")
        return cls(
            str(data.get("kernel_name", "")),
            Status(data.get("status", Status.FAILED)),
            tuple(Path(f) for f in data.get("files", [])),
            float(data.get("seconds", 0.0)),
            data.get("error"),
            str(data.get("request", "")),
            data.get("cached"),
            data.get("warning"),
            bool(data.get("coalesced", False)),
            Policy.from_json(policy) if isinstance(policy, Mapping) else None,
            data.get("tier"),
            data.get("via"),
            data.get("note"),
        )

    @classmethod
    def failed_early(
        cls, error: str, request: str = "", seconds: float = 0.0, via: str | None = None
    ) -> CompileOutcome:
        """A ``failed`` answer for a request that failed before its policy was decided (a
        bad request file, a missing header): the policy says ``unresolved`` and why."""
        return cls(
            "",
            Status.FAILED,
            (),
            seconds,
            error,
            request,
            policy=Policy.unresolved(error),
            via=via,
        )


# --- stats --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChipStats:
    """One chip folder in ``stats``: entries, bytes (apparent), the limit in MB and bytes
    (null with ``never_evict``), the remain ratio in %, fill % of the limit, the oldest and
    newest main-json access (ISO 8601 UTC); or only ``error`` when the folder cannot be read
    (``ESTALE``, ``EACCES``). A daemon adds the folder's ``counters`` and its last eviction's
    ``stuck_over_limit`` and ``future_atimes``; a local run adds ``counters``."""

    chip_dir: str
    error: str | None = None
    exists: bool = False
    entries: int = 0
    bytes: int = 0
    limit_mb: int | None = None
    limit_bytes: int | None = None
    never_evict: bool = False
    ratio_pct: int | None = None
    fill_pct: float | None = None
    oldest_access: str | None = None
    newest_access: str | None = None
    counters: dict[str, int] | None = None
    stuck_over_limit: bool | None = None
    future_atimes: int | None = None

    #: the figures of a readable folder, in their JSON order
    FIGURES = (
        "exists",
        "entries",
        "bytes",
        "limit_mb",
        "limit_bytes",
        "never_evict",
        "ratio_pct",
        "fill_pct",
        "oldest_access",
        "newest_access",
    )
    #: what a daemon or a local run adds, in their JSON order
    ADDED = ("counters", "stuck_over_limit", "future_atimes")

    def to_json(self) -> dict[str, Any]:
        """``{chip_dir, error}`` or ``{chip_dir, <figures>}``, then what was added."""
        doc: dict[str, Any] = {"chip_dir": self.chip_dir}
        if self.error is not None:
            doc["error"] = self.error
        else:
            doc.update((name, getattr(self, name)) for name in self.FIGURES)
        for name in self.ADDED:
            if getattr(self, name) is not None:
                doc[name] = getattr(self, name)
        return doc

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChipStats:
        """The inverse of :meth:`to_json`.

        :raises KeyError: a figure is missing from a row without ``error``.
        """
        values: dict[str, Any] = {"chip_dir": str(data["chip_dir"])}
        if data.get("error") is not None:
            values["error"] = str(data["error"])
        else:
            values.update((name, data[name]) for name in cls.FIGURES)
        values.update((name, data[name]) for name in cls.ADDED if name in data)
        return cls(**values)


@dataclass(frozen=True)
class StatsResult:
    """What ``stats`` shows of one kernel cache (docs/design.md#counters).

    :ivar counters: the counters of docs/design.md#counters summed over the chip folders (``hits``,
        ``misses``,
        ``compiles``…), in the order the cache keeps them.
    :ivar chip_folders: each chip folder by soc.
    :ivar daemon: a daemon's own figures, in its order (``queue_jobs``, ``queue``,
        ``remotes``, ``remote_uploads_dropped``, ``scan``, ``watch``); empty from a local run.
    :ivar via, route, other_kernel_caches, kernel_cache_dir, limits, filesystems: the CLI's
        additions (where it ran, the other governed kernel caches' folders by path, the
        limits with their origins, the access-time rule of each governed kernel cache's
        mount: :meth:`cachemgr.storage.atimes.CacheAtimes.to_json`).
    """

    counters: dict[str, int]
    chip_folders: dict[str, ChipStats]
    daemon: dict[str, Any] = field(default_factory=dict)
    via: str | None = None
    route: dict[str, Any] | None = None
    other_kernel_caches: dict[str, dict[str, ChipStats]] | None = None
    kernel_cache_dir: str | None = None
    limits: dict[str, Any] | None = None
    filesystems: list[dict[str, Any]] | None = None

    #: the CLI's additions, in their JSON order (after the daemon's figures)
    ADDED = ("via", "route", "other_kernel_caches", "kernel_cache_dir", "limits", "filesystems")

    @property
    def hits(self) -> int:
        """Requests answered by a verified entry."""
        return int(self.counters.get("hits", 0))

    @property
    def misses(self) -> int:
        """Lookups that found no entry."""
        return int(self.counters.get("misses", 0))

    def to_json(self) -> dict[str, Any]:
        """The object of ``stats --json`` (and, without the CLI's additions, ``GET
        /stats``): counters at the top, then ``chip_folders``, the daemon's figures, then
        the CLI's additions."""
        doc: dict[str, Any] = dict(self.counters)
        doc["chip_folders"] = {soc: c.to_json() for soc, c in self.chip_folders.items()}
        doc.update(self.daemon)
        for name in self.ADDED:
            value = getattr(self, name)
            if value is None:
                continue
            if name == "other_kernel_caches":
                value = {
                    kc: {soc: c.to_json() for soc, c in rows.items()} for kc, rows in value.items()
                }
            doc[name] = value
        return doc

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StatsResult:
        """The inverse of :meth:`to_json`: the integer members before ``chip_folders`` are the
        counters, the members after it other than the CLI's additions the daemon's figures.

        :raises KeyError: ``chip_folders`` is missing.
        """
        counters: dict[str, int] = {}
        daemon: dict[str, Any] = {}
        seen_chips = False
        for name, value in data.items():
            if name == "chip_folders":
                seen_chips = True
            elif name in cls.ADDED:
                continue
            elif seen_chips:
                daemon[name] = value
            else:
                counters[name] = int(value)
        others = data.get("other_kernel_caches")
        return cls(
            counters,
            {soc: ChipStats.from_json(c) for soc, c in data["chip_folders"].items()},
            daemon,
            data.get("via"),
            data.get("route"),
            None
            if others is None
            else {
                kc: {soc: ChipStats.from_json(c) for soc, c in rows.items()}
                for kc, rows in others.items()
            },
            data.get("kernel_cache_dir"),
            data.get("limits"),
            data.get("filesystems"),
        )
