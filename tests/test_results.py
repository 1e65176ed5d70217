"""Results are typed (issue 13 item 2): one status enum, one result type with
``to_json``/``from_json``, and the effective policy on every compile result — in ``--json``,
in the daemon's log line and in ``GET /jobs/{id}``."""

from __future__ import annotations

import json
from pathlib import Path

from cachemgr.compile import build
from cachemgr.compile.results import Policy, Status
from tests.compile_util import request_data, write_request
from tests.conftest import run_cli
from tests.daemon_util import daemon_env, start_daemon, wait_for


def _compile(tmp_path: Path, req: Path, root: Path, *extra: str) -> dict:
    out = run_cli(
        "compile", str(req), "--local", "--json", "--cache-dir", str(root), *extra,
        env=daemon_env(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[0])


def test_every_local_result_records_the_policy(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    req = write_request(tmp_path / "req", defines={"N": 5151, "B_N": 1})
    first = _compile(tmp_path, req, root)
    assert first["status"] == "compiled"
    assert first["policy"] == {
        "jit_compile": "auto",
        "binary_first": False,
        "cache_mode": "enable",
        "cached": True,
        "why_not_cached": None,
    }
    again = _compile(tmp_path, req, root)
    assert again["status"] == "hit" and again["policy"]["cached"] is True
    off = _compile(tmp_path, req, root, "--mode", "disable", "--out-dir", str(tmp_path / "o"))
    assert off["status"] == "compiled"
    assert off["policy"]["cache_mode"] == "disable" and off["policy"]["cached"] is False
    assert off["policy"]["why_not_cached"] == "op_compiler_cache_mode=disable"
    dbg = _compile(tmp_path, req, root, "--op-debug-level", "1", "--debug-dir", str(tmp_path))
    assert dbg["status"] == "debug" and dbg["policy"]["cached"] is False
    assert dbg["policy"]["why_not_cached"] == "op_debug_level=1 bypasses the cache"
    jit = _compile(tmp_path, req, root, "--jit-compile", "false")
    assert jit["policy"]["jit_compile"] == "false" and jit["policy"]["binary_first"] is True


def test_one_status_enum_and_a_lossless_round_trip() -> None:
    assert build.HIT is Status.HIT and build.FAILED is Status.FAILED
    assert json.dumps(Status.COMPILED) == '"compiled"'
    out = build.CompileOutcome(
        "k",
        Status.COMPILED,
        (Path("/a/k.json"),),
        1.5,
        request="r.json",
        cached=False,
        warning="w",
        coalesced=True,
        policy=Policy("auto", False, "enable", False, "w"),
    )
    back = build.CompileOutcome.from_json(json.loads(json.dumps(out.to_json())))
    assert back == out and isinstance(back.status, Status)


def test_daemon_job_and_log_line_carry_the_policy(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    d = start_daemon(tmp_path, "--cache-dir", str(root))
    try:
        client = d.client
        sub = client.compile(request_data(defines={"N": 5252, "B_N": 1}), wait=False)
        done = wait_for(
            lambda: (j := client.job(sub["job_id"]))["state"] in ("done", "failed") and j,
            60,
            "the job to finish",
        )
        assert done["status"] == "compiled", done
        assert done["policy"]["cache_mode"] == "enable" and done["policy"]["cached"] is True
        wait_for(lambda: "(jit auto, cache enable, cached)" in d.log(), 30, "the log line")
    finally:
        assert d.stop() == 0
