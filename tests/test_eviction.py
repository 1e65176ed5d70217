"""The eviction engine (docs/design.md#size-limits-and-eviction): exact plans over synthetic chip
folders, then gc on real files, real fcntl locks and real processes."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cachemgr.errors import InvalidInputError, LockBusyError
from cachemgr.eviction import (
    MIB,
    DryRun,
    EvictionPlan,
    chip_usage,
    files,
    gc_chip,
    plan_eviction,
    purge_chip,
)
from cachemgr.storage import entry, fsutil
from tests.conftest import ROOT, kernel_json, publish_mix

NOW_S = 2_000_000_000  # a fixed clock for the pure plans
DAY = 86400
HOUR = 3600


def ge_users_lock(path: Path) -> None:
    """Make ``path`` a lock file as GE's ``LockAndOpenCacheFile`` leaves it for the user who
    owns it (``0640``: its ``chmod`` worked), that user being ``nobody`` — not this process,
    whose own lock would make it group-writable (``locks.open_lock_file``), and a group-writable
    lock file is never unlinked (``files.lock_reapable``)."""
    path.write_bytes(b"")
    path.chmod(0o640)
    os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)


def make_entry(
    chip: Path, kernel: str, size: int, atime_s: float, mtime_s: float | None = None
) -> int:
    """Write a valid single-binary entry of exactly ``size`` bytes (json + binary) and set its
    access time (seconds). Fast: no store, no lock file. Returns ``size``."""
    chip.mkdir(parents=True, exist_ok=True)
    json_len = len(json.dumps(kernel_json(kernel, b"")).encode())  # sha256 has a fixed length
    binary = b"\0" * (size - json_len)
    raw = json.dumps(kernel_json(kernel, binary)).encode()
    assert len(raw) + len(binary) == size
    (chip / f"{kernel}.o").write_bytes(binary)
    (chip / f"{kernel}.json").write_bytes(raw)
    mtime = mtime_s if mtime_s is not None else atime_s
    for name in (f"{kernel}.o", f"{kernel}.json"):
        os.utime(chip / name, (atime_s, mtime))
    return size


def set_old(path: Path, age_s: float) -> None:
    """Give ``path`` access and modification times ``age_s`` seconds in the past."""
    t = time.time() - age_s
    os.utime(path, (t, t))


def names(chip: Path) -> set[str]:
    return set(os.listdir(chip))


def kernels(chip: Path) -> set[str]:
    return {n[:-5] for n in names(chip) if n.endswith(".json")}


@pytest.fixture
def twelve(chip: Path) -> Path:
    """12 entries of exactly 1 MiB each; k00 accessed longest ago, k11 most recently."""
    for i in range(12):
        make_entry(chip, f"te_k_{i:02d}", MIB, NOW_S - DAY + i * 60)
    return chip


# --- the pure plan -----------------------------------------------------------------------


def test_plan_evicts_least_recently_accessed_down_to_the_target(twelve: Path) -> None:
    scan = entry.scan_chip(twelve)
    assert scan.used_bytes == 12 * MIB
    plan = plan_eviction(scan, max_mb=10, ratio_pct=50, min_age_s=1800, now_ns=NOW_S * 10**9)
    assert plan.triggered and plan.max_bytes == 10 * MIB and plan.target_bytes == 5 * MIB
    assert plan.kernels == [f"te_k_{i:02d}" for i in range(7)]  # 12 - 7 = 5 MiB left
    assert plan.evict_bytes == 7 * MIB and not plan.kept_by_age
    assert [g.kernel for g in plan.reserve] == [f"te_k_{i:02d}" for i in range(7, 12)]


def test_plan_order_is_by_main_json_atime_not_name(chip: Path) -> None:
    for name, age in (("te_a", 10), ("te_b", 30), ("te_c", 20)):
        make_entry(chip, name, MIB, NOW_S - DAY * age)
    plan = plan_eviction(entry.scan_chip(chip), 2, 50, 1800, NOW_S * 10**9)
    assert plan.kernels == ["te_b", "te_c"]  # 3 MiB -> 1 MiB: oldest two


def test_trigger_is_used_at_or_above_max(twelve: Path) -> None:
    scan = entry.scan_chip(twelve)
    assert plan_eviction(scan, 12, 50, 0, NOW_S * 10**9).triggered  # used == max
    below = plan_eviction(scan, 13, 50, 0, NOW_S * 10**9)
    assert not below.triggered and not below.candidates and below.need_bytes == 0


def test_force_ratio_runs_below_the_trigger(twelve: Path) -> None:
    scan = entry.scan_chip(twelve)
    plan = plan_eviction(scan, 20, 50, 0, NOW_S * 10**9, force_ratio=True)
    assert plan.kernels == [f"te_k_{i:02d}" for i in range(2)]  # 12 -> 10 MiB
    assert not plan_eviction(scan, 40, 50, 0, NOW_S * 10**9, force_ratio=True).candidates


def test_aging_guard_keeps_recent_entries_and_says_which(chip: Path) -> None:
    for i in range(6):
        make_entry(chip, f"te_old_{i}", MIB, NOW_S - DAY + i)
    for i in range(6):  # accessed 100..600 s ago: inside GE's 1800 s
        make_entry(chip, f"te_new_{i}", MIB, NOW_S - 600 + i * 100)
    plan = plan_eviction(entry.scan_chip(chip), 10, 50, 1800, NOW_S * 10**9)
    assert plan.kernels == [f"te_old_{i}" for i in range(6)]
    assert [g.kernel for g in plan.kept_by_age] == ["te_new_0"]  # the 7th MiB it needed
    assert not plan.reserve
    unguarded = plan_eviction(entry.scan_chip(chip), 10, 50, 0, NOW_S * 10**9)
    assert unguarded.kernels == [*(f"te_old_{i}" for i in range(6)), "te_new_0"]


def test_minus_one_never_evicts(twelve: Path) -> None:
    plan = plan_eviction(entry.scan_chip(twelve), -1, 50, 0, NOW_S * 10**9)
    assert plan.max_bytes is None and not plan.triggered and not plan.candidates


@pytest.mark.parametrize(
    ("max_mb", "ratio", "age", "needle"),
    [(0, 50, 0, "max_op_cache_size=0"), (-2, 50, 0, "max_op_cache_size=-2"),
     (10, 101, 0, "remain_cache_size_ratio=101"), (10, 50, -1, "min_age_s=-1")],
)  # fmt: skip
def test_bad_limits_are_refused(
    twelve: Path, max_mb: int, ratio: int, age: float, needle: str
) -> None:
    with pytest.raises(InvalidInputError, match=needle):
        plan_eviction(entry.scan_chip(twelve), max_mb, ratio, age, NOW_S * 10**9)
    with pytest.raises(InvalidInputError, match=needle):
        gc_chip(twelve, max_mb, ratio, age)
    assert len(kernels(twelve)) == 12


# --- gc on real files ----------------------------------------------------------------------


@pytest.fixture
def aged(chip: Path) -> Path:
    """12 entries of 1 MiB, accessed 12 h down to 1 h ago (all older than the guard)."""
    now = time.time()
    for i in range(12):
        make_entry(chip, f"te_k_{i:02d}", MIB, now - 12 * HOUR + i * HOUR)
    return chip


def test_gc_removes_exactly_the_planned_entries(aged: Path) -> None:
    report = gc_chip(aged, 10, 50)
    gone = [f"te_k_{i:02d}" for i in range(7)]
    assert sorted(report.evicted) == gone
    assert kernels(aged) == {f"te_k_{i:02d}" for i in range(7, 12)}
    assert report.bytes_before == 12 * MIB and report.evicted_bytes == 7 * MIB
    assert report.bytes_after == 5 * MIB == entry.scan_chip(aged).used_bytes
    assert not (report.saved_by_hit or report.gone or report.denied)
    assert names(aged) - {f"te_k_{i:02d}{s}" for i in range(7, 12) for s in (".json", ".o")} == {
        "op_cache_file_del.lock"
    }
    assert report.to_json()["evicted_entries"] == 7


def test_the_report_names_evicted_entries_in_the_plans_order(chip: Path) -> None:
    """The removal threads take the candidates in order and each is recorded in that order,
    as the dry run names them: least recently accessed first (a report interleaved by thread
    said otherwise)."""
    now = time.time()
    for i in range(40):
        make_entry(chip, f"te_o_{i:02d}", 4096, now - DAY + i * 60)
    planned = gc_chip(chip, 1, 1, 0, force_ratio=True, dry_run=DryRun.YES).evicted
    report = gc_chip(chip, 1, 1, 0, force_ratio=True)
    assert len(planned) > 16  # more than one entry per removal thread
    assert report.evicted == planned == [f"te_o_{i:02d}" for i in range(len(planned))]


def test_dry_run_removes_nothing_and_names_the_same_entries(aged: Path) -> None:
    before = names(aged)
    report = gc_chip(aged, 10, 50, dry_run=DryRun.YES)
    assert report.dry_run and report.evicted == [f"te_k_{i:02d}" for i in range(7)]
    assert names(aged) - {"op_cache_file_del.lock"} == before


def test_minus_one_still_reclaims(aged: Path) -> None:
    orphan = aged / "te_gone.o"
    orphan.write_bytes(b"x" * 100)
    set_old(orphan, 2 * HOUR)
    report = gc_chip(aged, -1, 50)
    assert not report.evicted and report.max_bytes is None
    assert report.reclaimed.orphans == 1 and not orphan.exists()
    assert len(kernels(aged)) == 12


def test_mix_entries_are_removed_whole(chip: Path) -> None:
    publish_mix(chip, "te_mix_1", b"a" * 4000, b"b" * 4000)
    publish_mix(chip, "te_mix_2", b"c" * 4000, b"d" * 4000)
    old = time.time() - DAY
    for name in os.listdir(chip):
        if name.startswith("te_mix_1"):
            os.utime(chip / name, (old, old))
    report = gc_chip(chip, 1, 1, 0, force_ratio=True)  # target 10 KiB: one entry must go
    assert report.evicted == ["te_mix_1"]
    # json, subs, bins go; the lock file stays (a GE process may hold it)
    assert [n for n in names(chip) if n.startswith("te_mix_1")] == ["te_mix_1.lock"]
    assert {n for n in names(chip) if n.startswith("te_mix_2")} >= {
        "te_mix_2.json", "te_mix_2_mix_aic.json", "te_mix_2_mix_aiv.json",
        "te_mix_2_mix_aic.o", "te_mix_2_mix_aiv.o",
    }  # fmt: skip


def test_a_concurrent_hit_wins_and_the_next_entry_goes_instead(aged: Path) -> None:
    def hit(plan: EvictionPlan) -> None:
        fsutil.touch_atime(aged / "te_k_03.json")  # what Store.lookup does on a hit

    report = gc_chip(aged, 10, 50, on_planned=hit)
    assert report.saved_by_hit == ["te_k_03"]
    assert (aged / "te_k_03.json").exists() and (aged / "te_k_03.o").exists()
    assert sorted(report.evicted) == [f"te_k_{i:02d}" for i in (0, 1, 2, 4, 5, 6, 7)]
    assert report.bytes_after == 5 * MIB


def test_entries_removed_by_someone_else_mid_run_are_normal(aged: Path) -> None:
    def remove(plan: EvictionPlan) -> None:
        for name in ("te_k_00.json", "te_k_00.o", "te_k_01.json"):
            (aged / name).unlink()

    report = gc_chip(aged, 10, 50, on_planned=remove)
    assert report.gone == ["te_k_00", "te_k_01"]
    assert not report.denied
    assert sorted(report.evicted) == [f"te_k_{i:02d}" for i in range(2, 9)]


def test_a_held_entry_lock_keeps_that_entry(aged: Path) -> None:
    lock = fsutil.FcntlLock(aged / "te_k_00.lock")
    lock.acquire()
    try:
        report = gc_chip(aged, 10, 50)
    finally:
        lock.release()
    assert report.busy == ["te_k_00"] and "te_k_00" in kernels(aged)
    assert "te_k_07" in report.evicted  # the reserve made up for it


def test_entry_lock_files_outlive_their_entry_until_old(
    aged: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GE never re-checks the inode after locking (te_cache_utils.cc LockAndOpenCacheFile):
    # the lock file of an evicted entry stays until its ctime is an hour old
    ge_users_lock(aged / "te_k_00.lock")
    ge_users_lock(aged / "te_k_11.lock")
    report = gc_chip(aged, 10, 50)
    assert "te_k_00" in report.evicted and (aged / "te_k_00.lock").exists()
    gc_chip(aged, 10, 50)
    assert (aged / "te_k_00.lock").exists()  # young: a GE process may be about to lock it
    monkeypatch.setattr(files, "LOCK_REAP_AGE_S", 0)
    assert gc_chip(aged, 10, 50).reclaimed.locks >= 1
    assert not (aged / "te_k_00.lock").exists()
    assert (aged / "te_k_11.lock").exists()  # a live entry's lock is never unlinked


def test_missing_chip_folder_is_nothing_to_do(tmp_path: Path) -> None:
    chip = tmp_path / "kernel_cache" / "Ascend310P3"
    report = gc_chip(chip, 10, 50)
    assert report.skipped == "missing" and not chip.exists() and not chip.parent.exists()
    assert purge_chip(chip).missing


def test_busy_eviction_lock_skips(aged: Path) -> None:
    with fsutil.try_lock(aged / "op_cache_file_del.lock") as taken:
        assert taken
        report = gc_chip(aged, 10, 50)
    assert report.skipped == "busy" and len(kernels(aged)) == 12


# --- reclaim -----------------------------------------------------------------------------


def test_reclaims_orphans_temps_dead_locks_and_bad_entries(
    aged: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "LOCK_REAP_AGE_S", 0)  # dead locks' age is tested apart
    chip = aged
    loose = {
        "te_dead.o": 2 * HOUR,  # binary with no json: reclaimed
        "te_young.o": 10,  # a publish between its renames, maybe: kept
        "te_k_00.o.host.1.ab.temp": 2 * HOUR,  # dead writer's temp: reclaimed
        "te_k_01.json.host.2.cd.temp": 60,  # write in progress: kept
        "te_dead.lock": 0,  # lock of an entry that no longer exists: reclaimed
        "te_k_11.lock": 0,  # a live entry's lock: kept
        ".nfs000000000012345600000001": 2 * HOUR,  # NFS: open on another host: left
    }
    for name, age in loose.items():
        if name.endswith(".lock"):
            ge_users_lock(chip / name)
        else:
            (chip / name).write_bytes(b"x" * 10)
        set_old(chip / name, age)
    (chip / "te_bad_json.json").write_text("{ not json")  # unparsable, no binary
    (chip / "te_no_bin.json").write_text(json.dumps(kernel_json("te_no_bin", b"x")))
    odd = kernel_json("te_odd", b"payload")  # binary not named after the json: resolved
    odd["binFileName"] = "te_odd_binary"
    (chip / "te_odd.json").write_text(json.dumps(odd))
    (chip / "te_odd_binary.o").write_bytes(b"payload")
    set_old(chip / "te_odd_binary.o", 2 * HOUR)

    report = gc_chip(chip, -1, 50)
    rec = report.reclaimed
    assert (rec.orphans, rec.temps, rec.locks, rec.bad_entries) == (1, 1, 1, 2)
    assert sorted(b.split(":")[0] for b in rec.bad) == ["te_bad_json", "te_no_bin"]
    left = names(chip)
    assert not {"te_dead.o", "te_k_00.o.host.1.ab.temp", "te_dead.lock"} & left
    assert not {"te_bad_json.json", "te_no_bin.json"} & left  # their new lock files stay
    assert {"te_young.o", "te_k_01.json.host.2.cd.temp", "te_k_11.lock"} <= left
    assert ".nfs000000000012345600000001" in left
    assert {"te_odd.json", "te_odd_binary.o"} <= left  # opened, resolved, kept
    assert len(kernels(chip) - {"te_odd"}) == 12


def test_a_json_that_is_a_folder_is_reported_and_left(aged: Path) -> None:
    (aged / "te_dir.json").mkdir()
    (aged / "te_dir.o").write_bytes(b"x")
    set_old(aged / "te_dir.o", 2 * HOUR)
    report = gc_chip(aged, 10, 50)
    assert report.odd == {"te_dir.json": "not_a_file"}
    assert (aged / "te_dir.json").is_dir() and (aged / "te_dir.o").exists()
    # its 1 byte still counts in the used size (docs/design.md#size-limits-and-eviction) and is not
    # reclaimable: 8 must go
    assert sorted(report.evicted) == [f"te_k_{i:02d}" for i in range(8)] and not report.denied


@contextmanager
def immutable(path: Path) -> Iterator[None]:
    """Make ``path`` undeletable even for root (``chattr +i``), or skip the test."""
    if not shutil.which("chattr"):
        pytest.skip("chattr not found: cannot make a file undeletable as root")
    proc = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"chattr +i unsupported here: {proc.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_permission_denied_file_is_skipped_reported_and_the_run_goes_on(aged: Path) -> None:
    with immutable(aged / "te_k_01.json"):
        report = gc_chip(aged, 10, 50)
    assert [d.split(":")[0] for d in report.denied] == ["te_k_01.json"]
    assert {"te_k_01.json", "te_k_01.o"} <= names(aged)  # the entry stays whole
    assert sorted(report.evicted) == [f"te_k_{i:02d}" for i in (0, *range(2, 8))]


# --- two processes -------------------------------------------------------------------------

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from cachemgr.eviction import gc_chip
    chip, ready, go = map(Path, sys.argv[1:4])
    def wait(plan):
        ready.write_text(str(len(plan.candidates)))
        deadline = time.monotonic() + 60
        while not go.exists():
            if time.monotonic() > deadline:
                sys.exit("go file never came")
            time.sleep(0.01)
    report = gc_chip(chip, 10, 50, on_planned=wait)
    print(len(report.evicted), report.skipped)
    """
)


