"""Eviction: ``gc`` to 80 % on a chip folder of 100,000 entries (~200,000 files), side by side
with its floor and a CANN-style pass that opens every json.

The floor of a gc is what any eviction must do: one ``scandir`` + ``stat`` pass plus the
``unlink`` of the same files (those a dry run of the same gc names), one thread. Targets: gc
≤ 1× that floor; peak RSS of the process running gc ≤ 80 MiB at 100,000 entries
(``cases_scaling --large``: ≤ 150 MiB at 1,000,000; docs/eviction.md#memory).

``unlink`` latency swings with other processes' I/O (the floor alone went from 3.9 s to
15.5 s between two runs on this host), so gc and its floor are measured in pairs: two
identical folders (built by the same :func:`build`: the same names, contents and access
order) are settled, then gc runs on one and the floor on the other, back to back, the order
and the folders alternating by round (:func:`_pair`); each ratio is the median of the
rounds' ratios, with their min–max (``harness.ratio_row``). Every pass runs in its own child
process (times exclude interpreter start-up; RSS is the child's own peak). All passes see a
warm page cache: the folders were just settled and written back (``sync``) so no pass pays
for the settling's writeback. A folder is settled again (what was removed recreated, every
access time reset) before each pass that removes or touches files.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import harness
from bench.harness import ROOT, Row

NAME = "eviction"
ENTRIES = 100_000
QUICK_ENTRIES = 5_000
ROUNDS = 5
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


def measure(
    mode: str, chip: Path, *extra: str, record: Path | None = None
) -> tuple[dict[str, float], float]:
    """Run one pass in a child; return (its JSON output, its peak RSS in MiB).

    A gc child keeps its record of judged jsons (docs/eviction.md#jsons-judged-before) under
    ``record`` (its ``XDG_CACHE_HOME``); None = a new, empty folder: a first-ever gc of the
    chip folder, which reads every main json (the bench's own never uses the user's)."""
    cmd = [sys.executable, "-m", "bench._eviction_child", mode, str(chip), *extra]
    if record is None and mode.startswith("gc"):
        record = Path(tempfile.mkdtemp(prefix="bench-judged-", dir=chip.parent.parent))
    env = dict(os.environ, XDG_CACHE_HOME=str(record or chip.parent.parent))
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env)
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


#: Passes that remove nothing (run on the first folder, right after it was settled).
_READ_ONLY = ("floor", "floorfd", "dry")


def _pair(chips: tuple[Path, Path], r: int, max_mb: int, names: Path) -> dict[str, float]:
    """Round ``r``'s gc and floor (stat pass + the same unlinks, one thread), back to back on
    the two identical folders: which runs first, and on which folder, alternates by round
    (0: gc on the first then floor on the second; 1: floor, gc; 2 and 3 the same with the
    folders swapped), so neither the order nor a folder favours one side."""
    first, second = chips if r % 4 < 2 else chips[::-1]
    out: dict[str, float] = {}
    for kind, chip in (("gc", first), ("floor_unlink", second))[:: 1 if r % 2 == 0 else -1]:
        if kind == "gc":
            last, peak = measure("gc", chip, str(max_mb))
            out.update({k: float(v) for k, v in last.items()}, rss=peak, gc=last["seconds"])
        else:
            out["floor_unlink"] = measure("floorunlink", chip, str(names))[0]["seconds"]
    return out


def gc_rounds(
    chip: Path, twin: Path, entries: int, rounds: int, cann: bool = True
) -> dict[str, list[float]]:
    """Per round (index ``i`` of every list is round ``i``): both folders (``chip`` and its
    identical ``twin``, each built by :func:`build`) settled; on ``chip`` the stat pass
    (``floor``), the same over a descriptor (``floorfd``), the CANN pass and the dry run
    (``dry``, a first-ever gc of the folder, which names the files the floor unlinks; then
    ``dry_warm``, the same with the record of judged jsons that one left); then gc (a
    first-ever one, no record) and its floor back to back,
    one on each folder (:func:`_pair`); then the floor's unlinks on gc's threads
    (``floor_threads``) on a folder settled again. ``rss`` is gc's peak (MiB); ``evicted``,
    ``evicted_bytes``, ``bytes_before``, ``bytes_after`` its report's."""
    names = chip.parent / f"evict-{chip.name}.txt"
    runs: dict[str, list[float]] = {}
    for r in range(rounds):
        settle(chip, entries)
        settle(twin, entries)
        fl, _ = measure("floor", chip)
        max_mb = int(fl["bytes"]) // MIB  # used ≥ max: gc must bring it to 80 % of max
        got = {"floor": fl["seconds"], "floorfd": measure("floorfd", chip)[0]["seconds"]}
        if cann:
            got["cann"] = measure("cann", chip)[0]["seconds"]
            settle(chip, entries)  # reading the jsons may have moved their atimes (relatime)
        record = Path(tempfile.mkdtemp(prefix="bench-judged-", dir=chip.parent.parent))
        got["dry"] = measure("gcdry", chip, str(max_mb), str(names), record=record)[0]["seconds"]
        got["dry_warm"] = measure("gcdry", chip, str(max_mb), record=record)[0]["seconds"]
        files = [k + ext for k in names.read_text().split() for ext in (".json", ".o")]
        names.write_text("\n".join(files))
        got.update(_pair((chip, twin), r, max_mb, names))
        settle(chip, entries)
        got["floor_threads"] = measure("floorunlinkthreads", chip, str(names))[0]["seconds"]
        for key, value in got.items():
            runs.setdefault(key, []).append(value)
    settle(chip, entries)
    settle(twin, entries)
    names.unlink(missing_ok=True)
    return runs


def medians(runs: dict[str, list[float]]) -> dict[str, float]:
    """The median of each pass over the rounds (``rss``: the largest)."""
    out = {k: statistics.median(v) for k, v in runs.items()}
    out["rss"] = max(runs["rss"])
    return out


def rss_target(entries: int) -> int:
    """The peak RSS a gc of ``entries`` entries may reach (MiB): 80 up to 100,000, 150 at
    1,000,000 (docs/eviction.md#memory)."""
    return 80 if entries <= ENTRIES else 150


def twin_of(workdir: Path) -> Path:
    """The folder gc's floor runs on, built identical to the measured chip folder."""
    return workdir / "twin" / "Ascend910B1"


def run(workdir: Path, quick: bool) -> list[Row]:
    entries = QUICK_ENTRIES if quick else ENTRIES
    rounds = QUICK_ROUNDS if quick else ROUNDS
    chip = workdir / "kernel_cache" / "Ascend910B1"
    t0 = time.monotonic()
    settle(chip, entries)
    settle(twin_of(workdir), entries)
    build_s = time.monotonic() - t0
    load = harness.load_average()
    runs = gc_rounds(chip, twin_of(workdir), entries, rounds)
    m = medians(runs)
    evicted = int(m["evicted"])
    case = f"gc to 80 %, {entries:,} entries"
    note = (
        f"evicted {evicted:,} entries ({2 * evicted:,} files, "
        f"{m['evicted_bytes'] / MIB:.1f} MiB), {m['bytes_before'] / MIB:.1f} → "
        f"{m['bytes_after'] / MIB:.1f} MiB; gc and floor back to back on two identical "
        f"folders, order and folder alternating by round; both folders built in "
        f"{build_s:.0f} s"
    )
    load_col = harness.load_note(load)

    def paired(
        metric: str,
        key: str,
        base_name: str,
        base: str,
        target: float | None = None,
        row_note: str = "",
    ) -> Row:
        return harness.ratio_row(
            case,
            metric,
            runs[key],
            base_name,
            runs[base],
            unit="s",
            scale=1.0,
            target=target,
            note=row_note,
            load=load_col,
        )

    removal = [
        max(g - d, 1e-9) / max(2 * evicted, 1) * 1e6
        for g, d in zip(runs["gc"], runs["dry"], strict=True)
    ]
    return [
        paired("gc wall time", "gc", "floor: scandir+stat + the same unlinks", "floor_unlink",
               1.0, note),
        *([paired("gc wall time vs CANN-style pass", "gc", "CANN pass: open+parse every json",
                  "cann", row_note="the CANN pass deletes nothing")] if "cann" in runs else []),
        paired("gc without removals (dry run)", "dry", "scandir+stat pass", "floor",
               row_note="a first gc of the folder: scan + reclaim check (every main json "
               "read) + plan"),
        paired("dry run, jsons judged before", "dry_warm", "scandir+stat pass", "floor",
               row_note="the record the first dry run left: no main json read again "
               "(docs/eviction.md#jsons-judged-before)"),
        paired("floor: scandir+stat + unlinks", "floor_unlink", "scandir+stat pass", "floor",
               row_note=f"{2 * evicted:,} unlinks, one thread, in eviction order"),
        paired("gc wall time vs a threaded floor", "gc",
               "scandir+stat + the unlinks on gc's 8 threads", "floor_threads",
               row_note="unlink latency overlaps on threads: the floor of gc's own removal "
               "design (not back to back: the folder is settled between)"),
        paired("floor over a folder descriptor", "floorfd", "scandir+stat pass", "floor",
               row_note="fstatat per file, as gc's scan does"),
        *([paired("CANN-style pass", "cann", "scandir+stat pass", "floor",
                  row_note="GE's aging: stat + parse each main json")] if "cann" in runs else []),
        Row(case, "removal phase", statistics.median(removal), "µs/file", "", None, None, "",
            None, f"(gc − dry run) / {2 * evicted:,} unlinked files, median of {rounds}",
            load=load_col),
        Row(case, "peak RSS of gc", m["rss"], "MiB", "", None, None, f"≤ {rss_target(entries)} MiB",
            m["rss"] <= rss_target(entries), "the gc child's own VmHWM, Python included",
            load=load_col),
    ]  # fmt: skip
