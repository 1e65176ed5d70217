"""The compile queue, side by side with the floors it is measured against.

* **hit**: ``CompileQueue.compile`` of an already-parsed request whose 256 KiB kernel is in the
  cache — key computed, json parsed, binary read and SHA-256-verified, atimes set. Target: p50
  ≤ 1 ms. Floor: reading the binary and hashing it, nothing else.
* **miss overhead**: a miss through the queue (key, locks, compile in a private folder, kernel
  json, verified publish by rename, no fsync) vs the very same compiler argv run directly with
  ``subprocess.run``, interleaved, who goes first alternating; the median of the pairs'
  ratios. And, within the same queue runs, the whole miss vs the wall time of its compiler
  process (immune to drift between runs). Target: ≤ 1.05×.
* **pool**: N distinct C kernels through the pool (``workers`` = cores) vs ``xargs -P <cores>
  -L 1`` running the same compiler argv. Target: throughput ≥ 0.9× xargs.
* **reserve worker**: one caller's N kernels through the pool with one reserve worker (the
  daemon's default, docs/daemon.md#fair-workers) vs none. Target: throughput ≥ 0.97×.
* **sandbox**: the same compiler argv alone, under the daemon's limits only (``prlimit``: a
  compile for the daemon's own user) and in the allow-list view (``bwrap`` + ``prlimit``:
  another user's compile), interleaved; the median of the pairs' ratios. Informational.
* **ccache**: the same C kernels through ``ccache gcc`` (the Debian package; ``scripts/bench``
  installs it when missing) and the in-process queue: misses, hits. Informational.
* **CLI**: ``cachemgr compile REQUEST.json``, one process per request as a build runs it, for
  the non-editable ``pip install .`` users get and the checkout's editable ``.venv`` (byte code
  warm, ``PYTHONDONTWRITEBYTECODE`` unset), each beside ``ccache gcc`` of the same command and
  the plain ``gcc``, interleaved in the same rounds: misses, then warm hits of
  ``examples/requests/add_c.json``. Informational (the start-up case holds the CLI targets).

Every ratio is the median of paired repetitions' ratios, with their min–max, and the load
average while measured.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness import (
    ROOT,
    Command,
    Install,
    Row,
    editable_cachemgr,
    installed_cachemgr,
    load_average,
    load_note,
    measured_env,
    ratio_row,
    ratio_text,
    timed_runs,
)
from cachemgr.compile.build import CompileOutcome
from cachemgr.compile.queue import CompileQueue
from cachemgr.compile.request import CompileRequest, load_request, parse_request
from cachemgr.compilers import CompileJob, get_backend, process
from cachemgr.config import options
from cachemgr.storage import entry

NAME = "compile"
REQUESTS = ROOT / "examples" / "requests"
C_KERNELS = ("add", "mul", "softmax", "layernorm", "gemm", "reduce_sum")
BIG_KERNEL = """\
/* 256 KiB of weights in .rodata: the size of kernel a hit must serve in <= 1 ms. */
#define WORDS (256 * 1024 / 4)
__attribute__((used)) const float big_weights[WORDS] = {[0 ... WORDS - 1] = 1.5f};
void big_kernel(const float *x, float *y)
{
    for (long i = 0; i < WORDS; ++i)
        y[i] = x[i] * big_weights[i];
}
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_", "CACHEMGR_"))}


def _settings(work: Path) -> options.Settings:
    env = {**_env(), "HOME": str(work)}
    return options.resolve(cli={"op_compiler_cache_dir": str(work / "cache")}, env=env, cwd=work)


def _variant(example: str, work: Path, i: int, own_source: bool = False) -> CompileRequest:
    """The example request with one extra define, so every ``i`` is a distinct kernel; with
    ``own_source`` also a copy of its source with one more line of code (ccache hashes the
    preprocessed source, not an unused define: only a new source is a miss for it too)."""
    req = load_request(REQUESTS / f"{example}.json")
    source = req.kernel_source
    if own_source:
        source = _mkdir(work / "sources") / f"{i}-{req.kernel_source.name}"
        source.write_text(
            req.kernel_source.read_text() + f"\nconst int cachemgr_bench_variant_{i} = {i};\n"
        )
    data: dict[str, Any] = {
        "op_type": req.op_type,
        "soc_version": req.soc_version,
        "language": req.language,
        "kernel_source": str(source),
        "kernel_entry": req.kernel_entry,
        "inputs": [t.to_json() for t in req.inputs],
        "outputs": [t.to_json() for t in req.outputs],
        "attrs": dict(req.attrs),
        "defines": {**req.defines, "CACHEMGR_BENCH_VARIANT": i},
    }
    return parse_request(data, work)


