"""Messages in the operator's words: a missing compiler setting names the config key, the
file looked at and an example line; a mistyped request field gets the field it resembles;
a refused reload shows in ``status``, not only in the daemon's log."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from tests.compile_util import request_data
from tests.conftest import run_cli
from tests.daemon_util import start_daemon, wait_for


def _request(tmp_path: Path, name: str, **over: object) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(request_data(**over)))
    return str(path)


def test_a_cce_request_without_a_compiler_names_the_setting_and_the_file(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """Was ``template compiler needs config cce_command (got None)``."""
    req = _request(tmp_path, "cce", language="cce")
    cache = ("--cache-dir", str(tmp_path / "cache"))
    none = run_cli("compile", *cache, req, env=clean_env)
    cfg = tmp_path / "site.toml"
    cfg.write_text("[daemon]\nworkers = 2\n")
    named = run_cli("compile", *cache, "--config", str(cfg), req, env=clean_env)
    for proc in (none, named):
        assert proc.returncode == 1, proc.stdout + proc.stderr
        line = proc.stderr.strip()
        assert len(line.splitlines()) == 1, line
        assert "[compilers] cce_command" in line, line
        assert 'cce_command = "ccec -c {source} -o {output} {defines} {flags}"' in line, line
        assert "got None" not in line, line
    assert "no config file: set CACHEMGR_CONFIG or --config" in none.stderr, none.stderr
    assert f"config file {cfg}" in named.stderr, named.stderr


def test_a_mistyped_request_field_is_suggested(tmp_path: Path, clean_env: dict[str, str]) -> None:
    """``"optype"`` reported only ``missing field 'op_type'``."""
    data = request_data()
    data["optype"] = data.pop("op_type")
    missing = tmp_path / "optype.json"
    missing.write_text(json.dumps(data))
    unknown = _request(tmp_path, "opname", op_nme="x")
    cache = ("--cache-dir", str(tmp_path / "cache"))
    got = run_cli("compile", *cache, str(missing), env=clean_env)
    assert got.returncode == 2, got.stderr
    assert "missing field 'op_type' in request: 'optype' is given — did you mean 'op_type'?" in (
        got.stderr
    ), got.stderr
    got = run_cli("compile", *cache, unknown, env=clean_env)
    assert got.returncode == 2, got.stderr
    assert "unknown field 'op_nme' in request; did you mean 'op_name'?" in got.stderr, got.stderr
    nothing_alike = _request(tmp_path, "zzz", zzzzzz=1)
    got = run_cli("compile", *cache, nothing_alike, env=clean_env)
    assert got.returncode == 2 and "did you mean" not in got.stderr, got.stderr


def test_status_reports_a_refused_reload(tmp_path: Path, cache_root: Path) -> None:
    """A refused SIGHUP reload was only in the daemon's log while ``status`` said ``ok``."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'op_compiler_cache_dir = "{cache_root}"\n')
    d = start_daemon(tmp_path, "--config", str(cfg))
    status = ("status", "--socket", str(d.socket_path))
    try:
        assert d.client.health()["last_reload"] is None
        cfg.write_text("jit_compile = [oops\n")
        d.signal(signal.SIGHUP)
        last = wait_for(lambda: d.client.health()["last_reload"], 30, "the refused reload")
        assert isinstance(last, dict) and last["ok"] is False and str(cfg) in last["error"]
        refused = run_cli(*status, env=d.env)
        assert refused.returncode == 0, refused.stderr
        lines = [ln for ln in refused.stdout.splitlines() if ln.startswith("last reload failed")]
        assert len(lines) == 1 and f"at {last['at']}: " in lines[0], refused.stdout
        assert str(cfg) in lines[0] and "configuration it had before" in lines[0], lines
        cfg.write_text(f'op_compiler_cache_dir = "{cache_root}"\n')
        d.signal(signal.SIGHUP)
        wait_for(lambda: d.client.health()["last_reload"]["ok"], 30, "the good reload")
        fixed = run_cli(*status, env=d.env)
        assert fixed.returncode == 0 and "last reload" not in fixed.stdout, fixed.stdout
    finally:
        assert d.stop() == 0
