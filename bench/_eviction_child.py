"""One measured pass over a chip folder, run in its own process by ``cases_eviction``.

``python -m bench._eviction_child MODE CHIP [MAX_MB]`` prints one JSON line with the wall
time of the pass alone (interpreter start-up excluded). Modes:

* ``floor`` — one ``os.scandir`` + ``stat`` per file: the least any size accounting costs;
* ``floorfd`` — the same over a folder descriptor (``fstatat`` per file, as gc's scan does);
* ``floorunlink`` — the floor of a gc: the ``floor`` pass, then ``unlink`` of
  the files named one per line in ``NAMES`` (the ones a dry run of the same gc would evict),
  one thread, in that order; ``floorunlinkthreads`` the same unlinks on gc's removal threads;
* ``cann`` — what CANN GE's aging does before it deletes anything: list the main jsons, stat
  each, open and parse it, stat the binary it names (``TeCacheSpaceManager``);
* ``gc`` / ``gcdry`` — ``cachemgr.eviction.gc_chip`` to 80 % of ``MAX_MB`` (dry run: plan only;
  ``gcdry CHIP MAX_MB NAMES`` also writes the files it would evict to ``NAMES``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cachemgr.eviction import DryRun, gc_chip  # imported before the clock starts
from cachemgr.eviction.collect import DELETE_WORKERS

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


def floor_unlink(chip: Path, names: list[str], threads: int = 1) -> dict[str, int]:
    """The floor pass plus the unlinks the eviction must do (names read before the clock),
    on ``threads`` threads (gc removes on ``DELETE_WORKERS``)."""
    out = floor(chip)
    fd = os.open(chip, os.O_RDONLY | os.O_DIRECTORY)

    def unlink_all(part: list[str]) -> None:
        for name in part:
            os.unlink(name, dir_fd=fd)

    try:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(unlink_all, [names[i::threads] for i in range(threads)]))
    finally:
        os.close(fd)
    out["unlinked"] = len(names)
    return out


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


def gc(chip: Path, max_mb: int, dry: bool) -> tuple[dict[str, int], list[str]]:
    mode = DryRun.YES if dry else DryRun.NO
    report = gc_chip(chip, max_mb, 80, 1800, dry_run=mode)
    out = {
        "evicted": len(report.evicted),
        "evicted_bytes": report.evicted_bytes,
        "bytes_before": report.bytes_before,
        "bytes_after": report.bytes_after,
        "kept": len(report.kept_by_age),
    }
    return out, report.evicted


def _vm_hwm_kib() -> int:
    """This process's own peak resident memory (``VmHWM``, KiB), Python included. Not the
    parent's ``wait4`` ``ru_maxrss``: a child started by ``vfork`` + ``exec`` (what
    ``subprocess`` does) inherits the parent's high-water mark at ``exec``, so a bench
    process that had grown showed its own peak as gc's."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def main(argv: list[str]) -> None:
    mode, chip = argv[0], Path(argv[1])
    names: list[str] = []
    if mode.startswith("floorunlink"):
        names = Path(argv[2]).read_text().split()
    evicted: list[str] = []
    started = time.perf_counter()
    if mode == "floor":
        out = floor(chip)
    elif mode == "floorfd":
        out = floor_fd(chip)
    elif mode == "floorunlink":
        out = floor_unlink(chip, names)
    elif mode == "floorunlinkthreads":
        out = floor_unlink(chip, names, DELETE_WORKERS)
    elif mode == "cann":
        out = cann(chip)
    elif mode in ("gc", "gcdry"):
        out, evicted = gc(chip, int(argv[2]), dry=mode == "gcdry")
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    out["seconds"] = time.perf_counter() - started
    out["hwm_kib"] = _vm_hwm_kib()
    if len(argv) > 3:  # gcdry CHIP MAX_MB NAMES: the kernels it would evict, one a line
        Path(argv[3]).write_text("".join(k + "\n" for k in evicted))
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
