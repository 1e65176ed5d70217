"""Counters belong to a kernel cache (docs/design.md#counters): kept in the cache, added up
over every daemon and every in-process CLI run, zeroed by ``stats --zero``."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from cachemgr.client import Client
from cachemgr.storage.counters import CacheCounters, stats_file
from tests.compile_util import counting_cc, request_data, write_request
from tests.conftest import SOC, run_cli
from tests.daemon_util import daemon_env, start_daemon
from tests.shared_util import kernel_request


def _stats(env: dict[str, str], root: Path) -> dict:
    out = run_cli("stats", "--json", "--cache-dir", str(root), env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_two_daemons_of_one_user_add_up(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    env = daemon_env(tmp_path)  # one user: one HOME, one state folder
    a = start_daemon(
        tmp_path, "--cache-dir", str(root), "--socket", str(tmp_path / "a.sock"), env=env
    )
    b = start_daemon(
        tmp_path, "--cache-dir", str(root), "--socket", str(tmp_path / "b.sock"), env=env
    )
    try:
        Client(a.socket_path, local_hits=False).compile(kernel_request(1))
        Client(b.socket_path, local_hits=False).compile(kernel_request(2))
        Client(b.socket_path, local_hits=False).compile(kernel_request(1))  # A's entry: a hit
    finally:
        assert a.stop() == 0 and b.stop() == 0
    data = _stats(env, root)
    assert data["via"] == "local"
    assert (data["compiles"], data["misses"], data["hits"]) == (2, 2, 1)
    assert data["chip_folders"][SOC]["counters"]["compiles"] == 2
    assert stats_file(root / "kernel_cache", SOC).is_file()
    c = start_daemon(tmp_path, "--cache-dir", str(root), env=env)  # a restart keeps them
    try:
        assert c.client.stats().to_json()["compiles"] == 2
    finally:
        c.stop()


def test_cli_runs_are_counted_and_other_caches_show_nothing(tmp_path: Path, clean_env) -> None:
    root = tmp_path / "cache"
    req = write_request(tmp_path / "req")
    for _ in range(2):
        out = run_cli("compile", str(req), "--cache-dir", str(root), env=clean_env)
        assert out.returncode == 0, out.stderr
    data = _stats(clean_env, root)
    assert (data["compiles"], data["misses"], data["hits"]) == (1, 1, 1)
    empty = _stats(clean_env, tmp_path / "nowhere")
    assert empty["hits"] == 0 and empty["compiles"] == 0
    out = run_cli("stats", "--zero", "--cache-dir", str(root), env=clean_env)
    assert out.returncode == 0 and "zero" in out.stdout, out.stderr
    assert _stats(clean_env, root)["hits"] == 0


def test_compiles_count_compiler_runs_and_zero_through_the_daemon(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    cc = counting_cc(tmp_path / "cc", sleep_s=1.5)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[compilers]\ncc = "{cc}"\n')
    env = daemon_env(tmp_path)
    d = start_daemon(tmp_path, "--cache-dir", str(root), "--config", str(cfg), env=env)
    try:
        data = request_data(defines={"N": 4242, "B_N": 1})
        answers: list[dict] = []
        threads = [
            threading.Thread(
                target=lambda: answers.append(
                    Client(d.socket_path, local_hits=False).compile(data).to_json()
                )
            )
            for _ in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [a["status"] for a in answers] == ["compiled"] * 3
        stats = d.client.stats().to_json()
        assert stats["compiles"] == 1 and stats["coalesced"] == 2 and stats["misses"] == 3
        out = run_cli(
            "stats", "--zero", "--cache-dir", str(root), "--socket", str(d.socket_path), env=env
        )
        assert out.returncode == 0, out.stderr
        assert d.client.stats().to_json()["compiles"] == 0
    finally:
        d.stop()
    assert CacheCounters(root / "kernel_cache").snapshot()["compiles"] == 0


def test_a_damaged_counters_file_is_ignored(tmp_path: Path) -> None:
    kc = tmp_path / "kernel_cache"
    kc.mkdir()
    stats_file(kc, SOC).write_text('{"hits": 10, "misses": "x", "compiles": ' + "9" * 5000 + "}")
    counters = CacheCounters(kc)
    assert counters.snapshot()["hits"] == 0
    counters.add("hits", 2, SOC)
    assert counters.flush()
    assert CacheCounters(kc).snapshot()["hits"] == 2
