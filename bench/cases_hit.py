"""A hit served in the caller's process by ``cachemgr.Client``, beside the read+SHA-256 floor
of the same entry, in one run.

* **latency**: ``Client.compile`` of a request whose kernel is in the cache (the key computed
  from the source, its header and the place searched in vain before it, the entry's json
  read and checked, every binary SHA-256-verified, atimes set) vs the floor: opening,
  reading and hashing every file of that entry (json and binary) in plain Python, nothing
  else. For a 1 KiB and a 257 KiB binary. Blocks of the two alternate; the medians of the
  blocks' medians are compared. Target ≤ 3× the floor.
* **closed loop, 8 processes**: hits per second of 8 processes each asking in a closed loop
  (no pauses) over ``WINDOW_S``, vs 8 processes each running the floor in a closed loop.
  Rounds alternate which goes first; the median of the rounds' ratios. Target ≥ 0.3× the
  floor's rate.

The load average is in every row's note: on a busy 2-core host both sides slow alike.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench import cases_compile, cases_daemon
from bench.harness import Row, ratio_of
from cachemgr.client import Client
from cachemgr.compile.inputs import RACY_S

NAME = "hit"
#: Processes of the closed-loop comparison.
PROCS = 8
#: Closed-loop measuring window (seconds) and rounds.
WINDOW_S = 3.0
ROUNDS = 3
#: Latency: blocks of each side, hits per block.
BLOCKS = 7
PER_BLOCK = 400
#: The target ratios.
LATENCY_TARGET = 3.0
THROUGHPUT_TARGET = 0.3

_SMALL_KERNEL = """\
#include "small.h"
void add_kernel(const float *a, const float *b, float *c) { c[0] = SMALL_ADD(a[0], b[0]); }
"""


def small_request(work: Path) -> dict[str, Any]:
    """A request for a kernel of a 1 KiB binary that reads one header from an include folder
    (so the source's own folder is a place searched in vain: its manifest names both)."""
    inc = work / "inc"
    inc.mkdir(exist_ok=True)
    (inc / "small.h").write_text("#define SMALL_ADD(x, y) ((x) + (y))\n")
    src = work / "small.c"
    src.write_text(_SMALL_KERNEL)
    old = time.time() - 60  # not "racy": its digest may be remembered
    for path in (src, inc / "small.h"):
        os.utime(path, (old, old))
    tensor = {"shape": [16], "dtype": "float32", "format": "ND"}
    return {
        "op_type": "Add", "soc_version": "Ascend910B1", "language": "c",
        "kernel_source": str(src), "kernel_entry": "add_kernel", "include_dirs": [str(inc)],
        "inputs": [tensor, tensor], "outputs": [tensor],
    }  # fmt: skip


def _floor(files: list[str]) -> None:
    """Open, read and hash every file of the entry (the least a verified hit can do)."""
    for name in files:
        with open(name, "rb") as f:
            hashlib.sha256(f.read()).hexdigest()


def _block(call: Any, n: int) -> float:
    """The median of ``n`` calls' latencies (seconds)."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _latency_row(client: Client, request: dict[str, Any], what: str, quick: bool) -> Row:
    first = client.compile(request, base_dir="/")
    if first.status != "hit":
        raise RuntimeError(f"{what}: expected a hit, got {first.status} ({first.error})")
    files = [str(f) for f in first.files]
    size = max(os.stat(f).st_size for f in files if not f.endswith(".json"))

    def hit() -> None:
        if client.compile(request, base_dir="/").status != "hit":
            raise RuntimeError(f"{what}: a hit turned into a miss")

    blocks, n = (3, 100) if quick else (BLOCKS, PER_BLOCK)
    hits, floors = [], []
    for i in range(blocks):
        for side in ("hit", "floor") if i % 2 == 0 else ("floor", "hit"):
            if side == "hit":
                hits.append(_block(hit, n))
            else:
                floors.append(_block(lambda: _floor(files), n))
    value, base = statistics.median(hits) * 1e6, statistics.median(floors) * 1e6
    ratio = ratio_of(value, base)
    note = (
        f"{size / 1024:.0f} KiB binary + {os.stat(files[0]).st_size} B json; {blocks}×{n} "
        f"of each, alternating; blocks' medians hit {min(hits) * 1e6:.0f}–"
        f"{max(hits) * 1e6:.0f} µs, floor {min(floors) * 1e6:.0f}–{max(floors) * 1e6:.0f} µs; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    return Row(
        f"Client hit, {what}",
        "p50 latency",
        value,
        "µs",
        "read+sha256 of the entry's files",
        base,
        ratio,
        f"≤ {LATENCY_TARGET:g}× floor",
        ratio is not None and ratio <= LATENCY_TARGET,
        note,
    )


def _closed_client(
    sock: str, request: dict[str, Any], start_at: float, window: float, out: Any
) -> None:
    client = Client(sock, timeout_s=60)
    client.compile(request, base_dir="/")  # warm, not counted
    _closed(lambda: client.compile(request, base_dir="/"), start_at, window, out)
    client.close()


def _closed_floor(files: list[str], start_at: float, window: float, out: Any) -> None:
    _closed(lambda: _floor(files), start_at, window, out)


def _closed(call: Any, start_at: float, window: float, out: Any) -> None:
    time.sleep(max(0.0, start_at - time.time()))
    end, n = time.perf_counter() + window, 0
    while time.perf_counter() < end:
        call()
        n += 1
    out.put(n)


def _rate(target: Any, args: tuple[Any, ...], window: float) -> float:
    """Calls per second of :data:`PROCS` processes running ``target`` in a closed loop."""
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[int] = ctx.Queue()
    start_at = time.time() + 1.5  # every process set up before the window opens
    procs = [ctx.Process(target=target, args=(*args, start_at, window, out)) for _ in range(PROCS)]
    for p in procs:
        p.start()
    total = sum(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(60)
    return total / window


def _throughput_row(
    sock: Path, client: Client, request: dict[str, Any], what: str, quick: bool
) -> Row:
    files = [str(f) for f in client.compile(request, base_dir="/").files]
    window = 1.0 if quick else WINDOW_S
    ratios, pairs = [], []
    for r in range(1 if quick else ROUNDS):
        got = {}
        for side in ("client", "floor") if r % 2 == 0 else ("floor", "client"):
            if side == "client":
                got[side] = _rate(_closed_client, (str(sock), request), window)
            else:
                got[side] = _rate(_closed_floor, (files,), window)
        ratios.append(got["client"] / got["floor"])
        pairs.append((got["client"], got["floor"]))
    ratio = statistics.median(ratios)
    each = ", ".join(f"{c:,.0f} vs {f:,.0f}" for c, f in pairs)
    note = (
        f"{PROCS} processes, {window:.0f} s windows, median of {len(ratios)} rounds' ratios "
        f"(Client vs floor: {each}); load average {os.getloadavg()[0]:.1f}"
    )
    return Row(
        f"Client hit, {what}, {PROCS} processes, no pauses",
        "throughput",
        statistics.median(c for c, _ in pairs),
        "hits/s",
        f"read+sha256 of the entry's files, {PROCS} processes",
        statistics.median(f for _, f in pairs),
        ratio,
        f"≥ {THROUGHPUT_TARGET:g}× floor",
        ratio >= THROUGHPUT_TARGET,
        note,
    )


def _settle(requests: dict[str, dict[str, Any]]) -> None:
    """Wait until every input of ``requests`` (source, headers of its include folders)
    changed more than :data:`cachemgr.compile.inputs.RACY_S` ago. The requests age their
    files' mtimes a minute for that, but setting a time is a change too (ctime): a file
    changed in the last ``RACY_S`` seconds is read and hashed again on every use (its mtime
    may not have ticked since a change), so without this wait the 1 KiB latency blocks ran
    in that window while the compile of the other request was fast, and measured that."""
    paths = [Path(r["kernel_source"]) for r in requests.values()]
    for r in requests.values():
        paths += [p for d in r.get("include_dirs", ()) for p in Path(d).iterdir()]
    newest = max(max(p.stat().st_mtime, p.stat().st_ctime) for p in paths)
    time.sleep(max(0.0, newest + RACY_S + 0.1 - time.time()))


def run(workdir: Path, quick: bool) -> list[Row]:
    requests = {
        "1 KiB binary": small_request(workdir),
        "257 KiB binary": cases_compile.big_request(workdir),
    }
    proc, sock = cases_daemon._start(workdir, workdir / "cache")
    rows = []
    try:
        client = Client(sock, timeout_s=60)
        for what, request in requests.items():
            first = client.compile(request, base_dir="/")
            if first.status != "compiled":
                raise RuntimeError(f"{what} did not compile: {first.error}")
        _settle(requests)
        for what, request in requests.items():
            rows.append(_latency_row(client, request, what, quick))
        for what, request in requests.items():
            rows.append(_throughput_row(sock, client, request, what, quick))
        client.close()
    finally:
        cases_daemon._stop(proc)
    return rows
