"""``json.dumps`` of plain data without importing :mod:`json` (whose decoder imports ``re``,
``enum`` and their kin: start-up, docs/performance.md), for the lean ``cachemgr config``
(:mod:`cachemgr.quickconfig`).

The same text as ``json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)`` for dicts
with ``str`` keys, lists, tuples, ``str``, ``int``, ``float``, ``bool`` and None: strings are
escaped by the same C functions ``json.encoder`` uses (``_json.encode_basestring`` and
``encode_basestring_ascii``), numbers spelt as ``json.encoder``'s pure-Python
``_make_iterencode`` spells them (the one ``json`` runs whenever ``indent`` is given),
separators as ``json.dumps``' defaults (``", "`` and ``": "``; ``","`` with an indent).
``tests/test_os_only_rules.py`` compares both on generated values.

:raises TypeError: any other type (``json.dumps`` would call ``default``): the caller
    declines to the full path.
"""

from __future__ import annotations

import _json

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: typing costs start-up
    from typing import Any


def dumps(value: Any, indent: int | None = None, ensure_ascii: bool = True) -> str:
    """``value`` as ``json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)`` writes it
    (see the module docstring)."""
    text = _json.encode_basestring_ascii if ensure_ascii else _json.encode_basestring
    chunks: list[str] = []
    _encode(value, chunks, text, indent, 0)
    return "".join(chunks)


def _number(value: float) -> str:
    """A float as ``json.encoder``'s ``floatstr`` (``allow_nan``): ``repr``, or NaN/Infinity."""
    if value != value:
        return "NaN"
    if value == float("inf"):
        return "Infinity"
    if value == -float("inf"):
        return "-Infinity"
    return float.__repr__(value)


def _encode(value: Any, out: list[str], text: Any, indent: int | None, level: int) -> None:
    """Append the JSON of ``value`` at nesting ``level`` to ``out``."""
    if isinstance(value, str):
        out.append(text(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(_number(value))
    elif isinstance(value, list | tuple):
        _container(list(value), "[]", out, text, indent, level)
    elif isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise TypeError("a key that is not a string")
        _container(list(value.items()), "{}", out, text, indent, level)
    else:
        raise TypeError(f"{type(value).__name__} is not plain JSON data")


def _container(
    items: list[Any], ends: str, out: list[str], text: Any, indent: int | None, level: int
) -> None:
    """A list (``items``) or a dict (``items`` of ``(key, value)``) between ``ends``."""
    if not items:
        out.append(ends)
        return
    out.append(ends[0])
    inner = "" if indent is None else "\n" + " " * (indent * (level + 1))
    separator = ", " if indent is None else "," + inner
    for i, item in enumerate(items):
        out.append(inner if i == 0 else separator)
        if ends == "{}":
            out.append(text(item[0]) + ": ")
            item = item[1]
        _encode(item, out, text, indent, level + 1)
    if indent is not None:
        out.append("\n" + " " * (indent * level))
    out.append(ends[1])
