"""Heartbeats: the systemd watchdog means the service works.

The main loop, the request server (a real ``/health`` request over the daemon's own socket
succeeds) and the governance thread (a scheduler job runs) each :meth:`Heartbeats.beat`; the
compile pool counts as stuck when work waits and no job has started or finished for longer
than a compile may take. ``WATCHDOG=1`` is sent only while :meth:`Heartbeats.stale` is empty,
so a wedged part stops the pings and systemd restarts the service (``WatchdogSec=``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

MAIN, SERVER, GOVERNANCE, POOL = "main loop", "request server", "governance", "compile pool"


class Heartbeats:
    """Last beat (monotonic seconds) of each part; a part is stale after ``timeout_s``.

    :param timeout_s: seconds without a beat after which a part counts as stuck.
    :param extra: more checks, ``name → callable`` returning True while that part is stuck
        (the compile pool's own test).
    """

    def __init__(
        self, timeout_s: float, extra: dict[str, Callable[[], bool]] | None = None
    ) -> None:
        self.timeout_s = timeout_s
        self._extra = dict(extra or {})
        now = time.monotonic()
        self._last = {MAIN: now, SERVER: now, GOVERNANCE: now}
        self._lock = threading.Lock()
        self._reported: frozenset[str] = frozenset()

    def beat(self, part: str) -> None:
        """``part`` made progress now."""
        with self._lock:
            self._last[part] = time.monotonic()

    def ages(self) -> dict[str, float]:
        """Seconds since each part's last beat."""
        now = time.monotonic()
        with self._lock:
            return {part: round(now - last, 3) for part, last in self._last.items()}

    def stale(self) -> list[str]:
        """Parts with no progress for ``timeout_s`` (or whose own check says stuck); logged
        once when the set changes."""
        stale = [part for part, age in self.ages().items() if age > self.timeout_s]
        stale += [name for name, stuck in self._extra.items() if stuck()]
        now_stale = frozenset(stale)
        if now_stale != self._reported:
            if now_stale:
                log.error(
                    "no progress for %g s in: %s; withholding WATCHDOG=1",
                    self.timeout_s,
                    ", ".join(sorted(now_stale)),
                )
            else:
                log.info("every part makes progress again; WATCHDOG=1 resumes")
            self._reported = now_stale
        return sorted(stale)
