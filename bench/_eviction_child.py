"""One measured pass over a chip folder, run in its own process by ``cases_eviction``.

``python -m bench._eviction_child MODE CHIP [MAX_MB]`` prints one JSON line with the wall
time of the pass alone (interpreter start-up excluded). Modes:

* ``floor`` — one ``os.scandir`` + ``stat`` per file: the least any size accounting costs;
* ``floorfd`` — the same over a folder descriptor (``fstatat`` per file, as gc's scan does);
* ``cann`` — what CANN GE's aging does before it deletes anything: list the main jsons, stat
  each, open and parse it, stat the binary it names (``TeCacheSpaceManager``);
* ``gc`` / ``gcdry`` — ``cachemgr.eviction.gc_chip`` to 80 % of ``MAX_MB`` (dry run: plan only).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from cachemgr.eviction import DryRun, gc_chip  # imported before the clock starts

_SUBS = ("_mix_aic.json", "_mix_aiv.json")


def floor(chip: Path) -> dict[str, int]:
    files = total = 0
    with os.scandir(chip) as it:
        for de in it:
            total += de.stat(follow_symlinks=False).st_size
            files += 1
    return {"files": files, "bytes": total}


def floor_fd(chip: Path) -> dict[str, int]:
    """The same pass over a folder descriptor: each stat is an ``fstatat`` (what gc does)."""
    fd = os.open(chip, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with os.scandir(fd) as it:
            total = sum(de.stat(follow_symlinks=False).st_size for de in it)
    finally:
        os.close(fd)
    return {"bytes": total}


def cann(chip: Path) -> dict[str, int]:
    mains = [
        de.path
        for de in os.scandir(chip)
        if de.name.endswith(".json") and not de.name.endswith(_SUBS)
    ]
    parsed = 0
    for path in mains:
        st = os.stat(path)
        with open(path, "rb") as fh:
            data = json.load(fh)
        if not path.endswith("_pre.json") and "binFileName" in data:
            os.stat(chip / (data["binFileName"] + data["binFileSuffix"]))
        parsed += st.st_size > 0
    return {"jsons": parsed}


def gc(chip: Path, max_mb: int, dry: bool) -> dict[str, int]:
    mode = DryRun.YES if dry else DryRun.NO
    report = gc_chip(chip, max_mb, 80, 1800, dry_run=mode)
    return {
        "evicted": len(report.evicted),
        "evicted_bytes": report.evicted_bytes,
        "bytes_before": report.bytes_before,
        "bytes_after": report.bytes_after,
        "kept": len(report.kept_by_age),
    }


def main(argv: list[str]) -> None:
    mode, chip = argv[0], Path(argv[1])
    started = time.perf_counter()
    if mode == "floor":
        out = floor(chip)
    elif mode == "floorfd":
        out = floor_fd(chip)
    elif mode == "cann":
        out = cann(chip)
    elif mode in ("gc", "gcdry"):
        out = gc(chip, int(argv[2]), dry=mode == "gcdry")
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    out["seconds"] = time.perf_counter() - started
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
