"""Where a miss's time goes around its compiler: ``python -m bench.miss_profile [N]``.

Runs ``N`` (default 40) ``softmax_c`` misses through an in-process ``CompileQueue`` (one
worker, as the ``miss (queue)`` rows of ``cases_compile.py``) and prints, per miss, the
median wall time and thread CPU time of each step of the miss path — the caller's
``prepare`` and fast-path lookup, the worker's locks, locked lookup, mirror, compile
wrapper (``process.run_in_group`` is the compiler process itself, as the rows count it; the
files made for the publish while it runs, ``Reserved.make``, are inside it), ELF check,
publish and header manifest, and after the answer the worker's ``after_job`` (its next
mirror's file made by ``Spares.refill``). Not a case module: the harness does
not run it, and nothing is written to ``BENCHMARKS.md``. Measurement only: the steps are
wrapped for the run and restored afterwards.

``python -m bench.miss_profile --timeline [N]`` instead marks, per miss, when each of
:data:`MARKS` happened on its thread and prints the median gap between consecutive marks
(wall ms, with p10 and p90: the hand-offs between the caller and the worker are the gaps no
step times) and the thread CPU time of the caller's and the worker's spans (everything a
miss adds outside the compiler process is Python and system calls on these two threads).
"""

from __future__ import annotations

import collections
import functools
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import cases_compile
from cachemgr.compile import build, inputs, pipeline, publisher
from cachemgr.compile import queue as queue_module
from cachemgr.compile.queue import CompileQueue
from cachemgr.compilers import base, process
from cachemgr.storage import madeahead, store
from cachemgr.storage.chiplock import ChipLock
from cachemgr.storage.safedir import SafeDir

#: (owner, attribute): the steps timed, in the order of a miss.
STEPS: tuple[tuple[Any, str], ...] = (
    (pipeline, "prepare"),
    (CompileQueue, "_fast_path"),
    (ChipLock, "hold_shared"),
    (SafeDir, "open_chip"),
    (store.Store, "hold"),
    (store.Store, "lookup"),
    (publisher, "compile_job"),
    (inputs, "materialise"),
    (base.CompilerBackend, "compile"),
    (process, "run_in_group"),
    (madeahead.Reserved, "make"),
    (base.CompilerBackend, "still_runs"),
    (publisher, "_payload"),
    (publisher.Pending, "finish"),
    (store.Store, "publish"),
    (publisher, "_record_manifest"),
    (build.RunContext, "after_job"),
    (build.Spares, "refill"),
)


