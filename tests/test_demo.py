"""The README's first command runs the main job end to end (issue 5 item 6)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_ge_interop import fake_toolkit


@pytest.mark.parametrize("host", ["plain", "cann"])
def test_scripts_demo_runs_the_main_job(tmp_path: Path, host: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_", "CACHEMGR_"))}
    if host == "cann":  # ASCEND_HOME_PATH / ASCEND_OPP_PATH set, as on every CANN host
        env.update(fake_toolkit(tmp_path / "Ascend"))
    (tmp_path / "run").mkdir(mode=0o700)
    env.update(
        HOME=str(tmp_path),
        XDG_RUNTIME_DIR=str(tmp_path / "run"),
        XDG_STATE_HOME=str(tmp_path / "state"),
    )
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "demo")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    cold = out.split("== warm")[0]
    warm = out.split("== warm")[1].split("== cachemgr stats")[0]
    assert cold.count("compiled ") >= 6 and "hit " not in cold
    assert warm.count("hit ") == cold.count("compiled ")
    assert "(via daemon)" in out and "daemon stopped cleanly" in out
    chip = tmp_path / "atc_data" / "kernel_cache" / "Ascend910B1"
    assert chip.is_dir()
    # its own gc --ratio 80 keeps every kernel it just compiled (issue 9 item 1)
    assert len(list(chip.glob("*.json"))) == cold.count("compiled "), out
    assert "purged" not in out.split("== cachemgr gc")[1]
    assert not (tmp_path / "run" / "cachemgr" / "cachemgr.sock").exists()
