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
from tests.daemon_util import daemon_env, start_daemon, wait_for


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
