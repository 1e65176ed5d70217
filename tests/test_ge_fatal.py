"""Entries whose json makes CANN GE abort are removed on sight
(docs/interop.md#entries-that-abort-ge; the shapes: ``cachemgr/storage/gefatal.py``), and headers
GE's eviction left are reclaimed once old (docs/eviction.md).

Each shape is planted the way a member or a torn write would leave it, next to an entry GE's
twin (``tests/ge_twin.py``) wrote. The twin, run as its own process, aborts on it
(``SIGABRT``) as GE does; after cachemgr removed the entry its lookup is a clean miss."""

from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from cachemgr.storage import fsutil
from tests import ge_twin
from tests.conftest import ROOT, SOC, run_cli
from tests.daemon_util import Daemon, start_daemon, wait_first_scan, wait_for
from tests.mount_util import tmpfs

HOUR = 3600
INI = "[op_compiler_cache]\nadk_version=8.0.RC1\nops_version=8.0.RC1\n"


@dataclass(frozen=True)
class Shape:
    """A json shape GE cannot survive: written over ``file`` of an entry of ``kind``."""

    kind: str  # plain | mix | pre
    file: str  # the file's name after the kernel: ".json", "_mix_aic.json"
    change: Callable[[dict], None]
    step: str  # the twin's step that aborts: hit | evict
    field: str  # the offending field, as the log names it
    #: the written json's bytes → the planted ones (what ``json.dumps`` cannot write)
    raw: Callable[[bytes], bytes] = lambda raw: raw


#: an array nested deeper than Python's json parser goes (its recursion limit, ~1,000)
_DEEP = b"[" * 1100 + b"]" * 1100


def _set(key: str, value: object) -> Callable[[dict], None]:
    return lambda data: data.__setitem__(key, value)


SHAPES = {
    "sha256-number": Shape("plain", ".json", _set("sha256", 12345), "hit", "sha256"),
    "sha256-null": Shape("plain", ".json", _set("sha256", None), "hit", "sha256"),
    "binFileName-number": Shape("plain", ".json", _set("binFileName", 7), "hit", "binFileName"),
    "binFileSuffix-list": Shape(
        "plain", ".json", _set("binFileSuffix", [".o"]), "hit", "binFileSuffix"
    ),
    "kernelName-number": Shape("plain", ".json", _set("kernelName", 42), "hit", "kernelName"),
    "headerFileSuffix-number": Shape(
        "plain", ".json", _set("headerFileSuffix", 1), "hit", "headerFileSuffix"
    ),
    "pre-pattern-number": Shape("pre", ".json", _set("pattern", 3), "hit", "pattern"),
    "pre-coreType-list": Shape("pre", ".json", _set("coreType", ["AiCore"]), "hit", "coreType"),
    "pre-options-number": Shape(
        "pre", ".json", _set("prebuilt_options", 0), "hit", "prebuilt_options"
    ),
    # GE reads the first value only: bytes after it that are not UTF-8 are never read
    "sha256-number-then-not-utf8": Shape(
        "plain", ".json", _set("sha256", 12345), "hit", "sha256", lambda b: b + b"\n\xff# caf\xe9"
    ),
    # nlohmann has no depth limit; Python's parser stops at ~1,000 levels (rule F0)
    "sha256-number-nested-1100-deep": Shape(
        "plain",
        ".json",
        _set("sha256", 12345),
        "hit",
        "(the whole json)",
        lambda b: b.rstrip()[:-1] + b', "x": ' + _DEEP + b"}",
    ),
    "mix-jsonList-number": Shape("mix", ".json", _set("jsonList", 5), "evict", "jsonList"),
    "mix-item-without-name": Shape(
        "mix", ".json", _set("jsonList", [{"binType": "AIC"}]), "evict", "jsonList"
    ),
    "mix-sub-binFileName-number": Shape(
        "mix", "_mix_aic.json", _set("binFileName", 9), "evict", "binFileName"
    ),
}


def _kernel(shape: Shape, n: int = 0) -> str:
    return f"te_abort_{n}" + ("_pre" if shape.kind == "pre" else "")