def _argv(req: CompileRequest, out: Path) -> list[str]:
    """The compiler argv the queue runs for ``req`` (its backend's command), output in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    job = CompileJob(req.kernel_source, req.language, req.kernel_entry, req.defines, out, "k")
    return get_backend(req.language).command(job)


def _ms(seconds: list[float], q: float = 0.5) -> float:
    ordered = sorted(seconds)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


# --- hit ---------------------------------------------------------------------------------------


def big_request(work: Path) -> dict[str, Any]:
    """A request for the 256 KiB kernel (source written to ``work``, aged a minute so its
    digest may be remembered: not "racy")."""
    src = work / "big.c"
    src.write_text(BIG_KERNEL)
    old = time.time() - 60
    os.utime(src, (old, old))
    return {
        "op_type": "Mul",
        "soc_version": "Ascend910B1",
        "language": "c",
        "kernel_source": str(src),
        "kernel_entry": "big_kernel",
        "inputs": [{"shape": [65536], "dtype": "float32", "format": "ND"}],
        "outputs": [{"shape": [65536], "dtype": "float32", "format": "ND"}],
    }


def _compile_then_hits(
    work: Path, data: dict[str, Any], what: str, quick: bool
) -> tuple[CompileOutcome, list[float]]:
    """Compile ``data`` once in an in-process queue (it must compile), then ask for it again
    200 (quick) or 3000 times: the first outcome and each hit's latency in seconds.

    :raises RuntimeError: the first request did not compile, or a later one was no hit.
    """
    req = parse_request(data, work)
    with CompileQueue(_settings(work), workers=1) as queue:
        first = queue.compile(req)
        if first.status != "compiled":
            raise RuntimeError(f"{what} did not compile: {first.error}")
        hits = []
        for _ in range(200 if quick else 3000):
            start = time.perf_counter()
            outcome = queue.compile(req)
            hits.append(time.perf_counter() - start)
            if outcome.status != "hit":
                raise RuntimeError(f"expected a hit, got {outcome.status}")
    return first, hits


#: Rounds of the in-process hit vs its floor: each round times a block of hits and a block of
#: floor reads (who goes first alternates); the rounds' p50s are the paired repetitions.
HIT_ROUNDS = 10


def _hit_rows(work: Path, quick: bool) -> list[Row]:
    work.mkdir(parents=True)
    since = load_average()
    data = big_request(work)
    req = parse_request(data, work)
    per_round = (200 if quick else 3000) // HIT_ROUNDS
    hits: list[list[float]] = []
    floor: list[list[float]] = []
    with CompileQueue(_settings(work), workers=1) as queue:
        first = queue.compile(req)
        if first.status != "compiled":
            raise RuntimeError(f"big kernel did not compile: {first.error}")
        binary = next(f for f in first.files if f.suffix == ".o")

        def hit_block() -> list[float]:
            return _timed_block(lambda: _expect_hit(queue.compile(req)), per_round)

        def floor_block() -> list[float]:
            return _timed_block(lambda: entry.sha256_hex(binary.read_bytes()), per_round)

        for r in range(HIT_ROUNDS):
            if r % 2:
                floor.append(floor_block())
                hits.append(hit_block())
            else:
                hits.append(hit_block())
                floor.append(floor_block())
    every = [t for block in hits for t in block]
    size_kib = binary.stat().st_size / 1024
    note = f"{size_kib:.0f} KiB binary; {len(every)} hits"
    p50 = ratio_row(
        "hit (queue, in-process)",
        "p50 latency incl. SHA-256",
        [_ms(b) / 1e3 for b in hits],
        "read+sha256 only",
        [_ms(b) / 1e3 for b in floor],
        load=load_note(since),
        note=f"p50 per round of {per_round} hits and {per_round} floor reads; {note}",
    )
    p50.target, p50.met = "≤ 1 ms", p50.value <= 1.0
    return [
        p50,
        Row("hit (queue, in-process)", "p99 latency", _ms(every, 0.99), "ms", "", None, None, "",
            None, note, load=p50.load),
    ]  # fmt: skip


def _timed_block(call: Callable[[], object], n: int) -> list[float]:
    """Latency (seconds) of each of ``n`` calls."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def _expect_hit(outcome: CompileOutcome) -> None:
    if outcome.status != "hit":
        raise RuntimeError(f"expected a hit, got {outcome.status}")


