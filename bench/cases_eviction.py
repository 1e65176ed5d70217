"""Eviction: ``gc`` to 80 % on a chip folder of 100,000 entries (~200,000 files), side by side
with the floor (one ``scandir`` + ``stat`` pass) and a CANN-style pass that opens every json.

Targets (issue 3): gc ≤ 2× the floor; peak RSS of the process running gc ≤ 150 MB. Every pass
runs in its own child process (times exclude interpreter start-up; RSS is the child's peak as
the kernel reports it to the parent through ``wait4``). All passes see a warm page cache: the
folder was just built. The folder is rebuilt between gc runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import ROOT, Row, ratio_of

NAME = "eviction"
ENTRIES = 100_000
QUICK_ENTRIES = 5_000
ROUNDS = 3
QUICK_ROUNDS = 1
MIB = 2**20
#: Access times are spread over the two days before the run: all older than GE's 1800 s guard.
SPREAD_S = 2 * 86400


def _kernel(i: int) -> str:
    return "te_Mul_" + hashlib.sha256(i.to_bytes(8, "little")).hexdigest()


def _files(i: int) -> tuple[str, bytes, str, bytes]:
    """The entry ``i``: a CANN-shaped json and a 2–5 KiB binary (sizes vary by entry)."""
    kernel = _kernel(i)
    binary = (kernel.encode() * 64)[: 2048 + (i % 7) * 512]
    desc = {
        "binFileName": kernel,
        "binFileSuffix": ".o",
        "kernelName": kernel + "__kernel0",
        "sha256": hashlib.sha256(binary).hexdigest(),
        "blockDim": 8,
        "coreType": "AiCore",
        "magic": "RT_DEV_BINARY_MAGIC_ELF_AIVEC",
        "opParaSize": 24,
        "parameters": [0] * (i % 5),
        "workspace": {"num": 1, "size": [1024]},
    }
    return kernel + ".json", json.dumps(desc).encode(), kernel + ".o", binary


def _write(chip_fd: int, name: str, data: bytes) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o664, dir_fd=chip_fd)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def build(chip: Path, entries: int) -> int:
    """Create the missing entries of the folder and reset every access time; returns how many
    entries were (re)created. Entry ``i`` was last accessed ``SPREAD_S`` × (1 - i/n) ago in a
    scattered order, so eviction order is not the creation order."""
    chip.mkdir(parents=True, exist_ok=True)
    chip_fd = os.open(chip, os.O_RDONLY | os.O_DIRECTORY)
    created = 0
    now_ns = time.time_ns()
    try:
        present = set(os.listdir(chip_fd))
        for i in range(entries):
            json_name, desc, bin_name, binary = _files(i)
            if json_name not in present or bin_name not in present:
                _write(chip_fd, bin_name, binary)
                _write(chip_fd, json_name, desc)
                created += 1
            rank = (i * 7919) % entries  # a fixed scatter of access order
            atime = now_ns - int(SPREAD_S * 1e9 * (1 - rank / entries)) - 3600 * 10**9
            st = os.stat(json_name, dir_fd=chip_fd)
            os.utime(json_name, ns=(atime, st.st_mtime_ns), dir_fd=chip_fd)
    finally:
        os.close(chip_fd)
    return created


def measure(mode: str, chip: Path, *extra: str) -> tuple[dict[str, float], float]:
    """Run one pass in a child; return (its JSON output, its peak RSS in MiB)."""
    cmd = [sys.executable, "-m", "bench._eviction_child", mode, str(chip), *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}")
    return json.loads(out), usage.ru_maxrss / 1024  # Linux: ru_maxrss in KiB


def run(workdir: Path, quick: bool) -> list[Row]:
    entries = QUICK_ENTRIES if quick else ENTRIES
    rounds = QUICK_ROUNDS if quick else ROUNDS
    chip = workdir / "kernel_cache" / "Ascend910B1"
    t0 = time.monotonic()
    build(chip, entries)
    build_s = time.monotonic() - t0
    floors, fd_floors, canns, drys, gcs, rss = [], [], [], [], [], []
    last: dict[str, float] = {}
    for _ in range(rounds):
        fl, _ = measure("floor", chip)
        floors.append(fl["seconds"])
        max_mb = int(fl["bytes"]) // MIB  # used ≥ max: gc must bring it to 80 % of max
        fd_floors.append(measure("floorfd", chip)[0]["seconds"])
        canns.append(measure("cann", chip)[0]["seconds"])
        build(chip, entries)  # reading the jsons may have moved their atimes (relatime)
        drys.append(measure("gcdry", chip, str(max_mb))[0]["seconds"])
        last, peak = measure("gc", chip, str(max_mb))
        gcs.append(last["seconds"])
        rss.append(peak)
        build(chip, entries)
    floor, floor_fd, cann, dry, gc = (
        statistics.median(x) for x in (floors, fd_floors, canns, drys, gcs)
    )
    evicted = int(last["evicted"])
    unlinks_s = max(gc - dry, 1e-9)
    case = f"gc to 80 %, {entries:,} entries"
    note = (
        f"median of {rounds}; evicted {evicted:,} entries ({2 * evicted:,} files, "
        f"{last['evicted_bytes'] / MIB:.1f} MiB), {last['bytes_before'] / MIB:.1f} → "
        f"{last['bytes_after'] / MIB:.1f} MiB; folder built in {build_s:.0f} s"
    )
    return [
        Row(case, "gc wall time", gc, "s", "floor: scandir+stat", floor,
            ratio_of(gc, floor), "≤ 2.0× floor", gc <= 2 * floor, note),
        Row(case, "gc wall time vs CANN-style pass", gc, "s", "CANN pass: open+parse every json",
            cann, ratio_of(gc, cann), "", None, "the CANN pass deletes nothing"),
        Row(case, "gc without removals (dry run)", dry, "s", "floor: scandir+stat", floor,
            ratio_of(dry, floor), "", None, "scan + reclaim check + plan"),
        Row(case, "floor over a folder descriptor", floor_fd, "s", "floor: scandir+stat", floor,
            ratio_of(floor_fd, floor), "", None, "fstatat per file, as gc's scan does"),
        Row(case, "CANN-style pass", cann, "s", "floor: scandir+stat", floor,
            ratio_of(cann, floor), "", None, "GE's aging: stat + parse each main json"),
        Row(case, "removal phase", unlinks_s / max(2 * evicted, 1) * 1e6, "µs/file", "", None,
            None, "", None, f"(gc − dry run) / {2 * evicted:,} unlinked files"),
        Row(case, "peak RSS of gc", max(rss), "MiB", "", None, None, "≤ 150 MiB",
            max(rss) <= 150, "child's ru_maxrss via wait4, Python included"),
    ]  # fmt: skip
