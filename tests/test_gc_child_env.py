"""The governor's gc child, run as a root's owner, does not carry the governor's
environment (docs/daemon.md#the-privileges-it-needs): that owner can read the child's
``/proc/<pid>/environ``. A real user, the real child process; the child reports its own
environment through a ``sitecustomize`` on its ``PYTHONPATH``, as it starts."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.users_util import Runtime, Users, other_runtime, users

__all__ = ["other_runtime", "users"]

SECRET = "CACHEMGR_TEST_GOVERNOR_SECRET"


@pytest.fixture
def reporter() -> Iterator[Path]:
    """A world-readable folder with a ``sitecustomize.py`` that writes the starting
    interpreter's environment to ``<folder>/out/env-<uid>.json`` (``out`` world-writable)."""
    folder = Path(tempfile.mkdtemp(prefix="cachemgr-envreport-"))
    out = folder / "out"
    out.mkdir()
    (folder / "sitecustomize.py").write_text(
        "import json, os\n"
        f"path = {str(out)!r} + f'/env-{{os.getuid()}}.json'\n"
        "with open(path, 'w') as f:\n"
        "    json.dump(dict(os.environ), f)\n"
    )
    folder.chmod(0o755)
    (folder / "sitecustomize.py").chmod(0o644)
    out.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


#: The governor's side, as its own process (root): start one gc child as ARGV[1] (uid:gid,
#: or "" for its own user) with the jobs' API the governor uses.
_GOVERNOR = (
    "import sys; sys.path.insert(0, sys.argv[1])\n"
    "from pathlib import Path\n"
    "from cachemgr.daemon import gcchild\n"
    "who = tuple(int(x) for x in sys.argv[2].split(':')) if sys.argv[2] else None\n"
    "gcchild.run_jobs([gcchild.GcJob(Path(sys.argv[3]), 1, 50, 0.0)], run_as=who)\n"
)


def _governor(rt: Runtime, run_as: str, chip: Path, reporter: Path) -> dict[str, str]:
    """Run :data:`_GOVERNOR` with a secret in its environment; the child's environment."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LC_ALL": "C.UTF-8",
        SECRET: "hunter2",
        "PYTHONPATH": str(reporter),  # the child's report (sitecustomize)
    }
    argv = [rt.python, "-c", _GOVERNOR, rt.pythonpath, run_as, str(chip)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    uid = run_as.split(":")[0] if run_as else str(os.getuid())
    report = reporter / "out" / f"env-{uid}.json"
    assert report.is_file(), f"the child did not start: {done.stderr}"
    env = json.loads(report.read_text())
    report.unlink()
    return env


def test_a_gc_child_run_as_a_roots_owner_gets_none_of_the_governors_secrets(
    users: Users, other_runtime: Runtime, reporter: Path
) -> None:
    """The governor holds a secret in its environment and starts a gc child as carol (its
    way of changing her cache): the child's environment is PATH, the locale and cachemgr's
    PYTHONPATH — no secret. A child as the governor's own user keeps the whole environment
    (nobody else can read it)."""
    owner = pwd.getpwnam(users.carol)
    chip = users.base / "absent" / "Ascend910B1"  # the gc's outcome does not matter here
    env = _governor(other_runtime, f"{owner.pw_uid}:{owner.pw_gid}", chip, reporter)
    assert SECRET not in env and "hunter2" not in json.dumps(env), sorted(env)
    assert env["LC_ALL"] == "C.UTF-8" and env["PATH"], sorted(env)
    path = env["PYTHONPATH"].split(":")
    assert path[0] == other_runtime.pythonpath and str(reporter) in path, path
    kept = {"PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH"}
    assert {k for k in env if not k.startswith("LC_")} <= kept, sorted(env)

    mine = _governor(other_runtime, "", chip, reporter)  # the governor's own user
    assert mine[SECRET] == "hunter2"
