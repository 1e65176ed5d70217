"""Direct mode (a ``cachemgr compile`` hit answered without the compile path:
:mod:`cachemgr.direct`, :mod:`cachemgr.directwire`) for a member of the sharing group, through
the daemon deployed as README "As a system service" says.

The daemon runs as a dedicated user of the group with exactly what
``systemd/cachemgr.service`` gives it — its ambient and bounding capability sets,
``NoNewPrivileges=``, ``UMask=``, address families and namespaces (``tests/unit_util.py``,
read from the unit file) — started as the unit's ``ExecStart=`` does (``serve --config``, the
socket in ``$RUNTIME_DIRECTORY``, a folder of its user and the group, ``0750``; state in
``$STATE_DIRECTORY``). The root is ``root:<group>`` ``2770`` as in the README. The member's
environment is ``/etc/profile.d/cachemgr.sh``'s: ``CACHEMGR_SOCKET``,
``CACHEMGR_DAEMON_USER``, ``CACHEMGR_CONFIG``. Which path answered is read from
``python -X importtime``: the direct path never imports click (``tests/test_direct.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

from tests.daemon_util import Daemon, daemon_env, start_daemon, wait_first_scan, wait_for
from tests.test_direct import DAEMON_MODULES, Run, _no_seconds, write_scale_project
from tests.unit_util import (
    cap_bit,
    cap_sets,
    capabilities,
    restrict_helper,
    setpriv_argv,
    unit_umask,
)
from tests.users_util import Runtime, Users, run_as, user_home


def _deployed(users: Users, rt: Runtime) -> tuple[Daemon, Path, Path]:
    """alice as the unit's ``User=`` (``Group=`` the sharing group) serving the root of
    ``/etc/cachemgr/cachemgr.toml`` (here: ``users.base``); the daemon, the root and the
    config file."""
    root = users.base / "shared"
    root.mkdir()
    shutil.chown(root, "root", users.group)
    root.chmod(0o2770)  # the README's root: nothing for users outside the group
    cfg = users.base / "cachemgr.toml"
    cfg.write_text(f'op_compiler_cache_dir = "{root}"\n')
    cfg.chmod(0o644)  # readable by the group (README)
    home = user_home(users, users.alice)
    env = daemon_env(home)
    runtime, state = users.base / "run-cachemgr", users.base / "state-cachemgr"
    for folder in (runtime, state):  # RuntimeDirectory=/StateDirectory=, mode 0750
        folder.mkdir()
        shutil.chown(folder, users.alice, users.group)
        folder.chmod(0o750)
    for sub in ("home", "run", "state"):
        shutil.chown(home / sub, users.alice)
    env.update(RUNTIME_DIRECTORY=str(runtime), STATE_DIRECTORY=str(state))
    env["PYTHONPATH"] = rt.pythonpath
    tools = users.base / "tools"
    tools.mkdir()
    tools.chmod(0o755)
    prefix = [*setpriv_argv(users.alice, users.group), str(restrict_helper(tools))]
    daemon = start_daemon(
        home,
        "--config",
        str(cfg),
        env=env,
        notify=False,
        wait_ready=False,
        python=rt.python,
        popen_kw={"umask": unit_umask()},
        prefix=prefix,
        runs_as=users.alice,
    )
    daemon.socket_path = runtime / "cachemgr.sock"
    try:
        wait_for(
            lambda: daemon.proc.poll() is not None or daemon.client.available(),
            60,
            "the daemon to answer",
        )
        assert daemon.proc.poll() is None, daemon.log()
        wait_first_scan(daemon)
    except BaseException:
        daemon.stop()
        raise
    return daemon, root, cfg


def _project(users: Users) -> Path:
    """bob's project: a kernel, its header in an include folder, a request (relative paths)."""
    project = user_home(users, users.bob) / "proj"
    write_scale_project(project)
    for path in [project.parent, project, *project.rglob("*")]:
        shutil.chown(path, users.bob)
    return project


def _as_member(
    users: Users, rt: Runtime, daemon: Daemon, cfg: Path, project: Path, *extra: str
) -> Run:
    """``python -X importtime -m cachemgr compile req.json`` as bob in his project, with the
    environment of ``/etc/profile.d/cachemgr.sh``."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": rt.pythonpath,
        "HOME": str(project.parent),
        "CACHEMGR_SOCKET": str(daemon.socket_path),
        "CACHEMGR_DAEMON_USER": users.alice,
        "CACHEMGR_CONFIG": str(cfg),
    }
    proc = subprocess.run(
        [rt.python, "-X", "importtime", "-m", "cachemgr", "compile", *extra, "req.json"],
        env=env,
        cwd=project,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        **run_as(users.bob, users),  # type: ignore[arg-type]
    )
    return Run(proc)


def _counts(daemon: Daemon) -> tuple[int, int]:
    """The daemon's ``hits`` and ``misses``."""
    stats = daemon.client.stats()
    return stats.counters["hits"], stats.counters["misses"]


def test_a_members_direct_hit_through_the_units_daemon_says_and_counts_what_the_full_hit_does(
    users: Users, other_runtime: Runtime
) -> None:
    rt = other_runtime
    daemon, root, cfg = _deployed(users, rt)
    daemon.user = users.alice  # the test's client trusts the daemon user's socket
    try:
        ambient, _ = capabilities()
        given = sum(cap_bit(c) for c in ambient)
        sets = cap_sets(Path(f"/proc/{daemon.proc.pid}/status").read_text())
        assert sets["CapAmb"] == given, "the daemon does not run with the unit's capabilities"
        project = _project(users)

        def run(*extra: str) -> Run:
            return _as_member(users, rt, daemon, cfg, project, *extra)

        first = run()  # compiled by the daemon, in the view (bob is not its user)
        assert first.code == 0 and first.status() == "compiled", first.out + first.err
        for extra in ((), ("--json",)):
            full = run(*extra)  # the full path's hit writes the memo
            assert full.code == 0 and full.status() == "hit" and not full.direct, full.err
            hits, misses = _counts(daemon)
            lean = run(*extra)
            assert lean.code == 0 and lean.err == "", lean.err
            assert lean.direct, f"a member's hit took the full path: {sorted(lean.modules)[:5]}"
            ours = {m for m in lean.modules if m == "cachemgr" or m.startswith("cachemgr.")}
            assert ours <= DAEMON_MODULES, sorted(ours - DAEMON_MODULES)
            assert _counts(daemon) == (hits + 1, misses), "one request, one hit, by the daemon"
            assert _no_seconds(lean.out) == _no_seconds(full.out)
            if extra:
                assert json.loads(lean.out)["route"]["via"] == "daemon"
            else:
                said = lean.out
        hits, misses = _counts(daemon)
        loud = run("-v")  # says its route: the full path (no memo is kept for -v), same hit
        assert loud.code == 0 and not loud.direct and "route: daemon at" in loud.err, loud.err
        assert _no_seconds(loud.out) == _no_seconds(said)
        assert _counts(daemon) == (hits + 1, misses), "-v counts its hit as the direct path"
        memos = project.parent / ".cache" / "cachemgr" / "direct"
        st = memos.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode) & 0o077) == (_uid(users.bob), 0), oct(
            st.st_mode
        )
        assert not list(root.rglob("*.memo")), "a memo in the shared cache"
    finally:
        daemon.stop()


def _uid(name: str) -> int:
    import pwd

    return pwd.getpwnam(name).pw_uid
