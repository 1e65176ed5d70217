"""Outsiders read nothing (docs/shared-cache.md#outsiders-read-nothing): under the documented
``2770`` root cachemgr's own folders and files give others no bit, a user outside the group
cannot read an entry, and ``cachemgr config`` / ``status`` say in one line when the cache is
readable by every local user (the old ``2775`` root)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SOC, run_cli
from tests.daemon_util import start_daemon
from tests.test_ge_interop import REQUESTS, fake_toolkit
from tests.test_two_users import _request
from tests.users_util import Runtime, Users, run_as, run_python_as, user_home


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A folder every local user may pass through (pytest's own temp folder is ``0700``:
    nothing below it is reachable by others, so nothing there is exposed)."""
    base = Path(tempfile.mkdtemp(prefix="cachemgr-outsiders-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if "every local user" in line]


def test_config_says_in_one_line_when_every_local_user_can_read_the_cache(
    clean_env: dict[str, str], open_base: Path
) -> None:
    root = open_base / "shared"
    (root / "kernel_cache").mkdir(parents=True)
    for folder in (root, root / "kernel_cache"):
        folder.chmod(0o2775)  # the README's old root, and what was made below it
    proc = run_cli("config", "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 0, proc.stderr
    (line,) = _warnings(proc.stderr)
    for needle in (f"warning: {root} is readable", "(mode 2775)", f"chmod o-rwx {root}"):
        assert needle in line, line
    assert "docs/shared-cache.md#outsiders-read-nothing" in line
    assert not _warnings(proc.stdout)  # --json and the table stay as they were
    as_json = run_cli("config", "--json", "--cache-dir", str(root), env=clean_env)
    assert len(_warnings(as_json.stderr)) == 1 and json.loads(as_json.stdout)
    root.chmod(0o2770)  # the documented root: the kernel cache below it is out of reach
    proc = run_cli("config", "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 0 and not _warnings(proc.stderr + proc.stdout), proc.stderr
    root.chmod(0o2775)  # open root, closed kernel cache: the entries are out of reach
    (root / "kernel_cache").chmod(0o2770)
    proc = run_cli("config", "--cache-dir", str(root), env=clean_env)
    assert not _warnings(proc.stderr), proc.stderr


def test_a_cache_below_a_private_folder_is_not_reported(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    private = tmp_path / "home"
    private.chmod(0o700)  # a home of 0700: its 2775 cache is closed to others all the same
    root = private / "atc_data"
    (root / "kernel_cache").mkdir(parents=True)
    for folder in (root, root / "kernel_cache"):
        folder.chmod(0o2775)
    proc = run_cli("config", "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 0 and not _warnings(proc.stderr), proc.stderr


def test_status_says_in_one_line_when_every_local_user_can_read_the_cache(
    tmp_path: Path, open_base: Path
) -> None:
    root = open_base / "shared"
    root.mkdir()
    root.chmod(0o2775)
    daemon = start_daemon(tmp_path, "--cache-dir", str(root))
    try:
        status = ["status", "--socket", str(daemon.socket_path)]
        proc = run_cli(*status, env=daemon.env)
        assert proc.returncode == 0, proc.stderr
        assert not _warnings(proc.stdout), proc.stdout  # stdout: what status is asked to show
        (line,) = _warnings(proc.stderr)
        assert line.startswith(f"cachemgr: warning: {root} is readable by every local user ")
        assert "(mode 2775)" in line and f"chmod o-rwx {root}" in line, line
        quiet = run_cli(*status, "-q", env=daemon.env)  # -q: errors only
        assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
        root.chmod(0o2770)
        proc = run_cli(*status, env=daemon.env)
        assert proc.returncode == 0 and not _warnings(proc.stdout + proc.stderr), proc.stdout
    finally:
        daemon.stop()


def _others_bits(root: Path) -> list[str]:
    return [
        f"{p} {stat.filemode(p.lstat().st_mode)}"
        for p in [root, *root.rglob("*")]
        if p.lstat().st_mode & 0o007
    ]


def test_cachemgr_gives_others_nothing_under_a_2770_root(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o2770)
    env = {**clean_env, **fake_toolkit(tmp_path / "Ascend")}
    for args in (
        ["compile", str(REQUESTS / "add_c.json"), "--local"],  # entry, locks, manifest, ini
        ["limits", "set", "--max-size", "100", "--local"],
        ["gc", "--local"],  # GE's eviction lock
        ["verify"],
    ):
        proc = run_cli(*args, "--cache-dir", str(root), env=env, cwd=tmp_path)
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    made = [p.name for p in (root / "kernel_cache" / SOC).iterdir()]
    assert any(n.endswith(".json") for n in made) and "op_cache_file_del.lock" in made, made
    assert (root / "kernel_cache" / "op_cache.ini").exists()
    assert _others_bits(root) == []  # was: 2775 folders, 0664 files
    for folder in (root / "kernel_cache", root / "kernel_cache" / SOC):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o2770, folder
    for path in (root / "kernel_cache" / SOC).iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o660, path  # the group still shares


def test_what_cachemgr_creates_under_umask_022_raises_no_warning_of_its_own(
    clean_env: dict[str, str], open_base: Path, tmp_path: Path
) -> None:
    """cachemgr made ``$HOME/atc_data`` (and a missing ``--cache-dir``) ``0775`` under umask
    022 — others' bits taken from ``$HOME`` or ``/tmp`` — then warned that its own folder
    was readable by every local user. A folder outside the cache passes nothing on."""
    home = open_base / "home"
    home.mkdir()
    home.chmod(0o755)
    env = {**clean_env, **fake_toolkit(tmp_path / "Ascend"), "HOME": str(home)}
    roots = {"default": home / "atc_data", "named": open_base / "new" / "root"}
    for how, root in roots.items():
        named = [] if how == "default" else ["--cache-dir", str(root)]
        for args in (
            ["compile", str(REQUESTS / "add_c.json"), "--local"],
            ["limits", "set", "--max-size", "100", "--local"],
            ["gc", "--local"],
        ):
            proc = subprocess.run(
                [sys.executable, "-m", "cachemgr", *args, *named],
                env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, umask=0o022,
            )  # fmt: skip
            assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
        top = root if how == "default" else open_base / "new"
        assert _others_bits(top) == [], how  # was: 0775 folders, 0664 files
        config = run_cli("config", *named, env=env)
        assert config.returncode == 0 and not _warnings(config.stderr), config.stderr
    shared = open_base / "shared"  # a root shared on purpose (setgid) still passes its bits
    shared.mkdir()
    shared.chmod(0o2775)
    proc = run_cli("limits", "set", "--max-size", "100", "--local", "--cache-dir", str(shared),
                   env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE((shared / "kernel_cache").stat().st_mode) == 0o2775


def test_an_outsider_cannot_read_an_entry_a_member_compiled(
    users: Users, other_runtime: Runtime
) -> None:
    rt = other_runtime
    root = users.base / "shared"
    root.mkdir()
    shutil.chown(root, "root", users.group)
    root.chmod(0o2770)  # the README's root
    req = users.base / "req.json"
    req.write_text(json.dumps(_request(rt, 31)))
    req.chmod(0o644)
    home = user_home(users, users.bob)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": rt.pythonpath, "HOME": str(home)}

    def run(name: str, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv),
            env=env,
            cwd=users.base,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
            **run_as(name, users),  # type: ignore[arg-type]
        )

    cachemgr = (rt.python, "-m", "cachemgr")
    done = run(users.bob, *cachemgr, "compile", str(req), "--json", "--local", "--cache-dir",
               str(root))  # fmt: skip
    assert done.returncode == 0, done.stderr
    kernel = json.loads(done.stdout.splitlines()[0])["kernel_name"]
    doc = root / "kernel_cache" / SOC / f"{kernel}.json"
    assert doc.exists()
    assert _others_bits(root) == []  # bob's umask 022 gives others nothing either
    assert run(users.alice, "cat", str(doc)).returncode == 0  # a member reads it
    outsider = run(users.carol, "cat", str(doc))
    assert outsider.returncode != 0 and "Permission denied" in outsider.stderr
    listing = run(users.carol, *cachemgr, "ls", "--cache-dir", str(root))
    assert kernel not in listing.stdout, listing.stdout
    for command in ("ls", "stats", "verify"):  # the read-only commands: one line, as gc's
        proc = run(users.carol, *cachemgr, command, "--cache-dir", str(root))
        assert proc.returncode == 2, (command, proc.stderr)
        (line,) = proc.stderr.splitlines()  # was a warning about op_cache.ini's unknown
        # owner, then a bare "error: Permission denied: <root>/kernel_cache"
        for needle in (f"{root} is not readable by user {users.carol}", "mode drwxrws---",
                       f"{users.carol} is not in group {users.group}"):  # fmt: skip
            assert needle in line, (command, line)


def test_an_outsider_is_told_the_daemon_is_out_of_reach_not_missing(
    users: Users, other_runtime: Runtime, tmp_path: Path
) -> None:
    """A user outside the group asks a running daemon: its socket (``0660``, the group's)
    refuses the connect — the line says the daemon is out of this user's reach and names
    the socket's group, not "no daemon"; where a folder on the way is closed to the user,
    it says that."""
    run = users.base / "run"
    run.mkdir()
    run.chmod(0o755)
    sock = run / "cachemgr.sock"
    daemon = start_daemon(tmp_path, "--socket", str(sock), "--cache-dir", str(tmp_path / "c"))
    try:
        shutil.chown(sock, "root", users.group)
        sock.chmod(0o660)
        status = ("-m", "cachemgr", "status")  # the socket as the README sets it, by env
        env = {"CACHEMGR_SOCKET": str(sock)}
        proc = run_python_as(users, other_runtime, users.carol, *status, env=env)
        assert proc.returncode == 2, proc.stdout  # as stats and stop: not "none answers" (1)
        (line,) = proc.stderr.splitlines()
        assert f"cannot reach the daemon at {sock}: Permission denied" in line, line
        assert f"group {users.group}" in line and "no daemon" not in line, line
        stop = ("-m", "cachemgr", "stop", "--wait", "0")
        proc = run_python_as(users, other_runtime, users.carol, *stop, env=env)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.splitlines()
        assert f"cannot reach the daemon at {sock}: Permission denied" in line, line
        assert daemon.proc.poll() is None
        member = run_python_as(users, other_runtime, users.bob, *status, env=env)
        assert member.returncode == 0, member.stderr  # the group's members reach it
        sock.chmod(0o600)  # the owner's alone: a member is not told to join the group it is in
        member = run_python_as(users, other_runtime, users.bob, *status, env=env)
        (line,) = member.stderr.splitlines()
        assert "cannot reach the daemon" in line and "for the members of group" not in line, line
        assert "mode srw-------" in line and "only its owner root" in line, line
        sock.chmod(0o660)
        run.chmod(0o700)  # a folder on the way closed to others
        proc = run_python_as(users, other_runtime, users.carol, *status, env=env)
        (line,) = proc.stderr.splitlines()
        assert "cannot reach the daemon" in line and "may not enter a folder" in line, line
    finally:
        daemon.stop()


def test_an_outsider_of_the_units_runtime_folder_is_told_its_group(
    users: Users, other_runtime: Runtime, tmp_path: Path
) -> None:
    """The unit's socket sits in its ``RuntimeDirectory=`` (``0750``, of its user and the
    group): an outsider cannot see the socket, so the line names that folder and its group
    (it only said "a folder on the way"), for ``status`` and for ``stats`` routed by
    ``CACHEMGR_SOCKET``, which no longer says no daemon answers there nor to start one."""
    run = users.base / "run-cachemgr"
    run.mkdir()
    shutil.chown(run, "root", users.group)
    run.chmod(0o750)
    sock = run / "cachemgr.sock"
    cache = users.base / "shared"
    cache.mkdir()
    cache.chmod(0o755)  # the outsider's stats resolve it and go on to the daemon
    daemon = start_daemon(tmp_path, "--socket", str(sock), "--cache-dir", str(cache))
    try:
        shutil.chown(sock, "root", users.group)
        env = {"CACHEMGR_SOCKET": str(sock)}  # the README's /etc/profile.d/cachemgr.sh
        for args in (("status",), ("stats", "--cache-dir", str(cache))):
            proc = run_python_as(
                users, other_runtime, users.carol, "-m", "cachemgr", *args, env=env
            )
            assert proc.returncode == 2, (args, proc.stdout)  # the same code for both
            (line,) = [ln for ln in proc.stderr.splitlines() if "cannot reach" in ln]
            assert f"the folder {run} on the way is for the members of group {users.group}" in line
            assert "no cachemgr daemon" not in line and "start one" not in line, line
        member = run_python_as(users, other_runtime, users.bob, "-m", "cachemgr", "status", env=env)
        assert member.returncode == 0, member.stderr  # the group's members reach it
    finally:
        daemon.stop()
