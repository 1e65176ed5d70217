"""The compile queue with real compilers: modes, faults, single-flight, cancel, force.

Compiler invocations are counted with a wrapper script that appends to a file and then execs
the real gcc; waits are on conditions with deadlines.
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cachemgr.compile.queue import CompileQueue
from cachemgr.errors import InvalidInputError
from cachemgr.storage import entry
from cachemgr.storage.chiplock import ChipLock, chip_lock_path
from cachemgr.storage.store import Store
from tests.compile_util import (
    REQUESTS,
    SOC,
    calls,
    counting_cc,
    make_settings,
    nvcc_missing,
    request,
    wait_for,
    write_request,
)


def _chip(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "kernel_cache" / SOC


def _entries(tmp_path: Path) -> set[str]:
    return set(entry.scan_chip(_chip(tmp_path)).entries)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.fixture
def queue(tmp_path: Path, clean_env):
    q = CompileQueue(make_settings(tmp_path, clean_env), workers=2, output_dir=tmp_path / "out")
    yield q
    q.close(cancel_pending=True)


# --- the real kernels ------------------------------------------------------------------------


def test_every_c_example_compiles_then_hits(queue: CompileQueue, tmp_path: Path) -> None:
    from cachemgr.compile.request import load_request

    reqs = [load_request(p) for p in sorted(REQUESTS.glob("*_c.json"))]
    first = [f.result(timeout=120) for f in [queue.submit(r) for r in reqs]]
    assert [o.status for o in first] == ["compiled"] * len(reqs), [o.error for o in first]
    for req, outcome in zip(reqs, first, strict=True):
        assert outcome.kernel_name.startswith(f"te_{req.op_type.lower()}_")
        doc = json.loads(outcome.files[0].read_text())
        assert outcome.files[0].name == outcome.kernel_name + ".json"
        assert doc["kernelName"] == req.kernel_entry  # the real symbol in the binary
        assert doc["sha256"] == entry.sha256_hex(outcome.files[1].read_bytes())
        assert doc["supportInfo"]["opType"] == req.op_type
        assert doc["supportInfo"]["staticKey"] in outcome.kernel_name
        assert outcome.files[0].parent == _chip(tmp_path)
    again = [queue.compile(r) for r in reqs]
    assert [o.status for o in again] == ["hit"] * len(reqs)
    assert [o.kernel_name for o in again] == [o.kernel_name for o in first]
    assert Store(_chip(tmp_path)).verify_all().bad == []


def test_cuda_example_compiles_to_a_cubin(queue: CompileQueue, tmp_path: Path) -> None:
    if nvcc_missing():
        pytest.skip(f"nvcc unavailable: {nvcc_missing()}")
    outcome = queue.compile(request(tmp_path, example="add_cuda"))
    assert outcome.status == "compiled", outcome.error
    assert {f.suffix for f in outcome.files} == {".json", ".cubin"}
    doc = json.loads(outcome.files[0].read_text())
    assert doc["magic"] == "RT_DEV_BINARY_MAGIC_CUBIN" and doc["parameters"] == [0, 0, 0]


def test_disable_neither_reads_nor_writes(tmp_path: Path, clean_env) -> None:
    settings = make_settings(tmp_path, clean_env)
    with CompileQueue(settings, workers=1, output_dir=tmp_path / "out") as q:
        cached = q.compile(request(tmp_path))
        req = request(tmp_path, options={"op_compiler_cache_mode": "disable"})
        outcome = q.compile(req)
    assert cached.status == "compiled"
    assert outcome.status == "compiled" and outcome.kernel_name == cached.kernel_name
    assert all(f.parent == tmp_path / "out" for f in outcome.files)
    assert {f.suffix for f in outcome.files} == {".json", ".o"}
    assert not list((tmp_path / "out").glob(".cachemgr-build-*"))
    assert _entries(tmp_path) == {cached.kernel_name}


def test_a_bad_entry_is_recompiled(queue: CompileQueue, tmp_path: Path) -> None:
    req = request(tmp_path)
    first = queue.compile(req)
    binary = first.files[1]
    binary.write_bytes(binary.read_bytes()[:-8] + b"corrupt!")
    again = queue.compile(req)
    assert again.status == "compiled" and Store(_chip(tmp_path)).lookup(first.kernel_name).hit


def test_replace_recompiles_one_entry(tmp_path: Path, clean_env) -> None:
    wrap = counting_cc(tmp_path / "w")
    settings = make_settings(tmp_path, clean_env, compilers={"cc": str(wrap)})
    with CompileQueue(settings, workers=1) as q:
        a, b = request(tmp_path, "a"), request(tmp_path, "b", defines={"N": 8})
        ka, kb = q.compile(a).kernel_name, q.compile(b).kernel_name
        replaced = q.compile(a, replace=True)
        assert replaced.status == "compiled" and replaced.kernel_name == ka
        assert q.compile(a).status == "hit" and q.compile(b).status == "hit"
    assert len(calls(tmp_path / "w")) == 3
    assert _entries(tmp_path) == {ka, kb}


# --- debug -----------------------------------------------------------------------------------


def test_debug_bypasses_the_cache_and_keeps_artefacts(tmp_path: Path, clean_env) -> None:
    wrap = counting_cc(tmp_path / "w")
    settings = make_settings(tmp_path, clean_env, compilers={"cc": str(wrap)})
    with CompileQueue(settings, workers=1) as q:
        cached = q.compile(request(tmp_path))
        before = {p.name: p.stat().st_atime_ns for p in _chip(tmp_path).iterdir()}
        outs = [
            q.compile(request(tmp_path, options={"op_debug_level": level, "debug_dir": "dbg"}))
            for level in (1, 2, 3, 4)
        ]
    assert all(o.status == "debug" for o in outs), [o.error for o in outs]
    assert {p.name: p.stat().st_atime_ns for p in _chip(tmp_path).iterdir()} == before
    assert _entries(tmp_path) == {cached.kernel_name}, "debug wrote nothing to the cache"
    folder = tmp_path / "dbg" / "kernel_meta" / f"{os.uname().nodename.split('.')[0]}_{os.getpid()}"
    kinds = []
    for out in outs:
        assert all(f.parent == folder for f in out.files)
        kinds.append({f.name[len(out.kernel_name) :] for f in out.files})
    assert kinds == [
        {".o", ".json", ".cce", "_loc.json"},
        {".o", ".json", ".cce", "_loc.json"},
        {".o", ".json"},
        {".o", ".json", ".cce", "_compute.json"},
    ]
    level2 = [c for c in calls(tmp_path / "w") if "-O0" in c]
    assert level2 and "-g" in level2[0] and "-finstrument-functions" in level2[0]
    assert not list(folder.glob(".build-*"))
    compute = json.loads(outs[3].files[-1].read_text())
    assert compute["opType"] == "Add" and len(compute["graph"]["nodes"]) == 4


def test_cfg_and_its_op_debug_list(tmp_path: Path, clean_env) -> None:
    cfg = tmp_path / "test0.cfg"
    cfg.write_text("op_debug_config = dump_cce, ccec_g\nop_debug_list = OpType::Mul\n")
    settings = make_settings(tmp_path, clean_env, op_debug_config=str(cfg))
    with CompileQueue(settings, workers=1) as q:
        add = q.compile(request(tmp_path, "add"))  # not listed: through the cache
        add_again = q.compile(request(tmp_path, "add"))
        mul = q.compile(request(tmp_path, "mul", example="mul_c"))
    assert (add.status, add_again.status, mul.status) == ("compiled", "hit", "debug")
    assert {f.name[len(mul.kernel_name) :] for f in mul.files} == {".o", ".json", ".cce"}
    assert mul.kernel_name not in _entries(tmp_path)


def test_bad_cfg_is_refused_before_anything(tmp_path: Path, clean_env) -> None:
    cfg = tmp_path / "bad.cfg"
    cfg.write_text("op_debug_config = ccec_O0,oom\n")
    settings = make_settings(tmp_path, clean_env)
    with CompileQueue(settings, workers=1) as q:
        with pytest.raises(InvalidInputError, match="ccec_O0 and oom"):
            q.submit(request(tmp_path, options={"op_debug_config": str(cfg)}))
        cfg.write_text("op_debug_config = dump_everything\n")
        with pytest.raises(InvalidInputError, match="unknown option 'dump_everything'"):
            q.submit(request(tmp_path, options={"op_debug_config": str(cfg)}))
        with pytest.raises(InvalidInputError, match="cannot read"):
            q.submit(request(tmp_path, options={"op_debug_config": "missing.cfg"}))
    assert not _chip(tmp_path).exists() or not _entries(tmp_path)


# --- faults ----------------------------------------------------------------------------------


def _fault_queue(tmp_path: Path, env, script: str, timeout_s: float = 60.0) -> CompileQueue:
    fake = tmp_path / "fakecc"
    fake.write_text(
        f'#!/bin/sh\nif [ "$1" = "--version" ]; then echo "fakecc 1.0"; exit 0; fi\n'
        'case " $* " in *" -MM "*) exec gcc "$@";; esac\n'  # the header listing works
        f"{script}\n"
    )
    fake.chmod(0o755)
    settings = make_settings(tmp_path, env, compilers={"cc": str(fake)})
    return CompileQueue(settings, workers=1, timeout_s=timeout_s)


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("echo 'add.c:3: error: cachemgr-marker-4711' >&2; exit 1", "cachemgr-marker-4711"),
        ("echo 'internal compiler error' >&2; kill -SEGV $$", r"crashed \(SIGSEGV\)"),
        ("exit 0", "wrote no binary"),
    ],
    ids=["compiler-error", "crash", "no-binary"],
)
def test_compiler_faults_fail_cleanly(tmp_path, clean_env, script, expected) -> None:
    with _fault_queue(tmp_path, clean_env, script) as q:
        outcome = q.compile(request(tmp_path))
    assert outcome.status == "failed" and outcome.files == ()
    assert outcome.error is not None and "\n" not in outcome.error.strip()
    assert __import__("re").search(expected, outcome.error)
    assert not _entries(tmp_path)
    assert not [p for p in _chip(tmp_path).iterdir() if p.suffix in (".o", ".temp")]


def test_missing_compiler_is_named(tmp_path: Path, clean_env) -> None:
    settings = make_settings(tmp_path, clean_env, compilers={"cc": "cachemgr-no-such-cc"})
    with CompileQueue(settings, workers=1) as q:
        outcome = q.compile(request(tmp_path))
    assert outcome.status == "failed" and "cachemgr-no-such-cc" in (outcome.error or "")


def test_hang_is_killed_with_its_process_group(tmp_path: Path, clean_env) -> None:
    pidfile = tmp_path / "child.pid"
    script = f"sleep 300 &\necho $! > {pidfile}\nwait"
    start = time.monotonic()
    with _fault_queue(tmp_path, clean_env, script, timeout_s=1.0) as q:
        outcome = q.compile(request(tmp_path))
    assert outcome.status == "failed" and "timed out after 1 s" in (outcome.error or "")
    assert time.monotonic() - start < 10
    child = int(pidfile.read_text())
    wait_for(lambda: not _alive(child), 5.0, f"child {child} to die")
    assert not _entries(tmp_path)


# --- single-flight, cancel, priorities --------------------------------------------------------


def test_single_flight_threads(tmp_path: Path, clean_env) -> None:
    wrap = counting_cc(tmp_path / "w", sleep_s=0.5)
    settings = make_settings(tmp_path, clean_env, compilers={"cc": str(wrap)})
    req = request(tmp_path)
    results = []
    with CompileQueue(settings, workers=4) as q:
        barrier = threading.Barrier(8)

        def ask() -> None:
            barrier.wait()
            results.append(q.compile(req))

        threads = [threading.Thread(target=ask) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert len(calls(tmp_path / "w")) == 1, "the compiler ran once"
    assert len(results) == 8 and len({o.kernel_name for o in results}) == 1
    assert {o.status for o in results} <= {"compiled", "hit"}
    assert sum(o.status == "compiled" for o in results) >= 1


def test_single_flight_processes(tmp_path: Path, clean_env) -> None:
    wrap = counting_cc(tmp_path / "w", sleep_s=0.5)
    config = tmp_path / "cc.toml"
    config.write_text(f'[compilers]\ncc = "{wrap}"\n')
    req = write_request(tmp_path)
    argv = [sys.executable, "-m", "cachemgr", "compile", str(req), "--json"]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--config", str(config)]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outs
    statuses = sorted(json.loads(o)["status"] for o, _ in outs)
    assert len(calls(tmp_path / "w")) == 1, "one compile across 4 processes"
    assert statuses == ["compiled", "hit", "hit", "hit"]


def test_a_job_is_dropped_when_every_waiter_has_gone(tmp_path: Path, clean_env) -> None:
    wrap = counting_cc(tmp_path / "w", sleep_s=1.0)
    settings = make_settings(tmp_path, clean_env, compilers={"cc": str(wrap)})
    with CompileQueue(settings, workers=1) as q:
        busy = q.submit(request(tmp_path, "busy"))
        wait_for(lambda: calls(tmp_path / "w"), 10, "the first compile to start")
        wanted = [q.submit(request(tmp_path, "gone", defines={"N": 77})) for _ in range(3)]
        assert q.depth() == 2
        assert all(f.cancel() for f in wanted)
        assert busy.result(timeout=60).status == "compiled"
        later = q.compile(request(tmp_path, "later", defines={"N": 78}))
    assert later.status == "compiled"
    assert q.counters["dropped"] == 1
    assert not [c for c in calls(tmp_path / "w") if "-DN=77" in c], "the dropped job never ran"


def test_priorities(tmp_path: Path, clean_env) -> None:
    wrap = counting_cc(tmp_path / "w", sleep_s=0.3)
    settings = make_settings(tmp_path, clean_env, compilers={"cc": str(wrap)})
    with CompileQueue(settings, workers=1) as q:
        q.submit(request(tmp_path, "first", defines={"N": 1}))
        wait_for(lambda: calls(tmp_path / "w"), 10, "the first compile to start")
        low = q.submit(request(tmp_path, "low", defines={"N": 2}), priority=0)
        high = q.submit(request(tmp_path, "high", defines={"N": 3}), priority=5)
        low.result(60), high.result(60)
    order = [c.split("-DN=")[1].split()[0] for c in calls(tmp_path / "w")]
    assert order == ["1", "3", "2"]


# --- force -----------------------------------------------------------------------------------


def test_force_waits_for_in_flight_compiles_then_clears(tmp_path: Path, clean_env) -> None:
    """Force clears what was there when it was asked for; the kernels that
    in-flight compiles publish meanwhile — reported "compiled" with their paths — stay."""
    wrap = counting_cc(tmp_path / "w", sleep_s=1.0)
    settings = make_settings(tmp_path, clean_env, compilers={"cc": str(wrap)})
    chip = _chip(tmp_path)
    errors: list[str] = []
    stop = threading.Event()
    with CompileQueue(settings, workers=2) as q:
        old = q.compile(request(tmp_path, "old", defines={"N": 5}))
        flying = [q.submit(request(tmp_path, f"f{i}", defines={"N": 10 + i})) for i in range(2)]
        wait_for(lambda: len(calls(tmp_path / "w")) == 3, 10, "two compiles in flight")

        def reader() -> None:  # hits served meanwhile must verify (lookup checks sha256)
            while not stop.is_set():
                for kernel in entry.scan_chip(chip).entries:
                    try:
                        result = Store(chip).lookup(kernel, touch=False)
                    except Exception as exc:
                        errors.append(repr(exc))
                        continue
                    if result.hit:
                        try:
                            data = (chip / f"{kernel}.o").read_bytes() if result.files else b""
                        except FileNotFoundError:  # force cleared it after the lookup
                            continue
                        if data and entry.sha256_hex(data) != result.desc.binaries[0].sha256:
                            errors.append(f"corrupt {kernel}")

        watcher = threading.Thread(target=reader)
        watcher.start()
        forced = q.submit(request(tmp_path, "force", options={"op_compiler_cache_mode": "force"}))
        in_flight = [f.result(timeout=60) for f in flying]
        done = forced.result(timeout=60)
        stop.set()
        watcher.join(10)
        again = q.compile(request(tmp_path, "force2", options={"op_compiler_cache_mode": "force"}))
    assert [o.status for o in in_flight] == ["compiled", "compiled"], "in-flight ones finished"
    assert done.status == "compiled" and again.status == "hit", "force clears once per session"
    assert q.counters["force_cleared"] == 1  # old only: the two in flight are kept
    assert _entries(tmp_path) == {done.kernel_name, *(o.kernel_name for o in in_flight)}
    assert all(f.is_file() for o in in_flight for f in o.files), "a result names live files"
    assert old.kernel_name not in _entries(tmp_path)
    assert errors == []


def test_force_waits_for_another_process(tmp_path: Path, clean_env) -> None:
    """The chip lock is cross-process: force waits for a publisher in another process."""
    lock = chip_lock_path(tmp_path / "cache" / "kernel_cache", SOC)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom cachemgr.storage.chiplock import ChipLock\n"
            f"with ChipLock({str(lock)!r}).shared():\n"
            "    print('held', flush=True)\n    time.sleep(1.0)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    held_at = time.monotonic()
    settings = make_settings(tmp_path, clean_env)
    with CompileQueue(settings, workers=1) as q:
        outcome = q.compile(request(tmp_path, options={"op_compiler_cache_mode": "force"}))
    assert time.monotonic() - held_at >= 0.8, "force waited for the other process's publisher"
    holder.communicate(timeout=10)
    assert holder.returncode == 0
    assert outcome.status == "compiled"


def test_chip_lock_turnstile(tmp_path: Path) -> None:
    """While force waits for a publisher, a new publisher waits too (no starvation)."""
    cl = ChipLock(tmp_path / "x.chip.lock")
    events: list[str] = []
    with cl.shared():
        forcer = threading.Thread(target=lambda: _hold(cl.exclusive(), events, "force"))
        forcer.start()
        wait_for(lambda: _turnstile_taken(cl.path), 30, "force to hold the turnstile")
        late = threading.Thread(target=lambda: _hold(cl.shared(), events, "late"))
        late.start()
        time.sleep(0.2)  # a chance for the late publisher to get in wrongly
        events.append("first-done")
    forcer.join(10)
    late.join(10)
    assert events == ["first-done", "force", "late"]


def _turnstile_taken(path: Path) -> bool:
    """Whether byte 0 of the chip lock ``path`` (the turnstile) is held exclusive: a shared
    lock of it would conflict (``F_OFD_GETLK`` asks, takes nothing)."""
    fd = os.open(path, os.O_RDWR)
    try:
        query = struct.pack("hhqqi4x", fcntl.F_RDLCK, os.SEEK_SET, 0, 1, 0)
        l_type = struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_OFD_GETLK, query))[0]
    finally:
        os.close(fd)
    return l_type != fcntl.F_UNLCK


def _hold(ctx, events: list[str], name: str) -> None:
    with ctx:
        events.append(name)
        time.sleep(0.05)


def test_close_fails_pending_jobs(tmp_path: Path, clean_env) -> None:
    wrap = counting_cc(tmp_path / "w", sleep_s=0.5)
    settings = make_settings(tmp_path, clean_env, compilers={"cc": str(wrap)})
    q = CompileQueue(settings, workers=1)
    running = q.submit(request(tmp_path, "a", defines={"N": 1}))
    wait_for(lambda: calls(tmp_path / "w"), 10, "the compile to start")
    pending = q.submit(request(tmp_path, "b", defines={"N": 2}))
    q.close(cancel_pending=True)
    assert running.result(timeout=30).status == "compiled"
    assert pending.result(timeout=30).status == "failed"
    with pytest.raises(RuntimeError, match="closed"):
        q.submit(request(tmp_path, "c"))
