"""Counts in words for every layer's messages: ``1 chip folder``, ``2 chip folders``, never
``chip folder(s)`` (the CLI's output reads like ccache's: docs/commands.md)."""

from __future__ import annotations


def noun(count: int, one: str, many: str | None = None) -> str:
    """The noun that agrees with ``count``: ``one`` for 1, else ``many`` (default ``one`` +
    ``s``): ``stamp line 3`` but ``stamp lines 3, 4``."""
    return one if count == 1 else (many or one + "s")


def plural(count: int, one: str, many: str | None = None) -> str:
    """``1 entry``, ``2 entries``, ``0 entries``: ``count`` and the noun that agrees with it
    (:func:`noun`)."""
    return f"{count} {noun(count, one, many)}"
