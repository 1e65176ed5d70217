"""Every writer checks its locks: a CLI run without a daemon probes the
cache root's fcntl locks as the daemon does (answer cached per mount) and refuses or falls
back to the local cache by the same ``lock_fallback``; ``stats`` reports a chip folder it
cannot read and goes on with the others."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from cachemgr.cli.lockcheck import mount_key
from tests.compile_util import write_request
from tests.conftest import SOC, publish, run_cli
from tests.users_util import Runtime, Users, run_as, user_home


def _seed(env: dict[str, str], root: Path, ok: bool, detail: str) -> Path:
    """Record a probe answer for the mount of ``root`` in the CLI's per-mount cache."""
    cache = Path(env["XDG_CACHE_HOME"]) / "cachemgr" / "lockprobe.json"
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({mount_key(root): {"ok": ok, "detail": detail, "at": time.time()}}))
    return cache


def test_cli_refuses_or_falls_back_when_locks_do_not_work(
    tmp_path: Path, clean_env, request: pytest.FixtureRequest
) -> None:
    env = {**clean_env, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    root = tmp_path / "cache"
    root.mkdir()
    _seed(env, root, False, "a lock held by one process was not seen by another (test)")
    req = write_request(tmp_path / "req")
    out = run_cli("compile", str(req), "--cache-dir", str(root), env=env, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert 'lock_fallback = "local"' in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not list(root.rglob("*.json")), "nothing written into a cache that cannot lock"
    other = Path("/dev/shm")  # the local cache lives on another mount (probed on its own)
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second mount for the local cache")
    local = Path(tempfile.mkdtemp(dir=other, prefix="cachemgr-local-"))
    request.addfinalizer(lambda: shutil.rmtree(local, ignore_errors=True))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[daemon]\nlock_fallback = "local"\nlocal_cache_dir = "{local}"\n')
    out = run_cli(
        "compile",
        str(req),
        "--json",
        "--cache-dir",
        str(root),
        "--config",
        str(cfg),
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["status"] == "compiled" and doc["files"][0].startswith(str(local / "kernel_cache"))
    assert "serving the local cache" in out.stderr
    gc = run_cli("gc", "--cache-dir", str(root), env=env)
    assert gc.returncode == 2 and "lock" in gc.stderr


def test_the_probe_answer_is_cached_per_mount(tmp_path: Path, clean_env) -> None:
    env = {**clean_env, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    root = tmp_path / "cache"
    req = write_request(tmp_path / "req")
    first = run_cli("compile", str(req), "--cache-dir", str(root), env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    cache = tmp_path / "xdg" / "cachemgr" / "lockprobe.json"
    answers = json.loads(cache.read_text())
    assert [a["ok"] for a in answers.values()] == [True]
    stamp = cache.stat().st_mtime_ns
    again = run_cli("compile", str(req), "--cache-dir", str(root), env=env, cwd=tmp_path)
    assert again.returncode == 0 and cache.stat().st_mtime_ns == stamp, "probed again"
    assert not list((root / "kernel_cache").glob(".cachemgr-lockprobe*"))


def test_stats_reports_a_folder_it_cannot_read_and_goes_on(
    users: Users, other_runtime: Runtime
) -> None:
    root = users.base / "shared"
    kc = root / "kernel_cache"
    for soc in (SOC, "Ascend310P3"):
        (kc / soc).mkdir(parents=True)
        publish(kc / soc, f"te_{soc.lower()}_0", os.urandom(1000))
    for path in [root, kc, *kc.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    (kc / "Ascend310P3").chmod(0o000)  # this folder answers EACCES (as ESTALE would)
    home = user_home(users, users.alice)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": other_runtime.pythonpath}
    out = subprocess.run(
        [other_runtime.python, "-m", "cachemgr", "stats", "--json", "--cache-dir", str(root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        **run_as(users.alice, users),  # type: ignore[arg-type]
    )
    assert out.returncode == 0, out.stderr
    folders = json.loads(out.stdout)["chip_folders"]
    assert folders[SOC]["entries"] == 1
    assert "is not readable by user" in folders["Ascend310P3"]["error"]  # owner, mode, fix


def test_a_remembered_probe_says_so_and_names_its_mount(tmp_path: Path, clean_env) -> None:
    """``-v`` tells a remembered per-mount answer from a probe of the user's folder: it
    names the mount, when and on which folder it was probed (issue: it said ``fcntl locks
    work on <another run's folder>``)."""
    env = {**clean_env, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    req = write_request(tmp_path / "req")
    first_root, root = tmp_path / "first", tmp_path / "cache"
    first = run_cli("compile", str(req), "--cache-dir", str(first_root), "-v", env=env,
                    cwd=tmp_path)  # fmt: skip
    assert first.returncode == 0, first.stderr
    probed = [ln for ln in first.stderr.splitlines() if "fcntl locks work on" in ln]
    assert probed and str(first_root) in probed[0] and "a result remembered in" not in probed[0]
    again = run_cli("compile", str(req), "--cache-dir", str(root), "-v", env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    said = [ln for ln in again.stderr.splitlines() if "fcntl locks" in ln]
    assert len(said) == 1, again.stderr
    mount = mount_key(root)
    assert f"fcntl locks work on mount {mount}: a result remembered in " in said[0], said
    assert f"on {first_root / 'kernel_cache'}, not a probe of this folder" in said[0], said
