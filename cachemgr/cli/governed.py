"""How ``stats --all`` and ``status`` show the cache roots a daemon governs besides its own
cache (``[daemon] govern``: docs/daemon.md#governing-every-cache-on-a-build-host)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cachemgr.words import plural


def governed_lines(governed: Mapping[str, Any], detail: bool = True) -> list[str]:
    """One line per governed root (owner, kernel caches, bytes used of the limit per chip
    folder with ``detail``) and one per root skipped with its reason.

    :param governed: the ``governed`` object of ``/stats`` or ``/health``.
    """
    lines = []
    roots = governed.get("roots") or {}
    globs = ", ".join(governed.get("globs") or [])
    lines.append(
        f"governed: {len(roots)} cache root{'s' if len(roots) != 1 else ''} matching {globs} "
        f"({governed.get('reconciliations', 0)} reconciliations)"
    )
    for root, row in sorted(roots.items()):
        caches = row.get("kernel_caches") or {}
        lines.append(f"  {root} (owner {row.get('owner')}): {len(caches)} kernel caches")
        if not detail:
            continue
        for kc, cache in sorted(caches.items()):
            for soc, chip in sorted((cache.get("chip_folders") or {}).items()):
                limit = chip.get("max_bytes")
                shown = "never evict" if limit is None else f"limit {limit}"
                skipped = f"; skipped: {chip['skipped']}" if chip.get("skipped") else ""
                lines.append(
                    f"    {kc}/{soc}: {chip.get('used_bytes', 0)} bytes, "
                    f"{plural(int(chip.get('entries', 0)), 'entry', 'entries')} ({shown}, target "
                    f"{chip.get('target_bytes')}; limits from {cache.get('limits_from')}){skipped}"
                )
    for root, why in sorted((governed.get("skipped") or {}).items()):
        lines.append(f"  skipped {root}: {why}")
    return lines
