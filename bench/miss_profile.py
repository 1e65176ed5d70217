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


def main(argv: list[str]) -> int:
    """Print the table (see the module docstring)."""
    misses = int(argv[0]) if argv else 40
    table = profile(misses)
    print(f"{misses} softmax_c misses, in-process queue, one worker; ms per miss (median)")
    print(f"{'step':42s} {'wall':>8s} {'cpu':>8s} calls")
    for name, (wall, cpu, calls) in sorted(table.items(), key=lambda kv: -kv[1][0]):
        print(f"{name:42s} {wall:8.3f} {cpu:8.3f} {calls:5d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
