"""``[remote] storage``, ``CACHEMGR_REMOTE_STORAGE`` and ``--remote``:
ccache's URL-with-attributes syntax, the first source set wins, passwords never shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cachemgr.errors import ConfigError
from cachemgr.remote.config import ENV_VAR, REDACTED, parse_spec, resolve

SECRET = "s3cr3t-Pa55"


def test_attributes_and_defaults() -> None:
    r = parse_spec(
        "http://cache.example:8080/cache/|layout=bazel|read-only|connect-timeout=250"
        "|operation-timeout=2000|upload-timeout=30000|name=site-b",
        "test",
    )
    assert (r.kind, r.host, r.port, r.path, r.layout, r.read_only) == (
        "http",
        "cache.example",
        8080,
        "/cache",
        "bazel",
        True,
    )
    assert (r.connect_timeout_s, r.operation_timeout_s, r.name) == (0.25, 2.0, "site-b")
    assert r.upload_timeout_s == 30.0
    d = parse_spec("rediss://cache.example/3", "test")
    assert d.kind == "redis" and d.port is None and d.path == "/3" and d.read_only is False
    # for a LAN cache (docs/remote.md#timeouts): ccache's connect timeout, a short lookup,
    # ccache's operation timeout for the background upload
    assert (d.connect_timeout_s, d.operation_timeout_s, d.upload_timeout_s) == (0.1, 0.5, 10.0)
    assert d.name == "rediss://cache.example/3"


def test_password_in_url_is_redacted_everywhere() -> None:
    r = parse_spec(f"redis://user:{SECRET}@127.0.0.1:6379/0|operation-timeout=500", "test")
    assert r.password == SECRET and r.username == "user"
    for shown in (r.display, str(r), repr(r), r.name):
        assert SECRET not in shown, shown
    assert r.display == f"redis://user:{REDACTED}@127.0.0.1:6379/0|operation-timeout=500"
    with pytest.raises(ConfigError) as err:
        parse_spec(f"redis://:{SECRET}@127.0.0.1:6379/0|colour=blue", "CACHEMGR_REMOTE_STORAGE")
    assert SECRET not in str(err.value) and "colour" in str(err.value)
    assert "CACHEMGR_REMOTE_STORAGE" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError) as err:  # not even a URL that fails to parse leaks it
        parse_spec(f"redis://:{SECRET}@127.0.0.1:notaport/0", "test")
    assert SECRET not in str(err.value)


def test_password_and_token_from_files(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text(SECRET + "\n")
    tok = tmp_path / "tok"
    tok.write_text("tok-" + SECRET)
    r = parse_spec(f"redis://127.0.0.1:6379|password-file={pw}", "test")
    assert r.password == SECRET and SECRET not in r.display and str(pw) in r.display
    h = parse_spec(f"https://h.example/c|bearer-token-file={tok}", "test")
    assert h.bearer_token == "tok-" + SECRET and SECRET not in repr(h)
    for bad, why in (
        (f"redis://h|password-file={tmp_path / 'missing'}", "No such file"),
        (f"redis://h|bearer-token-file={tok}", "unknown or malformed attribute"),
        ("ftp://h/x", "scheme"),
        ("http://h/x|layout=tree", "layout"),
        ("redis://h/zero", "database"),
        ("http:///nohost", "no host"),
        ("http://h/x|operation-timeout=soon", "milliseconds"),
        ("http://h/x|upload-timeout=0", "milliseconds"),
    ):
        with pytest.raises(ConfigError, match=why):
            parse_spec(bad, "test")


def test_first_source_set_wins_and_table_tunables() -> None:
    table = {"storage": ["redis://a:1/0", "http://b:2/c|layout=flat"], "upload_queue": 8}
    cfg = resolve(None, {}, table, "c.toml")
    assert [r.host for r in cfg.remotes] == ["a", "b"] and cfg.upload_queue == 8
    assert cfg.origin == "c.toml [remote] storage"
    env = {ENV_VAR: "redis://e:1/0  http://f:2/"}
    assert [r.host for r in resolve(None, env, table).remotes] == ["e", "f"]
    cli = resolve(["redis://g:1/0"], env, table)
    assert [r.host for r in cli.remotes] == ["g"] and cli.origin == "--remote"
    assert resolve(None, {}, None).remotes == ()
    for bad in ({"storage": 5}, {"upload_queue": 0}, {"open_s": "x"}, {"colour": 1}):
        with pytest.raises(ConfigError, match=r"\[remote\]"):
            resolve(None, {}, bad, "c.toml")
    with pytest.raises(ConfigError, match="two remotes named"):
        resolve(["redis://a:1/0 redis://a:1/0"], {}, None)


def test_config_command_shows_remotes_redacted(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[remote]\nstorage = ["redis://:{SECRET}@127.0.0.1:6379/0|read-only"]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND", "CACHEMGR"))}
    env["HOME"] = str(tmp_path)
    base = [sys.executable, "-m", "cachemgr", "config", "--config", str(cfg)]
    base += ["--cache-dir", str(tmp_path / "cache")]
    out = subprocess.run([*base, "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)["remote_storage"]
    assert row["value"] == f"redis://:{REDACTED}@127.0.0.1:6379/0|read-only"
    assert "[remote] storage" in row["source"]
    env[ENV_VAR] = f"http://u:{SECRET}@h:1/c|layout=flat"
    text = subprocess.run(base, capture_output=True, text=True, env=env, timeout=60)
    assert text.returncode == 0 and SECRET not in text.stdout + text.stderr
    assert f"remote_storage = http://u:{REDACTED}@h:1/c|layout=flat" in text.stdout
    env[ENV_VAR] = f"redis://:{SECRET}@h:1/0|bogus"
    bad = subprocess.run(base, capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and "bogus" in bad.stderr and SECRET not in bad.stderr
    assert "Traceback" not in bad.stderr
