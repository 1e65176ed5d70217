"""The HTTP tier on two real WebDAV servers — wsgidav and Debian's nginx — with a deep prefix
(every missing folder made with ``MKCOL`` from the top), and an entry too big for the server
(``413``) or for the remote's cap, which is that entry's problem and never opens the breaker
(docs/remote.md#webdav, docs/remote.md#sizes)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import redis

from cachemgr.remote import blob
from cachemgr.remote.config import RemoteConfig, parse_spec
from cachemgr.remote.http_tier import HttpTier
from cachemgr.remote.tierset import OK, RemoteTiers
from tests.conftest import SOC
from tests.daemon_util import wait_for
from tests.remote_util import NginxServer, RedisServer, WebDavServer, publish_own, trust_fields

PREFIX = "/very/long/prefix"


def _tiers(url: str, keys_dir: Path, failures_before_open: int = 1) -> RemoteTiers:
    """One remote named ``dav`` whose first failure opens its breaker (so a wrongly blamed
    entry shows at once), signing with a key made in ``keys_dir``."""
    spec = parse_spec(f"{url}|name=dav|operation-timeout=5000", "test")
    config = RemoteConfig(
        (spec,),
        "test",
        failures_before_open=failures_before_open,
        open_s=60,
        **trust_fields(keys_dir),
    )
    tiers = RemoteTiers.from_config(config)
    assert tiers is not None
    return tiers


def _upload_and_fetch_back(tiers: RemoteTiers, kcd: Path, kernel: str) -> None:
    own = publish_own(kcd / SOC, kernel, os.urandom(3000))
    assert tiers.upload_now(kcd, SOC, kernel, digests=own) == 1, tiers.stats()
    tiers.flush_indexes()  # the index shard and registry land under the prefix too
    got = tiers.fetch(SOC, kernel)
    assert got is not None and got[1] == "dav", tiers.stats()
    assert tiers.drain(), "the use noted by the fetch is written in the background"
    assert tiers.recent(SOC, 10) == ([kernel], "dav")


def test_three_level_prefix_on_wsgidav(webdav_server: WebDavServer, tmp_path: Path) -> None:
    """``http://host/very/long/prefix`` on an empty wsgidav: each folder is made from the
    top, the entry and the index land under the prefix."""
    tiers = _tiers(f"http://127.0.0.1:{webdav_server.port}{PREFIX}", tmp_path)
    try:
        _upload_and_fetch_back(tiers, tmp_path / "kernel_cache", "te_deep")
        h = HttpTier.digest(SOC, "te_deep")
        stored = webdav_server.root / PREFIX.lstrip("/") / h[:2] / h[2:]
        assert stored.is_file() and blob.decode(stored.read_bytes(), SOC, "te_deep", tiers.keys)
        under = webdav_server.root / PREFIX.lstrip("/")
        assert all(under in p.parents for p in webdav_server.files() if "cache" not in p.parts)
        assert tiers.stats()["dav"]["errors"] == 0
    finally:
        tiers.close()


def test_three_level_prefix_on_nginx(nginx_server: NginxServer, tmp_path: Path) -> None:
    """The same on nginx's WebDAV module with ``create_full_put_path off``: its ``PUT`` into
    a missing folder fails (``500``), the folders are made with ``MKCOL`` from the top — the
    access log shows each one — and the ``PUT`` is tried once more."""
    tiers = _tiers(nginx_server.url + PREFIX, tmp_path)
    try:
        _upload_and_fetch_back(tiers, tmp_path / "kernel_cache", "te_deep")
        h = HttpTier.digest(SOC, "te_deep")
        assert (nginx_server.root / PREFIX.lstrip("/") / h[:2] / h[2:]).is_file()
        made = [ln.split('"')[1].split()[1] for ln in nginx_server.requests("MKCOL")]
        assert made[:4] == ["/very/", "/very/long/", "/very/long/prefix/", f"{PREFIX}/{h[:2]}/"]
        assert tiers.stats()["dav"]["errors"] == 0
    finally:
        tiers.close()


def test_413_and_the_cap_are_the_entrys_problem_not_an_outage(
    nginx_server: NginxServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """nginx takes bodies up to 1 MiB: a 2 MiB entry is answered ``413`` — counted as
    ``oversized``, the breaker stays closed (its first failure would open it) — then a small
    entry uploads and lookups still go to the remote. With the remote's cap under an entry's
    size, the entry is not sent at all (no ``PUT`` in nginx's log), counted, logged once."""
    caplog.set_level(logging.WARNING, "cachemgr.remote.tierset")
    kcd = tmp_path / "kernel_cache"
    tiers = _tiers(nginx_server.url + "/cache", tmp_path)
    try:
        own = publish_own(kcd / SOC, "te_big", os.urandom(2 << 20))
        assert tiers.upload_now(kcd, SOC, "te_big", digests=own) == 0
        # nginx logs a refused request once it has read (and dropped) the rest of its body
        wait_for(lambda: any('" 413 ' in ln for ln in nginx_server.requests("PUT")), 30, "413")
        row = tiers.stats()["dav"]
        assert (row["state"], row["errors"], row.get("oversized")) == (OK, 0, 1), row
        _upload_and_fetch_back(tiers, kcd, "te_small")
        assert tiers.stats()["dav"]["hits"] == 1

        tier = tiers.tiers[0]
        tier.max_blob_bytes = 100_000
        puts = len(nginx_server.requests("PUT"))
        for kernel in ("te_over_cap", "te_over_cap2"):
            own = publish_own(kcd / SOC, kernel, os.urandom(200_000))
            assert tiers.upload_now(kcd, SOC, kernel, digests=own) == 0
        assert len(nginx_server.requests("PUT")) == puts, "nothing sent over the cap"
        row = tiers.stats()["dav"]
        assert (row["state"], row["errors"], row.get("oversized")) == (OK, 0, 3), row
        lines = [r.getMessage() for r in caplog.records if "not uploaded" in r.getMessage()]
        assert len(lines) == 1 and "te_big" in lines[0] and "HTTP 413" in lines[0], lines
    finally:
        tiers.close()


def test_redis_dropping_an_oversized_value_is_not_an_outage(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A Redis whose ``proto-max-bulk-len`` is 1 MiB drops the connection on a 2 MiB value;
    the server still answers, so the entry is counted ``oversized`` and the breaker stays
    closed: the next entry uploads and is fetched back."""
    redis_server.client().config_set("proto-max-bulk-len", "1mb")
    spec = parse_spec(redis_server.url + "|name=r", "test")
    config = RemoteConfig((spec,), "test", failures_before_open=1, **trust_fields(tmp_path))
    tiers = RemoteTiers.from_config(config)
    assert tiers is not None
    kcd = tmp_path / "kernel_cache"
    try:
        own = publish_own(kcd / SOC, "te_big", os.urandom(2 << 20))
        assert tiers.upload_now(kcd, SOC, "te_big", digests=own) == 0
        row = tiers.stats()["r"]
        assert (row["state"], row.get("oversized")) == (OK, 1), row
        own = publish_own(kcd / SOC, "te_small", os.urandom(3000))
        assert tiers.upload_now(kcd, SOC, "te_small", digests=own) == 1
        assert tiers.fetch(SOC, "te_small") is not None
        assert redis_server.client().exists(f"cachemgr:{blob.FORMAT_VERSION}:{SOC}:te_small")
    except redis.RedisError as exc:  # pragma: no cover - a failure message, not a skip
        pytest.fail(f"the tier set let a Redis error through: {exc}")
    finally:
        tiers.close()