def _write(chip: Path, shape: Shape, kernel: str) -> None:
    """A good entry as GE writes it."""
    if shape.kind == "pre":
        assert ge_twin.write_pre(chip, kernel).files
    else:
        assert ge_twin.write_entry(chip, kernel, kind=shape.kind, header=True).files


def _plant(chip: Path, shape: Shape, kernel: str) -> Path:
    """Rewrite one json of the entry with the shape (temp + rename, as GE writes)."""
    path = chip / (kernel + shape.file)
    data = json.loads(path.read_bytes())
    shape.change(data)
    ge_twin.copy_to_cache(shape.raw(json.dumps(data, indent=4).encode()), path)
    return path


def _twin(chip: Path, shape: Shape, kernel: str) -> subprocess.CompletedProcess[str]:
    """The twin's lookup (or eviction) of the entry, as its own process."""
    args = ["hit", str(chip), kernel] if shape.step == "hit" else ["evict", str(chip), "1", "50"]
    return subprocess.run(
        [sys.executable, "-m", "tests.ge_twin", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _gone(chip: Path, kernel: str) -> bool:
    """No file of the entry is left but its lock file."""
    return not [p.name for p in chip.glob(kernel + "*") if not p.name.endswith(".lock")]


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_twin_aborts_on_the_shape_and_a_real_gc_removes_it(
    name: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    shape = SHAPES[name]
    root = tmp_path / "cache"
    chip = root / "kernel_cache" / SOC
    kernel, keeper = _kernel(shape, 0), _kernel(shape, 1)
    _write(chip, shape, kernel)
    _write(chip, shape, keeper)  # a good entry beside it stays
    (root / "kernel_cache" / "op_cache.ini").write_text(INI)
    _plant(chip, shape, kernel)
    before = _twin(chip, shape, kernel)
    assert before.returncode == -signal.SIGABRT, before  # what GE does: exit 134 in a shell
    assert "type_error" in before.stderr
    proc = run_cli("gc", "--json", "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    folder = json.loads(proc.stdout)["chip_folders"][SOC]
    assert folder["reclaimed"]["ge_fatal"] == 1, folder
    (line,) = folder["reclaimed"]["fatal"]
    assert line.startswith(kernel + ": ") and f" {shape.field} " in line and "GE aborts" in line
    assert shape.field in proc.stderr and "GE aborts" in proc.stderr  # logged, once
    assert proc.stderr.count("GE aborts") == 1
    assert _gone(chip, kernel), sorted(p.name for p in chip.iterdir())
    assert (chip / (keeper + ".json")).exists()
    after = _twin(chip, shape, kernel)
    if shape.step == "hit":
        assert after.returncode == 1, after  # a clean miss
    else:
        assert after.returncode == 0, after  # GE's eviction runs through
    stats = run_cli("stats", "--json", "--local", "--cache-dir", str(root), env=clean_env)
    assert json.loads(stats.stdout)["ge_fatal_removed"] == 1, stats.stdout


def test_gc_dry_run_names_the_shape_and_removes_nothing(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    shape = SHAPES["sha256-number"]
    root = tmp_path / "cache"
    chip = root / "kernel_cache" / SOC
    _write(chip, shape, "te_abort_0")
    (root / "kernel_cache" / "op_cache.ini").write_text(INI)
    _plant(chip, shape, "te_abort_0")
    proc = run_cli("gc", "--dry-run", "-v", "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 entry that abort GE" in proc.stdout
    assert f"would remove {SOC}/te_abort_0: te_abort_0.json: sha256 is a number (12345)" in (
        proc.stdout
    )
    assert (chip / "te_abort_0.json").exists()


SURVIVED = {
    # GE reads no number in its cache code; a huge one is parsed (a double) and kept
    "huge-blockDim": (".json", _set("blockDim", 10**30)),
    # one name without the other: SetBinFilePath misses before converting either
    "binFileName-number-alone": (
        ".json",
        lambda d: (d.__setitem__("binFileName", 7), d.pop("binFileSuffix")),
    ),
    # a kernelName-less .o misses in SetKernelBin, before the header and sha256
    "no-kernelName": (".json", lambda d: (d.pop("kernelName"), d.__setitem__("sha256", 1))),
    "jsonList-null": (".json", _set("jsonList", None)),
}


@pytest.mark.parametrize("name", sorted(SURVIVED))
def test_shapes_ge_survives_are_not_removed_as_fatal(
    name: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """The other side: a shape GE survives (a miss, or a hit) is no GE-fatal removal."""
    suffix, change = SURVIVED[name]
    root = tmp_path / "cache"
    chip = root / "kernel_cache" / SOC
    shape = Shape("plain", suffix, change, "hit", "")
    _write(chip, shape, "te_keep_0")
    (root / "kernel_cache" / "op_cache.ini").write_text(INI)
    _plant(chip, shape, "te_keep_0")
    assert _twin(chip, shape, "te_keep_0").returncode in (0, 1)  # a hit or a clean miss
    proc = run_cli("gc", "--json", "--dry-run", "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["chip_folders"][SOC]["reclaimed"]["ge_fatal"] == 0


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_a_running_daemon_removes_the_shape_within_2_s(name: str, tmp_path: Path) -> None:
    shape = SHAPES[name]
    root = tmp_path / "cache"
    chip = root / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    (root / "kernel_cache" / "op_cache.ini").write_text(INI)
    daemon = start_daemon(tmp_path, "--cache-dir", str(root))
    try:
        wait_first_scan(daemon)
        kernel = _kernel(shape)
        _write(chip, shape, kernel)
        _plant(chip, shape, kernel)
        planted = time.monotonic()
        wait_for(lambda: _gone(chip, kernel), 2.0, f"{name} to be removed")
        assert time.monotonic() - planted < 2.0
        # counted just after the removal
        wait_for(lambda: daemon.client.stats().counters["ge_fatal_removed"] == 1, 5.0, "count")
        metrics = daemon.client.request("GET", "/metrics")
        assert "cachemgr_ge_fatal_removed_total 1.0" in metrics
        wait_for(lambda: "GE aborts" in daemon.log(), 5.0, "the log line")
        (line,) = [ln for ln in daemon.log().splitlines() if "GE aborts" in ln]
        assert kernel in line and f" {shape.field} " in line
        assert _twin(chip, shape, kernel).returncode in (0, 1)  # a miss, no abort
    finally:
        daemon.stop()


# --- headers GE's eviction leaves ------------------------------------------------------


def _aged(path: Path, age_s: float) -> None:
    t = time.time() - age_s
    os.utime(path, (t, t))


def _ge_evicts_leaving_the_header(chip: Path, kernel: str) -> Path:
    """The twin writes an entry with a header and evicts it (GE's eviction deletes the json
    and the binary only: ``TeCacheSpaceManager::GetFilesAccessTime``)."""
    assert ge_twin.write_entry(chip, kernel, header=True).files
    for name in (f"{kernel}.json", f"{kernel}.o"):
        _aged(chip / name, 2 * HOUR)
    assert ge_twin.evict(chip, 1, 50) == [f"{kernel}.json"]
    header = chip / f"{kernel}.h"
    assert header.exists() and not (chip / f"{kernel}.json").exists()
    return header


@pytest.fixture
def noatime_root(tmp_path: Path) -> Path:
    """A cache root on a ``noatime`` tmpfs: the twin's eviction reads each json, which on a
    ``relatime`` root refreshes the access time it then re-checks (nothing would go)."""
    with tmpfs(tmp_path / "mnt", "noatime,size=16m") as mnt:
        (mnt / "kernel_cache").mkdir()
        (mnt / "kernel_cache" / "op_cache.ini").write_text(INI)
        yield mnt


def test_header_left_by_ge_eviction_is_reclaimed_once_past_the_aging_guard(
    clean_env: dict[str, str], noatime_root: Path
) -> None:
    chip = noatime_root / "kernel_cache" / SOC
    old = _ge_evicts_leaving_the_header(chip, "te_hdr_old")
    young = _ge_evicts_leaving_the_header(chip, "te_hdr_young")
    _aged(old, 2 * HOUR)
    _aged(young, 20 * 60)  # an orphan by age (10 min), not past GE's aging guard (30 min)
    proc = run_cli("gc", "--json", "--cache-dir", str(noatime_root), env=clean_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["chip_folders"][SOC]["reclaimed"]["orphans"] == 1
    assert not old.exists()
    assert young.exists()


def test_header_of_a_json_being_written_stays(clean_env: dict[str, str], tmp_path: Path) -> None:
    """GE copies the header, then the json (``CopyCompileRetIntoCacheDir``): while
    ``<kernel>.json_<pid>_<us>_<rand>.temp`` of a live writer is beside it, the header stays,
    whatever its age; a dead writer's temp protects nothing."""
    root = tmp_path / "cache"
    chip = root / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    (root / "kernel_cache" / "op_cache.ini").write_text(INI)
    for kernel in ("te_writing", "te_dead_writer"):
        (chip / f"{kernel}.h").write_bytes(b"/* header */\n")
        _aged(chip / f"{kernel}.h", 2 * HOUR)
    # a GE writer's temp (young: the one-hour temp rule) and one of this host's dead pid
    (chip / f"te_writing.json_{os.getpid()}_{time.time_ns() // 1000}_7.temp").write_bytes(b"{")
    dead_pid = 2**22 + 12345  # beyond the kernel's pid_max: no such process
    temp = f"te_dead_writer.json.{fsutil.short_host()}.{dead_pid}.0a0b0c0d.temp"
    (chip / temp).write_bytes(b"{")
    proc = run_cli("gc", "--json", "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (chip / "te_writing.h").exists()
    assert not (chip / "te_dead_writer.h").exists()


def _passes_over(daemon: Daemon) -> int:
    """Reclaim passes the daemon finished that read only the jsons changed since the last."""
    return daemon.log().count("reclaim pass over: GE-fatal shapes looked for in the jsons")


def test_a_json_changed_through_a_shared_mapping_is_found_by_a_later_full_pass(
    tmp_path: Path,
) -> None:
    """A member maps a json of the shared cache writable and shared (``mmap``) and stores into
    a page it dirtied before a reclaim pass: the bytes become a shape GE aborts on while the
    json's times stay those that pass already passed, and no inotify event goes. The passes
    that read only the jsons changed since the one before never read it again (it stayed
    until a ``gc`` run by hand); one pass of every ``FULL_FATAL_EVERY`` reads every json."""
    with tmpfs(tmp_path / "mnt", "size=16m") as root:  # no writeback: the page stays dirty
        chip = root / "kernel_cache" / SOC
        chip.mkdir(parents=True)
        (root / "kernel_cache" / "op_cache.ini").write_text(INI)
        kernel = "te_mapped_0"
        assert ge_twin.write_entry(chip, kernel).files
        cfg = tmp_path / "c.toml"
        cfg.write_text(
            "clock_skew_s = 0\n[daemon]\nreap_interval_s = 0.5\n"
            'debug_loggers = "cachemgr.daemon.governance"\n'
        )
        daemon = start_daemon(tmp_path, "--cache-dir", str(root), "--config", str(cfg))
        path = chip / f"{kernel}.json"
        fd = os.open(path, os.O_RDWR)
        try:
            wait_first_scan(daemon)
            mapped = mmap.mmap(fd, os.fstat(fd).st_size)
            mapped[0:1] = mapped[0:1]  # the page's first store stamps the times, now
            before = os.stat(path)
            passes = _passes_over(daemon)  # two more: one began after that stamp
            wait_for(lambda: _passes_over(daemon) >= passes + 2, 30, "two reclaim passes")
            start = mapped[:].index(b'"kernelName"') + len(b'"kernelName"')
            start = mapped[:].index(b'"', start + 1)  # the value's opening quote
            end = mapped[:].index(b'"', start + 1) + 1
            mapped[start:end] = b"42".ljust(end - start)  # a number: F2, same size
            after = os.stat(path)
            assert (after.st_mtime_ns, after.st_ctime_ns) == (
                before.st_mtime_ns,
                before.st_ctime_ns,
            ), "the store stamped a time: this kernel would not show the attack"
            assert _twin(chip, SHAPES["kernelName-number"], kernel).returncode == -signal.SIGABRT
            wait_for(lambda: _gone(chip, kernel), 30, "the mapped json to be removed")
            mapped.close()
        finally:
            os.close(fd)
            daemon.stop()
        assert "GE aborts" in daemon.log() and kernel in daemon.log()
