"""Eviction: ``gc`` to 80 % on a chip folder of 100,000 entries (~200,000 files), side by side
with its floor and a CANN-style pass that opens every json.

The floor of a gc is what any eviction must do, measured in the same folder
and run: one ``scandir`` + ``stat`` pass plus the ``unlink`` of the same files (those a dry
run of the same gc names), one thread. Targets: gc ≤ 1× that floor; peak RSS
of the process running gc ≤ 80 MiB at 100,000 entries (``cases_scaling --large``: ≤ 150 MiB
at 1,000,000; docs/eviction.md#memory). Every pass runs in its own child process (times exclude
interpreter start-up; RSS is the child's peak as the kernel reports it to the parent through
``wait4``). All passes see a warm page cache: the folder was just built, and written back
(``sync``) so no pass pays for the build's writeback. The folder is rebuilt between passes
that remove or touch files.
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


def settle(chip: Path, entries: int) -> None:
    """(Re)build the folder and write it back, so the next pass starts from the same state."""
    build(chip, entries)
    os.sync()


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
    result = json.loads(out)
    # The child's own VmHWM: wait4's ru_maxrss of a vfork+exec child starts at this
    # process's peak (the kernel keeps the old mm's high-water mark at exec).
    return result, result.get("hwm_kib", usage.ru_maxrss) / 1024


def gc_rounds(chip: Path, entries: int, rounds: int, cann: bool = True) -> dict[str, float]:
    """Medians over ``rounds`` of: the floor (stat pass + the gc's unlinks), the stat pass
    alone, over a descriptor, the CANN pass, the dry run and the gc (with its peak RSS)."""
    names = chip.parent / f"evict-{chip.name}.txt"
    runs: dict[str, list[float]] = {}
    last: dict[str, float] = {}
    for _ in range(rounds):
        fl, _ = measure("floor", chip)
        max_mb = int(fl["bytes"]) // MIB  # used ≥ max: gc must bring it to 80 % of max
        passes = [("floor", fl["seconds"])]
        passes.append(("floorfd", measure("floorfd", chip)[0]["seconds"]))
        if cann:
            passes.append(("cann", measure("cann", chip)[0]["seconds"]))
            settle(chip, entries)  # reading the jsons may have moved their atimes (relatime)
        passes.append(("dry", measure("gcdry", chip, str(max_mb), str(names))[0]["seconds"]))
        files = [k + ext for k in names.read_text().split() for ext in (".json", ".o")]
        names.write_text("\n".join(files))
        unlinked, _ = measure("floorunlink", chip, str(names))
        passes.append(("floor_unlink", unlinked["seconds"]))
        settle(chip, entries)
        threaded, _ = measure("floorunlinkthreads", chip, str(names))
        passes.append(("floor_threads", threaded["seconds"]))
        settle(chip, entries)
        last, peak = measure("gc", chip, str(max_mb))
        passes += [("gc", last["seconds"]), ("rss", peak)]
        settle(chip, entries)
        for key, value in passes:
            runs.setdefault(key, []).append(value)
    names.unlink(missing_ok=True)
    out = {k: statistics.median(v) for k, v in runs.items()}
    out["rss"] = max(runs["rss"])
    out.update({k: last[k] for k in ("evicted", "evicted_bytes", "bytes_before", "bytes_after")})
    return out


def rss_target(entries: int) -> int:
    """The peak RSS a gc of ``entries`` entries may reach (MiB): 80 up to 100,000, 150 at
    1,000,000 (docs/eviction.md#memory)."""
    return 80 if entries <= ENTRIES else 150


def run(workdir: Path, quick: bool) -> list[Row]:
    entries = QUICK_ENTRIES if quick else ENTRIES
    rounds = QUICK_ROUNDS if quick else ROUNDS
    chip = workdir / "kernel_cache" / "Ascend910B1"
    t0 = time.monotonic()
    settle(chip, entries)
    build_s = time.monotonic() - t0
    load = os.getloadavg()[0]
    m = gc_rounds(chip, entries, rounds)
    floor, floor_unlink, gc, dry = m["floor"], m["floor_unlink"], m["gc"], m["dry"]
    evicted = int(m["evicted"])
    unlinks_s = max(gc - dry, 1e-9)
    case = f"gc to 80 %, {entries:,} entries"
    note = (
        f"median of {rounds}; evicted {evicted:,} entries ({2 * evicted:,} files, "
        f"{m['evicted_bytes'] / MIB:.1f} MiB), {m['bytes_before'] / MIB:.1f} → "
        f"{m['bytes_after'] / MIB:.1f} MiB; folder built in {build_s:.0f} s; load average "
        f"{load:.1f} at start"
    )
    return [
        Row(case, "gc wall time", gc, "s", "floor: scandir+stat + the same unlinks",
            floor_unlink, ratio_of(gc, floor_unlink), "≤ 1.0× floor", gc <= floor_unlink,
            note),
        Row(case, "gc wall time vs CANN-style pass", gc, "s", "CANN pass: open+parse every json",
            m["cann"], ratio_of(gc, m["cann"]), "", None, "the CANN pass deletes nothing"),
        Row(case, "gc without removals (dry run)", dry, "s", "scandir+stat pass", floor,
            ratio_of(dry, floor), "", None, "scan + reclaim check + plan"),
        Row(case, "floor: scandir+stat + unlinks", floor_unlink, "s", "scandir+stat pass",
            floor, ratio_of(floor_unlink, floor), "", None,
            f"{2 * evicted:,} unlinks, one thread, in eviction order"),
        Row(case, "gc wall time vs a threaded floor", gc, "s",
            "scandir+stat + the unlinks on gc's 8 threads", m["floor_threads"],
            ratio_of(gc, m["floor_threads"]), "", None,
            "unlink latency overlaps on threads: the floor of gc's own removal design"),
        Row(case, "floor over a folder descriptor", m["floorfd"], "s", "scandir+stat pass",
            floor, ratio_of(m["floorfd"], floor), "", None, "fstatat per file, as gc's scan does"),
        Row(case, "CANN-style pass", m["cann"], "s", "scandir+stat pass", floor,
            ratio_of(m["cann"], floor), "", None, "GE's aging: stat + parse each main json"),
        Row(case, "removal phase", unlinks_s / max(2 * evicted, 1) * 1e6, "µs/file", "", None,
            None, "", None, f"(gc − dry run) / {2 * evicted:,} unlinked files"),
        Row(case, "peak RSS of gc", m["rss"], "MiB", "", None, None, f"≤ {rss_target(entries)} MiB",
            m["rss"] <= rss_target(entries), "the gc child's own VmHWM, Python included"),
    ]  # fmt: skip
