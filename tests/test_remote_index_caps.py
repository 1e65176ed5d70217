"""The remotes' index per chip is untrusted input read with bounds: anyone who can write
to the remote can fill it (docs/remote.md#sizes). Real ``redis-server``, real nginx (WebDAV),
the real ``cachemgr warm`` in its own process whose peak RSS is measured (``wait4``)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cachemgr.remote import http_tier, redis_tier
from cachemgr.remote.config import parse_spec
from cachemgr.remote.http_tier import HttpTier
from cachemgr.remote.redis_tier import RedisTier
from cachemgr.storage.tiers import EntryFiles
from tests.conftest import SOC, kernel_json
from tests.remote_util import NginxServer, RedisServer, keys_config, site_keys

#: warm's peak RSS must stay under this (MB): 45 MB now; 612 MB before, reading the index whole.
PEAK_MB = 150


def _entry(kernel: str, size: int) -> EntryFiles:
    data = os.urandom(size)
    doc = json.dumps(kernel_json(kernel, data)).encode()
    return EntryFiles(SOC, kernel, {kernel + ".json": doc, kernel + ".o": data})


#: Runs ARGV[2:] and writes its peak RSS (KiB, ``RUSAGE_CHILDREN``) to the file ARGV[1]. A
#: process of its own: a child started straight from pytest (vfork) would count pytest's
#: own peak as its own.
_MEASURE = (
    "import resource, subprocess, sys\n"
    "code = subprocess.call(sys.argv[2:])\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "open(sys.argv[1], 'w').write(str(peak))\n"
    "sys.exit(code)\n"
)


def _run_measured(args: list[str], env: dict[str, str], tmp: Path) -> tuple[int, str, str, float]:
    """Run ``python -m cachemgr ARGS``: exit status, stdout, stderr and its peak RSS (MB)."""
    peak = tmp / "peak_kib"
    cmd = [sys.executable, "-c", _MEASURE, str(peak), sys.executable, "-m", "cachemgr", *args]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    return out.returncode, out.stdout, out.stderr, int(peak.read_text()) / 1024


@pytest.mark.serial  # the server's scan of 240 MiB of names has a time budget
def test_a_redis_index_of_giant_names_costs_warm_no_memory_and_hides_no_entry(
    redis_server: RedisServer, tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """The review's repro: 60 index members of 4 MiB each, newer than every real row.
    ``warm`` peaked at 553 MB reading them whole; now the server-side read passes them over
    (one warning line naming the caps), the peak stays under 150 MB, and the three real
    entries listed below them are fetched."""
    tier = RedisTier(parse_spec(redis_server.url, "test"), keys=site_keys(tmp_path))
    real = [f"te_real{i}" for i in range(3)]
    for kernel in real:
        tier.put(_entry(kernel, 2048))
    tier.close()
    probe = redis_server.client()
    for i in range(60):  # the review's: {b"K%d" % i + b"a" * (4 << 20): 1e12 + i}
        probe.zadd(RedisTier.index_key(SOC), {b"K%d" % i + b"a" * (4 << 20): 1e12 + i})

    root = tmp_path / "cache"
    args = ["warm", "--json", "--cache-dir", str(root), "--soc", SOC]
    # the memory is the point: a loaded test host may take ~2 s to scan 60 giants (over 5 s
    # at load 13 beside other workers: the scan stopped at its budget and listed nothing)
    remote = redis_server.url + "|operation-timeout=30000"
    args += ["--remote", remote, "--config", str(keys_config(tmp_path))]
    code, out, err, peak_mb = _run_measured(args, clean_env, tmp_path)
    assert code == 0, err
    report = json.loads(out)["chip_folders"][0]
    assert sorted(report["fetched_names"]) == real, report
    assert peak_mb < PEAK_MB, f"warm peaked at {peak_mb:.0f} MB"
    lines = [ln for ln in err.splitlines() if "passed over" in ln]
    assert len(lines) == 1, err
    assert "60 members passed over" in lines[0] and "250 bytes a name" in lines[0], lines
    assert f"{redis_tier.MAX_SKIPPED} passed over, 15000 ms a read)" in lines[0], lines
    assert "Traceback" not in err
    for kernel in real:
        assert (root / "kernel_cache" / SOC / f"{kernel}.json").is_file()


def test_a_redis_index_read_stops_after_its_cap_of_bad_members(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Names that cannot be a kernel's (251 bytes, a ``/``, empty) are passed over on the
    server; a 250-byte name is one; after ``MAX_SKIPPED`` bad members the read stops (a
    writer of the index cannot make a read scan it all) and the warning says so."""
    tier = RedisTier(parse_spec(redis_server.url, "test"))
    probe = redis_server.client()
    index = RedisTier.index_key(SOC)
    longest = "n" * 250
    probe.zadd(index, {"te_ok": 1.0, longest: 2.0, "x" * 251: 3.0, "../te": 4.0, "": 5.0})
    with caplog.at_level(logging.WARNING, "cachemgr.remote.redis_tier"):
        assert tier.recent(SOC, 10) == [longest, "te_ok"]
        assert tier.recent(SOC, 1) == [longest]
    assert "3 members passed over" in caplog.text and "stopped" not in caplog.text
    caplog.clear()
    bad = {f"bad/{i}": 10.0 + i for i in range(redis_tier.MAX_SKIPPED + 50)}
    probe.zadd(index, bad)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, "cachemgr.remote.redis_tier"):
        assert tier.recent(SOC, 10) == []
    assert f"{redis_tier.MAX_SKIPPED} members passed over" in caplog.text, caplog.text
    assert "the read stopped at a cap" in caplog.text
    tier.close()


