"""GE's ``0750`` folders and ``0640`` files are given back to the group the moment cachemgr
meets them (docs/shared-cache.md#ges-modes-given-back-on-sight), not at the next
reconciliation minutes later: the daemon's watcher when the chip folder or a file appears,
and a lock, publish or eviction refused for that reason, retried once.

The daemon runs as the documented deployment does: a dedicated user of the sharing group
with exactly the systemd unit's capability sets and umask (``setpriv``, read from
``systemd/cachemgr.service``: ``tests/unit_util.py``). GE is the GE twin run as another
member of the group. The compiles that must be cached are the daemon user's own (they run
without the bubblewrap view, which a daemon holding ``CAP_FOWNER`` may not start for other
users until the compiler's process tree drops its capabilities).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path

from tests.daemon_util import Daemon, daemon_env, start_daemon, wait_first_scan, wait_for
from tests.test_ge_shared import _shared_root, twin_as
from tests.test_two_users import _request
from tests.unit_util import setpriv_argv, unit_wrapper
from tests.users_util import Runtime, Users, run_as, user_home

SOC = "Ascend910B1"
#: How soon GE's modes must be given back once GE's process is done (seconds).
ON_SIGHT_S = 2.0


def _root_2770(users: Users) -> Path:
    root = _shared_root(users)
    root.chmod(0o2770)  # the documented root (README "As a system service")
    return root


def _unit_daemon(users: Users, rt: Runtime, root: Path, user: str) -> Daemon:
    """``cachemgr serve`` as ``user`` with the unit's capabilities, umask and group; the
    reconciliation an hour away, so only meeting GE's files can give them back."""
    home = user_home(users, user)
    env = daemon_env(home)
    for sub in ("home", "run", "state"):
        os.chown(home / sub, int(_id(user)), -1)
    env["PYTHONPATH"] = rt.pythonpath
    cfg = users.base / "daemon.toml"
    cfg.write_text("[daemon]\nreconcile_interval_s = 3600\nreconcile_jitter_s = 0\n")
    cfg.chmod(0o644)
    wrapper = unit_wrapper(users.base, user, users.group, rt.python)
    daemon = start_daemon(
        home,
        *("--cache-dir", str(root), "--config", str(cfg)),
        env=env,
        notify=False,
        wait_ready=False,
        python=str(wrapper),
    )
    daemon.user = user  # its socket is trusted by its own user's clients and root
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
    return daemon


def _id(user: str) -> str:
    return subprocess.run(["id", "-u", user], capture_output=True, text=True, check=True).stdout


def _cli(
    users: Users,
    rt: Runtime,
    user: str,
    *args: str,
    env: dict[str, str] | None = None,
    prefix: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """``cachemgr ARGS`` as ``user`` (a member: umask 022), or under ``prefix`` (setpriv)."""
    home = users.base / user
    home = home if home.exists() else user_home(users, user)
    popen = {} if prefix else run_as(user, users)
    return subprocess.run(
        [*prefix, rt.python, "-m", "cachemgr", *args],
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": rt.pythonpath,
            "HOME": str(home),
            **(env or {}),
        },
        cwd=home,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        **popen,  # type: ignore[arg-type]
    )


def _request_file(users: Users, rt: Runtime, n: int) -> Path:
    req = users.base / f"req{n}.json"
    req.write_text(json.dumps(_request(rt, n)))
    req.chmod(0o644)
    return req


def _given_back(chip: Path) -> bool:
    """The chip folder ``g+rwxs`` and every file in it ``g+rw`` (others given nothing)."""
    try:
        st = chip.stat()
        files = [p.lstat() for p in chip.iterdir()]
    except FileNotFoundError:
        return False
    return (
        st.st_mode & 0o2070 == 0o2070
        and st.st_mode & 0o002 == 0
        and all(f.st_mode & 0o060 == 0o060 and f.st_mode & 0o002 == 0 for f in files)
    )


