"""Proof under load (docs/design.md#sharing-and-locking): several daemons with distinct host ids on
one cache root, many clients doing compile, lookup, gc, force and purge, a CANN-like writer filling
the cache past its limit — and the invariants that must hold:

* nothing corrupt or partial is ever served (every hit and compile is re-verified here,
  independently of cachemgr: the json's sha256 against its binary);
* no entry the clients saw is lost except by eviction, purge or force;
* after a final gc, usage is within the limit plus one in-flight entry;
* each distinct kernel is compiled once while no eviction, purge or force intervened
  (real compiler runs, counted by a wrapper script that logs them).

The default run is short (3 daemons × 8 clients × 10 s); ``--soak`` runs 3 × 16 × 60 s.
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cachemgr.client import Client, DaemonError
from cachemgr.storage import fsutil
from cachemgr.storage.store import Store
from tests.conftest import kernel_json
from tests.daemon_util import Daemon, daemon_env, start_daemon
from tests.shared_util import (
    GONE,
    GOOD,
    SOC,
    chip_bytes,
    compiles,
    evictions_in_log,
    kernel_request,
    reverify,
    timed_cc,
)

MIB = 1 << 20
MAX_MB = 1
FILLER_BYTES = 96 * 1024


@dataclass
class Ledger:
    """What the clients saw, shared by their threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    ops: Counter[str] = field(default_factory=Counter)
    corrupt: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    last_seen: dict[str, float] = field(default_factory=dict)  # kernel → epoch s
    # kernel → windows (epoch s) within which an eviction removed it
    removals: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    clears: list[tuple[float, float, str]] = field(default_factory=list)  # purge/force windows
    max_entry_bytes: int = 0

    def evicted(self, kernels: list[str], began: float, ended: float | None = None) -> None:
        """Kernels an eviction removed between ``began`` and ``ended`` (default: now)."""
        window = (began, time.time() if ended is None else ended)
        with self.lock:
            for kernel in kernels:
                self.removals.setdefault(kernel, []).append(window)

    def removed_between(self, kernel: str, after: float, before: float) -> bool:
        """Did an eviction, purge or force possibly remove ``kernel`` between the times?"""
        windows = self.removals.get(kernel, []) + [(a, b) for a, b, _ in self.clears]
        return any(lo <= before and hi >= after for lo, hi in windows)

    def served(self, kind: str, answer: dict[str, Any]) -> None:
        files = answer.get("files", [])
        verdict = reverify(files)
        stats = [fsutil.lstat_or_none(Path(f)) for f in files]  # evicted meanwhile: None
        size = sum(st.st_size for st in stats if st is not None)
        with self.lock:
            self.ops[f"{kind}:{answer.get('status')}"] += 1
            if verdict not in (GOOD, GONE):
                self.corrupt.append(f"{kind} {answer.get('kernel_name')}: {verdict}")
            elif verdict == GOOD:
                self.last_seen[answer["kernel_name"]] = time.time()
                self.max_entry_bytes = max(self.max_entry_bytes, size)


def _config(tmp: Path, cc: Path) -> Path:
    cfg = tmp / "cachemgr.toml"
    cfg.write_text(
        "min_age_s = 0\n"
        f'[compilers]\ncc = "{cc}"\n'
        "[daemon]\nworkers = 2\nevict_debounce_s = 0.2\n"
        "reconcile_interval_s = 2.0\nreconcile_jitter_s = 0.5\nreap_interval_s = 3.0\n"
        'debug_loggers = "cachemgr.evicted"\n'
    )
    return cfg