def _put_object(server: NginxServer, key: str, doc: dict[str, object] | bytes) -> None:
    """Write an index object straight into nginx's folder (``flat`` layout), as a writer of
    the remote may."""
    path = server.root / hashlib.sha256(key.encode()).hexdigest()
    path.write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())


def test_an_http_index_of_many_writers_and_fat_shards_is_read_within_its_caps(
    nginx_server: NginxServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A registry listing 300 writers, shards with more names than a writer keeps: at most
    ``MAX_INDEX_WRITERS`` shards are fetched (this writer's own first), a fat shard is passed
    over unparsed, the names kept are the newest, and one warning line names every cap."""
    spec = parse_spec(nginx_server.url + "|layout=flat", "test")
    me = "f" * 16
    writers = [f"{i:016x}" for i in range(300)]
    _put_object(
        nginx_server,
        HttpTier.registry_key(SOC),
        {"format": 1, "soc_version": SOC, "writers": [*writers, me]},
    )

    def shard(writer: str, kernels: dict[str, float]) -> None:
        doc = {"format": 1, "soc_version": SOC, "writer": writer, "kernels": kernels}
        _put_object(nginx_server, HttpTier.shard_key(SOC, writer), doc)

    shard(me, {"te_mine": 5.0})
    fat = {f"te_fat{i}": 1e12 + i for i in range(http_tier.INDEX_KEEP + 1)}
    shard(writers[0], fat)  # newer than everything, but more names than a writer keeps
    for i, w in enumerate(writers[1:], 1):
        shard(w, {f"te_w{i}": float(i), "te_mine": 1.0})
    reader = HttpTier(spec, writer=me)
    before = len(nginx_server.requests("GET"))
    with caplog.at_level(logging.WARNING, "cachemgr.remote.http_tier"):
        names = reader.recent(SOC, 100)
    gets = len(nginx_server.requests("GET")) - before
    assert gets == 1 + 64, gets  # the registry and 64 shards (MAX_INDEX_WRITERS)
    top = 64 - 2  # read: mine, the fat one (passed over), 1..62
    assert names[:3] == [f"te_w{top}", f"te_w{top - 1}", f"te_w{top - 2}"], names
    assert len(names) == top + 1 and "te_mine" in names, names  # mine, newest time (5.0)
    assert names.index("te_mine") == names.index("te_w5") - 1, names
    assert not any(n.startswith("te_fat") for n in names)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    caps = f"64 writers, {http_tier.MAX_INDEX_BYTES} bytes and "
    caps += f"{http_tier.INDEX_KEEP} names a shard, 100 names kept"
    assert caps in lines[0] and "63 of 301 writers' shards read, 1 passed over" in lines[0]
    # only the newest ``limit`` are kept between shards, and they are the right ones
    assert reader.recent(SOC, 3) == [f"te_w{top}", f"te_w{top - 1}", f"te_w{top - 2}"]
    reader.close()