@contextmanager
def _timed(log: list[tuple[str, float, float]]) -> Iterator[None]:
    """Every step of :data:`STEPS` appends (name, wall s, thread CPU s) to ``log`` per call."""
    saved = [(owner, name, owner.__dict__[name]) for owner, name in STEPS]
    lock = threading.Lock()

    def wrap(label: str, real: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(real)
        def timed(*args: Any, **kw: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return real(*args, **kw)
            finally:
                with lock:
                    log.append((label, time.perf_counter() - wall, time.thread_time() - cpu))

        return timed

    for owner, name, real in saved:
        label = f"{getattr(owner, '__name__', owner)}.{name}"
        if isinstance(real, classmethod):
            setattr(owner, name, classmethod(wrap(label, real.__func__)))
        else:
            setattr(owner, name, wrap(label, real))
    try:
        yield
    finally:
        for owner, name, real in saved:
            setattr(owner, name, real)


def profile(misses: int) -> dict[str, tuple[float, float, int]]:
    """Per step: median wall ms and thread CPU ms per miss, and calls per miss."""
    work = Path(tempfile.mkdtemp(prefix="miss-profile-", dir="/var/tmp"))
    per_miss: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    calls: dict[str, int] = {}
    log: list[tuple[str, float, float]] = []
    try:
        with CompileQueue(cases_compile._settings(work), workers=1) as queue:
            queue.compile(cases_compile._variant("softmax_c", work, 0))  # warm up
            requests = [cases_compile._variant("softmax_c", work, i) for i in range(1, misses + 1)]
            with _timed(log):
                for request in requests:
                    time.sleep(0.02)  # the previous job's after_job is over
                    log.clear()
                    if queue.compile(request).status != "compiled":
                        raise RuntimeError("expected a miss")
                    time.sleep(0.01)  # this job's after_job
                    wall: dict[str, float] = collections.defaultdict(float)
                    cpu: dict[str, float] = collections.defaultdict(float)
                    count: collections.Counter[str] = collections.Counter()
                    for name, w, c in log:
                        wall[name] += w
                        cpu[name] += c
                        count[name] += 1
                    for name in wall:
                        per_miss[name].append((wall[name] * 1e3, cpu[name] * 1e3))
                        calls[name] = count[name]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        name: (
            statistics.median(w for w, _ in rows),
            statistics.median(c for _, c in rows),
            calls[name],
        )
        for name, rows in per_miss.items()
    }


#: (owner, attribute, mark at its start, mark at its end): the timeline's marks, in the
#: order of a miss (``submit`` starts at ``start``, the caller's return is ``answered``).
MARKS: tuple[tuple[Any, str, str | None, str | None], ...] = (
    (pipeline, "prepare", None, "prepared"),
    (CompileQueue, "_fast_path", None, "fast path"),
    (CompileQueue, "_enqueue", None, "queued"),
    (CompileQueue, "_run", "worker", "compiled"),
    (publisher, "_hold_entry", "entry lock", "entry held"),
    (publisher, "compile_job", None, "mirrored"),
    (process, "run_in_group", "process", "process ended"),
    (base.CompilerBackend, "still_runs", "still_runs", None),
    (CompileQueue, "_finish", "publish", "published"),
    (queue_module, "_resolve", "answer", None),
    (build.RunContext, "after_job", "tidy", "tidied"),
)

#: (label, first mark, last mark): the spans whose thread CPU time the timeline prints.
CPU_SPANS = (
    ("caller: prepare to answer", "start", "answered"),
    ("worker: locks, lookup, mirror, argv", "worker", "process"),
    ("worker: exit, ELF, still_runs, payload", "process ended", "compiled"),
    ("worker: publish, manifest, release, answer", "publish", "published"),
    ("worker: after the answer (tidy)", "tidy", "tidied"),
)


@contextmanager
def _marked(wall: dict[str, int], cpu: dict[str, int]) -> Iterator[None]:
    """Every step of :data:`MARKS` records its marks' first times in ``wall``
    (``perf_counter_ns``) and ``cpu`` (the thread's ``thread_time_ns``)."""
    saved = [(owner, name, owner.__dict__[name]) for owner, name, *_ in MARKS]

    def mark(name: str | None) -> None:
        if name is not None and name not in wall:
            wall[name], cpu[name] = time.perf_counter_ns(), time.thread_time_ns()

    def wrap(real: Callable[..., Any], first: str | None, last: str | None) -> Callable[..., Any]:
        @functools.wraps(real)
        def marked(*args: Any, **kw: Any) -> Any:
            mark(first)
            try:
                return real(*args, **kw)
            finally:
                mark(last)

        return marked

    for owner, name, first, last in MARKS:
        setattr(owner, name, wrap(owner.__dict__[name], first, last))
    try:
        yield
    finally:
        for owner, name, real in saved:
            setattr(owner, name, real)


def timeline(misses: int) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
    """``misses`` ``softmax_c`` misses, one at a time: per miss, the wall and thread CPU
    time (ns) of every mark reached (:data:`MARKS`, plus ``start`` and ``answered``)."""
    work = Path(tempfile.mkdtemp(prefix="miss-timeline-", dir="/var/tmp"))
    walls: list[dict[str, int]] = []
    cpus: list[dict[str, int]] = []
    try:
        with CompileQueue(cases_compile._settings(work), workers=1) as queue:
            queue.compile(cases_compile._variant("softmax_c", work, 0))  # warm up
            requests = [cases_compile._variant("softmax_c", work, i) for i in range(1, misses + 1)]
            for request in requests:
                wall: dict[str, int] = {}
                cpu: dict[str, int] = {}
                with _marked(wall, cpu):
                    time.sleep(0.02)  # the previous job's tidy is over
                    wall["start"], cpu["start"] = time.perf_counter_ns(), time.thread_time_ns()
                    outcome = queue.compile(request)
                    wall["answered"] = time.perf_counter_ns()
                    cpu["answered"] = time.thread_time_ns()
                    time.sleep(0.02)  # this job's tidy
                if outcome.status != "compiled":
                    raise RuntimeError("expected a miss")
                walls.append(wall)
                cpus.append(cpu)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return walls, cpus


def _print_timeline(misses: int) -> None:
    walls, cpus = timeline(misses)
    names = {name for wall in walls for name in wall}
    # in the order they happen: by their median time after the miss's start
    order = sorted(
        names, key=lambda n: statistics.median(w[n] - w["start"] for w in walls if n in w)
    )
    print(f"{misses} softmax_c misses, one worker; ms between marks (median, p10, p90)")
    prev = "start"
    for name in order[1:]:
        gaps = sorted((w[name] - w[prev]) / 1e6 for w in walls if name in w and prev in w)
        if not gaps:
            continue
        p10, p90 = gaps[len(gaps) // 10], gaps[(9 * len(gaps)) // 10]
        print(f"{prev:>14s} -> {name:14s} {statistics.median(gaps):8.3f} {p10:8.3f} {p90:8.3f}")
        prev = name
    added = [
        (w["answered"] - w["start"] - (w["process ended"] - w["process"])) / 1e6 for w in walls
    ]
    print(f"added outside the compiler process: {statistics.median(added):.3f} ms (median)")
    print("thread CPU ms (median):")
    for label, first, last in CPU_SPANS:
        spent = [(c[last] - c[first]) / 1e6 for c in cpus if first in c and last in c]
        print(f"  {label:44s} {statistics.median(spent):8.3f}")


def main(argv: list[str]) -> int:
    """Print the table, or with ``--timeline`` the timeline (see the module docstring)."""
    if argv and argv[0] == "--timeline":
        _print_timeline(int(argv[1]) if len(argv) > 1 else 40)
        return 0
    misses = int(argv[0]) if argv else 40
    table = profile(misses)
    print(f"{misses} softmax_c misses, in-process queue, one worker; ms per miss (median)")
    print(f"{'step':42s} {'wall':>8s} {'cpu':>8s} calls")
    for name, (wall, cpu, calls) in sorted(table.items(), key=lambda kv: -kv[1][0]):
        print(f"{name:42s} {wall:8.3f} {cpu:8.3f} {calls:5d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
