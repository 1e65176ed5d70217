"""Outside review (attacker's view) of the daemon: a group member's requests and file names
must never make it answer with an internal error or write forged lines into its log."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from cachemgr.client import DaemonError
from tests.conftest import SOC, kernel_json
from tests.daemon_util import daemon_env, start_daemon, wait_first_scan, wait_for


def test_a_kernel_name_too_long_for_a_file_is_400_not_500(tmp_path: Path) -> None:
    """``/lookup`` of a 100,000-character kernel name was ``500 internal error: OSError:
    [Errno 36] File name too long`` with a full traceback in the log, for each request a
    member sent. Now it is a ``400`` naming the limit, and nothing is logged as an error."""
    root = tmp_path / "root"
    (root / "kernel_cache" / SOC).mkdir(parents=True)
    daemon = start_daemon(tmp_path, "--cache-dir", str(root))
    try:
        for name in ("a" * 100_000, "te_" + "b" * 251):
            with pytest.raises(DaemonError) as raised:
                daemon.client.request("POST", "/lookup", {"soc_version": SOC, "kernel_name": name})
            assert raised.value.status == 400, str(raised.value)
            assert "more than 250 bytes" in str(raised.value)
        ok = daemon.client.request(
            "POST", "/lookup", {"soc_version": SOC, "kernel_name": "te_" + "c" * 247}
        )
        assert ok["status"] == "miss"
        assert "internal error" not in daemon.log() and "Traceback" not in daemon.log()
    finally:
        daemon.stop()


def _plant_entry(chip: Path, kernel: bytes) -> None:
    """A valid entry (json + binary with a matching sha256) under a name a member chose,
    last accessed long ago (eviction takes it first)."""
    binary = b"kernel " + kernel + bytes(600 << 10)  # three of them: over a 1 MB limit
    doc = kernel_json(os.fsdecode(kernel), binary)
    doc["sha256"] = hashlib.sha256(binary).hexdigest()
    base = os.path.join(os.fsencode(chip), kernel)
    with open(base + b".o", "wb") as f:
        f.write(binary)
    with open(base + b".json", "wb") as f:
        f.write(json.dumps(doc).encode())
    for suffix in (b".o", b".json"):
        os.utime(base + suffix, (1, 1))


def test_the_daemons_log_escapes_names_a_member_chose(tmp_path: Path) -> None:
    """With ``[daemon] debug_loggers = "cachemgr.evicted"`` the daemon logs the names it
    evicts; a member's ``te_x\\nERROR forged…`` made a forged log line and ESC sequences
    went to whoever reads the log on a terminal. Now each event is one line, escaped."""
    root = tmp_path / "root"
    chip = root / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    evil = (b"te_x\nERROR cachemgr: forged_1", b"te_y\x1b]0;pwned\x07_2", b"te_z\xff_3")
    for kernel in evil:
        _plant_entry(chip, kernel)
    cfg = tmp_path / "c.toml"
    cfg.write_text('min_age_s = 0\n[daemon]\ndebug_loggers = "cachemgr.evicted"\n')
    env = daemon_env(tmp_path)
    env["ASCEND_MAX_OP_CACHE_SIZE"] = "1"  # MB: the daemon's own eviction logs the names
    daemon = start_daemon(tmp_path, "--config", str(cfg), "--cache-dir", str(root), env=env)
    try:
        wait_for(lambda: b"evicted from" in daemon.log_path.read_bytes(), 60, "an eviction")
    finally:
        daemon.stop()
    log = daemon.log_path.read_bytes()
    assert b"evicted from" in log, log[-2000:]
    assert b"\x1b" not in log and b"\x07" not in log and b"\xff" not in log, log[-2000:]
    assert not any(line.startswith(b"ERROR cachemgr: forged") for line in log.splitlines())
    assert b"te_x\\nERROR cachemgr: forged_1" in log and b"te_z\\xff_3" in log


def _peak_rss_bytes(pid: int) -> int:
    """The process's peak resident memory (``VmHWM``), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_giant_ini_planted_under_a_running_daemon_is_not_read(tmp_path: Path) -> None:
    """The daemon re-reads ``op_cache.ini`` at each reconciliation (an edited limit takes
    effect without a reload). A member truncating it to a sparse giant made it read the whole
    file into memory each time (100 GiB: the OOM killer). Now the file is read up to 1 MiB:
    the daemon warns once per change, keeps serving with env/default limits, and its memory
    stays small."""
    root = tmp_path / "root"
    (root / "kernel_cache" / SOC).mkdir(parents=True)
    cfg = tmp_path / "c.toml"
    cfg.write_text("[daemon]\nreconcile_interval_s = 1\nreconcile_jitter_s = 0\n")
    ini = root / "kernel_cache" / "op_cache.ini"
    ini.write_text(
        "[op_compiler_cache]\nmax_op_cache_size=100\nremain_cache_size_ratio=50\n"
        "adk_version=1\nops_version=1\n"
    )
    daemon = start_daemon(tmp_path, "--config", str(cfg), "--cache-dir", str(root))
    try:
        wait_first_scan(daemon)
        ini.unlink()
        with open(ini, "wb") as giant:
            giant.truncate(1 << 30)
        wait_for(lambda: "more than 1048576" in daemon.log(), 60, "the daemon to refuse the giant")
        assert daemon.client.request("GET", "/health")["status"] in ("ok", "degraded")
        assert _peak_rss_bytes(daemon.proc.pid) < 512 << 20
        assert "Traceback" not in daemon.log()
    finally:
        daemon.stop()
