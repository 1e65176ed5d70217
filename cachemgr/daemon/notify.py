"""The systemd notify protocol (``sd_notify``), spoken over ``$NOTIFY_SOCKET``
(docs/design.md#who-it-is-for).

A datagram of ``KEY=VALUE`` lines to the socket systemd names; an abstract socket is written
with a leading ``@``. Without ``NOTIFY_SOCKET`` every call is a no-op, so the daemon runs the
same under systemd and in a terminal. The watchdog interval comes from ``WATCHDOG_USEC``
(and ``WATCHDOG_PID`` when set must be ours).
"""

from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger(__name__)


class Notifier:
    """Sends ``READY=1``, ``STATUS=…``, ``WATCHDOG=1``, ``RELOADING=1``, ``STOPPING=1``.

    :param env: the environment to read ``NOTIFY_SOCKET``/``WATCHDOG_USEC`` from.
    """

    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ if env is None else env)
        addr = env.get("NOTIFY_SOCKET", "")
        self._addr: str | bytes | None = None
        if addr.startswith("@"):
            self._addr = b"\0" + addr[1:].encode()
        elif addr.startswith("/"):
            self._addr = addr
        self._sock: socket.socket | None = None
        if self._addr is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.watchdog_interval_s = _watchdog_interval(env)

    @property
    def enabled(self) -> bool:
        """True when running under a notify-aware supervisor."""
        return self._sock is not None

    def send(self, **fields: object) -> bool:
        """Send one notification, e.g. ``send(READY=1, STATUS="serving")``; False if not sent."""
        if self._sock is None or self._addr is None:
            return False
        payload = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
        try:
            self._sock.sendto(payload, self._addr)
        except OSError as exc:
            log.warning("sd_notify to %r failed: %s", self._addr, exc)
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send(READY=1, STATUS=status, MAINPID=os.getpid())

    def status(self, status: str) -> bool:
        return self.send(STATUS=status)

    def watchdog(self) -> bool:
        return self.send(WATCHDOG=1)

    def reloading(self) -> bool:
        return self.send(RELOADING=1, MONOTONIC_USEC=_monotonic_usec())

    def stopping(self) -> bool:
        return self.send(STOPPING=1, STATUS="stopping")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _monotonic_usec() -> int:
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)


def _watchdog_interval(env: dict[str, str]) -> float | None:
    """Half of ``WATCHDOG_USEC`` in seconds, or None when the watchdog is off (systemd docs)."""
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2e6 if value > 0 else None
