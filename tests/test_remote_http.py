"""The HTTP tier against a real WebDAV server (wsgidav) accepting PUT:
ccache's three layouts, verification of what comes back, two sites through ``bazel``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cachemgr.remote import blob
from cachemgr.remote.config import RemoteConfig, parse_spec
from cachemgr.remote.http_tier import HttpTier
from cachemgr.remote.tierset import RemoteTiers
from cachemgr.storage.tiers import EntryFiles
from tests.compile_util import calls, counting_cc, request_data
from tests.conftest import SOC, kernel_json
from tests.daemon_util import daemon_env, start_daemon, wait_for
from tests.remote_util import WebDavServer, free_port, keys_toml, trust_fields


def _entry(kernel: str) -> EntryFiles:
    data = os.urandom(2000)
    doc = json.dumps(kernel_json(kernel, data)).encode()
    return EntryFiles(SOC, kernel, {kernel + ".json": doc, kernel + ".o": data})


@pytest.mark.parametrize(
    ("layout", "shape"),
    [("flat", ["{h}"]), ("subdirs", ["{h2}", "{rest}"]), ("bazel", ["ac", "{h}"])],
)
def test_layouts_put_get_head_delete(
    webdav_server: WebDavServer, layout: str, shape: list[str], tmp_path: Path
) -> None:
    spec = parse_spec(f"{webdav_server.url}|layout={layout}|name=dav", "test")
    tiers = RemoteTiers.from_config(RemoteConfig((spec,), "test", **trust_fields(tmp_path)))
    assert tiers is not None
    tier = tiers.tiers[0]
    assert isinstance(tier, HttpTier)
    item = _entry("te_http")
    assert not tier.lookup(SOC, "te_http") and tiers.fetch(SOC, "te_http") is None
    tier.put(item)
    h = HttpTier.digest(SOC, "te_http")
    parts = [p.format(h=h, h2=h[:2], rest=h[2:]) for p in shape]
    stored = webdav_server.root / "cache" / Path(*parts)
    assert webdav_server.files() == [stored]
    assert blob.decode(stored.read_bytes(), SOC, "te_http", tiers.keys).files == item.files
    assert tier.lookup(SOC, "te_http")
    got = tiers.fetch(SOC, "te_http")
    assert got is not None and got[0].files == item.files and got[1] == "dav"
    raw = stored.read_bytes()  # tampered on the server: the last byte flipped (never a no-op,
    stored.write_bytes(raw[:-1] + bytes([raw[-1] ^ 0xFF]))  # as writing 0 over a 0 would be)
    assert tiers.fetch(SOC, "te_http") is None
    assert tiers.stats()["dav"]["rejected"] == 1
    assert tier.remove(SOC, "te_http") and not tier.lookup(SOC, "te_http")
    tiers.close()


def test_two_sites_share_a_kernel_over_http_bazel_layout(
    webdav_server: WebDavServer, tmp_path: Path
) -> None:
    """Proof (b): as proof (a), over HTTP with the ``bazel`` layout."""
    cc = counting_cc(tmp_path / "cc")
    remote = webdav_server.url + "|layout=bazel|name=bazel"
    daemons = []
    for site in ("a", "b"):
        folder = tmp_path / site
        folder.mkdir()
        cfg = folder / "c.toml"
        cfg.write_text(
            f'[compilers]\ncc = "{cc}"\n[remote]\nstorage = ["{remote}"]\n' + keys_toml(tmp_path)
        )
        args = ("--cache-dir", str(folder / "cache"), "--config", str(cfg))
        daemons.append(start_daemon(folder, *args, env=daemon_env(folder)))
    a, b = daemons
    try:
        data = request_data(defines={"N": 1818, "B_N": 1})
        first = a.client.compile(data).to_json()
        assert first["status"] == "compiled", first
        kernel, soc = first["kernel_name"], Path(first["files"][0]).parent.name
        slot = webdav_server.root / "cache" / "ac" / HttpTier.digest(soc, kernel)
        wait_for(slot.is_file, 30, "the upload from site A")
        second = b.client.compile(data).to_json()
        assert second["status"] == "hit" and second["tier"] == "remote:bazel", second
        third = b.client.compile(data).to_json()
        assert third["status"] == "hit" and "tier" not in third, third
        assert len(calls(tmp_path / "cc")) == 1, "the compiler ran once in total"
    finally:
        a.stop()
        b.stop()


def test_the_first_failure_of_a_run_is_one_line_naming_the_server(tmp_path: Path) -> None:
    """A daemon whose HTTP remote refuses connections: only the breaker's opening was
    logged, so the failures before it (``failures_before_open``, here 50) left no trace of
    an outage under way. The first failure of the run is one warning line naming the
    remote, its URL and the error; the ones after it are not said again."""
    url = f"http://127.0.0.1:{free_port()}/cache"
    cc = counting_cc(tmp_path / "cc")
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[compilers]\ncc = "{cc}"\n[remote]\nstorage = ["{url}|name=down"]\n'
        "failures_before_open = 50\n" + keys_toml(tmp_path)
    )
    d = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "cache"), "--config", str(cfg))
    try:
        for n in (7301, 7302):
            done = d.client.compile(request_data(defines={"N": n, "B_N": 1})).to_json()
            assert done["status"] == "compiled", done

        def errors() -> int:
            return int(d.client.stats().to_json()["remotes"]["down"]["errors"])

        wait_for(lambda: errors() >= 4, 30, "the lookups' and uploads' failures")
        assert d.client.stats().to_json()["remotes"]["down"]["state"] == "ok"  # not open yet
    finally:
        d.stop()
    said = [line for line in d.log().splitlines() if "remote down" in line]
    assert len(said) == 1, said
    assert f"WARNING cachemgr.remote.tierset: remote down ({url}): ConnectionError" in said[0]
    assert "Connection refused" in said[0], said
