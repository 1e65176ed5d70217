"""Counters mean what they say: with two daemons on one root, ``compiles``
equals the compiler runs; a request answered by the other daemon's compile is ``coalesced``
(and a miss), not a hit; the queue's figures and the latency histograms reach ``/metrics``."""

from __future__ import annotations

import re
import threading
from pathlib import Path

from cachemgr.client import Client
from tests.compile_util import calls, counting_cc, request_data
from tests.daemon_util import daemon_env, start_daemon, wait_for


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def test_two_daemons_on_one_root_count_compiler_runs(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    cc_dir = tmp_path / "cc"
    cc = counting_cc(cc_dir, sleep_s=2.0)
    cfg = tmp_path / "c.toml"
    # each daemon merges its counts into the cache's files every 0.2 s
    cfg.write_text(f'[compilers]\ncc = "{cc}"\n[daemon]\ncounters_save_interval_s = 0.2\n')
    env = daemon_env(tmp_path)
    a, b = (
        start_daemon(
            tmp_path,
            "--cache-dir",
            str(root),
            "--config",
            str(cfg),
            "--socket",
            str(tmp_path / f"{name}.sock"),
            env=env,
        )
        for name in ("a", "b")
    )
    try:
        answers: list[dict] = []
        same = request_data(defines={"N": 7171, "B_N": 1})

        def ask(sock: Path, data: dict) -> None:
            answers.append(Client(sock, local_hits=False).compile(data).to_json())

        # the same kernel asked of both daemons at once (twice of A), 4 kernels in all
        threads = [
            threading.Thread(target=ask, args=(a.socket_path, same)),
            threading.Thread(target=ask, args=(a.socket_path, same)),
            threading.Thread(target=ask, args=(b.socket_path, same)),
            threading.Thread(
                target=ask, args=(b.socket_path, request_data(defines={"N": 7272, "B_N": 1}))
            ),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(x["status"] in ("compiled", "hit") for x in answers), answers
        ask(a.socket_path, same)  # now a real hit
        runs = len(calls(cc_dir))
        assert runs == 2  # one per kernel: the entry lock serialised the two daemons
        want = {"compiles": runs, "coalesced": 2, "hits": 1, "misses": 4}

        def both_counted() -> bool:
            stats = a.client.stats().to_json()  # the cache's counters: both daemons' once merged
            return {k: stats[k] for k in want} == want

        try:
            wait_for(both_counted, 30, "both daemons' counts in the cache's counters")
        except AssertionError:
            raise AssertionError((a.client.stats().to_json(), b.client.stats().to_json())) from None
        stats = a.client.stats().to_json()
        metrics = a.client.request("GET", "/metrics")
        assert _metric(metrics, "cachemgr_compiles_total") == runs
        assert _metric(metrics, "cachemgr_coalesced_total") == 2
        assert _metric(metrics, "cachemgr_hit_rate") == 1 / 5
        assert _metric(metrics, "cachemgr_queue_queued") == 0
        assert _metric(metrics, "cachemgr_queue_running") == 0
        assert _metric(metrics, "cachemgr_queue_waited_total") == 1
        assert _metric(metrics, "cachemgr_hit_seconds_count") == 1
        assert stats["queue"] == {"queued": 0, "running": 0, "waited": 1}
    finally:
        assert a.stop() == 0 and b.stop() == 0
