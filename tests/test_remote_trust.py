"""A remote tier you can trust (docs/remote.md#keys): entries are signed by their writer's
ed25519 key and accepted only from ``[remote] trusted_keys``; only trusted writers' entries
travel; a blob carries its entry's parts and nothing else; error lines name the URL. Real
``redis-server``, a real HTTP server, real daemons, real users."""

from __future__ import annotations

import base64
import http.server
import json
import logging
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachemgr.remote import blob, signing
from cachemgr.remote.config import RemoteConfig, parse_spec
from cachemgr.remote.redis_tier import RedisTier
from cachemgr.remote.tierset import RemoteTiers
from cachemgr.storage.tiers import EntryFiles, LocalTier
from tests import ge_twin
from tests.compile_util import calls, counting_cc, request_data
from tests.conftest import SOC, kernel_json, publish, run_cli
from tests.daemon_util import AS_ROOT, Daemon, daemon_env, start_daemon, wait_for
from tests.remote_util import (
    TEST_KEY,
    RedisServer,
    free_port,
    http_server,
    keys_config,
    keys_toml,
    publish_own,
    site_key,
    site_keys,
    trust_fields,
)
from tests.users_util import Users


def _site(tmp: Path, name: str, cc: Path, remote: str, remote_toml: str) -> tuple[Daemon, Path]:
    folder = tmp / name
    folder.mkdir()
    cfg = folder / "c.toml"
    cfg.write_text(f'[compilers]\ncc = "{cc}"\n[remote]\nstorage = ["{remote}"]\n{remote_toml}')
    root = folder / "cache"
    d = start_daemon(folder, "--cache-dir", str(root), "--config", str(cfg), env=daemon_env(folder))
    return d, root


def _fresh_keys(folder: Path, name: str) -> signing.Keys:
    """An outsider's key: made with cachemgr's own keygen, trusted by nobody."""
    folder.mkdir(parents=True, exist_ok=True)
    signing.create_key_file(folder / f"{name}.key", name)
    return signing.Keys(secret=signing.read_key_file(folder / f"{name}.key", "test"))


def _evil(item: EntryFiles) -> EntryFiles:
    """``item`` with its binary replaced and its json's sha256 made to match: a
    well-formed entry of the attacker's code."""
    files = dict(item.files)
    doc = json.loads(files[item.main_json])
    binary = b"\x7fELF evil code " + os.urandom(64)
    files[doc["binFileName"] + doc["binFileSuffix"]] = binary
    files[item.main_json] = json.dumps(kernel_json(item.kernel, binary)).encode()
    return EntryFiles(item.soc_version, item.kernel, files)


