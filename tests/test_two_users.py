"""Two Unix users in one group share one cache root (docs/design.md#sharing-and-locking); a third
user, outside the group, gets a one-line permission error naming the folder, the user, the group and
the fix.

The users, the group and the runtime they run cachemgr with are the fixtures of
``tests/users_util.py`` (root only; skipped with the reason otherwise).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

from cachemgr.client import Client
from tests.daemon_util import Daemon, daemon_env, start_daemon, wait_for
from tests.shared_util import SOC, kernel_request
from tests.users_util import Runtime, Users, run_as, user_home


def _daemon(users: Users, rt: Runtime, name: str, root: Path) -> Daemon:
    home = user_home(users, name)
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
        popen_kw=run_as(name, users),
    )


def _off_mode(folder: Path, mode: int, gid: int) -> list[tuple[str, str, int]]:
    """The files of ``folder`` (name, mode, group) whose mode is not ``mode`` or whose group
    is not ``gid``."""
    off = []
    for path in folder.iterdir():
        try:
            st = path.stat()
        except FileNotFoundError:  # a temp file renamed into place meanwhile
            continue
        if stat.S_IMODE(st.st_mode) != mode or st.st_gid != gid:
            off.append((path.name, oct(stat.S_IMODE(st.st_mode)), st.st_gid))
    return off


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
    root.chmod(0o2775)  # docs/shared-cache.md's setup: setgid, group-writable, not world-writable
    chip = root / "kernel_cache" / SOC
    alice = _daemon(users, other_runtime, users.alice, root)
    bob = None
    try:
        a = Client(alice.socket_path, timeout_s=120, local_hits=False, daemon_user=users.alice)
        first = a.compile(_request(other_runtime, 1)).to_json()
        assert first["status"] == "compiled", first
        kernel = first["kernel_name"]
        json_path = chip / f"{kernel}.json"
        assert json_path.stat().st_uid != 0  # alice's file
        atime_before = json_path.stat().st_atime_ns

        bob = _daemon(users, other_runtime, users.bob, root)
        b = Client(bob.socket_path, timeout_s=120, local_hits=False, daemon_user=users.bob)
        hit = b.compile(_request(other_runtime, 1)).to_json()
        assert (hit["status"], hit["kernel_name"]) == ("hit", kernel)  # bob reads alice's
        assert json_path.stat().st_atime_ns > atime_before  # and his hit counts for LRU
        added = b.compile(_request(other_runtime, 2)).to_json()
        assert added["status"] == "compiled"  # bob adds beside alice's
        assert (
            a.compile(_request(other_runtime, 2)).to_json()["status"] == "hit"
        )  # alice reads bob's

        # every file the group's: a lock file is created under the daemons' umask (022 here,
        # the unit's is 0007) and given its mode at once — a daemon's reclaim pass may be
        # between the two as the folder is listed, so the modes are waited on, not sampled
        gid = root.stat().st_gid
        wait_for(lambda: not _off_mode(chip, 0o664, gid), 10, f"the files of {chip} at 0664")
        assert _off_mode(chip, 0o664, gid) == []
        assert stat.S_IMODE(chip.stat().st_mode) == 0o2775

        report = b.gc(ratio=0, min_age_s=0, soc=SOC).to_json()["chip_folders"][SOC]
        assert set(report["evicted"]) >= {kernel, added["kernel_name"]}  # bob evicts alice's
        assert report["denied"] == []
        assert not json_path.exists()
        assert a.compile(_request(other_runtime, 1)).to_json()["status"] == "compiled"

        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": other_runtime.pythonpath,
            "HOME": str(user_home(users, users.carol)),
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
                **run_as(users.carol, users),  # type: ignore[arg-type]
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
