"""The README's first command runs the main job end to end."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_ge_interop import fake_toolkit


def _demo(tmp_path: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "demo")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.parametrize("host", ["plain", "cann"])
def test_scripts_demo_runs_the_main_job(tmp_path: Path, host: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_", "CACHEMGR_"))}
    if host == "cann":  # ASCEND_HOME_PATH / ASCEND_OPP_PATH set, as on every CANN host
        env.update(fake_toolkit(tmp_path / "Ascend"))
    (tmp_path / "run").mkdir(mode=0o700)
    # a deep TMPDIR, as pytest's own grows: the demo's socket must still fit a Unix socket path
    long_tmp = tmp_path / ("deep-" + "t" * 60)
    long_tmp.mkdir()
    env.update(
        HOME=str(tmp_path),
        XDG_RUNTIME_DIR=str(tmp_path / "run"),
        XDG_STATE_HOME=str(tmp_path / "state"),
        TMPDIR=str(long_tmp),
    )
    for run in (1, 2):  # a second run starts cold too, as its text says
        out = _demo(tmp_path, env)
        # its own cache and socket under TMPDIR: never $HOME/atc_data (CANN's working cache
        # on a build host, which its gc --ratio 80 would evict) nor a running daemon's socket
        cache = Path(out.split("== the demo's cache: ")[1].split()[0])
        assert cache.is_relative_to(tmp_path) and cache != tmp_path / "atc_data", cache
        chip = cache / "kernel_cache" / "Ascend910B1"
        cold = out.split("== warm")[0]
        warm = out.split("== warm")[1].split("== cachemgr stats")[0]
        assert cold.count("compiled ") >= 6 and "hit " not in cold, (run, cold)
        assert warm.count("hit ") == cold.count("compiled "), (run, warm)
        assert "(via daemon)" in out and "daemon stopped cleanly" in out
        log = Path(out.split("its log: ")[1].split()[0])
        assert log.is_file() and "stop requested" in log.read_text(), log  # the log is kept
        assert "source .venv/bin/activate" in out and "pip install ." in out
        assert chip.is_dir()
        # its own gc --ratio 80 keeps every kernel it just compiled
        assert len(list(chip.glob("*.json"))) == cold.count("compiled "), out
        assert "purged" not in out.split("== cachemgr gc")[1]
    assert not (tmp_path / "atc_data").exists()
    assert not (tmp_path / "run" / "cachemgr").exists()  # the default socket was not used
    assert not list(tmp_path.glob("cachemgr-demo.*/cachemgr.sock"))  # its own is gone
