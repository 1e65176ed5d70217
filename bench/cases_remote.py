"""Remote tier: a remote hit's latency against the compile it saves, and
what a remote adds to a local miss when it is healthy, slow and down (breaker open).

Real servers on loopback: ``redis-server`` and wsgidav (HTTP, ``bazel`` layout). A remote hit
is fetch + verify (the writer's ed25519 signature, every part's sha256, the entry's parts) +
publish into the local chip folder. The signature's own cost, per entry, is measured apart:
signing an upload's header and verifying a fetched one (docs/remote.md#keys).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

from bench import cases_compile
from bench.harness import Row, ratio_of
from cachemgr.remote import blob, signing, warm
from cachemgr.remote.config import RemoteConfig, parse_spec
from cachemgr.remote.tierset import RemoteTiers
from cachemgr.storage.tiers import EntryFiles, LocalTier
from tests.conftest import kernel_json
from tests.remote_util import RedisServer, WebDavServer, free_port, site_keys, trust_fields

NAME = "remote"
SOC = "Ascend910B1"
BINARY_BYTES = 256 * 1024


#: Where the bench's site key lives (set by :func:`run`).
_KEYS_DIR: list[Path] = []


def _tiers(url: str, open_s: float = 60.0, timeout_ms: int = 500) -> RemoteTiers:
    spec = parse_spec(f"{url}|operation-timeout={timeout_ms}|connect-timeout={timeout_ms}", "b")
    trust = trust_fields(_KEYS_DIR[0])
    config = RemoteConfig((spec,), "bench", 64, 3, open_s, **trust)
    tiers = RemoteTiers.from_config(config)
    assert tiers is not None
    return tiers


def _entry(i: int) -> EntryFiles:
    kernel = f"te_remote_{i:04d}"
    data = os.urandom(BINARY_BYTES)
    doc = json.dumps(kernel_json(kernel, data)).encode()
    return EntryFiles(SOC, kernel, {kernel + ".json": doc, kernel + ".o": data})


def _hit_ms(tiers: RemoteTiers, work: Path, n: int) -> list[float]:
    """Remote hit: fetch + verify + publish locally, per distinct kernel (seconds)."""
    entries = [_entry(i) for i in range(n)]
    for item in entries:
        tiers.tiers[0].put(item)
    local = LocalTier(work / "kernel_cache")
    times = []
    for item in entries:
        start = time.perf_counter()
        got = tiers.fetch(SOC, item.kernel)
        assert got is not None
        local.put(got[0])
        times.append(time.perf_counter() - start)
    return times


def _warm_rate(tiers: RemoteTiers, work: Path, n: int, offset: int) -> tuple[float, int]:
    """``warm`` of a fresh chip folder from the remote's index (list, fetch, verify, publish
    GE's way): entries per second and entries fetched. The entries go up first, through the
    upload path (so the index is the one a daemon writes)."""
    source = work / "source" / "kernel_cache"
    local = LocalTier(source)
    for i in range(offset, offset + n):
        local.put(_entry(i))
        tiers.upload_now(source, SOC, f"te_remote_{i:04d}")
    tiers.flush_indexes()
    fresh = work / "fresh" / "kernel_cache"
    start = time.perf_counter()
    report = warm.warm_chip(tiers, fresh, SOC, None, n, None)
    seconds = time.perf_counter() - start
    return len(report.fetched) / seconds, len(report.fetched)


def _compile_s(work: Path, n: int) -> list[float]:
    """The compile a hit saves: gcc -c of the example softmax kernel (seconds)."""
    src = cases_compile.REQUESTS.parent / "kernels" / "c" / "softmax.c"
    times = []
    for i in range(n):
        start = time.perf_counter()
        subprocess.run(
            ["gcc", "-O2", "-c", str(src), "-o", str(work / f"k{i}.o")],
            check=True,
            capture_output=True,
        )
        times.append(time.perf_counter() - start)
    return times


def _sign_verify_s(keys: signing.Keys, n: int) -> tuple[list[float], list[float], float, float]:
    """Per entry: sign an upload's signed bytes, and verify a fetched blob's signature
    (seconds each) — the header of a real entry, as :func:`blob.encode` builds it; then the
    CPU seconds per sign and per verify (a shared host's load does not count in them)."""
    raw = blob.encode(_entry(0), keys)
    klen = raw[10]
    sig_at = 11 + klen
    hlen_at = sig_at + signing.SIGNATURE_BYTES
    hlen = int.from_bytes(raw[hlen_at : hlen_at + 4], "big")
    message = raw[:sig_at] + raw[hlen_at : hlen_at + 4 + hlen]
    signature = raw[sig_at:hlen_at]
    name = keys.signer_name or ""
    signs, verifies = [], []
    for _ in range(n):
        start = time.perf_counter()
        keys.sign(message)
        signs.append(time.perf_counter() - start)
        start = time.perf_counter()
        assert keys.verify(name, signature, message) is None
        verifies.append(time.perf_counter() - start)
    cpu = time.process_time()
    for _ in range(n):
        keys.sign(message)
    sign_cpu = (time.process_time() - cpu) / n
    cpu = time.process_time()
    for _ in range(n):
        keys.verify(name, signature, message)
    return signs, verifies, sign_cpu, (time.process_time() - cpu) / n


def _miss_ms(tiers: RemoteTiers, n: int) -> list[float]:
    times = []
    for i in range(n):
        start = time.perf_counter()
        assert tiers.fetch(SOC, f"te_absent_{i}") is None
        times.append(time.perf_counter() - start)
    return times


def _silent_server() -> tuple[socket.socket, int]:
    """A listener that accepts and never answers: a remote too slow for its timeout."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return srv, int(srv.getsockname()[1])


def run(workdir: Path, quick: bool) -> list[Row]:
    n = 20 if quick else 200
    ms = cases_compile._ms
    rows: list[Row] = []
    _KEYS_DIR[:] = [workdir / "keys"]
    signs, verifies, sign_cpu, verify_cpu = _sign_verify_s(
        site_keys(_KEYS_DIR[0]), 200 if quick else 2000
    )
    for what, times, cpu_s in (
        ("sign an upload", signs, sign_cpu),
        ("verify a fetched entry", verifies, verify_cpu),
    ):
        rows.append(
            Row(
                f"signature: {what}",
                "p50 per entry (ed25519 over the header)",
                ms(times),
                "ms",
                "",
                None,
                None,
                "≤ 0.2 ms",
                ms(times) <= 0.2,
                f"{len(times)} entries; p99 {ms(times, 0.99):.3f} ms; CPU time "
                f"{cpu_s * 1e3:.3f} ms per entry",
            )
        )
    compile_ms = ms(_compile_s(workdir, 5 if quick else 15))
    redis_dir, dav_dir = workdir / "redis", workdir / "dav"
    redis_dir.mkdir()
    redis = RedisServer(redis_dir, free_port())
    dav = WebDavServer(dav_dir / "root", free_port())
    dav.root.mkdir(parents=True)
    redis.start()
    dav.start()
    try:
        for label, url in (
            ("Redis", redis.url),
            ("HTTP bazel layout (wsgidav)", dav.url + "|layout=bazel"),
        ):
            tiers = _tiers(url)
            sub = workdir / label.split()[0]
            hits = _hit_ms(tiers, sub, n)
            h50 = ms(hits)
            rows.append(
                Row(
                    f"remote hit, {label}",
                    "p50 latency (fetch, verify, publish)",
                    h50,
                    "ms",
                    "gcc -O2 -c it saves",
                    compile_ms,
                    ratio_of(h50, compile_ms),
                    "",
                    None,
                    f"{n} distinct kernels, {BINARY_BYTES // 1024} KiB binary; p99 "
                    f"{ms(hits, 0.99):.2f} ms",
                )
            )
            rate, fetched = _warm_rate(tiers, sub, n, offset=10_000)
            rows.append(
                Row(
                    f"warm, {label}",
                    "entries per second (index, fetch, verify, publish GE's way)",
                    rate,
                    "entries/s",
                    "gcc -O2 -c compiles per second",
                    1000.0 / compile_ms,
                    ratio_of(rate, 1000.0 / compile_ms),
                    "",
                    None,
                    f"{fetched} entries of {BINARY_BYTES // 1024} KiB into an empty chip folder",
                )
            )
            healthy = ms(_miss_ms(tiers, n))
            rows.append(
                Row(
                    f"local miss + healthy remote, {label}",
                    "p50 added to the miss",
                    healthy,
                    "ms",
                    "gcc -O2 -c",
                    compile_ms,
                    ratio_of(healthy, compile_ms),
                    "",
                    None,
                    "remote miss: one GET",
                )
            )
            tiers.close()
    finally:
        redis.stop()
        dav.stop()
        shutil.rmtree(dav_dir, ignore_errors=True)
    srv, port = _silent_server()
    slow = _tiers(f"redis://127.0.0.1:{port}/0", timeout_ms=200)
    before_open = _miss_ms(slow, 1)  # it costs the timeout, and a timed-out lookup trips
    after_open = _miss_ms(slow, n * 10)
    srv.close()
    rows.append(
        Row(
            "local miss + slow remote (never answers)",
            "added to the one miss that opens the breaker",
            ms(before_open),
            "ms",
            "operation-timeout",
            200.0,
            ratio_of(ms(before_open), 200.0),
            "≤ timeout",
            ms(before_open) <= 200.0 * 1.5,
            "a timed-out lookup opens the breaker at once",
        )
    )
    rows.append(
        Row(
            "local miss + slow remote, breaker open",
            "p99 added per miss",
            ms(after_open, 0.99),
            "ms",
            "",
            None,
            None,
            "≤ 1 ms",
            ms(after_open, 0.99) <= 1.0,
            f"{len(after_open)} misses; p50 {ms(after_open) * 1e3:.1f} µs",
        )
    )
    down = _tiers(f"redis://127.0.0.1:{free_port()}/0")
    _miss_ms(down, 3)  # connection refused ×3: the breaker opens
    down_open = _miss_ms(down, n * 10)
    rows.append(
        Row(
            "local miss + remote down, breaker open",
            "p99 added per miss",
            ms(down_open, 0.99),
            "ms",
            "",
            None,
            None,
            "≤ 1 ms",
            ms(down_open, 0.99) <= 1.0,
            f"{len(down_open)} misses; p50 {ms(down_open) * 1e3:.1f} µs",
        )
    )
    return rows