def _client_loop(
    daemon: Daemon, rng: random.Random, pool: int, stop: threading.Event, ledger: Ledger
) -> None:
    client = Client(daemon.socket_path, timeout_s=300)
    try:
        while not stop.is_set():
            roll = rng.random()
            n = rng.randrange(pool)
            if roll < 0.75:
                try:
                    answer = client.compile(kernel_request(n)).to_json()
                except DaemonError as exc:
                    with ledger.lock:
                        ledger.failed.append(f"compile {n}: {exc}")
                    continue
                if answer.get("status") not in ("hit", "compiled"):
                    with ledger.lock:
                        ledger.failed.append(f"compile {n}: {answer}")
                    continue
                ledger.served(f"compile-{answer.get('via')}", answer)
            elif roll < 0.93:
                with ledger.lock:
                    known = list(ledger.last_seen)
                if not known:
                    continue
                found = client.lookup(SOC, rng.choice(known))
                if found["status"] == "hit":
                    ledger.served("lookup", {**found, "status": "hit"})
                else:
                    with ledger.lock:
                        ledger.ops["lookup:miss"] += 1
            else:
                began = time.time()
                report = client.gc(ratio=rng.randrange(20, 95), soc=SOC).to_json()
                ledger.evicted(report["chip_folders"].get(SOC, {}).get("evicted", []), began)
                with ledger.lock:
                    ledger.ops["gc"] += 1
    finally:
        client.close()


def _cann_writer(chip: Path, rng: random.Random, stop: threading.Event, ledger: Ledger) -> None:
    """A CANN-like process publishing its own entries into the same chip folder (json last,
    under the entry lock), pushing usage past the limit so eviction runs for real."""
    store = Store(chip)
    i = 0
    while not stop.wait(0.15):
        kernel = f"te_cannfill_{os.getpid()}_{i:05d}"
        data = rng.randbytes(FILLER_BYTES)
        store.publish(kernel, {kernel + ".o": data}, kernel_json(kernel, data))
        i += 1
    with ledger.lock:
        ledger.ops["cann_writes"] = i


def _chaos(
    daemons: list[Daemon], root: Path, seconds: float, stop: threading.Event, ledger: Ledger
) -> None:
    """One force through a daemon and one purge through the CLI, at fixed points of the run."""
    plan = [(0.35, "force"), (0.65, "purge")]
    start = time.monotonic()
    for at, what in plan:
        if stop.wait(max(0.0, start + at * seconds - time.monotonic())):
            return
        began = time.time()
        if what == "force":
            client = Client(daemons[1].socket_path, timeout_s=300)
            answer = client.compile(
                kernel_request(10_000, op_compiler_cache_mode="force")
            ).to_json()
            client.close()
            assert answer["status"] == "compiled", answer
        else:
            args = ["--cache-dir", str(root)]
            out = subprocess.run(
                [sys.executable, "-m", "cachemgr", "purge", "--soc", SOC, "--yes", "--json", *args],
                capture_output=True,
                text=True,
                timeout=300,
                env={k: v for k, v in os.environ.items() if not k.startswith("CACHEMGR_")},
            )
            assert out.returncode in (0, 1), out.stderr  # 1: an entry stayed busy
        with ledger.lock:
            ledger.clears.append((began, time.time(), what))


#: A background eviction is logged when its run ends; its removals happened at most this
#: long before the log line was seen (runs here last milliseconds; the monitor polls at 0.1 s).
EVICTION_RUN_S = 5.0


def _log_monitor(daemons: list[Daemon], stop: threading.Event, ledger: Ledger) -> None:
    """Read the daemons' logs as they grow: each background eviction is stamped with the time
    its line was seen, so a removal is placed in time (see :meth:`Ledger.removed_between`)."""
    offsets = [0] * len(daemons)
    while True:
        final = stop.wait(0.1)
        for i, d in enumerate(daemons):
            text = d.log()
            new, offsets[i] = text[offsets[i] :], len(text)
            cut = new.rfind("\n") + 1  # only whole lines; the rest next time
            offsets[i] -= len(new) - cut
            now = time.time()
            for kernels in evictions_in_log(new[:cut]):
                ledger.evicted(kernels, now - EVICTION_RUN_S, now)
        if final:
            return


