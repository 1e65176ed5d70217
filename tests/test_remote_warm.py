"""CANN's own entries travel too: the daemon uploads entries written by GE
(the GE twin, a separate process) that it sees, and ``cachemgr warm`` / ``[remote]
prefetch`` fill a fresh site from the remotes' index per chip — real ``redis-server``, real
wsgidav, real daemons."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from cachemgr.remote.config import RemoteConfig, parse_spec
from cachemgr.remote.http_tier import HttpTier
from cachemgr.remote.redis_tier import RedisTier
from cachemgr.storage.tiers import EntryFiles
from tests import ge_twin
from tests.conftest import SOC, kernel_json, run_cli
from tests.daemon_util import Daemon, daemon_env, start_daemon, wait_for
from tests.remote_util import (
    RedisServer,
    WebDavServer,
    free_port,
    keys_config,
    keys_toml,
    publish_own,
    site_keys,
    trust_fields,
)

REPO = Path(__file__).resolve().parents[1]


def _twin(*args: str) -> subprocess.CompletedProcess[str]:
    """The GE twin as its own process (a CANN process: it never talks to cachemgr)."""
    return subprocess.run(
        [sys.executable, "-m", "tests.ge_twin", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _site(
    tmp: Path, name: str, remote: str, extra: str = "", private: bool = False
) -> tuple[Daemon, Path, Path]:
    """A site's daemon; ``private``: its root is ``0700``, written by its user only — where
    the entries CANN writes are uploaded as seen (a group-writable file's bytes may be any
    member's: docs/remote.md#keys)."""
    folder = tmp / name
    folder.mkdir()
    cfg = folder / "c.toml"
    cfg.write_text(f'[remote]\nstorage = ["{remote}"]\n{extra}' + keys_toml(tmp))
    root = folder / "cache"
    if private:  # the user's own cache: nobody else may write its files
        (root / "kernel_cache" / SOC).mkdir(mode=0o700, parents=True)
        for part in (root, root / "kernel_cache", root / "kernel_cache" / SOC):
            part.chmod(0o700)
    d = start_daemon(folder, "--cache-dir", str(root), "--config", str(cfg), env=daemon_env(folder))
    return d, root, cfg


def test_ge_entry_written_at_a_is_warmed_at_b_and_hit_there_redis(
    redis_server: RedisServer, tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """CANN's own entries travel, over Redis: the twin writes entries at site A (a bad one too);
    A's daemon uploads the complete, verified ones with GE's names; ``warm`` at site B
    (whose daemon runs and does not send them back) makes the twin at B hit them."""
    remote = redis_server.url + "|name=shared"
    a, root_a, _ = _site(tmp_path, "a", remote, private=True)
    b, root_b, cfg_b = _site(tmp_path, "b", remote)
    probe = redis_server.client()
    chip_a = root_a / "kernel_cache" / SOC
    try:
        bad = ge_twin.write_entry(chip_a, "te_twin_bad", upper_sha=True)  # GE never hits it
        assert bad.files
        for kernel, extra in (("te_twin_hdr", ["--header"]), ("te_twin_plain", [])):
            out = _twin("write", str(chip_a), kernel, "--size", "4096", *extra)
            assert out.returncode == 0, out.stderr
        keys = [RedisTier.key(SOC, "te_twin_hdr"), RedisTier.key(SOC, "te_twin_plain")]
        wait_for(lambda: all(probe.exists(k) for k in keys), 60, "A's uploads of GE's entries")
        assert not probe.exists(RedisTier.key(SOC, "te_twin_bad")), "a bad entry never travels"
        assert (chip_a / "te_twin_bad.json").is_file(), "and the upload left it alone"
        index = {n.decode() for n in probe.zrange(RedisTier.index_key(SOC), 0, -1)}
        assert index == {"te_twin_hdr", "te_twin_plain"}
        # the count follows the upload's return, after its keys are written: waited for too
        wait_for(
            lambda: a.client.stats().to_json()["remotes"]["shared"]["uploads"] >= 2,
            60,
            "A's upload count",
        )
        row = a.client.stats().to_json()["remotes"]["shared"]
        assert row["uploads"] == 2 and row["errors"] == 0, row

        chip_b = root_b / "kernel_cache" / SOC
        assert _twin("hit", str(chip_b), "te_twin_hdr").returncode == 1  # cold
        base = ("--cache-dir", str(root_b), "--config", str(cfg_b))
        out = run_cli("warm", "--soc", SOC, "--json", *base, env=clean_env)
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)["chip_folders"][0]
        assert report["fetched"] == 2 and report["source"] == "index of remote shared", report
        for kernel in ("te_twin_hdr", "te_twin_plain"):
            assert _twin("hit", str(chip_b), kernel).returncode == 0, kernel
        assert (chip_b / "te_twin_hdr.h").read_bytes() == (chip_a / "te_twin_hdr.h").read_bytes()
        # B's daemon sees the warmed entries appear: it asks, finds them, sends nothing
        wait_for(
            lambda: b.client.stats().to_json()["remotes"]["shared"]["present"] >= 2,
            60,
            "B's daemon to see the warmed entries",
        )
        assert b.client.stats().to_json()["remotes"]["shared"]["uploads"] == 0
        again = run_cli("warm", "--soc", SOC, "--json", *base, env=clean_env)
        assert json.loads(again.stdout)["chip_folders"][0]["present"] == 2
    finally:
        a.stop()
        b.stop()


def test_ge_entry_travels_over_http_bazel_and_prefetch_fills_site_b(
    webdav_server: WebDavServer, tmp_path: Path
) -> None:
    """CANN's own entries travel, over HTTP (``bazel`` layout): A's daemon uploads the twin's entry
    and its index shard; B's daemon, started with ``[remote] prefetch``, downloads it at
    start; the twin at B hits it."""
    remote = webdav_server.url + "|layout=bazel|name=bazel"
    a, root_a, _ = _site(tmp_path, "a", remote, private=True)
    chip_a = root_a / "kernel_cache" / SOC
    try:
        out = _twin("write", str(chip_a), "te_twin_http", "--size", "8192", "--header")
        assert out.returncode == 0, out.stderr
        reader = HttpTier(parse_spec(remote, "test"), writer="0" * 16)
        wait_for(lambda: reader.recent(SOC, 10) == ["te_twin_http"], 60, "A's upload and index")
        assert all(p.parent.name == "ac" for p in webdav_server.files())  # bazel's /ac/<hex>
    finally:
        a.stop()
    extra = f'prefetch = 50\nprefetch_socs = ["{SOC}"]\n'
    b, root_b, _ = _site(tmp_path, "b", remote, extra)
    try:
        chip_b = root_b / "kernel_cache" / SOC
        wait_for(
            lambda: _twin("hit", str(chip_b), "te_twin_http").returncode == 0,
            60,
            "B's prefetch to make GE hit the kernel",
        )
        assert b.client.stats().to_json()["remotes"]["bazel"]["hits"] == 1
    finally:
        b.stop()


def _entry(kernel: str, size: int) -> EntryFiles:
    data = os.urandom(size)
    doc = json.dumps(kernel_json(kernel, data)).encode()
    return EntryFiles(SOC, kernel, {kernel + ".json": doc, kernel + ".o": data})


def test_http_index_loses_no_concurrent_writer(webdav_server: WebDavServer, tmp_path: Path) -> None:
    """Eight writers (eight hosts) upload into one chip at once: after each one's next
    flush every one is listed — the shards are per writer (no update of one can be lost);
    the registry is updated with If-Match and read back, and re-asserted at every flush.
    (wsgidav writes in place: a read racing a write may stall until the timeout; such a
    flush fails, keeps its changes and goes at the next one.)"""
    url = webdav_server.url + "|layout=flat|connect-timeout=5000|operation-timeout=2000"
    spec = parse_spec(url, "test")
    keys = site_keys(tmp_path)
    writers = [HttpTier(spec, writer=f"{i:016x}", keys=keys) for i in range(8)]
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            writers[i].put(_entry(f"te_w{i}", 100))
            writers[i].flush_index()
        except requests.RequestException as exc:  # a torn read of wsgidav (see above)
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(errors) < 8, errors
    for i, w in enumerate(writers):  # each one's next upload (a daemon's next burst)
        w.put(_entry(f"te_w{i}b", 100))
        w.flush_index()
    listed = HttpTier(spec, writer="f" * 16).recent(SOC, 100)
    assert sorted(n for n in listed if not n.endswith("b")) == [f"te_w{i}" for i in range(8)]
    # a fetch by another host moves its kernel to the top ("used anywhere")
    other = HttpTier(spec, writer="e" * 16)
    other.note_use(SOC, "te_w3")
    other.flush_index()
    assert other.recent(SOC, 1) == ["te_w3"]
    garbage = webdav_server.root / "cache" / HttpTier.digest(SOC, "x")  # not an index object
    garbage.write_bytes(b"\xff")
    registry = webdav_server.root / "cache" / hashlib_hex(HttpTier.registry_key(SOC))
    registry.write_bytes(b"not json")  # tampered on the server: no list, no crash
    assert other.recent(SOC, 10) == []


def hashlib_hex(key: str) -> str:
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()


def test_warm_stays_within_the_size_limit_and_checks_its_input(
    redis_server: RedisServer, tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """``warm`` fills the chip folder up to its eviction target and no further, newest
    first; ``--list`` names kernels (a bad line is exit 2 naming file and line, nothing
    written); without a remote or with both --limit and --list: exit 2."""
    tier = RedisTier(parse_spec(redis_server.url, "test"), keys=site_keys(tmp_path))
    for i in range(4):  # 400 KiB each; the newest last
        tier.put(_entry(f"te_size{i}", 400 << 10))
    root = tmp_path / "cache"
    env = dict(clean_env, ASCEND_MAX_OP_CACHE_SIZE="1", ASCEND_REMAIN_CACHE_SIZE_RATIO="100")
    keys = ("--config", str(keys_config(tmp_path)))
    base = ("--cache-dir", str(root), "--soc", SOC, "--remote", redis_server.url, *keys)
    out = run_cli("warm", "--json", *base, env=env)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)["chip_folders"][0]
    assert report["fetched"] == 2 and report["over_limit"] == 2, report
    assert report["fetched_names"] == ["te_size3", "te_size2"], "newest first"
    chip = root / "kernel_cache" / SOC
    used = sum(p.stat().st_size for p in chip.iterdir() if p.is_file())
    assert used <= 1 << 20

    listed = tmp_path / "list.txt"
    listed.write_text("# wanted\nte_size0\n../evil\n")
    bad = run_cli("warm", "--list", str(listed), *base, env=clean_env)
    assert bad.returncode == 2 and f"--list {listed} line 3" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr and not (chip / "te_size0.json").exists()
    listed.write_text("te_size0\nte_absent\n")
    out = run_cli("warm", "--list", str(listed), *base, env=clean_env)
    assert out.returncode == 1, out.stdout  # one asked for is missing
    assert "1 fetched" in out.stdout and "1 missing" in out.stdout
    assert (chip / "te_size0.json").is_file()
    both = run_cli("warm", "--limit", "3", "--list", str(listed), *base, env=clean_env)
    assert both.returncode == 2 and "exclude each other" in both.stderr
    none = run_cli("warm", "--cache-dir", str(root), "--soc", SOC, env=clean_env)
    assert none.returncode == 2 and "no remote tier configured" in none.stderr
    fresh = run_cli(
        "warm", "--cache-dir", str(tmp_path / "c2"), "--remote", redis_server.url, *keys
    )
    assert fresh.returncode == 2 and "--soc" in fresh.stderr, fresh.stderr
    tier.close()


def test_warm_says_why_no_remote_index_answered(tmp_path: Path, clean_env: dict[str, str]) -> None:
    """``warm`` against remotes nobody listens on said only "no remote index answered": it
    now names each remote's URL (not its spec's attributes) and its reason (connection
    refused), in text and ``--json``, without a traceback, exit 1."""
    redis_url = f"redis://127.0.0.1:{free_port()}/0|name=down|connect-timeout=500"
    http_url = f"http://127.0.0.1:{free_port()}/c|name=web"
    base = ("--cache-dir", str(tmp_path / "cache"), "--soc", SOC)
    base += ("--config", str(keys_config(tmp_path)))
    out = run_cli("warm", *base, "--remote", redis_url, "--remote", http_url, env=clean_env)
    assert out.returncode == 1, out.stderr
    assert "no remote index answered: redis://127.0.0.1:" in out.stdout, out.stdout
    assert "name=down" not in out.stdout and "http://127.0.0.1:" in out.stdout, out.stdout
    assert out.stdout.lower().count("refused") >= 2, out.stdout
    assert "Traceback" not in out.stderr, out.stderr
    out = run_cli("warm", "--json", *base, "--remote", redis_url, env=clean_env)
    assert out.returncode == 1, out.stderr
    error = json.loads(out.stdout)["chip_folders"][0]["error"]
    assert error.startswith("no remote index answered: redis://127.0.0.1:"), error
    assert "refused" in error.lower(), error


def test_warm_limit_fills_past_an_evicted_row_and_drops_it(
    redis_server: RedisServer, tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """The index lists 4 entries, the server evicted the newest one's value (as
    ``allkeys-lru`` does: the key goes, its index row stays): ``warm --limit 1`` still
    fetches 1 entry — the next row — and drops the gone row from the index."""
    from cachemgr.remote.tierset import RemoteTiers

    spec = parse_spec(redis_server.url + "|name=r", "test")
    tiers = RemoteTiers.from_config(RemoteConfig((spec,), "test", **trust_fields(tmp_path)))
    assert tiers is not None
    site_a = tmp_path / "a" / "kernel_cache"
    names = [f"te_evict{i}" for i in range(4)]
    try:
        for kernel in names:  # uploaded in order: the last is the newest row
            own = publish_own(site_a / SOC, kernel, os.urandom(1500))
            assert tiers.upload_now(site_a, SOC, kernel, digests=own) == 1
    finally:
        tiers.close()
    probe = redis_server.client()
    index = RedisTier.index_key(SOC)
    assert [n.decode() for n in probe.zrevrange(index, 0, -1)] == names[::-1]
    assert probe.delete(RedisTier.key(SOC, names[3])) == 1  # evicted by the server

    root_b = tmp_path / "b"
    args = ["--soc", SOC, "--limit", "1", "--json", "--cache-dir", str(root_b)]
    args += ["--config", str(keys_config(tmp_path))]
    out = run_cli("warm", *args, "--remote", redis_server.url + "|name=r", env=clean_env)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)["chip_folders"][0]
    assert report["fetched"] == 1 and report["fetched_names"] == [names[2]], report
    assert (report["missing"], report["dropped_rows"]) == (1, 1), report
    assert (root_b / "kernel_cache" / SOC / f"{names[2]}.json").is_file()
    assert [n.decode() for n in probe.zrevrange(index, 0, -1)] == names[2::-1], "row dropped"


def test_a_full_upload_queue_drops_and_counts(tmp_path: Path) -> None:
    """A remote too slow for the entries GE writes: the bounded queue drops the rest and
    counts them; the daemon keeps answering at once."""
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)  # accepts (the kernel's backlog), never answers: a hung server
    port = srv.getsockname()[1]
    remote = f"redis://127.0.0.1:{port}/0|operation-timeout=3000|connect-timeout=3000"
    extra = "upload_queue = 1\nfailures_before_open = 100\n"
    d, root, _ = _site(tmp_path, "a", remote, extra)
    chip = root / "kernel_cache" / SOC
    try:
        for i in range(12):
            ge_twin.write_entry(chip, f"te_flood{i}")
        wait_for(
            lambda: d.client.stats().to_json()["remote_uploads_dropped"] >= 5,
            60,
            "the queue to overflow",
        )
        health = d.client.health()
        assert health["status"] in ("ok", "degraded")
    finally:
        d.stop()
        srv.close()


