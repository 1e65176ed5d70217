"""The user's own files outside the cache (docs/design.md#the-users-own-files): the compiler
identities (``compilers.json``), the ``-march=native`` resolutions (``native.json``), the lock
probe's answers (``lockprobe.json``) in ``~/.cache/cachemgr``, a remote's breaker in the state
folder. Where users share a primary group, a folder made by the shared cache's rule (group
``rwx``) let a member rename the victim's file away and plant their own, which was read
without an owner check: the victim's next compile was keyed and labelled with the planted
compiler. Real users (root only; alice the victim, bob a member of her primary group), real
``cachemgr`` processes, real files.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.users_util import Runtime, Users, run_as, user_home

REQUEST = {
    "op_type": "Scale",
    "soc_version": "Ascend910B1",
    "language": "c",
    "kernel_source": "k.c",
    "kernel_entry": "scale_kernel",
    "inputs": [{"shape": [16], "dtype": "float32", "format": "ND"}],
    "outputs": [{"shape": [16], "dtype": "float32", "format": "ND"}],
}


def _run(
    users: Users,
    rt: Runtime,
    name: str,
    home: Path,
    *argv: str,
    umask: int = 0o077,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``rt.python *argv`` as ``name`` with ``HOME=home`` and ``umask``."""
    how = {**run_as(name, users), "umask": umask}
    return subprocess.run(
        [rt.python, *argv],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": rt.pythonpath, "HOME": str(home)},
        check=False,
        **how,  # type: ignore[arg-type]
    )


def _script(users: Users, rt: Runtime, name: str, home: Path, code: str, umask: int = 0o077) -> str:
    """Run ``code`` in Python as ``name``; its stdout (it must succeed)."""
    done = _run(users, rt, name, home, "-c", textwrap.dedent(code), umask=umask)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _home(users: Users) -> Path:
    """alice's home, ``0755`` (others may look in, as a default home is on many hosts)."""
    home = user_home(users, users.alice)
    home.chmod(0o755)
    return home


def _project(users: Users, home: Path) -> Path:
    """alice's kernel and request, and a cache folder of hers beside them."""
    work = home / "work"
    work.mkdir()
    (work / "k.c").write_text("void scale_kernel(float *x) { x[0] *= 2.0f; }\n")
    (work / "req.json").write_text(json.dumps(REQUEST))
    for path in (work, *work.iterdir()):
        shutil.chown(path, users.alice)
    return work


def _compile(
    users: Users,
    rt: Runtime,
    home: Path,
    work: Path,
    umask: int = 0o077,
    err: list[str] | None = None,
) -> str:
    """alice compiles her request (``--json``); its status. ``err`` gets its stderr."""
    done = _run(
        users, rt, users.alice, home,
        "-m", "cachemgr", "compile", "--local", "--json",
        "--cache-dir", str(work / "cache"), str(work / "req.json"),
        umask=umask, cwd=work,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    if err is not None:
        err.append(done.stderr)
    return str(json.loads(done.stdout)["status"])


def _entry_jsons(work: Path) -> str:
    return "".join(p.read_text() for p in (work / "cache").rglob("*.json"))


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode) | (path.lstat().st_mode & stat.S_ISGID)


#: bob's plant: rename alice's file away and put his own in its place.
PLANT = """
import os
path = {path!r}
if os.path.exists(path):
    os.rename(path, path + ".gone")
with open(path, "w") as fh:
    fh.write({content!r})
"""


def _plant(users: Users, rt: Runtime, home: Path, path: Path, content: str) -> None:
    """bob plants ``content`` at ``path`` in alice's folder (made group-writable by root,
    as cachemgr made it before: the folder's mode is what the test is not about)."""
    code = PLANT.format(path=str(path), content=content)
    _script(users, rt, users.bob, home, code, umask=0o022)  # alice may read it
    assert path.stat().st_uid != path.parent.stat().st_uid


