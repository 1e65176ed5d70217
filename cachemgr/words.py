"""Counts and sizes in words for every layer's messages: ``1 chip folder``, ``2 chip
folders``, never ``chip folder(s)``; ``3.0 KiB``, never ``3072 bytes`` (the CLI's output reads
like ccache's: docs/commands.md)."""

from __future__ import annotations


def noun(count: int, one: str, many: str | None = None) -> str:
    """The noun that agrees with ``count``: ``one`` for 1, else ``many`` (default ``one`` +
    ``s``): ``stamp line 3`` but ``stamp lines 3, 4``."""
    return one if count == 1 else (many or one + "s")


def plural(count: int, one: str, many: str | None = None) -> str:
    """``1 entry``, ``2 entries``, ``0 entries``: ``count`` and the noun that agrees with it
    (:func:`noun`)."""
    return f"{count} {noun(count, one, many)}"


_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def size(n_bytes: int | None) -> str:
    """``512 B``, ``3.0 KiB``, ``1.2 MiB``… (powers of 1024, as CANN's MB); ``-`` for None.

    Never ``0.0 MiB`` for a few KiB: the unit is the largest that keeps the number ≥ 1.
    """
    if n_bytes is None:
        return "-"
    if abs(n_bytes) < 1024:
        return f"{n_bytes} B"
    value, exp = float(n_bytes), 0
    while abs(value) >= 1023.95 and exp < len(_UNITS):  # 1023.97 KiB shows as 1.0 MiB
        value /= 1024
        exp += 1
    return f"{value:.1f} {_UNITS[exp - 1]}"


def percent(part: int, whole: int) -> str:
    """``50.00 %`` of ``whole``; ``-`` when ``whole`` is 0."""
    return "-" if not whole else f"{100 * part / whole:.2f} %"


def bar(pct: float | None, width: int = 10) -> str:
    """``[######----]``: ``pct`` % of ``width`` cells filled (over 100 % fills every cell);
    ``""`` for None (no limit to fill)."""
    if pct is None:
        return ""
    filled = min(width, max(0, round(pct * width / 100)))
    return "[" + "#" * filled + "-" * (width - filled) + "]"