def test_a_chip_folder_ge_makes_is_shared_on_sight_and_compiles_into_it_are_cached(
    users: Users, other_runtime: Runtime
) -> None:
    rt = other_runtime
    root = _root_2770(users)
    chip = root / "kernel_cache" / SOC
    daemon = _unit_daemon(users, rt, root, users.bob)
    via = {"CACHEMGR_SOCKET": str(daemon.socket_path), "CACHEMGR_DAEMON_USER": users.bob}
    try:
        # GE (alice) makes the chip folder 0750 while the daemon runs, writes an entry (0640
        # files, its 0640 lock) and runs its eviction (GE's 0640 op_cache_file_del.lock)
        assert twin_as(users, rt, users.alice, "write", str(chip), "te_ge_0").returncode == 0
        assert twin_as(users, rt, users.alice, "evict", str(chip), "1", "50").returncode == 0
        made = time.monotonic()
        assert chip.stat().st_uid != int(_id(users.bob))  # alice's folder
        wait_for(lambda: _given_back(chip), ON_SIGHT_S, "GE's chip folder given back")
        seconds = time.monotonic() - made
        # a GE entry written after the folder is watched: its files given back as they appear
        assert twin_as(users, rt, users.alice, "write", str(chip), "te_ge_1").returncode == 0
        wait_for(lambda: _given_back(chip), ON_SIGHT_S, "GE's later files given back")
        # the daemon user's compile through the daemon is cached, the next one a hit
        req = _request_file(users, rt, 41)
        args = ("compile", str(req), "--json", "--cache-dir", str(root))
        first = _cli(users, rt, users.bob, *args, env=via)
        assert first.returncode == 0, first.stdout + first.stderr
        out = json.loads(first.stdout.splitlines()[0])
        assert out["status"] == "compiled" and out.get("cached", True), first.stdout + first.stderr
        assert (chip / f"{out['kernel_name']}.json").exists()
        exposed = [p for p in [root, *root.rglob("*")] if p.lstat().st_mode & 0o007]
        assert exposed == [], exposed  # the daemon's files under a 2770 root: others nothing
        again = _cli(users, rt, users.bob, *args, env=via)
        assert json.loads(again.stdout.splitlines()[0])["status"] == "hit", again.stdout
        # gc: through the daemon, and in the daemon user's own shell (no capability)
        for env, extra in ((via, ()), ({}, ("--local",))):
            gc = _cli(users, rt, users.bob, "gc", "--cache-dir", str(root), *extra, env=env)
            assert gc.returncode == 0, (extra, gc.stdout, gc.stderr)
        gc = _cli(users, rt, users.alice, "gc", "--local", "--cache-dir", str(root))
        assert gc.returncode == 0, gc.stdout + gc.stderr  # and by GE's own user
        assert "given back" in daemon.log(), daemon.log()
        print(f"GE's chip folder given back {seconds:.3f} s after GE's process ended")
    finally:
        daemon.stop()


def _ge_chip(users: Users, rt: Runtime) -> tuple[Path, Path]:
    """A 2770 root whose chip folder GE (alice) made: 0750, an entry's 0640 files, its
    0640 eviction lock — and no daemon to see it appear."""
    root = _root_2770(users)
    chip = root / "kernel_cache" / SOC
    assert twin_as(users, rt, users.alice, "write", str(chip), "te_ge_0").returncode == 0
    assert twin_as(users, rt, users.alice, "evict", str(chip), "1", "50").returncode == 0
    assert stat.S_IMODE(chip.stat().st_mode) & 0o070 == 0o050  # GE's 0750
    user_home(users, users.bob)
    return root, chip


PUBLISH = """
import hashlib, json, sys
from pathlib import Path
from cachemgr.storage.store import Store
chip, kernel = Path(sys.argv[1]), sys.argv[2]
binary = b"\\x7fELF" + kernel.encode() * 8
doc = {"binFileName": kernel, "binFileSuffix": ".o", "kernelName": kernel + "__kernel0",
       "sha256": hashlib.sha256(binary).hexdigest(), "blockDim": 8,
       "magic": "RT_DEV_BINARY_MAGIC_ELF_AIVEC"}
store = Store(chip)
hold = store.hold(kernel)          # the folder is writable now
print("held", flush=True)
sys.stdin.readline()               # ... GE's 0750 comes back meanwhile
print(store.publish(kernel, {kernel + ".o": binary}, doc, held=hold).status, flush=True)
hold.release()
"""