@contextmanager
def gc_in_another_process(chip: Path, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A real process running gc_chip on ``chip``, paused between plan and removal."""
    ready, go = tmp_path / "ready", tmp_path / "go"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(chip), str(ready), str(go)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, "the holder exited early"
            assert time.monotonic() < deadline, "the holder never planned"
            time.sleep(0.01)
        yield proc
    finally:
        go.write_text("go")
        proc.wait(timeout=60)


def test_two_evictors_at_once_one_skips(aged: Path, tmp_path: Path) -> None:
    with gc_in_another_process(aged, tmp_path) as first:
        second = gc_chip(aged, 10, 50)
        assert second.skipped == "busy" and not second.evicted
        assert len(kernels(aged)) == 12
    out, _ = first.communicate(timeout=60)
    assert first.returncode == 0 and out.split() == ["7"]
    assert len(kernels(aged)) == 5


# --- purge and usage -----------------------------------------------------------------------


def test_purge_removes_everything_but_writes_in_progress(
    aged: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "LOCK_REAP_AGE_S", 0)  # lock files old enough to go
    publish_mix(aged, "te_mix", b"a" * 10, b"b" * 10)
    ge_users_lock(aged / "te_k_00.lock")
    (aged / "te_orphan.o").write_bytes(b"x")
    (aged / "te_x.o.h.1.a.temp").write_bytes(b"x")  # young: a write in progress
    report = purge_chip(aged)
    assert report.entries == 13 and not report.busy and not report.denied
    left = names(aged) - {"te_x.o.h.1.a.temp", "op_cache_file_del.lock"}
    # the lock files cachemgr made taking each entry's lock are group-writable: a member's GE
    # may have one open and fail to chmod it, so they stay (files.lock_reapable); the GE
    # user's own old 0640 one goes with its entry
    assert left == {f"te_k_{i:02d}.lock" for i in range(1, 12)} | {"te_mix.lock"}, left
    assert all((aged / name).stat().st_mode & 0o020 for name in left)
    assert report.left_temps == ["te_x.o.h.1.a.temp"]


def test_purge_waits_for_a_running_gc_then_gives_up(aged: Path, tmp_path: Path) -> None:
    with gc_in_another_process(aged, tmp_path):
        with pytest.raises(LockBusyError, match=r"op_cache_file_del\.lock"):
            purge_chip(aged, lock_wait_s=0.3)
        assert len(kernels(aged)) == 12


def test_chip_usage(aged: Path) -> None:
    usage = chip_usage(aged)
    assert (usage.entries, usage.bytes) == (12, 12 * MIB)
    assert usage.oldest_atime_ns is not None and usage.newest_atime_ns is not None
    assert usage.newest_atime_ns - usage.oldest_atime_ns == pytest.approx(11 * HOUR * 1e9, rel=1e-3)