def test_an_outsiders_blob_is_rejected_the_site_compiles_and_warm_brings_nothing(
    redis_server: RedisServer, tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """The attack of the issue: an outsider replaces a Redis value with a well-formed blob
    made with cachemgr's own encoder, its sha256 fields matching its own ``.o``, signed by a
    fresh key (and then by one impersonating the trusted key's name). Site B compiles the
    kernel locally (not a remote hit), counts the rejections by reason in ``stats --json``
    and ``/metrics``, logs one line per key; ``warm`` at a third site brings nothing."""
    cc = counting_cc(tmp_path / "cc")
    remote = redis_server.url + "|name=shared"
    trust = keys_toml(tmp_path)
    a, root_a = _site(tmp_path, "a", cc, remote, trust)
    b, root_b = _site(tmp_path, "b", cc, remote, trust)
    probe = redis_server.client()
    try:
        data = request_data(defines={"N": 2424, "B_N": 1})
        first = a.client.compile(data).to_json()
        assert first["status"] == "compiled", first
        kernel, soc = first["kernel_name"], Path(first["files"][0]).parent.name
        key = RedisTier.key(soc, kernel)
        wait_for(lambda: probe.exists(key), 30, "the upload from site A")
        genuine = LocalTier(root_a / "kernel_cache").read(soc, kernel)
        assert genuine is not None
        evil = _evil(genuine)
        probe.set(key, blob.encode(evil, _fresh_keys(tmp_path / "outsider", "outsider")))

        second = b.client.compile(data).to_json()
        assert second["status"] == "compiled" and "tier" not in second, second
        assert len(calls(tmp_path / "cc")) == 2, "site B compiled it itself"
        served = (root_b / "kernel_cache" / soc / f"{kernel}.o").read_bytes()
        assert served == genuine.files[f"{kernel}.o"] and b"evil" not in served

        wait_for(  # B uploads its own compile: let it land before the next attack
            lambda: b.client.stats().to_json()["remotes"]["shared"]["uploads"] == 1,
            30,
            "B's upload",
        )
        impostor = _fresh_keys(tmp_path / "impostor", TEST_KEY)  # the trusted key's name
        probe.set(key, blob.encode(evil, impostor))
        for name in (f"{kernel}.json", f"{kernel}.o"):
            (root_b / "kernel_cache" / soc / name).unlink()
        third = b.client.compile(data).to_json()
        assert third["status"] == "compiled" and "tier" not in third, third

        at_b = ("--socket", str(b.socket_path), "--cache-dir", str(root_b))
        shown = run_cli("stats", "--json", *at_b, env=b.env)
        assert shown.returncode == 0, shown.stderr
        stats = json.loads(shown.stdout)
        row = stats["remotes"]["shared"]
        assert row["hits"] == 0 and row["rejected"] == 2, row
        assert row["rejected_by_reason"] == {"bad_signature": 1, "unknown_key": 1}, row
        assert stats["remote_rejected"] == {"bad_signature": 1, "unknown_key": 1}, stats
        metrics = b.client.request("GET", "/metrics")
        for reason in ("unknown_key", "bad_signature"):
            line = f'cachemgr_remote_rejected_by_reason_total{{reason="{reason}",remote="shared"}}'
            assert f"{line} 1.0" in metrics, metrics
        assert b.log().count("rejected (unknown_key)") == 1, b.log()
        assert "key 'outsider'" in b.log()

        wait_for(
            lambda: b.client.stats().to_json()["remotes"]["shared"]["uploads"] == 2,
            30,
            "B's second upload",
        )
        probe.set(key, blob.encode(evil, _fresh_keys(tmp_path / "outsider2", "outsider")))
        probe.zadd(RedisTier.index_key(soc), {kernel: 1e10})  # listed first
        cfg_c = keys_config(tmp_path)
        root_c = tmp_path / "c" / "cache"
        out = run_cli(
            "warm", "--json", "--soc", soc, "--cache-dir", str(root_c), "--config", str(cfg_c),
            "--remote", remote, env=clean_env,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)["chip_folders"][0]
        assert report["fetched"] == 0 and report["missing"] == 1, report
        assert json.loads(out.stdout)["remotes"]["shared"]["rejected_by_reason"] == {
            "unknown_key": 1
        }
        assert not (root_c / "kernel_cache" / soc / f"{kernel}.json").exists()
    finally:
        a.stop()
        b.stop()


def test_rotation_two_trusted_keys_both_work_and_a_retired_key_is_rejected(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Two sites sign with two keys; a reader trusting both takes both entries; after the
    old key is retired (dropped from ``trusted_keys``) its entries are rejected
    (``unknown_key``) and the new key's still accepted."""
    spec = parse_spec(redis_server.url + "|name=r", "test")
    old = RedisTier(spec, keys=site_keys(tmp_path / "old", "site-2024"))
    new = RedisTier(spec, keys=site_keys(tmp_path / "new", "site-2025"))
    chip = tmp_path / "src" / SOC
    chip.mkdir(parents=True)
    for kernel, tier in (("te_old", old), ("te_new", new)):
        publish(chip, kernel, os.urandom(1000))
        item = LocalTier(chip.parent).read(SOC, kernel)
        assert item is not None
        tier.put(item)
    _, old_line = site_key(tmp_path / "old", "site-2024")
    _, new_line = site_key(tmp_path / "new", "site-2025")

    def reader(*lines: str) -> RemoteTiers:
        keys = tuple(signing.parse_public_key(x, "test") for x in lines)
        tiers = RemoteTiers.from_config(RemoteConfig((spec,), "test", trusted_keys=keys))
        assert tiers is not None
        return tiers

    both = reader(old_line, new_line)
    assert both.fetch(SOC, "te_old") is not None and both.fetch(SOC, "te_new") is not None
    assert both.stats()["r"]["rejected"] == 0
    both.close()
    retired = reader(new_line)
    assert retired.fetch(SOC, "te_old") is None
    got = retired.fetch(SOC, "te_new")
    assert got is not None and got[0].files == LocalTier(chip.parent).read(SOC, "te_new").files
    assert retired.stats()["r"]["rejected_by_reason"] == {"unknown_key": 1}
    retired.close()
    old.close()
    new.close()


def _signed_blob(files: dict[str, bytes], kernel: str, keys: signing.Keys) -> bytes:
    """A format-2 blob of ``files`` as they are, signed with ``keys`` — what a writer that
    skips the parts check (an old or hostile cachemgr) would send."""
    import hashlib

    names = sorted(files, key=lambda n: (n == kernel + ".json", n))
    header = {
        "format": 2,
        "soc_version": SOC,
        "kernel": kernel,
        "files": [
            {"name": n, "size": len(files[n]), "sha256": hashlib.sha256(files[n]).hexdigest()}
            for n in names
        ],
    }
    raw = json.dumps(header, separators=(",", ":")).encode()
    name = (keys.signer_name or "").encode()
    head = blob.MAGIC + (2).to_bytes(2, "big") + bytes([len(name)]) + name
    hlen = len(raw).to_bytes(4, "big")
    return b"".join([head, keys.sign(head + hlen + raw), hlen, raw, *(files[n] for n in names)])


@pytest.mark.parametrize(
    "extra",
    ["te_lk.lock", "te_lk.manifest", "te_lk.json.bak", "te_lk.json.1234.temp", "te_lk.o.tmp"],
)
def test_a_blob_carrying_a_file_that_is_not_a_part_of_its_entry_is_rejected(
    redis_server: RedisServer, tmp_path: Path, clean_env: dict[str, str], extra: str
) -> None:
    """A blob signed by a trusted key but carrying ``<kernel>.lock`` (contents LOCKDATA), a
    ``.manifest``, a ``.bak`` or a temp name besides the entry's parts: rejected (reason
    ``parts``), and ``warm`` writes nothing of it into the chip folder; the same entry
    without the extra file is taken."""
    keys = site_keys(tmp_path)
    binary = os.urandom(800)
    files = {
        "te_lk.json": json.dumps(kernel_json("te_lk", binary)).encode(),
        "te_lk.o": binary,
        extra: b"LOCKDATA",
    }
    probe = redis_server.client()
    probe.set(RedisTier.key(SOC, "te_lk"), _signed_blob(files, "te_lk", keys))
    probe.zadd(RedisTier.index_key(SOC), {"te_lk": 1.0})
    root = tmp_path / "cache"
    base = ("--soc", SOC, "--cache-dir", str(root), "--config", str(keys_config(tmp_path)))
    out = run_cli("warm", "--json", *base, "--remote", redis_server.url, env=clean_env)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["chip_folders"][0]["fetched"] == 0, answer
    remote = answer["remotes"][redis_server.url]
    assert remote["rejected_by_reason"] == {"parts": 1}, remote
    assert f"{extra!r}" in out.stderr and "not a part of te_lk" in out.stderr, out.stderr
    chip = root / "kernel_cache" / SOC
    written = [p for p in chip.iterdir()] if chip.exists() else []
    assert not any(p.read_bytes() == b"LOCKDATA" for p in written if p.is_file()), written
    del files[extra]  # the entry alone is well formed: taken
    probe.set(RedisTier.key(SOC, "te_lk"), _signed_blob(files, "te_lk", keys))
    out = run_cli("warm", "--json", *base, "--remote", redis_server.url, env=clean_env)
    assert json.loads(out.stdout)["chip_folders"][0]["fetched"] == 1, out.stdout


def test_encode_sends_exactly_the_entrys_parts(tmp_path: Path) -> None:
    """The writer's side of the same rule: an entry with a file that is not one of its
    parts is never encoded; a mix entry (sub-jsons, their binaries, the header) is."""
    keys = site_keys(tmp_path)
    binary = os.urandom(100)
    main = json.dumps(kernel_json("te_x", binary, headerFileSuffix=".h")).encode()
    good = {"te_x.json": main, "te_x.o": binary, "te_x.h": b"// header"}
    raw = blob.encode(EntryFiles(SOC, "te_x", good), keys)
    assert blob.decode(raw, SOC, "te_x", keys).files == good
    with pytest.raises(blob.BadBlob, match=r"te_x\.lock") as caught:
        blob.encode(EntryFiles(SOC, "te_x", {**good, "te_x.lock": b"LOCKDATA"}), keys)
    assert caught.value.reason == blob.PARTS
    with pytest.raises(blob.BadBlob, match=r"lacks 'te_x\.o'"):
        blob.encode(EntryFiles(SOC, "te_x", {"te_x.json": main}), keys)


def _plant(chip: Path, kernel: str, owner: str, stage: Path) -> None:
    """A member plants an entry: written in ``stage`` (the same filesystem), given to
    ``owner``, then renamed into the chip folder binary first, json last (as GE writes)."""
    stage.mkdir(parents=True, exist_ok=True)
    written = ge_twin.write_entry(stage, kernel, size=2048)
    names = sorted(written.files, key=lambda n: n.endswith(".json"))
    for name in names:
        shutil.chown(stage / name, owner)
    for name in names:
        os.rename(stage / name, chip / name)


def test_a_members_planted_entry_is_not_uploaded_unless_its_user_is_an_upload_writer(
    redis_server: RedisServer, tmp_path: Path, users: Users
) -> None:
    """A member (a real user) plants complete, valid entries in the shared chip folder: the
    daemon does not upload them (``remote_upload_refused``, one warning line for that
    user), while an entry written by the daemon's own user goes; with the member's user in
    ``[remote] upload_writers`` (how the users CANN jobs run as are added), the next one
    goes."""
    remote = redis_server.url + "|name=r"
    folder = tmp_path / "site"
    folder.mkdir()
    cfg = folder / "c.toml"
    cfg.write_text(f'[remote]\nstorage = ["{remote}"]\n' + keys_toml(tmp_path))
    root = folder / "cache"
    chip = root / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    d = start_daemon(folder, "--cache-dir", str(root), "--config", str(cfg), env=daemon_env(folder))
    probe = redis_server.client()
    try:
        _plant(chip, "te_planted1", users.alice, tmp_path / "stage")
        _plant(chip, "te_planted2", users.alice, tmp_path / "stage")
        ge_twin.write_entry(chip, "te_own", size=2048)  # the daemon's user's own (root)
        wait_for(lambda: probe.exists(RedisTier.key(SOC, "te_own")), 60, "the own entry's upload")
        wait_for(
            lambda: d.client.stats().to_json()["remote_upload_refused"] == 2,
            60,
            "the planted entries to be refused",
        )
        assert not probe.exists(RedisTier.key(SOC, "te_planted1"))
        assert not probe.exists(RedisTier.key(SOC, "te_planted2"))
        assert d.log().count(f"belongs to {users.alice}") == 1, d.log()
        assert "cachemgr_remote_upload_refused_total 2.0" in d.client.request("GET", "/metrics")

        cfg.write_text(cfg.read_text() + f'upload_writers = ["{users.alice}"]\n')
        assert d.client.reload()["reloaded"] is True
        _plant(chip, "te_planted3", users.alice, tmp_path / "stage")
        wait_for(lambda: probe.exists(RedisTier.key(SOC, "te_planted3")), 60, "the writer's upload")
    finally:
        d.stop()


def test_no_trusted_key_is_refused_in_one_line_and_the_opt_out_warns(
    redis_server: RedisServer, tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """Reading a remote with no trusted key is refused: one line naming ``[remote]
    trusted_keys``, exit 2 (``warm``, ``compile --remote``, ``serve``). ``trust_unsigned =
    true`` (the single-writer opt-out) reads anything, and ``config`` and ``status`` say so
    in a warning, as they say that uploads are off without a ``signing_key``."""
    remote = redis_server.url + "|name=r"
    root = tmp_path / "cache"
    base = ("--soc", SOC, "--cache-dir", str(root), "--remote", remote)
    out = run_cli("warm", *base, env=clean_env)
    assert out.returncode == 2 and "[remote] trusted_keys is empty" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    req = tmp_path / "req.json"
    req.write_text(json.dumps(request_data(defines={"N": 2525, "B_N": 1})))
    at = ("--cache-dir", str(root), "--remote", remote)
    out = run_cli("compile", "--local", *at, str(req), env=clean_env)
    assert out.returncode == 2 and "[remote] trusted_keys is empty" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    (tmp_path / "d0").mkdir()
    env = daemon_env(tmp_path / "d0")
    serve = run_cli("serve", *AS_ROOT, "--cache-dir", str(root), "--remote", remote, env=env)
    assert serve.returncode == 2 and "[remote] trusted_keys is empty" in serve.stderr

    item_keys = _fresh_keys(tmp_path / "writer", "writer")  # a key nobody lists
    binary = os.urandom(500)
    item = EntryFiles(
        SOC, "te_u", {"te_u.json": json.dumps(kernel_json("te_u", binary)).encode(),
                      "te_u.o": binary},
    )  # fmt: skip
    redis_server.client().set(RedisTier.key(SOC, "te_u"), blob.encode(item, item_keys))
    cfg = tmp_path / "optout.toml"
    cfg.write_text("[remote]\ntrust_unsigned = true\n")
    listed = tmp_path / "list.txt"
    listed.write_text("te_u\n")
    out = run_cli("warm", *base, "--config", str(cfg), "--list", str(listed), env=clean_env)
    assert out.returncode == 0 and "1 fetched" in out.stdout, (out.stdout, out.stderr)
    assert "uploads to the remotes are off" in out.stderr
    shown = run_cli("config", "--config", str(cfg), "--remote", remote, env=clean_env)
    assert shown.returncode == 0, shown.stderr
    assert "warning: [remote] trust_unsigned = true" in shown.stderr, shown.stderr
    assert "uploads to the remotes are off: [remote] signing_key is not set" in shown.stderr
    assert "(option: config" in shown.stdout and "remote.trust_unsigned = True" in shown.stdout
    folder = tmp_path / "d1"
    folder.mkdir()
    d = start_daemon(
        folder, "--cache-dir", str(tmp_path / "c1"), "--config", str(cfg), "--remote", remote,
        env=daemon_env(folder),
    )  # fmt: skip
    try:
        status = run_cli("status", "--socket", str(d.socket_path), env=d.env)
        assert status.returncode == 0, status.stderr
        assert "cachemgr: warning: [remote] trust_unsigned = true" in status.stderr, status
        assert "cachemgr: warning: uploads to the remotes are off" in status.stderr
        assert d.client.health()["warnings"], "in /health too"
        assert d.log().count("uploads to the remotes are off") == 1, d.log()
    finally:
        d.stop()


def test_keygen_makes_a_private_file_prints_the_public_key_and_never_shows_the_secret(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """``cachemgr remote keygen NAME``: a new file of mode 0600 (never overwritten, a link
    never followed), one public key line ``NAME:BASE64`` on stdout; the private key is in no
    output and no daemon log; a key readable by others, or another user's, is refused by the
    daemon in one line."""
    path = tmp_path / "keys" / "site-a.key"
    path.parent.mkdir()
    out = run_cli("remote", "keygen", "site-a", "--out", str(path), env=clean_env)
    assert out.returncode == 0, out.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == os.geteuid()
    line = out.stdout.strip()
    assert len(out.stdout.splitlines()) == 1 and line.startswith("site-a:"), out.stdout
    assert len(base64.b64decode(line.split(":", 1)[1], validate=True)) == 32
    secret = path.read_text().strip().split(":", 1)[1]
    assert secret not in out.stdout + out.stderr and f'signing_key = "{path}"' in out.stderr
    again = run_cli("remote", "keygen", "site-a", "--out", str(path), env=clean_env)
    assert again.returncode == 2 and "exists" in again.stderr
    assert "choose another --out FILE" in again.stderr, again.stderr  # --out was given
    assert path.read_text().strip().split(":", 1)[1] == secret, "never overwritten"
    target = tmp_path / "victim"
    target.write_text("keep\n")
    link = tmp_path / "keys" / "link.key"
    link.symlink_to(target)
    linked = run_cli("remote", "keygen", "x", "--out", str(link), env=clean_env)
    assert linked.returncode == 2 and target.read_text() == "keep\n", linked.stderr
    bad = run_cli("remote", "keygen", "../x", "--out", str(tmp_path / "k"), env=clean_env)
    assert bad.returncode == 2 and "key name" in bad.stderr and not (tmp_path / "k").exists()

    cfg = tmp_path / "c.toml"
    storage = f"redis://127.0.0.1:{free_port()}/0|name=r|connect-timeout=100"
    cfg.write_text(
        f'[remote]\nstorage = ["{storage}"]\nsigning_key = "{path}"\ntrusted_keys = ["{line}"]\n'
    )
    folder = tmp_path / "d"
    folder.mkdir()
    d = start_daemon(
        folder, "--cache-dir", str(tmp_path / "cache"), "--config", str(cfg),
        env=daemon_env(folder),
    )  # fmt: skip
    try:
        assert d.client.health()["warnings"] == []
        assert d.client.reload()["reloaded"] is True
    finally:
        d.stop()
    assert secret not in d.log()
    path.chmod(0o640)
    refused = run_cli("serve", *AS_ROOT, "--cache-dir", str(tmp_path / "cache"), "--config",
                      str(cfg), env=daemon_env(folder))  # fmt: skip
    assert refused.returncode == 2 and "chmod 600" in refused.stderr, refused.stderr
    errors = [x for x in refused.stderr.splitlines() if x.startswith("cachemgr: error:")]
    assert len(errors) == 1 and "chmod 600" in errors[0] and secret not in refused.stderr


class _Refuses413(http.server.BaseHTTPRequestHandler):
    """A real HTTP server that refuses every upload as too large."""

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(413)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_413() -> Iterator[str]:
    with http_server(_Refuses413) as url:
        yield url


def test_error_lines_name_the_url_not_the_spec(
    http_413: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``PUT http://…:46723|name=h413: HTTP 413`` showed the attribute list as if it were
    the URL: an error line names the URL it asked (no ``|attributes``)."""
    spec = parse_spec(f"{http_413}|name=h413", "test")
    config = RemoteConfig((spec,), "test", failures_before_open=1, **trust_fields(tmp_path))
    tiers = RemoteTiers.from_config(config)
    assert tiers is not None
    chip = tmp_path / "kc" / SOC
    chip.mkdir(parents=True)
    own = publish_own(chip, "te_413", os.urandom(300))
    caplog.set_level(logging.WARNING, "cachemgr.remote.tierset")
    assert tiers.upload_now(chip.parent, SOC, "te_413", digests=own) == 0
    line = next(r.getMessage() for r in caplog.records if "HTTP 413" in r.getMessage())
    assert f"PUT {http_413}/" in line and "|" not in line and "name=h413" not in line, line
    assert tiers.stats()["h413"]["url"] == http_413
    tiers.close()


def test_bad_key_settings_are_one_line_each(tmp_path: Path) -> None:
    """A malformed public key, two keys of one name, an unknown upload writer, a private
    key file readable by others or not a key: one line naming the setting, never the
    private key."""
    from cachemgr.errors import ConfigError
    from cachemgr.remote.config import load_keys, resolve

    _, line = site_key(tmp_path)
    base = {"storage": ["redis://127.0.0.1:1/0"]}
    cases = {
        "trusted_keys": {"trusted_keys": ["no-colon"]},
        "base64 of 32 bytes": {"trusted_keys": ["k:AAAA"]},
        "two keys named": {"trusted_keys": [line, line]},
        "no user 'no-such-user-x'": {"upload_writers": ["no-such-user-x"]},
        "trust_unsigned": {"trust_unsigned": "yes"},
    }
    for why, table in cases.items():
        with pytest.raises(ConfigError, match=why):
            resolve(None, {}, {**base, **table})
    loose = tmp_path / "loose.key"
    signing.create_key_file(loose, "loose")
    secret = loose.read_text().split(":", 1)[1].strip()
    loose.chmod(0o644)
    config = resolve(None, {}, {**base, "trusted_keys": [line], "signing_key": str(loose)})
    with pytest.raises(ConfigError, match="chmod 600") as caught:
        load_keys(config, strict=True)
    assert secret not in str(caught.value)
    assert load_keys(config, strict=False).signer_name is None  # a member's run: no uploads
    junk = tmp_path / "junk.key"
    junk.write_text("not a key\n")
    junk.chmod(0o600)
    config = resolve(None, {}, {**base, "trusted_keys": [line], "signing_key": str(junk)})
    with pytest.raises(ConfigError, match="not a private key file"):
        load_keys(config, strict=True)
