"""The places of TCP connections that have not authenticated yet: few per source address,
few in all, the oldest given up for a newcomer.

A TCP connection is *unauthenticated* from its accept until the daemon has read the headers
of a request on it carrying the listener's token (``Authorization: Bearer <token>``,
:mod:`.httpauth`); once authenticated it stays so for its life (keep-alive). An
unauthenticated connection holds one place here; the pool holds at most ``per_address``
places per source address and ``total`` in all, and both bounds sit below the TCP share of
the connection limits, so the rest of that share is left to authenticated connections
(docs/security.md#9-connections-are-bounded).

A newcomer is never refused a place: when its address, or the pool, is full, the oldest place
(of its address, else of the address holding most) is given up — its connection is evicted
and closed by the caller. An honest client sends its request as soon as it connects, so it is
the newest and authenticates long before it would be the oldest; an outsider holding idle or
trickling connections only ever evicts its own, or other unauthenticated ones.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


class UnauthPool(Generic[T]):
    """Unauthenticated connections (any hashable handle), by source address, oldest first.
    Not thread-safe: the caller holds its own lock around every call.

    :param per_address: most places one source address holds (≥ 1).
    :param total: most places in all (≥ 1).
    :raises ValueError: a bound below 1.
    """

    def __init__(self, per_address: int, total: int) -> None:
        if per_address < 1 or total < 1:
            raise ValueError(f"pool bounds must be ≥ 1 (per address {per_address}, {total})")
        self.per_address = per_address
        self.total = total
        self._by_address: dict[str, dict[T, None]] = {}  # insertion order = age
        self._address: dict[T, str] = {}

    def __len__(self) -> int:
        return len(self._address)

    def __contains__(self, item: object) -> bool:
        return item in self._address

    def count(self, address: str) -> int:
        """Places held by ``address``."""
        return len(self._by_address.get(address, ()))

    def add(self, item: T, address: str) -> T | None:
        """Give ``item`` (from ``address``) a place; return the connection evicted to make
        room (already removed from the pool), or None."""
        victim = self.victim_for(address)
        if victim is not None:
            self.remove(victim)
        self._by_address.setdefault(address, {})[item] = None
        self._address[item] = address
        return victim

    def victim_for(self, address: str) -> T | None:
        """The connection :meth:`add` would evict for a newcomer from ``address`` (the
        oldest of that address when it is full, else of the largest when the pool is full),
        or None when there is room."""
        if self.count(address) >= self.per_address:
            return next(iter(self._by_address[address]))
        if len(self) >= self.total:
            return self.oldest_of_largest()
        return None

    def remove(self, item: T) -> bool:
        """Give up ``item``'s place (it authenticated, closed or was evicted); False when it
        held none."""
        address = self._address.pop(item, None)
        if address is None:
            return False
        held = self._by_address[address]
        del held[item]
        if not held:
            del self._by_address[address]
        return True

    def oldest_of_largest(self) -> T | None:
        """The oldest connection of the address holding most places (of those tied, the one
        whose oldest is oldest), or None when the pool is empty."""
        best: T | None = None
        most = 0
        order = {item: n for n, item in enumerate(self._address)}  # age across addresses
        for held in self._by_address.values():
            first = next(iter(held))
            older = best is not None and order[first] < order[best]
            if len(held) > most or (len(held) == most and older):
                best, most = first, len(held)
        return best
