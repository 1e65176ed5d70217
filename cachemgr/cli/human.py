"""Output for people, like ccache's: sizes in sensible units, correct
plurals, aligned tables, progress bars on a terminal only, and a quiet exit when the reader
of a pipe (``cachemgr ls | head``) has gone."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click

from cachemgr.cli.common import VERBOSITY, printable
from cachemgr.words import bar as bar  # re-exported: a fill bar, every layer's
from cachemgr.words import percent as percent  # re-exported: a share in per cent
from cachemgr.words import plural as plural  # re-exported: the CLI's counts in words
from cachemgr.words import size as size  # re-exported: sizes in KiB/MiB, every layer's


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> None:
    """Print ``rows`` under ``header`` in aligned columns (``right``: right-aligned columns)."""
    cells = [[printable(str(c)) for c in header]] + [
        [printable(str(c)) for c in row] for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for row in cells:
        parts = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        click.echo("  ".join(parts).rstrip())


def bars_enabled(as_json: bool = False) -> bool:
    """Progress bars only for a person: stdout a terminal (not closed), no ``--json``, no
    ``-q``."""
    return sys.stdout is not None and sys.stdout.isatty() and not as_json and VERBOSITY.level >= 0


@contextmanager
def progress(enabled: bool, label: str, total: int | None, unit: str) -> Iterator[Any]:
    """A tqdm bar on stderr (``bar.update(n)``, ``bar.total = …``) when ``enabled``; a bar
    that does nothing otherwise."""
    if not enabled:
        yield _NoBar()
        return
    from tqdm import tqdm

    bar = tqdm(total=total, desc=label, unit=unit, file=sys.stderr, leave=False)
    try:
        yield bar
    finally:
        bar.close()


class _NoBar:
    """Stands in for a tqdm bar when bars are off."""

    total: int | None = None
    n = 0

    def update(self, n: int = 1) -> None:
        """Nothing to show."""

    def refresh(self) -> None:
        """Nothing to show."""
