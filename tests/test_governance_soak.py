"""Soak phase of the governance tests (``--soak``): while clients compile and hit through the daemon
and a CANN-like writer keeps the chip folder over its limit, the daemon is paused (SIGSTOP), its
socket is removed and the cache root is flipped read-only and back. Nothing corrupt is ever
served, every answer is a kernel or a clear error, and usage returns under the limit after.
Real tmpfs remounts (root only)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from cachemgr.client import Client
from cachemgr.errors import CacheMgrError
from tests import mount_util
from tests.conftest import SOC, publish
from tests.daemon_util import Daemon, start_daemon, wait_for
from tests.shared_util import GONE, GOOD, chip_bytes, kernel_request, reverify

MIB = 1 << 20
MAX_MB = 2
FILLER = 100 * 1024


def _remount(mnt: Path, mode: str) -> None:
    """Remount ``mnt``; a read-only remount fails (EBUSY, exit 32) while a writer has a file
    open on it — the clients and the CANN-like writer keep writing — so try until it takes."""
    argv = ["mount", "-o", f"remount,{mode}", str(mnt)]
    wait_for(lambda: subprocess.run(argv, capture_output=True).returncode == 0, 60, " ".join(argv))


def run_faults(tmp_path: Path, seconds: float, n_clients: int) -> None:
    with mount_util.tmpfs(tmp_path / "mnt", "size=64m") as mnt:
        _run_faults(tmp_path, mnt, seconds, n_clients)


def _run_faults(tmp_path: Path, mnt: Path, seconds: float, n_clients: int) -> None:
    kc = mnt / "kernel_cache"
    chip = kc / SOC
    chip.mkdir(parents=True)
    (kc / "op_cache.ini").write_text(
        f"[op_compiler_cache]\nmax_op_cache_size={MAX_MB}\n"
        "remain_cache_size_ratio=50\nadk_version=1\nops_version=1\n"
    )
    cfg = tmp_path / "c.toml"
    cfg.write_text("min_age_s = 0\n[daemon]\nevict_debounce_s = 0.5\nreconcile_interval_s = 5.0\n")
    seed = int(os.environ.get("CACHEMGR_TEST_SEED", time.time_ns() % 1_000_000))
    print(f"fault soak: {n_clients} clients x {seconds} s, seed {seed}")
    d = start_daemon(tmp_path, "--cache-dir", str(mnt), "--config", str(cfg))
    stop = threading.Event()
    corrupt: list[str] = []
    served = errors = 0
    lock = threading.Lock()

    def client_loop(n: int) -> None:
        nonlocal served, errors
        rng = random.Random(seed + n)
        client = Client(d.socket_path, timeout_s=120, local_hits=rng.random() < 0.5)
        while not stop.is_set():
            try:
                answer = client.compile(kernel_request(rng.randrange(30))).to_json()
            except (CacheMgrError, OSError):
                with lock:
                    errors += 1  # the socket is gone or the daemon paused: a clear error
                stop.wait(0.2)
                continue
            verdict = reverify(answer["files"]) if answer.get("files") else answer.get("error")
            with lock:
                served += 1
                if verdict not in (GOOD, GONE):
                    corrupt.append(f"{answer.get('kernel_name')}: {verdict}")

    def writer() -> None:  # CANN-like: fills the chip folder with old entries
        i = 0
        while not stop.is_set():
            try:
                publish(chip, f"te_fill_{i:05d}", os.urandom(FILLER), atime_s=1_000_000 + i)
            except (OSError, CacheMgrError):
                stop.wait(0.2)  # the read-only phase
            i += 1
            stop.wait(0.05)

    threads = [threading.Thread(target=client_loop, args=(n,)) for n in range(n_clients)]
    threads.append(threading.Thread(target=writer))
    for t in threads:
        t.start()
    try:
        try:
            _faults(d, mnt, seconds)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
            subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=False)
        assert corrupt == [], corrupt[:5]
        assert served > 0, f"nothing served ({errors} errors)"
        wait_for(lambda: chip_bytes(chip) <= MAX_MB * MIB, 60, "usage back under the limit")
        assert d.proc.poll() is None, d.log()[-2000:]
        print(f"served {served} answers, {errors} clear errors during the faults")
    finally:
        d.signal(signal.SIGCONT)
        d.stop()


def _faults(d: Daemon, mnt: Path, seconds: float) -> None:
    """Pause, remove the socket, flip the root read-only and back, a fifth of the run each."""
    step = seconds / 5
    time.sleep(step)
    d.signal(signal.SIGSTOP)  # a pause longer than any grace time
    time.sleep(min(6.0, step))
    d.signal(signal.SIGCONT)
    time.sleep(step)
    os.unlink(d.socket_path)  # a /tmp cleaner
    wait_for(lambda: d.socket_path.exists(), 15, "the socket re-created")
    time.sleep(step)
    _remount(mnt, "ro")
    wait_for(lambda: d.client.health()["status"] == "degraded", 20, "degraded (read-only)")
    time.sleep(step)
    _remount(mnt, "rw")
    wait_for(lambda: d.client.health()["status"] != "degraded", 20, "recovered")


def test_faults_while_serving_short(tmp_path: Path) -> None:
    """A short run of the fault phases (a few seconds each)."""
    run_faults(tmp_path, seconds=15.0, n_clients=4)


@pytest.mark.soak
def test_faults_while_serving_soak(tmp_path: Path) -> None:
    run_faults(tmp_path, seconds=60.0, n_clients=12)