@pytest.mark.parametrize("soc", [SOC])
def test_prefetch_config_is_checked(soc: str) -> None:
    """``[remote] prefetch`` / ``prefetch_socs``: bad values are one clear error."""
    from cachemgr.errors import ConfigError
    from cachemgr.remote.config import resolve

    cfg = resolve(None, {}, {"storage": ["redis://h:1/0"], "prefetch": 5, "prefetch_socs": [soc]})
    assert (cfg.prefetch, cfg.prefetch_socs) == (5, (soc,))
    assert isinstance(cfg, RemoteConfig)
    for bad in ({"prefetch": -1}, {"prefetch": "x"}, {"prefetch_socs": ["a/b"]}):
        with pytest.raises(ConfigError, match="prefetch"):
            resolve(None, {}, bad)


def test_docs_and_benchmarks_describe_sharing_across_sites() -> None:
    """Item 5: "Sharing across sites" (``docs/remote.md``, linked from the README) gives both
    servers' command lines with the flags they need, the composition with an NFS root and
    warming; BENCHMARKS.md has the warm rows (entries per second) measured by
    ``scripts/bench --only remote``."""
    part = (REPO / "docs" / "remote.md").read_text()
    assert part.startswith("# Sharing across sites")
    assert "(docs/remote.md)" in (REPO / "README.md").read_text()
    for needle in (
        "docker run",
        "buchgr/bazel-remote-cache",
        "--disable_http_ac_validation",
        "layout=bazel",
        "--maxmemory-policy allkeys-lru",
        "With a shared NFS root",
        "cachemgr warm --soc",
        "prefetch = ",
        "one shard per writer",
        "remote tiers untouched",
    ):
        assert needle in part, needle
    bench = (REPO / "BENCHMARKS.md").read_text()
    remote = bench.split("<!-- bench:remote -->", 1)[1].split("<!-- /bench:remote -->")[0]
    rows = [ln for ln in remote.splitlines() if ln.startswith("| warm, ")]
    assert len(rows) == 2 and all("entries/s" in r for r in rows), rows
