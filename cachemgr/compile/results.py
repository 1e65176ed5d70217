"""The status of a compile result and the policy that produced it (issue 13 item 2): one
:class:`Status` for every layer (library, daemon, ``Client``, CLI) and a :class:`Policy`
recorded on every compile result — the jit mode applied, the cache mode, whether the kernel
is in the cache and, when not, why."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    """What answered a compile request. A ``StrEnum``: equal to its JSON string."""

    HIT = "hit"  # a verified entry of the cache (SPEC §3.3)
    COMPILED = "compiled"  # a compiler run (this request's or one it shared)
    BINARY = "binary"  # a precompiled package's binary (SPEC §6)
    DEBUG = "debug"  # compiled for debugging in kernel_meta, bypassing the cache (SPEC §7)
    FAILED = "failed"  # no kernel: the compiler's message says why


@dataclass(frozen=True)
class Policy:
    """The policy in force for one compile result.

    :ivar jit_compile: the ``jit_compile`` value applied (``auto``, ``true``, ``false``).
    :ivar binary_first: True when a precompiled binary was looked for before compiling
        (``jit_compile`` false, or auto for a static shape: SPEC §6).
    :ivar cache_mode: the ``op_compiler_cache_mode`` applied (``enable``, ``disable``,
        ``force``; SPEC §4).
    :ivar cached: True when the kernel answered is an entry of the cache.
    :ivar why_not_cached: one line saying why not, when ``cached`` is False.
    """

    jit_compile: str
    binary_first: bool
    cache_mode: str
    cached: bool
    why_not_cached: str | None = None

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
            str(data["jit_compile"]),
            bool(data["binary_first"]),
            str(data["cache_mode"]),
            bool(data["cached"]),
            data.get("why_not_cached"),
        )

    def describe(self) -> str:
        """One phrase for a log line: ``jit auto, cache enable, cached`` (or ``not cached:
        why``)."""
        cached = "cached" if self.cached else f"not cached: {self.why_not_cached}"
        return f"jit {self.jit_compile}, cache {self.cache_mode}, {cached}"
