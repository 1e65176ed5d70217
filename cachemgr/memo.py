"""Bounded, thread-safe memos: the package's process-wide caches.

A module that remembers something across calls (a file's digest by its identity, a compiler's
version line, a parsed manifest) owns one :class:`Memo` with a stated bound instead of a bare
module-level dict: the least recently used entry goes when the bound is reached, so a daemon
that sees millions of files keeps a constant footprint. :class:`OnceSet` is the same for
"warn once per folder". A leaf module: it imports nothing of cachemgr.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Memo(Generic[K, V]):
    """A map from a key to a computed value holding at most ``max_entries`` (LRU).

    :param name: what is remembered (for ``repr`` and logs).
    :param max_entries: the bound (entries, at least 1).
    :raises ValueError: for a bound below 1.
    """

    def __init__(self, name: str, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"memo {name}: max_entries={max_entries} must be at least 1")
        self.name = name
        self.max_entries = max_entries
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value remembered for ``key`` (now the most recently used), or None."""
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        """Remember ``value`` for ``key``; the least recently used entry goes beyond the bound."""
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def put_new(self, key: K, value: V) -> bool:
        """Remember ``value`` for ``key`` unless ``key`` is remembered already; True if it was
        new (one step under the lock: of two threads, exactly one sees True)."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return False
            self._items[key] = value
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)
            return True

    def discard(self, key: K) -> None:
        """Forget ``key`` (no error when it is not remembered)."""
        with self._lock:
            self._items.pop(key, None)

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __repr__(self) -> str:
        return f"Memo({self.name!r}, {len(self)}/{self.max_entries})"


class OnceSet(Generic[K]):
    """Keys already seen, at most ``max_entries`` of them (LRU): "warn once per folder".

    :param name: what is remembered.
    :param max_entries: the bound (entries); a key pushed out may be reported again once.
    """

    def __init__(self, name: str, max_entries: int) -> None:
        self._memo: Memo[K, bool] = Memo(name, max_entries)

    def first(self, key: K) -> bool:
        """True the first time ``key`` is seen (and remembers it), False after; atomic."""
        return self._memo.put_new(key, True)

    def forget(self, key: K) -> None:
        """Forget ``key``: the next :meth:`first` is True again. A key not seen costs no
        lock (one dict look-up, atomic: a hit forgets its folder every time)."""
        if key in self._memo._items:
            self._memo.discard(key)

    def __len__(self) -> int:
        return len(self._memo)