MANIFEST_HEADERS = 20


def manifest_request(work: Path, headers: int = MANIFEST_HEADERS) -> dict[str, Any]:
    """A kernel that includes ``headers`` local headers (sources aged a minute: not racy),
    so a hit hashes the source and every header its manifest names."""
    inc = work / "inc"
    inc.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(headers):
        (inc / f"h{i}.h").write_text(f"#define H{i} {i}\n" + "/* padding */\n" * 40)
        lines.append(f'#include "h{i}.h"')
    body = " + ".join(f"H{i}" for i in range(headers))
    src = work / "manifest.c"
    src.write_text("\n".join(lines) + f"\nvoid k(float *x) {{ x[0] += {body}; }}\n")
    old = time.time() - 60
    for path in [src, *inc.iterdir()]:
        os.utime(path, (old, old))
    return {
        "op_type": "Add",
        "soc_version": "Ascend910B1",
        "language": "c",
        "kernel_source": str(src),
        "kernel_entry": "k",
        "include_dirs": [str(inc)],
        "inputs": [{"shape": [1], "dtype": "float32", "format": "ND"}],
        "outputs": [{"shape": [1], "dtype": "float32", "format": "ND"}],
    }


def _manifest_hit_rows(work: Path, quick: bool) -> list[Row]:
    """Hit latency with a 20-header manifest: no preprocessor run, 21 digests (remembered per
    file identity) and the verified lookup."""
    work.mkdir(parents=True)
    _, hits = _compile_then_hits(work, manifest_request(work), "manifest kernel", quick)
    p50, p99 = _ms(hits), _ms(hits, 0.99)
    note = f"{MANIFEST_HEADERS} headers in the manifest; {len(hits)} hits"
    return [
        Row("hit (queue, in-process)", f"p50 latency, {MANIFEST_HEADERS}-header manifest", p50,
            "ms", "", None, None, "≤ 1 ms", p50 <= 1.0, note),
        Row("hit (queue, in-process)", f"p99 latency, {MANIFEST_HEADERS}-header manifest", p99,
            "ms", "", None, None, "", None, note),
    ]  # fmt: skip


#: Include folders searched in vain before the one holding the headers.
EARLIER_FOLDERS = 3


def searched_request(work: Path) -> dict[str, Any]:
    """:func:`manifest_request` with its 20 headers included as ``<hN.h>`` from the last of
    ``EARLIER_FOLDERS + 1`` include folders: each header was looked for in vain in the 3
    before it, so the manifest holds 60 absent places a hit must ``stat``
    (docs/compiling.md#files-looked-for)."""
    data = manifest_request(work)
    src = Path(data["kernel_source"])
    src.write_text(src.read_text().replace('#include "', "#include <").replace('.h"', ".h>"))
    old = time.time() - 60
    os.utime(src, (old, old))
    earlier = [work / f"earlier{i}" for i in range(EARLIER_FOLDERS)]
    for folder in earlier:
        folder.mkdir(exist_ok=True)
    data["include_dirs"] = [*map(str, earlier), *data["include_dirs"]]
    data["op_type"] = "Sub"
    return data


def _searched_hit_rows(work: Path, quick: bool) -> list[Row]:
    """Hit latency with 20 headers each found after 3 include folders: 21 digests and 60
    ``stat`` calls of places that must still be absent, no preprocessor."""
    work.mkdir(parents=True)
    _, hits = _compile_then_hits(work, searched_request(work), "searched kernel", quick)
    p50, p99 = _ms(hits), _ms(hits, 0.99)
    places = MANIFEST_HEADERS * EARLIER_FOLDERS
    note = f"{MANIFEST_HEADERS} headers, {places} absent places in the manifest; {len(hits)} hits"
    what = f"{MANIFEST_HEADERS} headers found after {EARLIER_FOLDERS} include folders each"
    return [
        Row("hit (queue, in-process)", f"p50 latency, {what}", p50, "ms", "", None, None,
            "≤ 1 ms", p50 <= 1.0, note),
        Row("hit (queue, in-process)", f"p99 latency, {what}", p99, "ms", "", None, None, "",
            None, note),
    ]  # fmt: skip


