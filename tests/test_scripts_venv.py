"""``scripts/_venv.sh``, which ``scripts/test`` and ``scripts/demo`` source: run at the same
time, they used to create and ``pip install`` into one virtualenv concurrently. The create
and install step is serialised with ``flock`` on ``<venv>.lock``; a virtualenv already
installed takes no lock. Real bash processes, a real virtualenv, a real pip."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

INSTALLING = "installing cachemgr"


def _start(script: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["bash", str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.skipif(shutil.which("flock") is None, reason="flock (util-linux) is not installed")
def test_two_runs_at_once_install_the_virtualenv_once(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    script = tmp_path / "use.sh"
    script.write_text(
        f'source "{ROOT}/scripts/_venv.sh"\npython -c "import cachemgr, sys; print(sys.prefix)"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEMGR_")}
    env.pop("VIRTUAL_ENV", None)
    env.update(CACHEMGR_VENV=str(venv), PYTHON=sys.executable)

    runs = [_start(script, env), _start(script, env)]  # both at once: neither sees a stamp
    outputs = [run.communicate(timeout=600) for run in runs]
    for run, (out, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, err
        assert out.strip() == str(venv), (out, err)  # each ran the installed cachemgr
    stderr = "".join(err for _, err in outputs)
    assert stderr.count(INSTALLING) == 1, stderr
    assert stderr.count("creating virtualenv") == 1, stderr
    assert (tmp_path / "venv.lock").exists()

    again = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and again.stderr == "", again.stderr  # the fast path