def test_a_publish_refused_by_ges_folder_mode_is_retried_once_after_giving_it_back(
    users: Users, other_runtime: Runtime
) -> None:
    """The watcher is not involved: the chip folder turns 0750 between the entry lock and
    the publish (GE's modes where no daemon runs, or one whose watch missed it)."""
    rt = other_runtime
    _, chip = _ge_chip(users, rt)
    chip.chmod(0o2770)  # given back once ...
    proc = subprocess.Popen(
        [*setpriv_argv(users.bob, users.group), rt.python, "-c", PUBLISH, str(chip), "te_mine"],
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": rt.pythonpath},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "held", proc.stderr
        chip.chmod(0o2750)  # ... and GE's mode is back before the publish
        out, err = proc.communicate("go\n", timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err  # was: CachePermissionError ... chmod g+rwX
    assert out.split()[-1] == "published", out
    assert (chip / "te_mine.json").exists()
    assert stat.S_IMODE(chip.stat().st_mode) & 0o2070 == 0o2070


def test_a_lock_and_an_eviction_refused_by_ges_modes_are_retried_after_giving_them_back(
    users: Users, other_runtime: Runtime
) -> None:
    """In the daemon user's process with the unit's CAP_FOWNER, no daemon: an in-process
    compile (the entry lock in GE's 0750 folder) is cached, gc (GE's 0640 eviction lock)
    exits 0. The same user without the capability gets the one line naming the owner."""
    rt = other_runtime
    root, chip = _ge_chip(users, rt)
    plain = _cli(users, rt, users.bob, "gc", "--local", "--cache-dir", str(root))
    assert plain.returncode == 1 and "chmod" in plain.stderr, plain  # not allowed: as before
    unit = tuple(setpriv_argv(users.bob, users.group))
    req = _request_file(users, rt, 42)
    done = _cli(
        users, rt, users.bob, "compile", str(req), "--json", "--local", "--cache-dir",
        str(root), prefix=unit,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.splitlines()[0])
    assert out["status"] == "compiled" and out.get("cached", True), done.stdout + done.stderr
    assert (chip / f"{out['kernel_name']}.json").exists()
    chip.chmod(0o2750)  # GE's mode again, for the eviction
    gc = _cli(users, rt, users.bob, "gc", "--local", "--cache-dir", str(root), prefix=unit)
    assert gc.returncode == 0, gc.stdout + gc.stderr
    lock = chip / "op_cache_file_del.lock"
    assert stat.S_IMODE(lock.stat().st_mode) & 0o060 == 0o060


_MAKE_FATAL = """
import json, os, sys
chip, kernel = sys.argv[1], sys.argv[2]
path = os.path.join(chip, kernel + ".json")
data = json.load(open(path))
data["binFileName"] = 7  # docs/interop.md#entries-that-abort-ge: GE aborts on it
tmp = path + ".member.tmp"
with open(tmp, "w") as f:
    json.dump(data, f, indent=4)
os.chmod(tmp, 0o640)  # GE's mode: the daemon user may read it only through its group
os.rename(tmp, path)
"""


def test_a_members_json_that_aborts_ge_is_removed_by_the_unit_daemon(
    users: Users, other_runtime: Runtime
) -> None:
    """A hostile member (alice) writes an entry GE's way (her 0640 files), then makes its
    json one CANN GE's lookup aborts on. The daemon as the unit runs it (bob, CAP_FOWNER,
    umask 0007, no-new-privs) reads her json with O_NOATIME (allowed by CAP_FOWNER: no
    access time moved) and removes the entry on sight; GE's lookup is then a miss, no
    abort (docs/interop.md#entries-that-abort-ge)."""
    rt = other_runtime
    root = _root_2770(users)
    chip = root / "kernel_cache" / SOC
    daemon = _unit_daemon(users, rt, root, users.bob)
    try:
        kernel = "te_member_abort"
        assert twin_as(users, rt, users.alice, "write", str(chip), kernel).returncode == 0
        json_path = chip / f"{kernel}.json"
        wait_for(json_path.exists, 10, "alice's entry")
        done = subprocess.run(
            [rt.python, "-c", _MAKE_FATAL, str(chip), kernel],
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            **run_as(users.alice, users),  # type: ignore[arg-type]
        )
        assert done.returncode == 0, done.stderr
        wait_for(lambda: not json_path.exists(), 10, "the daemon to remove the GE-fatal entry")
        wait_for(lambda: "binFileName" in daemon.log(), 10, "the removal's log line")
        hit = twin_as(users, rt, users.alice, "hit", str(chip), kernel)
        assert hit.returncode in (0, 1), hit.stdout + hit.stderr  # a miss, no abort
    finally:
        daemon.stop()
