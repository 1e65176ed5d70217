"""The cost curve: the same measures at 10,000, 100,000 and (``--large``)
1,000,000 entries of one chip folder, so growth can be read off one run.

At each size, in a folder built for it (``cases_eviction.build``: a CANN-shaped json and a
2–5 KiB binary per entry, access times spread over two days):

* **gc to 80 %**: wall time beside its floor (one ``scandir`` + ``stat`` pass plus the same
  unlinks, back to back on an identical folder: ``cases_eviction.gc_rounds``, 3 paired
  rounds, 1 at 1,000,000), the dry run, and gc's peak RSS;
* **the daemon** (eviction off, so nothing is removed): start to ``READY=1``, start to the end
  of its first scan (reclaim pass, then the usage index), resident memory once the index is
  complete (target ≤ 100 MB at 1,000,000 entries) and its peak; then, after the hits, a
  limit 10 % under the folder and ``/reload``: the daemon evicts on its own, and its
  resident memory once it is idle again;
* **a hit through the daemon**: one client, sequential hits on a 256 KiB kernel compiled into
  the same chip folder, p50 / p99.

Growth rows compare each size with the smallest: per-entry cost for gc and the first scan
(linear = 1.0×), the hit's p50 as it is (flat = 1.0×). The 1,000,000-entry folder takes
minutes to build (about 2,000,000 files, ~10 GiB on disk), hence opt-in; ``REUSE_ENV`` keeps
it between runs.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from bench import cases_compile, cases_daemon, cases_eviction, harness
from bench.harness import Row, ratio_of
from cachemgr.client import Client

NAME = "scaling"
SIZES = (10_000, 100_000)
LARGE = 1_000_000
QUICK_SIZES = (2_000, 10_000)
HITS = 300
QUICK_HITS = 50
#: Paired rounds of gc and its floor at each size up to 100,000 entries (1 at 1,000,000).
GC_ROUNDS = 3
#: Growth per entry this far above the smallest size's still counts as linear (noise).
LINEAR = 1.25


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _daemon(work: Path, cache: Path, hits: int) -> dict[str, float]:
    """Start a daemon on ``cache``; time READY and the first scan; RSS; hit latency."""
    ini = cache / "kernel_cache" / "op_cache.ini"
    ini.write_text(
        "[op_compiler_cache]\nmax_op_cache_size=-1\nremain_cache_size_ratio=50\n"
        "adk_version=1\nops_version=1\n"
    )
    start = time.perf_counter()
    proc, sock = cases_daemon._start(work, cache)
    ready = time.perf_counter() - start
    try:
        client = Client(sock, timeout_s=600)
        while client.health().get("scan", {}).get("state") not in ("done", "failed"):
            time.sleep(0.05)
        indexed = time.perf_counter() - start
        state = client.health()["scan"]
        time.sleep(1.0)  # let the scan's memory go back (release_memory) before reading RSS
        rss = _status_kb(proc.pid, "VmRSS") / 1024
        request = cases_compile.big_request(work)
        if client.compile(request, base_dir="/").to_json()["status"] not in ("compiled", "hit"):
            raise RuntimeError("the hit kernel did not compile")
        times = []
        for _ in range(hits):
            t0 = time.perf_counter()
            answer = client.compile(request, base_dir="/").to_json()
            times.append(time.perf_counter() - t0)
            if answer["status"] != "hit":
                raise RuntimeError(f"expected a hit, got {answer}")
        peak = _status_kb(proc.pid, "VmHWM") / 1024
        evicted = _evict(proc.pid, client, ini)
    finally:
        cases_daemon._stop(proc)
    if state.get("state") != "done":
        raise RuntimeError(f"the daemon's first scan failed: {state}")
    return {
        "ready": ready,
        "indexed": indexed,
        "daemon_rss": rss,
        "daemon_peak": peak,
        "hit_p50": cases_compile._ms(times),
        "hit_p99": cases_compile._ms(times, 0.99),
        "files": float(state.get("files", 0)),
        **evicted,
    }


def _metric(client: Client, name: str) -> float:
    for line in str(client.request("GET", "/metrics")).splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _evict(pid: int, client: Client, ini: Path) -> dict[str, float]:
    """Make the daemon evict on its own (a limit 10 % below the folder, then ``/reload``),
    wait until it is idle again; its RSS then (an eviction the daemon runs
    must not grow its heap back)."""
    used = sum(
        float(line.split()[1])
        for line in str(client.request("GET", "/metrics")).splitlines()
        if line.startswith("cachemgr_chip_used_bytes{")
    )
    ini.write_text(
        f"[op_compiler_cache]\nmax_op_cache_size={int(used) >> 20}\n"
        "remain_cache_size_ratio=90\nadk_version=1\nops_version=1\n"
    )
    t0 = time.perf_counter()
    client.reload()
    while _metric(client, "cachemgr_evicted_entries_total") == 0:
        if time.perf_counter() - t0 > 3600:
            raise RuntimeError("the daemon did not evict within an hour")
        time.sleep(0.2)
    ticks = -1
    while (now := _cpu_ticks(pid)) != ticks:  # the index rescan after it, memory release
        ticks = now
        time.sleep(2.0)
    return {
        "evict_s": time.perf_counter() - t0,
        "evicted_n": _metric(client, "cachemgr_evicted_entries_total"),
        "evict_rss": _status_kb(pid, "VmRSS") / 1024,
        "evict_peak": _status_kb(pid, "VmHWM") / 1024,
    }


#: A folder where the folders of each size are built once and kept between runs (the
#: 1,000,000-entry one takes minutes to build): ``CACHEMGR_BENCH_REUSE=/path scripts/bench
#: --only scaling --large``; each run resets what the last one removed or touched.
REUSE_ENV = "CACHEMGR_BENCH_REUSE"


def _measure(workdir: Path, entries: int, hits: int) -> dict[str, float]:
    reuse = os.environ.get(REUSE_ENV)
    work = (Path(reuse) if reuse else workdir) / f"n{entries}"
    cache = work / "cache"
    chip = cache / "kernel_cache" / "Ascend910B1"
    t0 = time.monotonic()
    twin = work / "twin" / chip.name  # outside the cache: the daemon below never sees it
    cases_eviction.settle(chip, entries)
    cases_eviction.settle(twin, entries)
    out = {"build": time.monotonic() - t0, "load": os.getloadavg()[0]}
    rounds = GC_ROUNDS if entries <= cases_eviction.ENTRIES else 1
    runs = cases_eviction.gc_rounds(chip, twin, entries, rounds, cann=False)
    out.update(cases_eviction.medians(runs))
    ratios = [g / f for g, f in zip(runs["gc"], runs["floor_unlink"], strict=True)]
    out.update(gc_ratio=statistics.median(ratios), gc_ratio_min=min(ratios),
               gc_ratio_max=max(ratios), gc_rounds=rounds)  # fmt: skip
    out.update(_daemon(work, cache, hits))
    if not reuse:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _rows(entries: int, m: dict[str, float], base_n: int, base: dict[str, float]) -> list[Row]:
    case = f"{entries:,} entries"
    note = f"load average {m['load']:.1f} at start; folder built in {m['build']:.0f} s"
    rows = [
        Row(case, "gc to 80 %", m["gc"], "s", "floor: scandir+stat + the same unlinks",
            m["floor_unlink"], m["gc_ratio"], "≤ 1.0× floor", m["gc_ratio"] <= 1.0,
            f"median of {int(m['gc_rounds'])} paired runs' ratios (gc and floor back to back "
            f"on identical folders); {int(m['evicted']):,} evicted; vs the unlinks on gc's "
            f"8 threads "
            f"{m['gc'] / m['floor_threads']:.2f}×; dry run {m['dry']:.2f} s = "
            f"{m['dry'] / m['floor']:.2f}× the scandir+stat pass; {note}",
            ratio_min=m["gc_ratio_min"], ratio_max=m["gc_ratio_max"]),
        Row(case, "gc peak RSS", m["rss"], "MiB", "", None, None,
            f"≤ {cases_eviction.rss_target(entries)} MiB" if entries >= 100_000 else "",
            m["rss"] <= cases_eviction.rss_target(entries) if entries >= 100_000 else None,
            "the gc child's own VmHWM; docs/eviction.md#memory"),
        Row(case, "daemon start to READY=1", m["ready"] * 1e3, "ms", "", None, None, "", None,
            "the first scan runs after READY=1, beside serving"),
        Row(case, "daemon start to first scan done", m["indexed"], "s",
            "scandir+stat pass", m["floor"], ratio_of(m["indexed"], m["floor"]), "", None,
            f"reclaim pass + usage index of {int(m['files']):,} files"),
        Row(case, "daemon RSS, index complete", m["daemon_rss"], "MB", "", None, None,
            "≤ 100 MB" if entries >= LARGE else "",
            (m["daemon_rss"] <= 100) if entries >= LARGE else None,
            f"peak (VmHWM) {m['daemon_peak']:.0f} MB; the reclaim pass runs in a child "
            "process, the index is an SQLite table"),
        Row(case, "daemon RSS after an eviction it ran", m["evict_rss"], "MB", "", None, None,
            "≤ 100 MB" if entries >= LARGE else "",
            (m["evict_rss"] <= 100) if entries >= LARGE else None,
            f"limit set 10 % under the folder, then /reload: {int(m['evicted_n']):,} evicted, "
            f"idle again after {m['evict_s']:.1f} s; peak (VmHWM) {m['evict_peak']:.0f} MB"),
        Row(case, "hit via Client, p50", m["hit_p50"], "ms", f"p50 at {base_n:,} entries",
            base["hit_p50"], ratio_of(m["hit_p50"], base["hit_p50"]),
            f"≤ {LINEAR}× (flat)" if entries != base_n else "",
            m["hit_p50"] <= LINEAR * base["hit_p50"] if entries != base_n else None,
            f"one client, sequential; p99 {m['hit_p99']:.2f} ms"),
    ]  # fmt: skip
    if entries != base_n:
        for metric, key in (("gc time per entry", "gc"), ("first scan per entry", "indexed")):
            per, per_base = m[key] / entries * 1e6, base[key] / base_n * 1e6
            row = Row(case, metric, per, "µs", f"at {base_n:,} entries", per_base,
                      ratio_of(per, per_base), f"≤ {LINEAR}× (linear)", per <= LINEAR * per_base,
                      "growth in entries: 1.0× is linear")  # fmt: skip
            rows.append(row)
    return rows


def run(workdir: Path, quick: bool) -> list[Row]:
    sizes = QUICK_SIZES if quick else SIZES + ((LARGE,) if harness.LARGE else ())
    hits = QUICK_HITS if quick else HITS
    measured = [(n, _measure(workdir, n, hits)) for n in sizes]
    base_n, base = measured[0]
    rows = []
    for n, m in measured:
        rows += _rows(n, m, base_n, base)
    return rows


if __name__ == "__main__":  # pragma: no cover - manual runs
    print(json.dumps([r.__dict__ for r in run(Path(sys.argv[1]), True)], indent=1))
