"""Two Unix users in one group share one cache root (issue 6, SPEC §9); a third user, outside
the group, gets a one-line permission error naming the folder, the user, the group and the fix.

The users and the group are created here (``useradd``/``groupadd``, so this runs as root; it
is skipped with the reason otherwise) and removed afterwards. The project's own virtualenv may
live where other users cannot read (``/root`` is mode 700), so they run cachemgr with the
system's Python 3.11 from a world-readable virtualenv holding the project's dependencies
(built once per dependency set and kept in the temp folder) and a copy of this checkout's
``cachemgr`` package made for the test session.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cachemgr.client import Client
from tests.conftest import ROOT
from tests.daemon_util import Daemon, daemon_env, start_daemon
from tests.shared_util import SOC, kernel_request

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
    reused while they do not change (built in a temp name, then renamed into place)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    tag = hashlib.sha256("\n".join(sorted(deps)).encode()).hexdigest()[:12]
    venv = Path(tempfile.gettempdir()) / f"cachemgr-test-venv-{tag}"
    if (venv / ".complete").exists():
        return venv
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
        for name in made:
            subprocess.run(["userdel", name], check=False, capture_output=True)
        subprocess.run(["groupdel", group], check=False, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _home(users: Users, name: str) -> Path:
    home = users.base / name
    home.mkdir()
    shutil.chown(home, name)
    return home


def _as(name: str, users: Users) -> dict[str, object]:
    """Popen arguments that run as ``name`` with the group (when a member) and umask 022 — a
    careless umask on purpose: cachemgr's files must still come out group-shareable."""
    extra = [users.group] if name != users.carol else []
    return {"user": name, "group": "users", "extra_groups": extra, "umask": 0o022}


def _daemon(users: Users, rt: Runtime, name: str, root: Path) -> Daemon:
    home = _home(users, name)
    env = daemon_env(home)
    for sub in ("home", "run", "state"):
        shutil.chown(home / sub, name)
    env["PYTHONPATH"] = rt.pythonpath
    return start_daemon(
        home,
        *("--cache-dir", str(root), "--host-id", name),
        env=env,
        notify=False,
        python=rt.python,
        popen_kw=_as(name, users),
    )


def _request(rt: Runtime, n: int) -> dict[str, object]:
    data = kernel_request(n)
    data["kernel_source"] = str(rt.kernels / "c" / "add.c")
    return data


def test_two_users_share_one_root_and_a_third_is_told_why_not(
    users: Users, other_runtime: Runtime
) -> None:
    root = users.base / "shared"
    root.mkdir()
    shutil.chown(root, "root", users.group)
    root.chmod(0o2775)  # the README's setup: setgid, group-writable, not world-writable
    chip = root / "kernel_cache" / SOC
    alice = _daemon(users, other_runtime, users.alice, root)
    bob = None
    try:
        a = Client(alice.socket_path, timeout_s=120, local_hits=False)
        first = a.compile(_request(other_runtime, 1))
        assert first["status"] == "compiled", first
        kernel = first["kernel_name"]
        json_path = chip / f"{kernel}.json"
        assert json_path.stat().st_uid != 0  # alice's file
        atime_before = json_path.stat().st_atime_ns

        bob = _daemon(users, other_runtime, users.bob, root)
        b = Client(bob.socket_path, timeout_s=120, local_hits=False)
        hit = b.compile(_request(other_runtime, 1))
        assert (hit["status"], hit["kernel_name"]) == ("hit", kernel)  # bob reads alice's
        assert json_path.stat().st_atime_ns > atime_before  # and his hit counts for LRU
        added = b.compile(_request(other_runtime, 2))
        assert added["status"] == "compiled"  # bob adds beside alice's
        assert a.compile(_request(other_runtime, 2))["status"] == "hit"  # alice reads bob's

        for path in chip.iterdir():
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode == 0o664, (path, oct(mode))
            assert path.stat().st_gid == root.stat().st_gid, path
        assert stat.S_IMODE(chip.stat().st_mode) == 0o2775

        report = b.gc(ratio=0, min_age_s=0, soc=SOC)["chip_folders"][SOC]
        assert set(report["evicted"]) >= {kernel, added["kernel_name"]}  # bob evicts alice's
        assert report["denied"] == []
        assert not json_path.exists()
        assert a.compile(_request(other_runtime, 1))["status"] == "compiled"

        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": other_runtime.pythonpath,
            "HOME": str(_home(users, users.carol)),
        }
        cmd = [other_runtime.python, "-m", "cachemgr"]
        for args in (["serve", "--cache-dir", str(root)], ["gc", "--cache-dir", str(root)]):
            out = subprocess.run(
                cmd + args,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
                **_as(users.carol, users),  # type: ignore[arg-type]
            )
            assert out.returncode == 2, out
            line = out.stderr.strip()
            assert "\n" not in line and "Traceback" not in line, line
            for needle in (str(root), users.carol, users.group, "usermod -aG"):
                assert needle in line, line
    finally:
        alice.stop()
        if bob is not None:
            bob.stop()
