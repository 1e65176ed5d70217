"""The daemon: hit latency through ``cachemgr.Client`` with 32 concurrent clients,
idle CPU, and RSS with 100,000 entries indexed — each beside its baseline in one run.

* **hit through Client**: 32 client processes, each a session that asks for the same 256 KiB
  kernel (a compile request that hits: key computed, json parsed, binary SHA-256-verified,
  atimes set) and then pauses ``THINK_S`` (a framework worker between kernel launches).
  Baseline: the same hit through an in-process ``CompileQueue``. Targets p50 ≤ 1 ms, p99 ≤ 5 ms.
* **throughput at saturation**: hits per second in closed loop (no pauses)
  over the same ``WINDOW_S``: 32 ``Client`` processes vs the ceiling, the in-process queue
  hit rate the machine's cores reach (one process per core, each its own ``CompileQueue`` on
  the same cache, the request parsed once). Rounds alternate which goes first; the median of
  the rounds' ratios is compared with the target ≥ 0.9×. The daemon's CPU during the client
  runs is in the note (``Client`` serves hits in its own process and reports them to the
  daemon's ``/hits`` at most once a second).
* **idle CPU**: CPU seconds the daemon uses over ``IDLE_S`` with nothing to do (target: none
  measurable, i.e. ≤ 1 clock tick), beside ``sleep`` for the same time.
* **RSS with 100,000 entries indexed**: the daemon's resident memory after start-up on a chip
  folder of 100,000 entries (~200,000 files; eviction off so nothing is removed) once its
  first scan is done and it has answered ``stats``, beside the same daemon on an empty cache.
  Target ≤ 80 MB.
* **peak RSS with a 900 MiB object**: the daemon's peak (``VmHWM``) above its idle peak while
  it compiles a kernel whose object is 900 MiB, publishes it and serves it as a hit (the
  hit's SHA-256 done by the daemon). Target ≤ 200 MB above idle.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import cases_compile, cases_eviction
from bench.harness import Row, load_average, load_note, measured_env, ratio_of, ratio_row
from cachemgr.client import Client
from cachemgr.compile.queue import CompileQueue
from cachemgr.compile.request import parse_request

NAME = "daemon"
CLIENTS = 32
THINK_S = 0.05
IDLE_S = 10.0
#: Closed-loop measuring window (seconds) and rounds of the throughput comparison.
WINDOW_S = 5.0
ROUNDS = 3


def _start(work: Path, cache: Path, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
    """A daemon serving ``cache`` with its runtime folder in ``work``; returns once it is
    READY (sd_notify). Its environment is :func:`measured_env`'s: its memory is measured, and
    modules compiled from source on every start would add to its peak."""
    env = {k: v for k, v in measured_env().items() if not k.startswith(("ASCEND_", "CACHEMGR_"))}
    env.update(HOME=str(work), XDG_RUNTIME_DIR=str(work / "run"), XDG_STATE_HOME=str(work / "st"))
    (work / "run").mkdir(mode=0o700, exist_ok=True)
    notify_path = work / f"notify-{time.monotonic_ns()}"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    env["NOTIFY_SOCKET"] = str(notify_path)
    as_root = ["--allow-root"] if os.geteuid() == 0 else []  # serve refuses root otherwise
    proc = subprocess.Popen(
        [sys.executable, "-m", "cachemgr", "serve", *as_root, "--cache-dir", str(cache), *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    notify.settimeout(600)
    while b"READY=1" not in notify.recv(4096):
        pass
    notify.close()
    return proc, work / "run" / "cachemgr" / "cachemgr.sock"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)


def _session(
    sock: str,
    request: dict[str, object],
    n: int,
    think_s: float,
    seed: int,
    out: multiprocessing.Queue,
) -> None:
    client = Client(sock, timeout_s=60)
    rng = random.Random(seed)
    times = []
    client.compile(request, base_dir="/")  # a long-lived framework client: warm, not timed
    time.sleep(rng.uniform(0, think_s))  # sessions do not start in lockstep
    for _ in range(n):
        start = time.perf_counter()
        answer = client.compile(request, base_dir="/").to_json()
        times.append(time.perf_counter() - start)
        if answer["status"] != "hit":
            raise RuntimeError(f"expected a hit, got {answer}")
        if think_s:
            time.sleep(rng.expovariate(1 / think_s))
    out.put(times)


def _clients(
    sock: Path, request: dict[str, object], n: int, think_s: float
) -> tuple[list[list[float]], float]:
    """Each session's latencies (seconds), and the wall time of them all."""
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()
    procs = [
        ctx.Process(target=_session, args=(str(sock), request, n, think_s, i, out))
        for i in range(CLIENTS)
    ]
    start = time.perf_counter()
    for p in procs:
        p.start()
    times = [out.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - start
    for p in procs:
        p.join(60)
    return times, wall


def _closed_client(
    sock: str, request: dict[str, object], start_at: float, window_s: float, out: Any
) -> None:
    """Closed loop through ``Client`` from ``start_at`` (``time.time()``) for ``window_s``."""
    client = Client(sock, timeout_s=60)
    client.compile(request, base_dir="/")  # warm, not counted
    _closed_loop(lambda: client.compile(request, base_dir="/"), start_at, window_s, out)
    client.close()


def _closed_queue(
    work: Path, request: dict[str, object], start_at: float, window_s: float, out: Any
) -> None:
    """Closed loop of in-process queue hits (the ceiling), like :func:`_closed_client`."""
    with CompileQueue(cases_compile._settings(work), workers=1) as queue:
        req = parse_request(request, work)
        queue.compile(req)  # warm, not counted
        _closed_loop(lambda: queue.compile(req), start_at, window_s, out)


def _closed_loop(call: Any, start_at: float, window_s: float, out: Any) -> None:
    time.sleep(max(0.0, start_at - time.time()))
    end = time.perf_counter() + window_s
    times = []
    while time.perf_counter() < end:
        start = time.perf_counter()
        answer = call()
        times.append(time.perf_counter() - start)
        status = answer["status"] if isinstance(answer, dict) else answer.status
        if status != "hit":
            raise RuntimeError(f"expected a hit, got {answer}")
    out.put(times)


def _rate(target: Any, args: tuple[Any, ...], procs: int, window_s: float) -> list[float]:
    """Run ``procs`` processes of ``target(*args, start_at, window_s, out)``; every latency."""
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()
    start_at = time.time() + 2.0  # every process set up before the window opens
    ps = [ctx.Process(target=target, args=(*args, start_at, window_s, out)) for _ in range(procs)]
    for p in ps:
        p.start()
    times = [t for _ in ps for t in out.get(timeout=600)]
    for p in ps:
        p.join(60)
    return times


def _throughput_rows(
    work: Path, request: dict[str, object], sock: Path, pid: int, quick: bool
) -> list[Row]:
    cores = os.cpu_count() or 1
    window = 2.0 if quick else WINDOW_S
    since = load_average()
    ratios, ceilings, rates, daemon_cpu = [], [], [], 0
    same_procs: list[tuple[float, float]] = []  # (in-process at CLIENTS processes, ratio)
    c50 = c99 = 0.0
    for r in range(1 if quick else ROUNDS):
        runs = ["queue", "queue32", "client"] if r % 2 == 0 else ["client", "queue32", "queue"]
        got: dict[str, float] = {}
        for which in runs:
            if which == "queue":
                times = _rate(_closed_queue, (work, request), cores, window)
            elif which == "queue32":
                times = _rate(_closed_queue, (work, request), CLIENTS, window)
            else:
                before = _cpu_ticks(pid)
                times = _rate(_closed_client, (str(sock), request), CLIENTS, window)
                daemon_cpu += _cpu_ticks(pid) - before
                c50, c99 = cases_compile._ms(times), cases_compile._ms(times, 0.99)
            got[which] = len(times) / window
        ceilings.append(got["queue"])
        rates.append(got["client"])
        ratios.append(got["client"] / got["queue"])
        same_procs.append((got["queue32"], got["client"] / got["queue32"]))
    at_clients = statistics.median(q for q, _ in same_procs)  # in-process, CLIENTS processes
    tick = os.sysconf("SC_CLK_TCK")
    each = ", ".join(f"{q:,.0f} vs {c:,.0f}" for q, c in zip(ceilings, rates, strict=True))
    note = (
        f"{CLIENTS} client processes vs {cores} in-process queues, {window:.0f} s windows, "
        f"rounds alternate who goes first (ceiling vs Client: {each}); last round's "
        f"Client latency p50 {c50:.2f} ms, p99 {c99:.2f} ms; daemon CPU "
        f"{daemon_cpu / tick:.2f} s over {len(ratios) * window:.0f} s of client runs"
    )
    load = load_note(since)
    case = "hit via Client, 32 clients, no pauses"
    return [
        ratio_row(case, "throughput", rates, f"in-process queue hits, {cores} processes",
                  ceilings, unit="hits/s", scale=1.0, target=0.9, at_least=True, note=note,
                  load=load),
        ratio_row(case, "throughput vs the same number of in-process queues", rates,
                  f"in-process queue hits, {CLIENTS} processes", [q for q, _ in same_procs],
                  unit="hits/s", scale=1.0, load=load,
                  note=f"what 32 processes on {cores} cores cost by themselves: the in-process "
                  f"rate at {CLIENTS} processes is "
                  f"{at_clients / statistics.median(ceilings):.2f}× its rate at {cores}"),
    ]  # fmt: skip


def _hit_rows(work: Path, quick: bool) -> list[Row]:
    request = cases_compile.big_request(work)
    settings = cases_compile._settings(work)
    with CompileQueue(settings, workers=1) as queue:
        req = parse_request(request, work)
        queue.compile(req)
        base = []
        for _ in range(100 if quick else 1000):
            start = time.perf_counter()
            queue.compile(parse_request(request, work))
            base.append(time.perf_counter() - start)
    proc, sock = _start(work, work / "cache")
    try:
        Client(sock).compile(request, base_dir="/")
        n = 20 if quick else 150
        since = load_average()
        sessions, _ = _clients(sock, request, n, THINK_S)
        load = load_note(since)
        throughput = _throughput_rows(work, request, sock, proc.pid, quick)
    finally:
        _stop(proc)
    note = (
        f"{CLIENTS} client processes × {n} hits, pause {THINK_S * 1e3:.0f} ms (exp.); "
        f"ratio min–max over the {CLIENTS} sessions' own"
    )
    return [
        _session_row("p50 latency", sessions, base, 0.5, 1.0, note, load),
        _session_row("p99 latency", sessions, base, 0.99, 5.0, note, load),
        *throughput,
    ]


def _session_row(
    metric: str,
    sessions: list[list[float]],
    base: list[float],
    q: float,
    target_ms: float,
    note: str,
    load: str,
) -> Row:
    """The ``q`` quantile of every session's hits together vs the in-process one; the ratio's
    min–max is each session's own quantile vs it (the sessions ran side by side)."""
    ms = cases_compile._ms
    every = [t for times in sessions for t in times]
    value, floor = ms(every, q), ms(base, q)
    each = [ms(times, q) / floor for times in sessions]
    return Row(
        "hit via Client, 32 clients",
        metric,
        value,
        "ms",
        "in-process queue hit",
        floor,
        ratio_of(value, floor),
        f"≤ {target_ms:g} ms",
        value <= target_ms,
        f"{note} {metric.split()[0]}",
        min(each),
        max(each),
        load,
    )


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime, clock ticks


def _idle_rows(work: Path, quick: bool) -> list[Row]:
    proc, _ = _start(work, work / "idle-cache")
    since = load_average()
    try:
        time.sleep(2.0)  # let start-up work (first reap) finish
        seconds = 3.0 if quick else IDLE_S
        before = _cpu_ticks(proc.pid)
        time.sleep(seconds)
        used = _cpu_ticks(proc.pid) - before
    finally:
        _stop(proc)
    sleeper = subprocess.Popen(["sleep", str(seconds)])
    sleeper.wait()
    tick = os.sysconf("SC_CLK_TCK")
    return [
        Row(
            "idle daemon",
            f"CPU over {seconds:.0f} s",
            used / tick,
            "s",
            "sleep(1)",
            0.0,
            None,
            "≤ 1 tick",
            used <= 1,
            f"{used} ticks of 1/{tick} s",
            load=load_note(since),
        )
    ]


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _hwm_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _rss_rows(work: Path, quick: bool) -> list[Row]:
    entries = cases_eviction.QUICK_ENTRIES if quick else cases_eviction.ENTRIES
    since = load_average()
    empty, _ = _start(work, work / "empty-cache")
    try:
        empty_mb = _rss_kb(empty.pid) / 1024
    finally:
        _stop(empty)
    cache = work / "big-cache"
    chip = cache / "kernel_cache" / "Ascend910B1"
    chip.mkdir(parents=True)
    cases_eviction.build(chip, entries)
    files = sum(1 for _ in os.scandir(chip))
    ini = cache / "kernel_cache" / "op_cache.ini"
    ini.write_text(
        "[op_compiler_cache]\nmax_op_cache_size=-1\nremain_cache_size_ratio=50\n"
        "adk_version=1\nops_version=1\n"
    )
    proc, sock = _start(work, cache)
    try:
        client = Client(sock, timeout_s=600)
        while client.health().get("scan", {}).get("state") not in ("done", "failed"):
            time.sleep(0.05)  # the first scan (reclaim pass, then the index) runs after READY
        scan = client.health()["scan"]
        stats = client.stats().to_json()
        indexed = stats["chip_folders"]["Ascend910B1"]["entries"]
        time.sleep(1.0)
        rss_mb = _rss_kb(proc.pid) / 1024
        peak_mb = _hwm_kb(proc.pid) / 1024
    finally:
        _stop(proc)
    note = (
        f"after the first scan ({scan['state']}: {scan['files']} of {files} files indexed) and "
        f"`stats` ({indexed} entries); peak (VmHWM) {peak_mb:.1f} MB; empty-cache daemon "
        f"{empty_mb:.1f} MB"
    )
    return [
        Row(
            f"daemon RSS, {entries} entries",
            "resident memory",
            rss_mb,
            "MB",
            "same daemon, empty cache",
            empty_mb,
            ratio_of(rss_mb, empty_mb),
            "≤ 80 MB",
            rss_mb <= 80,
            f"{note}; one run of each, not repeated",
            load=load_note(since),
        )
    ]


#: The initialised data of the big kernel (bytes): a 900 MiB object (300 MiB in --quick).
BIG_OBJECT_BYTES = 900 << 20
#: What compiling and serving it may add to the idle daemon's peak (MB).
BIG_ALLOWED_MB = 200


def _big_source(folder: Path, fill_bytes: int) -> Path:
    """A C kernel whose object holds ``fill_bytes`` of initialised data (``.fill`` in a
    ``.data`` section: the assembler writes it without holding it in memory)."""
    src = folder / "big.c"
    src.write_text(
        '__asm__(".section .data.blob,\\"aw\\"\\n.globl big_blob\\nbig_blob:\\n'
        f'.fill {fill_bytes},1,1\\n.text\\n");\n'
        "void big_kernel(const float *a, float *out) { out[0] = a[0]; }\n"
    )
    return src


def _big_object_rows(work: Path, quick: bool) -> list[Row]:
    """The daemon's peak resident memory (``VmHWM``: its workers are threads of it) while it
    compiles, publishes and then serves a kernel whose object is 900 MiB, beside its own
    peak when idle (docs/daemon.md, "Bounded memory"). Target: ≤ 200 MB above idle."""
    fill = BIG_OBJECT_BYTES // 3 if quick else BIG_OBJECT_BYTES
    src = _big_source(work, fill)
    tensor = {"shape": [16], "dtype": "float32", "format": "ND"}
    request = {
        "op_type": "Big", "soc_version": "Ascend910B1", "language": "c",
        "kernel_source": str(src), "kernel_entry": "big_kernel",
        "inputs": [tensor], "outputs": [tensor],
    }  # fmt: skip
    since = load_average()
    proc, sock = _start(work, work / "cache")
    try:
        client = Client(sock, timeout_s=600, local_hits=False)  # the daemon hashes the hit
        while client.health().get("scan", {}).get("state") not in ("done", "failed"):
            time.sleep(0.05)
        idle_mb = _hwm_kb(proc.pid) / 1024
        start = time.perf_counter()
        out = client.compile(request, base_dir=str(work))
        seconds = time.perf_counter() - start
        hit = client.compile(request, base_dir=str(work))
        peak_mb = _hwm_kb(proc.pid) / 1024
        size = max((f.stat().st_size for f in out.files), default=0)
    finally:
        _stop(proc)
    for path in (work / "cache").rglob("*.o"):
        path.unlink()  # the disk back at once
    above = peak_mb - idle_mb
    note = (
        f"{out.status} ({size / 1e6:.0f} MB object, {seconds:.1f} s: compile, hash, copy into "
        f"the chip folder), then {hit.status}; the compiler's own memory is its process's"
    )
    return [
        Row(
            f"daemon peak RSS, {fill >> 20} MiB object",
            "peak resident memory (VmHWM) above idle",
            above,
            "MB",
            "same daemon, idle (VmHWM)",
            idle_mb,
            None,
            f"≤ {BIG_ALLOWED_MB} MB above idle",
            above <= BIG_ALLOWED_MB and out.status == "compiled" and hit.status == "hit",
            note,
            load=load_note(since),
        )
    ]


def run(workdir: Path, quick: bool) -> list[Row]:
    rows = []
    parts = [("hit", _hit_rows), ("idle", _idle_rows), ("rss", _rss_rows)]
    for name, part in [*parts, ("big", _big_object_rows)]:
        sub = workdir / name
        sub.mkdir()
        rows += part(sub, quick)
    return rows


if __name__ == "__main__":  # pragma: no cover - manual runs
    print(json.dumps([r.__dict__ for r in run(Path(sys.argv[1]), True)], indent=1))
