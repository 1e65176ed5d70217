"""``scripts/_venv.sh``, which ``scripts/test`` and ``scripts/demo`` source: run at the same
time, they used to create and ``pip install`` into one virtualenv concurrently. The create
and install step is serialised with ``flock`` on ``<venv>.lock``; a virtualenv already
installed takes no lock. Real bash processes, a real virtualenv, a real pip."""

from __future__ import annotations

import hashlib
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


@pytest.mark.skipif(shutil.which("flock") is None, reason="flock (util-linux) is not installed")
@pytest.mark.parametrize("planted", ["fifo", "symlink"])
def test_a_planted_lock_name_neither_hangs_nor_truncates(tmp_path: Path, planted: str) -> None:
    """Attack review: ``<venv>.lock`` was opened with ``>``: a FIFO planted under that name
    (a virtualenv in a folder others may write) hung the run for good, and a symbolic link
    to a file of the user emptied that file. The lock is opened read-write, without
    truncating, and never blocks on a FIFO."""
    venv = tmp_path / "venv"
    victim = tmp_path / "notes.txt"
    victim.write_text("precious\n")
    lock = tmp_path / "venv.lock"
    if planted == "fifo":
        os.mkfifo(lock)
    else:
        lock.symlink_to(victim)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEMGR_")}
    env.pop("VIRTUAL_ENV", None)
    env.update(CACHEMGR_VENV=str(venv), PYTHON="/bin/false")  # fails right after the lock
    script = tmp_path / "use.sh"
    script.write_text(f'source "{ROOT}/scripts/_venv.sh"\n')
    run = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=20)
    assert "creating virtualenv" in run.stderr, run.stderr  # it got past the lock
    assert victim.read_text() == "precious\n"


def _stamped_venv(tmp_path: Path, extras: str) -> tuple[Path, dict[str, str], Path]:
    """A real virtualenv (no pip in it: an install attempt fails at once) that ``_venv.sh``
    recorded as installed with ``extras`` (its own stamp name), an environment naming it,
    and a script that sources ``_venv.sh`` and prints the ``python`` it then runs."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    (venv / f".installed-{digest}-{extras}").touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEMGR_")}
    env.pop("VIRTUAL_ENV", None)
    env.update(CACHEMGR_VENV=str(venv), PYTHON=sys.executable)
    script = tmp_path / "use.sh"
    script.write_text(
        f'source "{ROOT}/scripts/_venv.sh"\npython -c "import sys; print(sys.prefix)"\n'
    )
    return venv, env, script


def test_a_venv_with_the_test_extras_serves_a_run_without_them(tmp_path: Path) -> None:
    """``scripts/demo`` (no extras) beside ``scripts/test`` (the ``test`` extras, a superset)
    on one ``.venv`` reinstalled cachemgr under the running tests; it is ready as it is."""
    venv, env, script = _stamped_venv(tmp_path, "test")
    run = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert run.stdout.strip() == str(venv)
    assert not (tmp_path / "venv.lock").exists()  # the fast path: no lock taken


def test_a_venv_without_the_test_extras_is_installed_for_them(tmp_path: Path) -> None:
    _, env, script = _stamped_venv(tmp_path, "main")
    env["CACHEMGR_EXTRAS"] = "test"
    run = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert f"{INSTALLING}[test] into" in run.stderr, run.stderr  # then fails: no pip there
