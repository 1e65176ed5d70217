"""Counters that survive a restart, kept under ``$STATE_DIRECTORY`` (systemd
``StateDirectory=``) or the user state dir. The socket's place is in :mod:`cachemgr.client`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path

import platformdirs

from cachemgr import fsutil

log = logging.getLogger(__name__)

COUNTER_NAMES = ("hits", "misses", "compiles", "binaries", "debug_compiles", "failures",
                 "evicted_entries", "evicted_bytes", "no_space")  # fmt: skip


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$STATE_DIRECTORY`` under systemd, else the user state dir (``~/.local/state/cachemgr``)."""
    env = os.environ if env is None else env
    if env.get("STATE_DIRECTORY"):
        return Path(env["STATE_DIRECTORY"].split(":")[0])
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]) / "cachemgr"
    home = env.get("HOME")
    if home:
        return Path(home) / ".local" / "state" / "cachemgr"
    return Path(platformdirs.user_state_dir("cachemgr"))


class Counters:
    """Thread-safe named counters persisted as JSON in ``<state dir>/counters.json``.

    :param path: the JSON file; loaded if present (a damaged file is logged and ignored).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._values = dict.fromkeys(COUNTER_NAMES, 0)
        self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("ignoring damaged counters file %s: %s", self.path, exc)
            return
        if isinstance(data, dict):
            for name, value in data.items():
                if name in self._values and isinstance(value, int) and value >= 0:
                    self._values[name] = value

    def add(self, name: str, amount: int = 1) -> None:
        """Add ``amount`` to counter ``name`` (unknown names are created)."""
        with self._lock:
            self._values[name] = self._values.get(name, 0) + amount

    def snapshot(self) -> dict[str, int]:
        """A copy of every counter."""
        with self._lock:
            return dict(self._values)

    def save(self) -> None:
        """Write the counters atomically (temp + rename).

        :raises OSError: when the state folder cannot be written.
        """
        fsutil.ensure_dir(self.path.parent)
        data = json.dumps(self.snapshot(), sort_keys=True).encode()
        fsutil.atomic_write_bytes(self.path, data, mode=0o644)
