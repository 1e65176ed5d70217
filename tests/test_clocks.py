"""Clocks: access times in the future are suspect — warned about, ordered by
when cachemgr first saw them, and a folder left over its limit because everything is "young"
is reported; reads that are not hits (``ls``, ``verify``) never change access times, for any
user. Real future times set with ``os.utime``; real users (root only)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import SOC, publish, run_cli
from tests.daemon_util import Daemon, start_daemon, wait_for
from tests.shared_util import chip_bytes
from tests.users_util import Runtime, Users, run_as, user_home

AHEAD_S = 3600  # a host whose clock runs an hour ahead


def _cache(root: Path) -> Path:
    kc = root / "kernel_cache"
    kc.mkdir(parents=True)
    (kc / "op_cache.ini").write_text(
        "[op_compiler_cache]\nmax_op_cache_size=1\n"
        "remain_cache_size_ratio=50\nadk_version=1\nops_version=1\n"
    )
    return kc / SOC


def _future(chip: Path, n: int) -> None:
    ahead = time.time() + AHEAD_S
    for i in range(n):
        publish(chip, f"te_ahead_{i:02d}", os.urandom(100 * 1024), atime_s=ahead + i)


def test_gc_reports_a_folder_kept_over_its_limit_by_future_times(tmp_path: Path, clean_env) -> None:
    chip = _cache(tmp_path / "cache")
    _future(chip, 12)  # 1.2 MiB > 1 MiB, every entry "accessed" an hour from now
    out = run_cli("gc", "--json", "--cache-dir", str(tmp_path / "cache"), env=clean_env)
    assert out.returncode == 1, out.stderr
    folder = json.loads(out.stdout)["chip_folders"][SOC]
    assert folder["stuck_over_limit"] is True and folder["future_atimes"] == 12
    assert folder["max_skew_s"] > AHEAD_S - 60
    assert "in the future" in out.stderr and "owner root" in out.stderr
    assert "still over its limit" in out.stderr
    assert chip_bytes(chip) > 1 << 20  # nothing evicted: they are "young" since first seen


# alone: beside three other workers at load 4 the warning was missing once in three CI runs
# (the daemon's gc runs raced the test's writes of the future atimes); not yet understood
@pytest.mark.serial
def test_daemon_orders_future_times_by_first_sight_and_evicts(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    chip = _cache(root)
    cfg = tmp_path / "c.toml"
    cfg.write_text("min_age_s = 0\n[daemon]\nevict_debounce_s = 0.2\n")
    d = start_daemon(tmp_path, "--cache-dir", str(root), "--config", str(cfg))
    try:
        _future(chip, 12)
        wait_for(lambda: chip_bytes(chip) <= 512 * 1024, 30, "eviction despite future times")
        left = len(list(chip.glob("te_ahead_*.json")))
        assert 1 <= left < 12
        # the report lands after the files are gone, and under load a second run (events
        # still queued when the first began) may follow: wait for the last run's figures,
        # which count every entry left (all from the future), never 0
        row = wait_for(
            lambda: _row_counting(d, left), 30, f"stats counting {left} future access times"
        )
        assert row["stuck_over_limit"] is False
        metrics = d.client.request("GET", "/metrics")
        assert f'cachemgr_chip_future_atimes{{soc_version="{SOC}"}}' in metrics
    finally:
        d.stop()
    assert d.log().count("access times in the future") == 1  # once per folder


def _row_counting(d: Daemon, left: int) -> dict[str, object] | None:
    """The chip folder's stats row once it counts at least ``left`` future access times."""
    row = d.client.stats().to_json()["chip_folders"][SOC]
    return row if row["future_atimes"] >= left else None


def test_a_folder_under_its_limit_reports_its_future_times(tmp_path: Path, clean_env) -> None:
    chip = _cache(tmp_path / "cache")
    _future(chip, 3)  # 300 KiB < 1 MiB: nothing to evict, the skew is reported all the same
    out = run_cli("gc", "--json", "--cache-dir", str(tmp_path / "cache"), env=clean_env)
    assert out.returncode == 0, out.stderr
    folder = json.loads(out.stdout)["chip_folders"][SOC]
    assert folder["future_atimes"] == 3 and folder["stuck_over_limit"] is False
    assert folder["evicted_entries"] == 0 and "in the future" in out.stderr
    assert len(list(chip.glob("te_ahead_*.json"))) == 3


def test_a_hit_stamps_the_filesystem_time_and_keeps_mtime(tmp_path: Path) -> None:
    chip = tmp_path / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    doc = publish(chip, "te_hit_0", b"x" * 100, atime_s=time.time() + AHEAD_S)
    mtime = doc.stat().st_mtime_ns
    from cachemgr.storage.store import Store

    assert Store(chip).lookup("te_hit_0").hit
    st = doc.stat()
    assert abs(st.st_atime - time.time()) < 60, "the future time is replaced by now"
    assert st.st_mtime_ns == mtime


def test_verify_and_ls_by_another_user_keep_access_times(
    users: Users, other_runtime: Runtime
) -> None:
    root = users.base / "shared"
    root.mkdir()
    shutil.chown(root, "root", users.group)
    root.chmod(0o2775)
    chip = root / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    for i in range(3):
        publish(chip, f"te_owned_{i}", os.urandom(4096))
    for path in [root / "kernel_cache", chip, *chip.iterdir()]:
        shutil.chown(path, users.alice, users.group)  # alice's entries; atime == mtime
    for path in chip.iterdir():
        path.chmod(0o664)
    before = {p.name: p.stat().st_atime_ns for p in chip.iterdir()}
    home = user_home(users, users.bob)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": other_runtime.pythonpath}
    for cmd in ("verify", "ls"):
        out = subprocess.run(
            [other_runtime.python, "-m", "cachemgr", cmd, "--cache-dir", str(root)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            **run_as(users.bob, users),  # type: ignore[arg-type]
        )
        assert out.returncode == 0, out.stderr
        if cmd == "verify":
            assert "not checked: 3 entries" in out.stderr, out.stderr
    after = {p.name: p.stat().st_atime_ns for p in chip.iterdir()}
    assert after == before, "a read by bob changed alice's access times (the LRU order)"
