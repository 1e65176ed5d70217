"""Events a storage tier reports, passed as objects to a sink the caller owns —
never through module-level listener lists.

A :class:`Events` sink is made by whoever wants to hear (the daemon makes one and gives it to
its compile queue and its governance); code that publishes takes the sink as a parameter.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NoSpaceEvent:
    """A publish into ``chip_dir`` failed on a full filesystem (``ENOSPC``/``EDQUOT``) and
    needed ``bytes_needed`` bytes (docs/design.md#size-limits-and-eviction, #sharing-and-locking:
    the daemon evicts that chip folder)."""

    chip_dir: Path
    bytes_needed: int


E = TypeVar("E")


class Events:
    """A sink for tier events: handlers subscribe per event type; :meth:`emit` calls each
    handler of the event's type. A failing handler is logged and never turns the caller's
    error into another one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handlers: dict[type, list[Callable[[Any], None]]] = {}

    def subscribe(self, kind: type[E], handler: Callable[[E], None]) -> None:
        """Call ``handler(event)`` for every emitted event of type ``kind``."""
        with self._lock:
            self._handlers.setdefault(kind, []).append(handler)

    def unsubscribe(self, kind: type[E], handler: Callable[[E], None]) -> None:
        """Stop calling ``handler`` (no error when it was not subscribed)."""
        with self._lock:
            handlers = self._handlers.get(kind, [])
            if handler in handlers:
                handlers.remove(handler)

    def emit(self, event: object) -> None:
        """Hand ``event`` to the handlers of its type, in subscription order."""
        with self._lock:
            handlers = list(self._handlers.get(type(event), ()))
        for handler in handlers:
            try:
                handler(event)
            except Exception:  # a handler must not change the outcome of what emitted
                log.exception("handler of %s failed", type(event).__name__)