def run_load(tmp_path: Path, n_daemons: int, n_clients: int, seconds: float, pool: int) -> None:
    seed = int(os.environ.get("CACHEMGR_TEST_SEED", time.time_ns() % 1_000_000))
    print(f"load: {n_daemons} daemons x {n_clients} clients x {seconds} s, seed {seed}")
    root = tmp_path / "cache"
    kcache = root / "kernel_cache"
    chip = kcache / SOC
    kcache.mkdir(parents=True)
    (kcache / "op_cache.ini").write_text(
        f"[op_compiler_cache]\nmax_op_cache_size={MAX_MB}\n"
        "remain_cache_size_ratio=50\nadk_version=1\nops_version=1\n"
    )
    cc = timed_cc(tmp_path / "cc")
    cfg = _config(tmp_path, cc)
    daemons = []
    try:
        for i in range(n_daemons):
            home = tmp_path / f"host{i}"
            home.mkdir()
            daemons.append(
                start_daemon(
                    home,
                    "--cache-dir",
                    str(root),
                    "--host-id",
                    f"host{i}",
                    "--config",
                    str(cfg),
                    env=daemon_env(home),
                )
            )
        ledger = Ledger()
        stop = threading.Event()
        rng = random.Random(seed)
        errors: list[str] = []

        def guarded(target: Any, *args: Any) -> None:
            try:
                target(*args)
            except BaseException as exc:  # reported by the assertion below
                errors.append("".join(traceback.format_exception(exc)))
                stop.set()

        jobs: list[tuple[Any, tuple[Any, ...]]] = [
            (_client_loop, (daemons[c % n_daemons], random.Random(rng.random()), pool))
            for c in range(n_daemons * n_clients)
        ]
        jobs.append((_cann_writer, (chip, random.Random(seed))))
        jobs.append((_chaos, (daemons, root, seconds)))
        monitor_stop = threading.Event()
        monitor = threading.Thread(target=_log_monitor, args=(daemons, monitor_stop, ledger))
        monitor.start()
        threads = [
            threading.Thread(target=guarded, args=(target, *args, stop, ledger))
            for target, args in jobs
        ]
        for t in threads:
            t.start()
        stop.wait(seconds)
        stop.set()
        for t in threads:
            t.join(300)
        assert not errors, errors[0]
        assert not any(t.is_alive() for t in threads), "a client hung"

        # a final gc through one daemon (limits applied as configured), then usage
        began = time.time()
        final = daemons[0].client.gc(soc=SOC).to_json()["chip_folders"][SOC]
        ledger.evicted(final["evicted"], began)
        used = chip_bytes(chip)
        monitor_stop.set()
        monitor.join(60)
        logs = [d.log() for d in daemons]
        print(f"ops {dict(ledger.ops)}; used {used} bytes after the final gc")

        assert ledger.corrupt == [], ledger.corrupt[:5]
        assert ledger.failed == [], ledger.failed[:5]
        assert ledger.ops["compile-client:hit"] + ledger.ops["compile-daemon:hit"] > 0
        assert used <= MAX_MB * MIB + max(ledger.max_entry_bytes, FILLER_BYTES + 4096), used
        for text in logs:
            assert "Traceback" not in text, text[-3000:]

        # nothing lost but by eviction, purge or force
        present = {p.name[:-5] for p in chip.glob("te_*.json")}
        lost = [
            k
            for k, seen in ledger.last_seen.items()
            if k not in present and not ledger.removed_between(k, seen, float("inf"))
        ]
        assert lost == [], f"entries lost without eviction, purge or force: {lost[:5]}"

        # each kernel compiled once while nothing removed it in between
        runs: dict[str, list[float]] = defaultdict(list)
        for c in compiles(tmp_path / "cc"):
            runs[c.kernel].append(c.at)
        again = [
            (k, a, b)
            for k, times in runs.items()
            for a, b in itertools.pairwise(times)
            if not ledger.removed_between(k, a, b)
        ]
        assert again == [], f"compiled again with no eviction/purge/force between: {again[:5]}"
        assert len(runs) >= min(pool, 8)
        print(
            f"{len(runs)} kernels, {sum(len(t) for t in runs.values())} compiler runs; "
            f"{sum(map(len, ledger.removals.values()))} evictions of "
            f"{len(ledger.removals)} kernels; clears {ledger.clears}"
        )
    finally:
        for d in daemons:
            d.stop()


def test_three_daemons_mixed_load(tmp_path: Path) -> None:
    run_load(tmp_path, n_daemons=3, n_clients=8, seconds=10.0, pool=40)


@pytest.mark.soak
def test_three_daemons_mixed_load_soak(tmp_path: Path) -> None:
    run_load(tmp_path, n_daemons=3, n_clients=16, seconds=60.0, pool=160)
