"""``--remote`` on the command line and each remote's figures in ``stats``, ``/metrics`` and
``status`` — against a real ``redis-server``."""

from __future__ import annotations

import json
from pathlib import Path

from tests.compile_util import calls, counting_cc, request_data
from tests.conftest import run_cli
from tests.daemon_util import daemon_env, start_daemon, wait_for
from tests.remote_util import RedisServer, free_port, keys_toml


def test_remote_flags_win_and_each_remote_is_shown_everywhere(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """``serve --remote`` (repeatable) replaces CACHEMGR_REMOTE_STORAGE; three remotes — one
    good, one refusing our password (disabled: retrying cannot help), one down (failing) —
    each with its hits, misses, errors, bytes and state in ``stats``, ``/metrics`` (same
    names) and ``status``; compiles go on."""
    redis_server.client().config_set("requirepass", "s3cret")
    port = redis_server.port
    good = f"redis://:s3cret@127.0.0.1:{port}/0|name=good"
    locked = f"redis://:wrong@127.0.0.1:{port}/0|name=locked"
    down = f"redis://127.0.0.1:{free_port()}/0|name=down|connect-timeout=200"
    cc = counting_cc(tmp_path / "cc")
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[compilers]\ncc = "{cc}"\n[remote]\nfailures_before_open = 1\n' + keys_toml(tmp_path)
    )
    env = daemon_env(tmp_path)
    env["CACHEMGR_REMOTE_STORAGE"] = f"redis://127.0.0.1:{port}/0|name=from_env"
    args = ["--cache-dir", str(tmp_path / "cache"), "--config", str(cfg)]
    args += ["--remote", good, "--remote", locked, "--remote", down]
    d = start_daemon(tmp_path, *args, env=env)
    try:
        for n in (2101, 2102):
            out = d.client.compile(request_data(defines={"N": n, "B_N": 1})).to_json()
            assert out["status"] == "compiled", out
        assert len(calls(tmp_path / "cc")) == 2
        wait_for(
            lambda: d.client.stats().to_json()["remotes"]["good"]["uploads"] == 2, 30, "uploads"
        )
        rows = d.client.stats().to_json()["remotes"]
        assert sorted(rows) == ["down", "good", "locked"], "--remote replaced the env var"
        assert rows["good"]["state"] == "ok" and rows["good"]["misses"] == 2
        assert rows["good"]["bytes_out"] > 0 and rows["good"]["errors"] == 0
        assert rows["locked"]["state"] == "disabled" and rows["locked"]["errors"] == 1, rows
        assert rows["down"]["state"] == "failing" and rows["down"]["errors"] >= 1, rows
        assert "s3cret" not in json.dumps(rows) and "wrong" not in json.dumps(rows)
        assert d.log().count("remote locked disabled") == 1

        metrics = d.client.request("GET", "/metrics")
        for name, row in rows.items():
            for counter in ("hits", "misses", "errors", "bytes_in", "bytes_out"):
                line = f'cachemgr_remote_{counter}_total{{remote="{name}"}} {float(row[counter])}'
                assert line in metrics, (line, metrics)
        assert 'cachemgr_remote_state{remote="locked",state="disabled"} 1.0' in metrics
        assert 'cachemgr_remote_state{remote="down",state="failing"} 1.0' in metrics
        assert 'cachemgr_remote_state{remote="good",state="ok"} 1.0' in metrics

        status = run_cli("status", "--socket", str(d.socket_path), env=env)
        assert status.returncode == 0, status.stderr
        assert "remote good: ok, 0 hits, 2 misses, 0 errors" in status.stdout, status.stdout
        assert "remote locked: disabled" in status.stdout
        assert "degraded: remote down failing" in status.stdout
    finally:
        d.stop()


def test_remote_flag_on_compile_config_and_verify(
    redis_server: RedisServer, tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """``compile --remote`` (in this process): site A uploads before exiting, site B gets a
    remote hit; ``config --remote`` shows it (origin option, password redacted); a bad
    ``--remote`` is one line, exit 2."""
    cc = counting_cc(tmp_path / "cc")
    req = tmp_path / "req.json"
    req.write_text(json.dumps(request_data(defines={"N": 2201, "B_N": 1})))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[compilers]\ncc = "{cc}"\n[remote]\n' + keys_toml(tmp_path))
    remote = redis_server.url + "|name=r"
    outs = []
    for site in ("a", "b"):
        root = tmp_path / site
        out = run_cli(
            "compile", "--json", "--config", str(cfg), "--cache-dir", str(root),
            "--remote", remote, str(req), env=clean_env,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        outs.append(json.loads(out.stdout))
    assert outs[0]["status"] == "compiled" and outs[0]["via"] == "local"
    assert outs[1]["status"] == "hit" and outs[1]["tier"] == "remote:r", outs[1]
    assert len(calls(tmp_path / "cc")) == 1

    secret = f"redis://:pa55word@127.0.0.1:{redis_server.port}/0"
    env = dict(clean_env, CACHEMGR_REMOTE_STORAGE="redis://elsewhere:1/0")
    out = run_cli(
        "config", "--json", "--cache-dir", str(tmp_path / "a"), "--remote", secret, env=env
    )
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)["remote_storage"]
    assert row["origin"] == "option" and row["source"] == "--remote", row
    assert "pa55word" not in out.stdout and "********" in row["value"]
    bad = run_cli("verify", "--cache-dir", str(tmp_path / "a"), "--remote", "ftp://x/y", env=env)
    assert bad.returncode == 2 and "from --remote" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def test_force_clears_local_only_and_says_so(redis_server: RedisServer, tmp_path: Path) -> None:
    """Item 3: ``force`` clears the local chip folder, compiles afresh (not answered from a
    remote), says "remote tiers untouched", and the remote keeps every entry."""
    cc = counting_cc(tmp_path / "cc")
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[compilers]\ncc = "{cc}"\n[remote]\nstorage = ["{redis_server.url}|name=r"]\n'
        + keys_toml(tmp_path)
    )
    env = daemon_env(tmp_path)
    d = start_daemon(
        tmp_path, "--cache-dir", str(tmp_path / "cache"), "--config", str(cfg), env=env
    )
    probe = redis_server.client()
    try:
        reqs = []
        for n in (2301, 2302):
            req = tmp_path / f"r{n}.json"
            req.write_text(json.dumps(request_data(defines={"N": n, "B_N": 1})))
            reqs.append(req)
            assert d.client.compile(json.loads(req.read_text())).to_json()["status"] == "compiled"
        wait_for(lambda: probe.dbsize() == 3, 30, "two uploads and the chip's index")
        keys = sorted(probe.keys())
        base = ("--socket", str(d.socket_path), "--cache-dir", str(tmp_path / "cache"))
        out = run_cli(
            "compile", "--mode", "force", *base, "--config", str(cfg), str(reqs[0]), env=env
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("compiled"), out.stdout  # a fresh compile, no remote hit
        assert "cachemgr: note: force cleared 2 entries of the local chip folder" in out.stderr
        assert "remote tiers untouched" in out.stderr, out.stderr
        assert len(calls(tmp_path / "cc")) == 3
        assert sorted(probe.keys()) == keys, "the remote kept every entry"
        again = d.client.compile(json.loads(reqs[1].read_text())).to_json()
        assert again["status"] == "hit" and again["tier"] == "remote:r", again
        assert "remote tiers untouched" in d.log()
    finally:
        d.stop()
