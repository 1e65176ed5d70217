"""No silent change of cache: a daemon on the default socket that serves another cache is
passed by in one line at default verbosity — which daemon, which cache, how to reach it —
while the command runs in this process on its own cache (exit unchanged); ``-q`` and
``--local`` leave the line out. A real daemon on the default socket: the test's own
``XDG_RUNTIME_DIR`` makes the default socket the test's."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import ROOT, SOC, run_cli
from tests.daemon_util import start_daemon

REQUEST = str(ROOT / "examples" / "requests" / "add_c.json")


def test_a_daemon_of_another_cache_on_the_default_socket_is_named(tmp_path: Path) -> None:
    theirs = tmp_path / "daemon-cache"
    config = tmp_path / "daemon.toml"
    config.write_text(f'op_compiler_cache_dir = "{theirs}"\n')
    d = start_daemon(tmp_path, "--config", str(config))
    env = dict(d.env)
    env.pop("NOTIFY_SOCKET", None)
    try:
        plain = run_cli("compile", REQUEST, env=env)
        as_json = run_cli("compile", REQUEST, "--json", env=env)
        quiet = run_cli("compile", REQUEST, "-q", env=env)
        local = run_cli("compile", REQUEST, "--local", env=env)
        stats = run_cli("stats", env=env)
    finally:
        d.stop()
    ours = Path(env["HOME"]) / "atc_data" / "kernel_cache"
    for proc in (plain, as_json, quiet, local, stats):
        assert proc.returncode == 0, proc.stderr
    assert list((ours / SOC).glob("te_add_*.json")), "the compile ran here, on this cache"
    assert not (theirs / "kernel_cache" / SOC).exists()
    assert json.loads(as_json.stdout.splitlines()[0])["status"] == "hit"
    for proc in (plain, as_json, stats):
        lines = [ln for ln in proc.stderr.splitlines() if "default socket" in ln]
        assert len(lines) == 1, proc.stderr
        for needle in (
            str(d.socket_path),
            f"serves {theirs / 'kernel_cache'}",
            f"not this command's {ours}",
            "running in this process",
            f"pass --cache-dir {theirs}",
            f"CACHEMGR_CONFIG={config}",
        ):
            assert needle in lines[0], lines[0]
    for proc in (quiet, local):
        assert "default socket" not in proc.stderr, proc.stderr
