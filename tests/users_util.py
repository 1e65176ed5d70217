"""Real Unix users for tests: a group with two members and an outsider,
created with ``useradd``/``groupadd`` (root only; skipped with the reason otherwise) and
removed afterwards, plus a world-readable runtime through which those users run this
checkout's cachemgr.

The project's own virtualenv may live where other users cannot read (``/root`` is mode 700),
so they run cachemgr with the system's Python 3.11 from a world-readable virtualenv holding
the project's dependencies (built once per dependency set and kept in the temp folder) and a
copy of this checkout's ``cachemgr`` package made for the test session.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import filelock
import pytest

from tests.conftest import ROOT

SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass(frozen=True)
class Runtime:
    """How another user runs this checkout's cachemgr."""

    python: str
    pythonpath: str
    kernels: Path  # world-readable copies of the example kernels


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "creating Unix users needs root"
    for tool in ("useradd", "groupadd", "userdel", "groupdel"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} is not installed"
    version = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info >= (3, 11))"],
        capture_output=True,
        text=True,
        check=False,
    )
    if version.stdout.strip() != "True":
        return f"{SYSTEM_PYTHON} is older than 3.11"
    return None


def _venv_with_dependencies() -> Path:
    """A world-readable virtualenv of the system Python with the project's dependencies,
    reused while they do not change (built in a temp name, then renamed into place). The
    suite's xdist workers (and other runs) build it one at a time, under a ``flock`` on
    ``<venv>.lock``: the others wait for it instead of running pip side by side."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    tag = hashlib.sha256("\n".join(sorted(deps)).encode()).hexdigest()[:12]
    venv = Path(tempfile.gettempdir()) / f"cachemgr-test-venv-{tag}"
    if (venv / ".complete").exists():
        return venv
    with filelock.FileLock(f"{venv}.lock", timeout=900):
        if (venv / ".complete").exists():  # another worker built it while this one waited
            return venv
        return _build_venv(venv, deps)


def _build_venv(venv: Path, deps: list[str]) -> Path:
    """Build the virtualenv ``venv`` with ``deps`` (the caller holds its lock)."""
    building = Path(tempfile.mkdtemp(prefix=f"{venv.name}.", dir=venv.parent))
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(building)], check=True)
    pip = subprocess.run(
        [str(building / "bin" / "python"), "-m", "pip", "install", "-q", *deps],
        capture_output=True,
        text=True,
        check=False,
    )
    if pip.returncode != 0:
        shutil.rmtree(building, ignore_errors=True)
        pytest.skip(f"cannot install the dependencies for {SYSTEM_PYTHON}: {pip.stderr[-300:]}")
    (building / ".complete").write_text("")
    building.chmod(0o755)
    try:
        building.rename(venv)
    except OSError:  # another session made it meanwhile
        shutil.rmtree(building, ignore_errors=True)
    return venv


def _compile(venv: Path, package: Path) -> None:
    """Byte code for ``package`` beside it, and under ``$PYTHONPYCACHEPREFIX`` when set
    (where a run with this environment looks): the users may write neither, so each of
    their runs would otherwise compile every module from source again."""
    plain = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    for env in (plain, dict(os.environ)):
        argv = [str(venv / "bin" / "python"), "-m", "compileall", "-q", str(package)]
        subprocess.run(argv, check=True, capture_output=True, env=env)


@pytest.fixture(scope="session")
def other_runtime() -> Iterator[Runtime]:
    why = _why_not()
    if why:
        pytest.skip(why)
    venv = _venv_with_dependencies()
    src = Path(tempfile.mkdtemp(prefix="cachemgr-src-"))
    try:
        shutil.copytree(
            ROOT / "cachemgr", src / "cachemgr", ignore=shutil.ignore_patterns("__pycache__")
        )
        shutil.copytree(ROOT / "examples" / "kernels", src / "kernels")
        _compile(venv, src / "cachemgr")
        for path in [src, *src.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield Runtime(str(venv / "bin" / "python"), str(src), src / "kernels")
    finally:
        shutil.rmtree(src, ignore_errors=True)


@dataclass(frozen=True)
class Users:
    group: str
    alice: str
    bob: str
    carol: str  # not in the group
    base: Path  # world-traversable folder of the test


@pytest.fixture
def users() -> Iterator[Users]:
    tag = secrets.token_hex(3)
    group = f"cmshare{tag}"
    names = [f"cma{tag}", f"cmb{tag}", f"cmc{tag}"]
    base = Path(tempfile.mkdtemp(prefix="cachemgr-users-"))
    base.chmod(0o755)
    made: list[str] = []
    try:
        subprocess.run(["groupadd", group], check=True, capture_output=True)
        for name in names:
            extra = ["-G", group] if name != names[2] else []
            subprocess.run(
                ["useradd", "-M", "-N", "-d", str(base / name), *extra, name],
                check=True,
                capture_output=True,
            )
            made.append(name)
        yield Users(group, *names, base=base)
    finally:
        _remove_users(made)
        subprocess.run(["groupdel", group], check=False, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _remove_users(names: list[str]) -> None:
    """Delete the test users, first killing what they still run (``userdel`` refuses a user
    with processes: they were left in /etc/passwd) and removing their ``cachemgr-*`` folders
    in the temp folder (a killed compile's build folder, which no other user may reclaim).

    :raises AssertionError: a user could not be deleted (named, with userdel's words).
    """
    uids = set()
    for name in names:
        done = subprocess.run(["id", "-u", name], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            uids.add(int(done.stdout))
        subprocess.run(["pkill", "-KILL", "-u", name], check=False, capture_output=True)
    tmp = Path(tempfile.gettempdir())
    for item in tmp.iterdir():
        with contextlib.suppress(OSError):
            if not item.name.startswith("cachemgr-") or item.lstat().st_uid not in uids:
                continue
            if item.is_dir() and not item.is_symlink():
                shutil.rmtree(item)
            else:
                item.unlink()
    failed = []
    for name in names:
        for _ in range(50):  # a killed process may take a moment to be reaped
            done = subprocess.run(["userdel", name], check=False, capture_output=True, text=True)
            if done.returncode in (0, 6):  # 6: no such user
                break
            time.sleep(0.1)
        else:
            failed.append(f"{name}: {done.stderr.strip()}")
    assert not failed, f"test users left behind: {failed}"


def user_home(users: Users, name: str) -> Path:
    home = users.base / name
    home.mkdir()
    shutil.chown(home, name)
    return home


def run_as(name: str, users: Users) -> dict[str, object]:
    """Popen arguments that run as ``name`` with the group (when a member) and umask 022 — a
    careless umask on purpose: cachemgr's files must still come out group-shareable."""
    extra = [users.group] if name != users.carol else []
    return {"user": name, "group": "users", "extra_groups": extra, "umask": 0o022}


def run_python_as(
    users: Users,
    rt: Runtime,
    name: str,
    *argv: str,
    env: dict[str, str] | None = None,
    timeout: float = 180,
) -> subprocess.CompletedProcess[str]:
    """``rt.python *argv`` as user ``name`` (:func:`run_as`), with a minimal environment:
    ``PATH``, ``rt``'s ``PYTHONPATH``, ``HOME`` the users' base folder, then ``env``."""
    return subprocess.run(
        [rt.python, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={
            "PATH": os.environ.get("PATH", ""),
            "PYTHONPATH": rt.pythonpath,
            "HOME": str(users.base),
            **(env or {}),
        },
        **run_as(name, users),  # type: ignore[arg-type]
    )