def _group_writable(folder: Path, mode: int = 0o770) -> None:
    """alice's own folder (and ``~/.cache`` above it), group ``rwx`` as the shared cache's
    rule made them."""
    folder.parent.chmod(0o770)
    folder.chmod(mode)


def test_planted_compilers_json_is_ignored_and_the_identity_recomputed(
    users: Users, other_runtime: Runtime
) -> None:
    rt, home = other_runtime, _home(users)
    work = _project(users, home)
    assert _compile(users, rt, home, work) == "compiled"
    own = home / ".cache" / "cachemgr"
    identities = own / "compilers.json"
    first = json.loads(identities.read_text())
    assert first, "the first compile remembers gcc's identity"
    # bob's compiler identity: its version line and stamp (what the key holds)
    planted = {key: [*value[:2], "gcc (planted by bob) 99.0", value[3], "planted-stamp"]
               for key, value in first.items()}  # fmt: skip
    _group_writable(own)
    _plant(users, rt, home, identities, json.dumps(planted))
    shutil.rmtree(own / "direct", ignore_errors=True)  # the full path answers
    err: list[str] = []
    assert _compile(users, rt, home, work, err=err) == "hit"  # keyed by the real gcc, not bob's
    warned = [line for line in err[0].splitlines() if "compilers.json" in line]
    assert len(warned) == 1 and f"belongs to {users.bob}" in warned[0], err[0]
    assert "planted" not in _entry_jsons(work)
    # recomputed and written again as alice's own, in a folder made private again
    assert identities.stat().st_uid == home.stat().st_uid
    assert "planted" not in identities.read_text()
    assert _mode(own) == 0o700 and _mode(identities) == 0o600


def test_planted_native_json_is_ignored(users: Users, other_runtime: Runtime) -> None:
    rt, home = other_runtime, _home(users)
    resolve = """
        import shutil, subprocess
        from cachemgr.compilers import native
        from cachemgr.compilers.base import CompilerIdentity
        from cachemgr.compilers.process import Outcome
        gcc = shutil.which("gcc")
        ident = CompilerIdentity("gcc", gcc, "gcc", gcc, "s")
        def run(argv):
            p = subprocess.run(argv, capture_output=True, input=b"")
            return Outcome(p.returncode, p.stdout, p.stderr, 0.0)
        print(" ".join(native.resolve(ident, ("-march=native",), run, "c")))
    """
    real = _script(users, rt, users.alice, home, resolve).strip()
    assert real and "native" not in real
    own = home / ".cache" / "cachemgr"
    remembered = json.loads((own / "native.json").read_text())
    _group_writable(own)
    planted = {key: ["-march=planted-by-bob"] for key in remembered}
    _plant(users, rt, home, own / "native.json", json.dumps(planted))
    assert _script(users, rt, users.alice, home, resolve).strip() == real


def _probe_code(folder: Path) -> str:
    return f"""
        from pathlib import Path
        from cachemgr.cli import lockcheck
        probe = lockcheck.cached_probe(Path({str(folder)!r}))
        print(probe.ok, probe.detail)
    """


def _planted_probe(users: Users, rt: Runtime, home: Path, folder: Path) -> str:
    """The lock probe cache as bob would plant it: this mount's locks "work", fresh."""
    key = _script(users, rt, users.alice, home, f"""
        from pathlib import Path
        from cachemgr.cli import lockcheck
        print(lockcheck.mount_key(Path({str(folder)!r})))
    """).strip()  # fmt: skip
    import time

    doc = {key: {"ok": True, "detail": "planted by bob", "at": time.time(), "folder": "/x"}}
    return json.dumps(doc)


def test_planted_lockprobe_json_is_ignored(users: Users, other_runtime: Runtime) -> None:
    rt, home = other_runtime, _home(users)
    folder = home / "root"
    folder.mkdir()
    shutil.chown(folder, users.alice)
    first = _script(users, rt, users.alice, home, _probe_code(folder))
    assert "planted" not in first
    own = home / ".cache" / "cachemgr"
    _group_writable(own)
    _plant(users, rt, home, own / "lockprobe.json", _planted_probe(users, rt, home, folder))
    again = _script(users, rt, users.alice, home, _probe_code(folder))
    assert "planted" not in again, again  # probed again, not bob's "ok": true


