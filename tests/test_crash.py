"""Crash safety (docs/design.md#writing-and-reading-an-entry, #sharing-and-locking): ``kill -9`` of
a daemon in the middle of a publish or an eviction, or of a compiler, at random points — then a
restart (which reclaims what the dead process left) and a full verify. No partial or corrupt entry
may ever be visible.

Default: 40 trials; ``--soak``: 200. The seed is printed (``CACHEMGR_TEST_SEED`` replays it).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from cachemgr.client import Client
from cachemgr.storage import entry, fsutil
from cachemgr.storage.store import Store
from tests.conftest import kernel_json, run_cli
from tests.daemon_util import Daemon, daemon_env, start_daemon, wait_first_scan, wait_for
from tests.shared_util import SOC, compiles, kernel_request, timed_cc


def _fire(daemon: Daemon, call: str, *args: object, **kw: object) -> threading.Thread:
    """Send one request in a thread; a daemon killed under it is expected (errors ignored)."""

    def run() -> None:
        client = Client(daemon.socket_path, timeout_s=60, local_hits=False)
        try:
            getattr(client, call)(*args, **kw)
        except Exception:  # the daemon was killed: that is the point
            pass
        finally:
            client.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _kill_when(cond: object, deadline_s: float) -> None:
    """Spin until ``cond()`` is true or the deadline passes (tight: the window is short)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and not cond():  # type: ignore[operator]
        time.sleep(0.0002)


def _names(chip: Path) -> list[str]:
    try:
        return os.listdir(chip)
    except FileNotFoundError:
        return []


def _fill(chip: Path, rng: random.Random, count: int, tag: str) -> None:
    store = Store(chip)
    for i in range(count):
        kernel = f"te_fill_{tag}_{i:04d}"
        data = rng.randbytes(rng.randrange(2000, 20000))
        store.publish(kernel, {kernel + ".o": data}, kernel_json(kernel, data))


def _check(chip: Path, dead_pid: int | None, trial: str) -> int:
    """Full verify: no entry with a problem; loose files only orphans of removals; no temp of
    the dead daemon left after its restart. Returns the number of entries checked."""
    report = Store(chip).verify_all()
    bad = [f for f in report.findings if f.kind == "entry"]
    assert bad == [], f"{trial}: partial or corrupt entries {[(f.name, f.problems) for f in bad]}"
    loose = {p.kind for f in report.findings for p in f.problems}
    assert loose <= {entry.ORPHAN_BINARY, entry.ORPHAN_FILE}, f"{trial}: {report.findings}"
    if dead_pid is not None:
        left = [
            n for n in _names(chip) if (w := fsutil.temp_writer(n)) is not None and w[1] == dead_pid
        ]
        assert left == [], f"{trial}: temps of the killed daemon {dead_pid} left: {left}"
    return report.checked


def run_trials(tmp_path: Path, trials: int) -> None:
    seed = int(os.environ.get("CACHEMGR_TEST_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    print(f"kill -9 trials: {trials}, seed {seed}")
    root = tmp_path / "cache"
    chip = root / "kernel_cache" / SOC
    cc_dir = tmp_path / "cc"
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'min_age_s = 0\n[compilers]\ncc = "{timed_cc(cc_dir)}"\n[daemon]\nworkers = 2\n'
    )
    home = tmp_path / "host"
    home.mkdir()
    env = daemon_env(home)
    args = ("--cache-dir", str(root), "--config", str(cfg))
    daemon = start_daemon(home, *args, env=env)
    kinds: dict[str, int] = {}
    checked = 0
    try:
        for trial in range(trials):
            kind = rng.choice(["publish", "publish", "evict", "compiler"])
            kinds[kind] = kinds.get(kind, 0) + 1
            label = f"trial {trial} ({kind}, seed {seed})"
            if kind == "compiler":
                n = 100_000 + trial
                before = len(compiles(cc_dir))
                _fire(daemon, "compile", kernel_request(n))
                wait_for(lambda b=before: len(compiles(cc_dir)) > b, 30, "the compiler to start")
                line = (cc_dir / "cc.log").read_text().splitlines()[-1]
                time.sleep(rng.uniform(0, 0.03))
                with contextlib.suppress(ProcessLookupError):  # it may have finished first
                    os.kill(int(line.split()[1]), signal.SIGKILL)
                client = daemon.client
                wait_for(lambda c=client: c.stats().daemon["queue_jobs"] == 0, 30, "the job to end")
                assert daemon.proc.poll() is None, "killing a compiler must not kill the daemon"
                checked += _check(chip, None, label)
                continue
            if kind == "publish":
                for j in range(4):
                    _fire(daemon, "compile", kernel_request(trial * 10 + j))
                if rng.random() < 0.6:  # the moment a temp file appears: mid-publish
                    _kill_when(lambda: any(n.endswith(".temp") for n in _names(chip)), 10)
                else:
                    time.sleep(rng.uniform(0, 0.3))
            else:
                _fill(chip, rng, rng.randrange(20, 80), str(trial))
                jsons = sum(n.endswith(".json") for n in _names(chip))
                _fire(daemon, "gc", ratio=0, soc=SOC)
                if rng.random() < 0.6:  # once removals have begun: mid-evict
                    _kill_when(
                        lambda j=jsons: sum(n.endswith(".json") for n in _names(chip)) < j, 10
                    )
                else:
                    time.sleep(rng.uniform(0, 0.05))
            dead = daemon.proc.pid
            daemon.proc.send_signal(signal.SIGKILL)
            daemon.proc.wait(30)
            daemon.stop()
            temps = [n for n in _names(chip) if (w := fsutil.temp_writer(n)) and w[1] == dead]
            kinds["left temps"] = kinds.get("left temps", 0) + bool(temps)
            daemon = start_daemon(home, *args, env=env)  # READY, then the start-up reclaim
            wait_first_scan(daemon)
            checked += _check(chip, dead, label)
        out = run_cli("verify", "--json", "--cache-dir", str(root), env=env)
        report = json.loads(out.stdout)
        bad = [
            f
            for folder in report["chip_folders"].values()
            for f in folder["findings"]
            if f["kind"] == "entry"
        ]
        assert bad == [], bad
        print(f"kinds {kinds}; {checked} entry checks, all whole")
    finally:
        daemon.stop()


def test_kill9_trials(tmp_path: Path) -> None:
    run_trials(tmp_path, 40)


@pytest.mark.soak
def test_kill9_trials_soak(tmp_path: Path) -> None:
    run_trials(tmp_path, 200)
