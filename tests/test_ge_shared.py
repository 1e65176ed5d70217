"""cachemgr and the GE twin on one kernel cache at the same time, as two users of one group:
GE's 0640/0750 modes, every kernel cache
under ``ASCEND_CACHE_PATH``, a daemon that follows the ini and the toolkit by itself."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

from cachemgr.config.ini import OpCacheIni
from cachemgr.storage import entry, fsutil
from tests import ge_twin
from tests.conftest import ROOT, SOC, run_cli
from tests.daemon_util import daemon_env, start_daemon, wait_first_scan, wait_for
from tests.test_ge_interop import REQUESTS, fake_toolkit, set_old
from tests.test_two_users import _request
from tests.users_util import Runtime, Users, run_as, user_home

HOUR = 3600


def _shared_root(users: Users) -> Path:
    root = users.base / "shared"
    root.mkdir()
    shutil.chown(root, "root", users.group)
    root.chmod(0o2775)  # docs/shared-cache.md's setup: setgid, group-writable
    return root


def _twin(users: Users) -> Path:
    """A world-readable copy of the GE twin (standalone: it imports nothing of cachemgr)."""
    path = users.base / "ge_twin.py"
    if not path.exists():
        shutil.copy(ROOT / "tests" / "ge_twin.py", path)
        path.chmod(0o644)
    return path


def _env(users: Users, rt: Runtime, name: str) -> dict[str, str]:
    home = users.base / name
    if not home.exists():
        home = user_home(users, name)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": rt.pythonpath,
        "HOME": str(home),
        "XDG_RUNTIME_DIR": str(home),
    }


def as_user(
    users: Users, rt: Runtime, name: str, *args: str, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``cachemgr ARGS`` run as ``name`` (umask 022, a careless one on purpose)."""
    return _run_as(users, rt, name, ["-m", "cachemgr", *args], timeout)