@pytest.mark.parametrize("mode", [0o770, 0o2770])
def test_files_in_an_existing_group_writable_folder_are_not_trusted(
    users: Users, other_runtime: Runtime, mode: int
) -> None:
    """alice's own file, but in a folder the group may write (a member could have put it
    there as hers: renamed from elsewhere): not trusted. A plain ``0770`` folder (as
    cachemgr made it) is made ``0700`` on the next write; a setgid one (shared on purpose)
    is left as it is, and nothing is written there."""
    rt, home = other_runtime, _home(users)
    folder = home / "root"
    folder.mkdir()
    shutil.chown(folder, users.alice)
    own = home / ".cache" / "cachemgr"
    own.mkdir(parents=True)
    for path in (home / ".cache", own):
        shutil.chown(path, users.alice)
    _group_writable(own, mode)
    probes = own / "lockprobe.json"
    probes.write_text(_planted_probe(users, rt, home, folder))
    shutil.chown(probes, users.alice)
    probes.chmod(0o600)
    out = _script(users, rt, users.alice, home, _probe_code(folder))
    assert "planted" not in out, out
    if mode & stat.S_ISGID:
        assert _mode(own) == mode and "planted" in probes.read_text()
    else:
        assert _mode(own) == 0o700 and "planted" not in probes.read_text()


@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_private_folders_are_made_0700_whatever_the_umask(
    users: Users, other_runtime: Runtime, umask: int
) -> None:
    rt, home = other_runtime, _home(users)
    work = _project(users, home)
    assert _compile(users, rt, home, work, umask=umask) == "compiled"
    assert _compile(users, rt, home, work, umask=umask) == "hit"  # writes the direct memo
    own = home / ".cache" / "cachemgr"
    for folder in (home / ".cache", own, own / "direct"):
        assert _mode(folder) == 0o700, (folder, oct(_mode(folder)))
    for name in ("compilers.json", "lockprobe.json"):
        assert _mode(own / name) == 0o600, name
    _script(users, rt, users.alice, home, """
        from cachemgr.daemon.state import remotes_state_dir
        from cachemgr.remote.breakerfile import BreakerFile
        BreakerFile(remotes_state_dir(), "http://remote.invalid").save(60.0, "down")
    """, umask=umask)  # fmt: skip
    state = home / ".local" / "state" / "cachemgr" / "remotes"
    for folder in (home / ".local", home / ".local" / "state", state.parent, state):
        assert _mode(folder) == 0o700, (folder, oct(_mode(folder)))


def test_planted_breaker_state_is_ignored(users: Users, other_runtime: Runtime) -> None:
    """A member's breaker file in alice's state folder cannot switch her remote off."""
    rt, home = other_runtime, _home(users)
    load = """
        from cachemgr.daemon.state import remotes_state_dir
        from cachemgr.remote.breakerfile import BreakerFile
        print(BreakerFile(remotes_state_dir(), "http://remote.invalid").load(600.0))
    """
    save = """
        from cachemgr.daemon.state import remotes_state_dir
        from cachemgr.remote.breakerfile import BreakerFile
        f = BreakerFile(remotes_state_dir(), "http://remote.invalid")
        f.save(60.0, "down"); f.clear(); print(f.path)
    """
    path = Path(_script(users, rt, users.alice, home, save).strip())
    for folder in (home / ".local", home / ".local" / "state", path.parent.parent):
        folder.chmod(0o755)
    path.parent.chmod(0o770)  # as an older cachemgr or a careless umask left it
    content = json.dumps(
        {"format": 1, "url": "http://remote.invalid", "open_until": 4e9, "why": "bob says"}
    )
    _plant(users, rt, home, path, content)
    assert _script(users, rt, users.alice, home, load).strip() == "None"
