"""How many hits a caller may report to ``POST /hits`` (docs/daemon.md#hits-a-client-reports).

A client serves hits in its own process and reports their count; the daemon cannot tell a
true count from an invented one (any member pushed 8 billion). So what one caller may add is
bounded by what its processes could have served: a token bucket per caller (its uid; every
TCP token holder is one caller ``tcp``) refilled at ``rate`` hits a second and holding at
most one second's worth. The daemon's own user and root are not bounded (they may zero the
counters anyway).
"""

from __future__ import annotations

import logging
import os
import threading
import time

from cachemgr.errors import CacheMgrError

log = logging.getLogger(__name__)

#: Hits one CPU core could serve in a second, with room to spare: a verified hit hashes its
#: binary and parses its json (about 0.4 ms of CPU for a 256 KiB kernel, BENCHMARKS.md
#: *daemon*); a tiny kernel is still ≥ 0.1 ms.
HITS_PER_CORE_S = 20_000
#: At most one warning per caller this often (seconds): a flood of refused reports is not
#: a flood of log lines.
WARN_EVERY_S = 60.0


class HitsRefused(CacheMgrError):
    """A caller reported more hits than its budget holds (``http_status`` 429)."""

    exit_code = 1
    http_status = 429


def default_rate() -> int:
    """``[daemon] max_reported_hits_per_s = 0``: :data:`HITS_PER_CORE_S` per CPU core."""
    return HITS_PER_CORE_S * (os.cpu_count() or 1)


class HitBudget:
    """Per-caller token buckets of reportable hits.

    :param rate: hits per second one caller may report (also the most it may report at
        once after a quiet second); 0 means :func:`default_rate`.
    """

    def __init__(self, rate: int = 0) -> None:
        self.rate = rate or default_rate()
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # caller → (tokens, when)
        self._warned: dict[str, float] = {}

    def take(self, caller: str, hits: int) -> int:
        """Take ``hits`` from ``caller``'s bucket; return how many it held (≤ ``hits``)."""
        now = time.monotonic()
        with self._lock:
            tokens, then = self._buckets.get(caller, (float(self.rate), now))
            tokens = min(float(self.rate), tokens + (now - then) * self.rate)
            granted = min(hits, int(tokens))
            self._buckets[caller] = (tokens - granted, now)
            if len(self._buckets) > 4096:  # callers are uids: forget the full buckets
                self._buckets = {c: b for c, b in self._buckets.items() if b[0] < self.rate}
        return granted

    def refuse(self, caller: str, hits: int, granted: int) -> HitsRefused:
        """The error for a report of ``hits`` of which only ``granted`` were counted (one
        warning per caller per :data:`WARN_EVERY_S`)."""
        now = time.monotonic()
        with self._lock:
            warn = now - self._warned.get(caller, float("-inf")) >= WARN_EVERY_S
            if warn:
                self._warned[caller] = now
        if warn:
            log.warning(
                "/hits from %s: reported hits over its budget of %d a second; counted %d of %d",
                caller,
                self.rate,
                granted,
                hits,
            )
        return HitsRefused(
            f"/hits: {caller} reported {hits} hits, counted {granted}: a caller may report at "
            f"most {self.rate} hits a second ([daemon] max_reported_hits_per_s), what its "
            "processes could serve"
        )