def twin_as(
    users: Users, rt: Runtime, name: str, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The GE twin run as ``name``, as a CANN process of that user would run."""
    return _run_as(users, rt, name, [str(_twin(users)), *args], timeout)


def _run_as(
    users: Users, rt: Runtime, name: str, argv: list[str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``python ARGV`` of the other runtime, run as ``name`` in that user's environment."""
    return subprocess.run(
        [rt.python, *argv],
        env=_env(users, rt, name),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **run_as(name, users),  # type: ignore[arg-type]
    )


# --- GE's file modes do not lock cachemgr out -------------------------------------


def test_a_ge_eviction_lock_file_is_respected_by_a_group_member(
    users: Users, other_runtime: Runtime
) -> None:
    rt = other_runtime
    root = _shared_root(users)
    chip = fsutil.ensure_dir(root / "kernel_cache" / SOC)  # made by cachemgr: 2775
    for i in range(3):
        assert twin_as(users, rt, users.alice, "write", str(chip), f"te_ge_{i}").returncode == 0
    assert twin_as(users, rt, users.alice, "evict", str(chip), "1", "50").returncode == 0
    lock = chip / "op_cache_file_del.lock"
    assert stat.S_IMODE(lock.stat().st_mode) == 0o640 and lock.stat().st_uid != 0  # GE's
    proc = as_user(users, rt, users.bob, "gc", "--json", "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stdout + proc.stderr  # was: Permission denied, exit 1
    assert json.loads(proc.stdout)["chip_folders"][SOC]["skipped"] == ""
    # while bob's cachemgr holds it (a read lock + its own companion lock), GE cannot evict
    # and another cachemgr process cannot take it either
    hold = (
        "import sys, time; from pathlib import Path; from cachemgr.storage import fsutil; "
        "lock = fsutil.FcntlLock(Path(sys.argv[1])); "
        "print(lock.acquire(blocking=False), flush=True); time.sleep(float(sys.argv[2]))"
    )
    holder = subprocess.Popen(
        [rt.python, "-c", hold, str(lock), "60"],
        env=_env(users, rt, users.bob),
        stdout=subprocess.PIPE,
        text=True,
        **run_as(users.bob, users),  # type: ignore[arg-type]
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "True"
        ge = twin_as(users, rt, users.alice, "evict", str(chip), "1", "50")
        assert ge.stdout.strip() == "<busy>", ge
        other = subprocess.run(
            [rt.python, "-c", hold, str(lock), "0"],
            env=_env(users, rt, users.bob),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            **run_as(users.bob, users),  # type: ignore[arg-type]
        )
        assert other.stdout.strip() == "False", other
    finally:
        holder.kill()
        holder.wait()
    assert twin_as(users, rt, users.alice, "evict", str(chip), "1", "50").stdout.strip() != "<busy>"


def test_a_folder_ge_created_compiles_outside_the_cache_with_one_line(
    users: Users, other_runtime: Runtime, tmp_path: Path
) -> None:
    rt = other_runtime
    root = _shared_root(users)
    chip = root / "kernel_cache" / SOC
    assert twin_as(users, rt, users.alice, "write", str(chip), "te_ge_0").returncode == 0
    assert stat.S_IMODE(chip.stat().st_mode) == 0o2750  # GE's 0750 (setgid inherited)
    req = users.base / "req.json"
    req.write_text(json.dumps(_request(rt, 7)))
    req.chmod(0o644)
    out = users.base / "out"
    out.mkdir()
    shutil.chown(out, users.bob)
    proc = as_user(
        users, rt, users.bob, "compile", str(req), "--json", "--out-dir", str(out),
        "--cache-dir", str(root),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.splitlines()[0])
    assert result["status"] == "compiled" and not (chip / f"{result['kernel_name']}.json").exists()
    lines = [line for line in proc.stderr.splitlines() if "not cached" in line]
    assert len(lines) == 1, proc.stderr  # said once (it was logged, then warned again)
    for needle in (
        str(chip),
        users.alice,
        "drwxr-s---",
        f"'chgrp {users.group} {chip.parent} && chmod 2770 {chip.parent}'",
    ):
        assert needle in lines[0], lines[0]
    # gc there: GE's 0640 eviction lock in a folder bob may not write: that chip folder is
    # skipped with one warning line, exit 1 (the others would be collected: attack review)
    assert twin_as(users, rt, users.alice, "evict", str(chip), "1", "50").returncode == 0
    gc = as_user(users, rt, users.bob, "gc", "--cache-dir", str(root))
    assert gc.returncode == 1 and len(gc.stderr.strip().splitlines()) == 1, gc
    for needle in (str(chip / "op_cache_file_del.lock"), users.alice, "drwxr-s---", "chmod"):
        assert needle in gc.stderr, gc.stderr
    assert (chip / "te_ge_0.json").exists()


def test_the_systemd_unit_names_the_capability_it_needs() -> None:
    unit = (ROOT / "systemd" / "cachemgr.service").read_text()
    assert "AmbientCapabilities=CAP_FOWNER" in unit.splitlines()


def test_the_daemon_gives_ge_files_back_to_the_group(
    users: Users, other_runtime: Runtime, tmp_path: Path
) -> None:
    rt = other_runtime
    root = _shared_root(users)
    chip = root / "kernel_cache" / SOC
    for i in range(2):
        assert twin_as(users, rt, users.alice, "write", str(chip), f"te_ge_{i}").returncode == 0
    assert stat.S_IMODE((chip / "te_ge_0.json").stat().st_mode) == 0o640
    cfg = tmp_path / "c.toml"
    cfg.write_text("[daemon]\nreconcile_interval_s = 1\nreconcile_jitter_s = 0\n")
    daemon = start_daemon(tmp_path, "--cache-dir", str(root), "--config", str(cfg))  # root:
    try:  # CAP_FOWNER, as AmbientCapabilities=CAP_FOWNER in systemd/cachemgr.service gives

        def shared() -> bool:  # in the first scan, right after READY=1
            folders = all(
                stat.S_IMODE(f.stat().st_mode) & 0o2070 == 0o2070
                for f in (root / "kernel_cache", chip)
            )
            return folders and all(
                stat.S_IMODE(p.stat().st_mode) & 0o060 == 0o060 for p in chip.iterdir()
            )

        wait_for(shared, 60, "GE's files given back to the group")
        assert twin_as(users, rt, users.alice, "write", str(chip), "te_ge_9").returncode == 0
        late = chip / "te_ge_9.json"
        wait_for(lambda: stat.S_IMODE(late.stat().st_mode) & 0o060 == 0o060, 60, "g+rw again")
        # bob may now publish beside GE's entries
        assert as_user(users, rt, users.bob, "gc", "--cache-dir", str(root)).returncode == 0
    finally:
        daemon.stop()


def test_ge_and_cachemgr_share_one_folder_as_two_users(
    users: Users, other_runtime: Runtime
) -> None:
    """The GE twin (alice) writes and hits every kind of entry while cachemgr (bob) compiles,
    collects, verifies and repairs on the same chip folder: nobody loses a valid entry and
    nothing corrupt is ever served."""
    rt = other_runtime
    root = _shared_root(users)
    chip = fsutil.ensure_dir(root / "kernel_cache" / SOC)
    ge = subprocess.Popen(
        [rt.python, str(_twin(users)), "loop", str(chip), "te_ge_", "8"],
        env=_env(users, rt, users.alice),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **run_as(users.alice, users),  # type: ignore[arg-type]
    )
    reqs = []
    for n in range(3):
        req = users.base / f"req{n}.json"
        req.write_text(json.dumps(_request(rt, 20 + n)))
        req.chmod(0o644)
        reqs.append(str(req))
    deadline = time.monotonic() + 8
    rounds = 0
    while time.monotonic() < deadline or rounds < 2:
        for args in (["compile", *reqs], ["gc"], ["verify", "--repair"]):
            proc = as_user(users, rt, users.bob, *args, "--cache-dir", str(root))
            assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
            assert "Traceback" not in proc.stderr
        rounds += 1
    out, err = ge.communicate(timeout=120)
    assert ge.returncode == 0, err
    written = {line.split()[1] for line in out.splitlines() if line.startswith("wrote ")}
    assert written, out
    for kernel in written:  # every GE entry is still there, and GE still serves it
        assert (chip / f"{kernel}.json").exists(), kernel
        if kernel.endswith("_pre"):
            assert ge_twin.hit_pre(chip, kernel)
        elif "jsonList" not in json.loads((chip / f"{kernel}.json").read_text()):
            assert ge_twin.hit(chip, kernel, touch=False), kernel
    final = as_user(users, rt, users.bob, "verify", "--json", "--cache-dir", str(root))
    assert final.returncode == 0 and json.loads(final.stdout)["bad"] == 0, final.stdout
    for kernel in entry.scan_chip(chip).entries:
        assert entry.check_entry(chip, kernel)[1] == [], kernel


# --- every kernel cache under ASCEND_CACHE_PATH -------------------------------------


def _ini(kc: Path, max_mb: int) -> None:
    kc.mkdir(parents=True, exist_ok=True)
    (kc / "op_cache.ini").write_text(
        "[op_compiler_cache]\nadk_version=8.0.RC1\nops_version=8.0.RC1\n"
        f"max_op_cache_size={max_mb}\nremain_cache_size_ratio=50\n"
    )


def test_every_kernel_cache_under_ascend_cache_path_is_governed(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    acp = tmp_path / "acp"
    env = {
        **clean_env,
        **fake_toolkit(tmp_path / "Ascend"),
        "ASCEND_CACHE_PATH": str(acp),
        "CACHEMGR_HOST_ID": "h1",
    }
    ge_kc, mine = acp / "kernel_cache", acp / "kernel_cache_h1"
    for kc, max_mb in ((ge_kc, 1), (mine, 500)):
        _ini(kc, max_mb)  # each with its own limits
        for i in range(3):
            ge_twin.write_entry(kc / SOC, f"te_big_{i}", size=400_000)
            for name in (f"te_big_{i}.json", f"te_big_{i}.o"):
                set_old(kc / SOC / name, 2 * HOUR + i)
    cfg = json.loads(run_cli("config", "--json", env=env).stdout)
    assert cfg["governed_kernel_caches"]["value"] == [str(mine), str(ge_kc)]
    stats = json.loads(run_cli("stats", "--json", env=env).stdout)
    assert stats["other_kernel_caches"][str(ge_kc)][SOC]["entries"] == 3
    assert stats["other_kernel_caches"][str(ge_kc)][SOC]["limit_mb"] == 1
    report = json.loads(run_cli("gc", "--json", env=env).stdout)
    other = report["other_kernel_caches"][str(ge_kc)]
    assert other["chip_folders"][SOC]["evicted_entries"] == 2  # 1.2 MB down to 0.5 MB
    assert report["chip_folders"][SOC]["evicted_entries"] == 0  # its own 500 MB limit
    assert len(list((mine / SOC).glob("*.json"))) == 3
    proc = run_cli("compile", str(REQUESTS / "add_c.json"), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    kernel = json.loads(proc.stdout.splitlines()[0])["kernel_name"]
    assert (mine / SOC / f"{kernel}.json").exists()  # compiles publish into the resolved one
    # the daemon governs them too: a new GE entry over the limit is evicted by itself
    for i in range(3, 6):
        ge_twin.write_entry(ge_kc / SOC, f"te_big_{i}", size=400_000)
        for name in (f"te_big_{i}.json", f"te_big_{i}.o"):
            set_old(ge_kc / SOC / name, 2 * HOUR)
    denv = daemon_env(tmp_path, env)
    denv.update({k: v for k, v in env.items() if k.startswith(("ASCEND_", "CACHEMGR_HOST"))})
    daemon = start_daemon(tmp_path, env=denv)
    try:  # at start: in the first scan, right after READY=1
        wait_first_scan(daemon)
        assert len(list((ge_kc / SOC).glob("*.json"))) == 1
    finally:
        daemon.stop()


# --- the daemon follows the ini and the toolkit by itself ----------------------------


def test_the_daemon_follows_the_ini_and_the_toolkit(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    tk = fake_toolkit(tmp_path / "Ascend")
    root = tmp_path / "root"
    kc = root / "kernel_cache"
    _ini(kc, 500)
    for i in range(2):
        ge_twin.write_entry(kc / SOC, f"te_k_{i}")
    cfg = tmp_path / "c.toml"
    cfg.write_text("[daemon]\nreconcile_interval_s = 1\nreconcile_jitter_s = 0\n")
    env = daemon_env(tmp_path)
    env.update(tk)
    daemon = start_daemon(tmp_path, "--cache-dir", str(root), "--config", str(cfg), env=env)
    try:
        client = daemon.client
        assert client.config()["max_op_cache_size"]["value"] == 500
        assert len(list((kc / SOC).glob("*.json"))) == 2  # stamps match: kept
        text = (kc / "op_cache.ini").read_text().replace("=500", "=7")
        (kc / "op_cache.ini").write_text(text)  # edited by hand: no reload asked for
        wait_for(lambda: client.config()["max_op_cache_size"]["value"] == 7, 60, "the new limit")
        # a toolkit upgrade under the running daemon: GE's rule, at the next reconciliation
        Path(tk["ASCEND_OPP_PATH"], "version.info").write_text("Version=9.0.0\n")
        wait_for(lambda: not list((kc / SOC).glob("*.json")), 60, "the purge after an upgrade")
        wait_for(  # the ini is restamped after the purge (versions.sync_toolkit): not at once
            lambda: OpCacheIni.load(kc / "op_cache.ini").ge.stamps == ("8.0.RC1", "9.0.0"),
            60,
            "the restamp after the purge",
        )
        assert "reason: upgraded" in daemon.log()
    finally:
        daemon.stop()


def test_pack_all_skips_ge_dynamic_entries_with_a_note(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    proc = run_cli("compile", str(REQUESTS / "add_c.json"), "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 0, proc.stderr
    ge_twin.write_entry(root / "kernel_cache" / SOC, "te_Mul_dyn", kind="dynamic")
    out = tmp_path / "pkg"
    proc = run_cli("pack", "--out", str(out), "--all", "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 0, proc.stderr
    assert "te_Mul_dyn" in proc.stderr and "skipped" in proc.stderr
    assert any(p.suffix == ".o" for p in out.rglob("*"))