# --- miss overhead --------------------------------------------------------------------------


def _miss_row(work: Path, example: str, rounds: int) -> list[Row]:
    """A/B: the queue and the same argv alone, interleaved (who goes first alternates); and,
    in the same queue runs, the wall time around the compiler process itself."""
    work.mkdir(parents=True)
    since = load_average()
    direct, queued, inside = [], [], []
    compiler_s: list[float] = []
    real_run = process.run_in_group

    def timed_run(argv: list[str], *args: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        try:
            return real_run(argv, *args, **kw)
        finally:
            # the first use of a compiler also asks its version; a miss lists its headers
            # first (-MM): neither is the compile being compared
            if "--version" not in argv and "-MM" not in argv and "-M" not in argv:
                compiler_s.append(time.perf_counter() - start)

    with CompileQueue(_settings(work), workers=1) as queue:
        for i in range(rounds + 1):  # round 0 warms both paths up and is not counted
            req = _variant(example, work, i)
            argv = _argv(req, work / f"direct-{i}")

            def run_direct(argv: list[str] = argv, cwd: Path = work / f"direct-{i}") -> object:
                return subprocess.run(argv, check=True, cwd=cwd, capture_output=True)

            def run_queued(req: CompileRequest = req) -> object:
                compiler_s.clear()
                process.run_in_group = timed_run  # measurement only
                try:
                    outcome = queue.compile(req)
                finally:
                    process.run_in_group = real_run
                if outcome.status != "compiled" or len(compiler_s) != 1:
                    raise RuntimeError(f"{example}: expected one compile, got {outcome}")
                return outcome

            order = [run_direct, run_queued] if i % 2 else [run_queued, run_direct]
            times = dict(zip(order, _each(order), strict=True))
            if i:
                direct.append(times[run_direct])
                queued.append(times[run_queued])
                inside.append(compiler_s[0])
    added = statistics.median(b - a for a, b in zip(inside, queued, strict=True)) * 1e3
    fastest = min(queued) / min(direct)
    fsync_ms = _fsync_ms(work)
    load = load_note(since)
    return [
        ratio_row("miss (queue)", f"wall time per miss, {example}", queued,
                  "same argv, subprocess.run", direct, target=1.05, load=load,
                  note=f"interleaved; fastest {min(queued) * 1e3:.1f} vs "
                  f"{min(direct) * 1e3:.1f} ms ({fastest:.3f}×)"),
        ratio_row("miss (queue)", f"same runs: whole miss vs its compiler process, {example}",
                  queued, "compiler process alone", inside, target=1.05, load=load,
                  note=f"median added {added:.1f} ms per miss (key, locks, lookups, kernel json, "
                  f"ELF check, publish by rename without fsync; an fsync, which a miss no longer "
                  f"pays, took {fsync_ms:.2f} ms p50 on this disk then)"),
    ]  # fmt: skip


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fsync_ms(work: Path, n: int = 20) -> float:
    """Median latency of fsync-ing a fresh 2 KiB file in ``work`` (what a publish pays)."""
    times = []
    for i in range(n):
        fd = os.open(work / f"fsync-probe-{i}", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"x" * 2048)
            start = time.perf_counter()
            os.fsync(fd)
            times.append(time.perf_counter() - start)
        finally:
            os.close(fd)
    return statistics.median(times) * 1e3


def _miss_rows(work: Path, quick: bool) -> list[Row]:
    rows = _miss_row(work / "c", "softmax_c", 3 if quick else 20)
    try:
        get_backend("cuda").executable()
    except Exception as exc:  # nvcc not installed: say so in the table
        rows.append(Row("miss (queue)", "wall time per miss, add_cuda", 0.0, "ms",
                        note=f"skipped: {exc}"))  # fmt: skip
        return rows
    rows += _miss_row(work / "cuda", "add_cuda", 2 if quick else 8)
    return rows


def _sandbox_rows(work: Path, quick: bool) -> list[Row]:
    """A/B/C: one small C compile alone, under the limits, and in the view (interleaved)."""
    from cachemgr.compilers import sandbox

    box = sandbox.from_table({}, [])
    if not box.isolated:
        return [Row("sandbox", "view per compiler process", 0.0, "ms", note=box.why_not)]
    rounds = 5 if quick else 30
    since = load_average()
    times: dict[str, list[float]] = {"alone": [], "limits": [], "view": []}
    for i in range(rounds + 1):  # round 0 warms up and is not counted
        out = Path(tempfile.mkdtemp(prefix="cachemgr-bench-", dir=work))
        req = _variant("softmax_c", work, i)  # its source mirrored into the build folder
        source = out / req.kernel_source.name
        shutil.copyfile(req.kernel_source, source)
        job = CompileJob(source, req.language, req.kernel_entry, req.defines, out, "k")
        argv = get_backend(req.language).command(job)
        runs = {
            "alone": argv,
            "limits": box.wrap(argv, out, namespaces=False),
            "view": box.wrap(argv, out),
        }
        names = list(runs)[i % 3 :] + list(runs)[: i % 3]  # who goes first rotates
        calls = [lambda a=runs[n], c=out: subprocess.run(a, check=True, cwd=c, capture_output=True)
                 for n in names]  # fmt: skip
        for name, took in zip(names, _each(calls), strict=True):
            if i:
                times[name].append(took)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    load = load_note(since)
    return [
        ratio_row("sandbox", "own user's compile: limits only (prlimit)", times["limits"],
                  "compiler alone", times["alone"], note="interleaved", load=load),
        ratio_row("sandbox", "another user's compile: view (bwrap + prlimit)", times["view"],
                  "compiler alone", times["alone"], load=load,
                  note=f"interleaved; added {ms['view'] - ms['alone']:.1f} ms per compiler "
                  "process"),
    ]  # fmt: skip


# --- pool vs xargs ----------------------------------------------------------------------------


def _c_requests(
    work: Path, variants: int, base: int, own_source: bool = False
) -> list[CompileRequest]:
    return [
        _variant(f"{k}_c", work, base + v, own_source) for v in range(variants) for k in C_KERNELS
    ]


def _time_queue(
    work: Path, reqs: list[CompileRequest], workers: int, reserve: int = 0, caller: object = None
) -> float:
    with CompileQueue(_settings(work), workers=workers, reserve_workers=reserve) as queue:
        start = time.perf_counter()
        futures = [queue.submit(r, caller=caller) for r in reqs]
        outcomes = [f.result() for f in futures]
        elapsed = time.perf_counter() - start
    bad = [o for o in outcomes if o.status != "compiled"]
    if bad:
        raise RuntimeError(f"pool: {bad[0]}")
    return elapsed


def _time_xargs(work: Path, reqs: list[CompileRequest], workers: int) -> float:
    """``xargs -P <workers> -L 1 <compiler>`` over the argv of each request (one per line)."""
    argvs = [_argv(r, work / "xargs-out" / str(i)) for i, r in enumerate(reqs)]
    compiler = argvs[0][0]
    if any(a[0] != compiler or any(" " in w for w in a) for a in argvs):
        raise RuntimeError("xargs baseline needs one compiler and no blanks in arguments")
    cmds = work / "cmds.txt"
    cmds.write_text("".join(" ".join(a[1:]) + "\n" for a in argvs))
    start = time.perf_counter()
    with open(cmds) as fh:
        subprocess.run(["xargs", "-P", str(workers), "-L", "1", compiler], stdin=fh, check=True)
    elapsed = time.perf_counter() - start
    if len(list((work / "xargs-out").glob("*/k.o"))) != len(reqs):
        raise RuntimeError("xargs baseline did not write every object")
    return elapsed


def _pool_rows(work: Path, quick: bool) -> list[Row]:
    cores = os.cpu_count() or 1
    variants, rounds = (2, 1) if quick else (4, 7)
    since = load_average()
    ours, theirs, ratios = [], [], []
    for r in range(rounds):
        reqs = _c_requests(work, variants, 1000 * (r + 1))
        if r % 2:  # alternate who goes first: a noisy neighbour hits both alike
            q_s = _time_queue(work / f"q{r}", reqs, cores)
            x_s = _time_xargs(work / f"x{r}", reqs, cores)
        else:
            x_s = _time_xargs(work / f"x{r}", reqs, cores)
            q_s = _time_queue(work / f"q{r}", reqs, cores)
        ours.append(q_s)
        theirs.append(x_s)
        ratios.append(x_s / q_s)
    n = variants * len(C_KERNELS)
    note = (
        f"{n} distinct C kernels, {cores} workers, back-to-back rounds "
        f"(each: {', '.join(f'{v:.2f}' for v in ratios)})"
    )
    return [ratio_row("pool vs xargs", "throughput", [n / t for t in ours], f"xargs -P {cores}",
                      [n / t for t in theirs], unit="kernels/s", scale=1.0, target=0.9,
                      at_least=True, note=note, load=load_note(since))]  # fmt: skip


def _reserve_rows(work: Path, quick: bool) -> list[Row]:
    """One caller's N kernels through the pool with the daemon's default reserve worker
    (``[daemon] reserve_workers = 1``) vs without one: the cost of fair workers for a single
    user (docs/daemon.md#fair-workers). Rounds alternate who goes first."""
    cores = os.cpu_count() or 1
    variants, rounds = (2, 1) if quick else (4, 7)
    since = load_average()
    with_r, without, ratios = [], [], []
    for r in range(rounds):
        reqs = _c_requests(work, variants, 5000 + 1000 * r)
        runs = [("on", 1), ("off", 0)] if r % 2 else [("off", 0), ("on", 1)]
        took = {
            name: _time_queue(work / f"{name}{r}", reqs, cores, n, "uid 1000") for name, n in runs
        }
        with_r.append(took["on"])
        without.append(took["off"])
        ratios.append(took["off"] / took["on"])
    n = variants * len(C_KERNELS)
    note = (
        f"{n} distinct C kernels of one caller, {cores} workers, back-to-back rounds "
        f"(each: {', '.join(f'{v:.2f}' for v in ratios)})"
    )
    return [ratio_row("pool, one caller, reserve worker", "throughput", [n / t for t in with_r],
                      "no reserve worker", [n / t for t in without], unit="kernels/s",
                      scale=1.0, target=0.97, at_least=True, note=note,
                      load=load_note(since))]  # fmt: skip


# --- ccache ---------------------------------------------------------------------------------


def ensure_ccache() -> str | None:
    """Path of ccache (``scripts/bench`` installs the Debian package when it may); None when
    it is not installed."""
    return shutil.which("ccache")


def _each(calls: list[Callable[[], object]]) -> list[float]:
    times = []
    for call in calls:
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def _ccache_rows(work: Path, quick: bool) -> list[Row]:
    """The same C kernels through ``ccache gcc`` and the in-process queue, kernel by kernel:
    misses, then hits (each kernel's pair is one repetition)."""
    ccache = ensure_ccache()
    if ccache is None:
        return [Row("vs ccache", "miss", 0.0, "ms", note="skipped: ccache not installed")]
    since = load_average()
    reqs = _c_requests(work, 1 if quick else 3, 50_000, own_source=True)
    env = {**_env(), "CCACHE_DIR": str(work / "ccache"), "CCACHE_NOSTATS": "1"}

    def via_ccache(i: int, req: CompileRequest) -> Callable[[], object]:
        argv = [ccache, *_argv(req, work / "cc-out" / str(i))]
        return lambda: subprocess.run(argv, check=True, env=env, capture_output=True)

    cc_calls = [via_ccache(i, r) for i, r in enumerate(reqs)]
    cc_miss, cc_hit = _each(cc_calls), _each(cc_calls)
    with CompileQueue(_settings(work / "cm"), workers=1) as queue:
        cm_calls = [lambda r=r: queue.compile(r) for r in reqs]
        cm_miss, cm_hit = _each(cm_calls), _each(cm_calls)
    n = f"{len(reqs)} C kernels, sequential"
    load = load_note(since)
    return [
        ratio_row("vs ccache", "miss (in-process queue)", cm_miss, "ccache gcc miss", cc_miss,
                  note=n, load=load),
        ratio_row("vs ccache", "hit (in-process queue)", cm_hit, "ccache gcc hit", cc_hit,
                  note=n, load=load),
    ]  # fmt: skip


# --- one process per request: cachemgr's CLI beside ccache and gcc ---------------------------

#: The request the CLI hit rows ask for: the small C kernel of the examples.
CLI_HIT_EXAMPLE = "add_c"


def _cli_kinds() -> list[Install]:
    """The cachemgr installs whose CLI is measured: ``pip install .`` as users get it and the
    checkout's editable ``.venv``."""
    return [installed_cachemgr(), editable_cachemgr()]


def _cli_commands(
    work: Path,
    kinds: list[Install],
    ccache: str,
    req: CompileRequest,
    tag: str,
    daemon_run: Path | None = None,
) -> dict[str, Command]:
    """One request as each tool runs it, one process each: ``gcc`` (the compile a hit saves),
    ``ccache gcc`` (its own cache folder), and ``cachemgr compile`` of every install (each
    its own cache folder; no daemon reachable: the in-process route) — with ``daemon_run``
    (the ``XDG_RUNTIME_DIR`` of a daemon serving ``work/cache-daemon``) also through it."""
    request = _request_files(work, [req])[0]
    argv = _argv(req, work / "gcc-out" / tag)
    base = {**_env(), "HOME": str(work), "XDG_RUNTIME_DIR": str(_mkdir(work / "no-run"))}
    commands: dict[str, Command] = {
        "gcc": (argv, base),
        "ccache": ([ccache, *_argv(req, work / "cc-out" / tag)],
                   {**base, "CCACHE_DIR": str(work / "ccache"), "CCACHE_NOSTATS": "1"}),
    }  # fmt: skip
    for kind in kinds:
        cache = work / f"cache-{kind.kind}"
        commands[kind.kind] = (
            [str(kind.script), "compile", "--cache-dir", str(cache), str(request)],
            base,
        )
        if daemon_run is not None:
            commands[f"{kind.kind}-daemon"] = (
                [str(kind.script), "compile", "--cache-dir", str(work / "cache-daemon"),
                 str(request)],
                {**base, "XDG_RUNTIME_DIR": str(daemon_run)},
            )  # fmt: skip
    return commands


def _check_daemon_route(commands: dict[str, Command]) -> None:
    """Each ``…-daemon`` command's answer is a hit served through the daemon.

    :raises RuntimeError: it was answered another way (e.g. in process).
    """
    for name, (argv, env) in commands.items():
        if name.endswith("-daemon"):
            proc = subprocess.run([*argv, "--json"], env=measured_env(env), capture_output=True)
            answer = json.loads(proc.stdout) if proc.returncode == 0 else {}
            if answer.get("status") != "hit" or answer.get("route", {}).get("via") != "daemon":
                raise RuntimeError(
                    f"{name}: expected a hit through the daemon, got {proc.stdout!r}"
                )


def _cli_rows(work: Path, quick: bool) -> list[Row]:
    """``cachemgr compile`` as one process per request — installed and editable — each beside
    a ``ccache gcc`` of the same command and the plain ``gcc``, interleaved in the same rounds:
    misses (a fresh kernel each round, a miss for every cache alike), then warm hits of
    ``examples/requests/add_c.json``."""
    ccache = ensure_ccache()
    if ccache is None:
        return [Row("CLI vs ccache", "hit", 0.0, "ms", note="skipped: ccache not installed")]
    work.mkdir(parents=True)
    kinds = _cli_kinds()
    names = [k.kind for k in kinds]
    rows = []
    since = load_average()
    cpu: dict[str, list[float]] = {}
    misses = timed_runs(
        lambda r: _cli_commands(work, kinds, ccache, _variant("softmax_c", work, 90_000 + r, True),
                                f"miss-{r}"),
        3 if quick else 12,
        expect=dict.fromkeys(names, "compiled"),
        cpu=cpu,
    )  # fmt: skip
    rows += _cli_table(misses, cpu, names, "miss, a new softmax_c variant each", load_note(since))
    from bench import cases_daemon  # it imports this module

    hit_req = load_request(REQUESTS / f"{CLI_HIT_EXAMPLE}.json")
    proc, _ = cases_daemon._start(_mkdir(work / "d"), work / "cache-daemon")
    try:
        commands = _cli_commands(work, kinds, ccache, hit_req, "hit", work / "d" / "run")
        names = [n for n in commands if n not in ("gcc", "ccache")]
        since = load_average()
        cpu = {}
        hits = timed_runs(commands, 5 if quick else 21, expect=dict.fromkeys(names, "hit"), cpu=cpu)
        load = load_note(since)
        _check_daemon_route(commands)
    finally:
        cases_daemon._stop(proc)
    rows += _cli_table(hits, cpu, names, f"hit, {CLI_HIT_EXAMPLE}", load)
    return rows


def _cli_table(
    times: dict[str, list[float]],
    cpu: dict[str, list[float]],
    names: list[str],
    what: str,
    load: str,
) -> list[Row]:
    """Each cachemgr CLI row, then ccache's beside it; all against the plain gcc of the same
    rounds, and cachemgr's against the ccache run in the same round too (in the note), with
    each one's CPU time (less swayed by the load than wall time)."""

    def cpu_text(name: str) -> str:
        ms = statistics.median(cpu[name]) * 1e3
        return f"CPU {ms:.0f} ms, {ratio_text(ratio_row('', '', cpu[name], 'gcc', cpu['gcc']))}"

    rows = []
    label = {
        "installed": "installed (pip install .)",
        "editable": "editable .venv",
        "installed-daemon": "installed (pip install .), through the daemon",
        "editable-daemon": "editable .venv, through the daemon",
    }
    route = {True: "through a running daemon (its CPU not counted)", False: "no daemon"}
    for name in names:
        vs_ccache = ratio_row("", "", times[name], "ccache", times["ccache"])
        rows.append(
            ratio_row(
                f"CLI {what.split(',')[0]}",
                f"`cachemgr compile`, {label.get(name, name)}: {what}",
                times[name], "gcc -c, same command", times["gcc"], load=load,
                note=f"vs the ccache run beside it: {ratio_text(vs_ccache)}; {cpu_text(name)} "
                f"of gcc's {statistics.median(cpu['gcc']) * 1e3:.0f} ms; one process per request, "
                f"{route['daemon' in name]}",
            )
        )  # fmt: skip
    rows.append(
        ratio_row(f"CLI {what.split(',')[0]}", f"`ccache gcc`: {what}", times["ccache"],
                  "gcc -c, same command", times["gcc"], load=load,
                  note=f"ccache 4 (Debian), its own cache folder; {cpu_text('ccache')}")
    )  # fmt: skip
    return rows


def _request_files(work: Path, reqs: list[CompileRequest]) -> list[Path]:
    folder = Path(tempfile.mkdtemp(prefix="reqs-", dir=work))
    paths = []
    for i, req in enumerate(reqs):
        data = {
            "op_type": req.op_type,
            "soc_version": req.soc_version,
            "language": req.language,
            "kernel_source": str(req.kernel_source),
            "kernel_entry": req.kernel_entry,
            "inputs": [t.to_json() for t in req.inputs],
            "outputs": [t.to_json() for t in req.outputs],
            "attrs": dict(req.attrs),
            "defines": dict(req.defines),
        }
        path = folder / f"r{i}.json"
        path.write_text(json.dumps(data))
        paths.append(path)
    return paths


def run(workdir: Path, quick: bool) -> list[Row]:
    """Every row of this module (see the module docstring)."""
    rows = _hit_rows(workdir / "hit", quick)
    rows[0].note += f"; niceness {os.nice(0)}"
    rows += _manifest_hit_rows(workdir / "manifest-hit", quick)
    rows += _searched_hit_rows(workdir / "searched-hit", quick)
    rows += _miss_rows(workdir / "miss", quick)
    rows += _sandbox_rows(_mkdir(workdir / "sandbox"), quick)
    rows += _pool_rows(workdir / "pool", quick)
    rows += _reserve_rows(workdir / "reserve", quick)
    rows += _ccache_rows(workdir / "ccache", quick)
    rows += _cli_rows(workdir / "cli", quick)
    return rows
