"""Attack review: a member plants the ``kernel_meta/<host>_<pid>`` folder of a process to come.

``kernel_meta`` lives in the caller's base (``debug_dir``, ``ASCEND_WORK_PATH`` or the current
folder), which may be a folder the group shares. A member may make ``<host>_<pid>`` there
before the victim's process has that id (ids are few and predictable): a link to a private
folder of the victim, or a folder of the member's own. A debug compile wrote its ``.owner``
and its outputs through the link into the victim's private folder, or into the member's
folder. It is now refused in one line, and nothing is written there.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from cachemgr.constants import short_host
from tests.compile_util import scale_request
from tests.test_deputy import _setup
from tests.users_util import Runtime, Users, run_as

#: alice's process: says its pid, waits for a line, then runs the CLI's debug compile.
VICTIM = """
import os, sys
print(os.getpid(), flush=True)
sys.stdin.readline()
from cachemgr.main import main
sys.argv = ["cachemgr", "compile", "--local", "--cache-dir", sys.argv[1], sys.argv[2]]
main()
"""


@pytest.mark.parametrize("planted", ["link", "folder"])
def test_a_planted_process_folder_in_a_shared_kernel_meta_is_refused(
    users: Users, other_runtime: Runtime, planted: str
) -> None:
    rt = other_runtime
    work = users.base / "work"  # the group's shared work folder, where alice compiles
    work.mkdir()
    shutil.chown(work, "root", users.group)
    work.chmod(0o2775)
    meta = work / "kernel_meta"
    private = users.base / "alice-private"  # alice's own folder, none of bob's business
    private.mkdir(mode=0o700)
    shutil.chown(private, users.alice)
    source = users.base / "k.c"
    source.write_text("void scale_kernel(float *x) { x[0] *= 2; }\n")
    source.chmod(0o644)
    req = users.base / "dbg.json"
    req.write_text(json.dumps(scale_request(str(source), options={"op_debug_level": 2})))
    req.chmod(0o644)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": rt.pythonpath, "HOME": str(users.base)}
    victim = subprocess.Popen(
        [rt.python, "-c", VICTIM, str(work / "cache"), str(req)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=work,
        env=env,
        **run_as(users.alice, users),  # type: ignore[arg-type]
    )
    try:
        assert victim.stdout is not None and victim.stdin is not None
        pid = int(victim.stdout.readline())
        name = meta / f"{short_host()}_{pid}"
        plant = f"ln -s {private} {name}" if planted == "link" else f"mkdir -m 2777 {name}"
        subprocess.run(
            ["sh", "-c", f"mkdir -p -m 2775 {meta} && {plant}"],
            check=True,
            **run_as(users.bob, users),  # type: ignore[arg-type]
        )
        out, _ = victim.communicate("go\n", timeout=120)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    assert list(private.iterdir()) == [], f"written through bob's link: {out}"
    if planted == "folder":
        assert list(name.iterdir()) == [], f"written into bob's folder: {out}"
    assert victim.returncode == 1, out
    assert "debug output folder" in out and "Traceback" not in out, out


# --- a member swaps the process folder for a link while the victim compiles ------------------

#: The attacker's swap loop. Once the victim's folder exists, whenever something new appears
#: in it (a compile at work), and else 30 ms after the last swap, the folder is swapped for
#: a link to the attacker's folder — the
#: folder moves to a spare name and the link takes its place, atomically
#: (``renameat2(RENAME_EXCHANGE)``: the name never goes missing, so the victim never makes a
#: new folder there) — made to look like the victim's (each sub-folder of the victim's, a
#: link back to the real one); the link stays 10 ms, or while the real folder has a
#: sub-folder (at most 2 s), then the folder is swapped back. Until
#: the stop file appears or its time is up; prints the number of swaps and of the files that
#: came into the real folder while the link stood in its place, and leaves the victim's real
#: folder at its name.
SWAPPER = r"""
import ctypes, os, sys, time
meta, name, trap, stop, seconds = sys.argv[1:6]
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
target = os.path.join(meta, name)
spare = os.path.join(meta, "." + name + ".swap")
def exchange():
    if libc.renameat2(AT_FDCWD, spare.encode(), AT_FDCWD, target.encode(), RENAME_EXCHANGE):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), target)
def entries():  # what the folder holds, writes in flight (temp names) aside
    try:
        return {n for n in os.listdir(target) if not n.endswith(".temp")}
    except OSError:
        return set()
print("ready", flush=True)
deadline = time.monotonic() + float(seconds)
while not os.path.exists(os.path.join(target, ".owner")) and time.monotonic() < deadline:
    time.sleep(0.001)  # the victim's first compile made its folder
os.symlink(trap, spare)
swaps, landed, seen, back = 0, 0, {".owner"}, time.monotonic()
while time.monotonic() < deadline and not os.path.exists(stop):
    now = entries()
    if now <= seen and time.monotonic() - back < 0.03:
        time.sleep(0.001)
        continue
    for sub in now:  # each sub-folder: a link back to the real one (at the spare name)
        there = os.path.join(trap, sub)
        if os.path.isdir(os.path.join(target, sub)) and not os.path.lexists(there):
            os.symlink(os.path.join(spare, sub), there)
    exchange()  # the link at the victim's name; the real folder at the spare name
    swaps += 1
    held = time.monotonic()
    time.sleep(0.01)
    while time.monotonic() - held < 2 and any(
        os.path.isdir(os.path.join(spare, sub)) for sub in os.listdir(spare)
    ):
        time.sleep(0.002)  # the victim is at work in a sub-folder: keep the link there
    landed += len(set(os.listdir(spare)) - now)  # written while the link was in place
    exchange()  # and back
    seen, back = entries(), time.monotonic()
os.unlink(spare)
print(swaps, landed, flush=True)
"""

#: The victim through a daemon: says its pid, waits for a line, then compiles each request
#: file with the client (which writes the daemon's hand-back as this user); one JSON line each.
CLIENT_MANY = """
import json, os, sys
print(os.getpid(), flush=True)
sys.stdin.readline()
from cachemgr.client import Client
from cachemgr.errors import CacheMgrError
client = Client(sys.argv[1], timeout_s=120)
for path in sys.argv[3:]:
    with open(path) as f:
        req = json.load(f)
    try:
        print(json.dumps(client.compile(req, base_dir=sys.argv[2]).to_json()), flush=True)
    except CacheMgrError as exc:
        print(json.dumps({"status": "failed", "error": str(exc)}), flush=True)
"""

#: The victim in process: says its pid, waits for a line, then runs ``compile --local`` on
#: each request file in turn, in this process (``--json``: one line each).
LOCAL_MANY = """
import os, sys
print(os.getpid(), flush=True)
sys.stdin.readline()
from cachemgr.main import main
cache, requests = sys.argv[1], sys.argv[2:]
for path in requests:
    sys.argv = ["cachemgr", "compile", "--local", "--json", "--cache-dir", cache, path]
    try:
        main()
    except SystemExit:
        pass
"""

#: Debug compiles per victim, cycling through the levels (their artefacts differ).
SWAP_COMPILES = 16


def _debug_requests(users: Users, work: Path) -> list[str]:
    """Request files of ``SWAP_COMPILES`` different debug compiles into ``work/kernel_meta``."""
    paths = []
    for i in range(SWAP_COMPILES):
        source = users.base / f"k{i}.c"
        source.write_text(f"void scale_kernel(float *x) {{ x[0] *= {i + 2}; }}\n")
        source.chmod(0o644)
        options = {"op_debug_level": 1 + i % 4, "debug_dir": str(work)}
        req = users.base / f"dbg{i}.json"
        req.write_text(json.dumps(scale_request(str(source), options=options)))
        req.chmod(0o644)
        paths.append(str(req))
    return paths


def _shared_work(users: Users) -> tuple[Path, Path]:
    """The group's shared work folder (``2775``) and the attacker's folder, which anyone may
    write (so a write redirected there would succeed)."""
    work = users.base / "work"
    work.mkdir()
    shutil.chown(work, "root", users.group)
    work.chmod(0o2775)
    trap = users.base / "trap"
    trap.mkdir()
    trap.chmod(0o777)
    return work, trap


def _run_swapped(
    users: Users, rt: Runtime, victim_argv: list[str], victim: str, attacker: str, work: Path,
    trap: Path, env: dict[str, str],
) -> tuple[list[dict], tuple[int, int], Path, str]:  # fmt: skip
    """Run the victim's compiles while ``attacker`` runs :data:`SWAPPER` on the victim's
    process folder: the victim's JSON lines, the swapper's two numbers (swaps, files that
    came in while swapped), the victim's process folder and what the victim wrote to
    stderr."""
    stop = users.base / "stop"
    proc = subprocess.Popen(
        [rt.python, "-c", *victim_argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=work, env=env,
        **run_as(victim, users),  # type: ignore[arg-type]
    )  # fmt: skip
    swapper = None
    try:
        assert proc.stdout is not None and proc.stdin is not None
        pid = int(proc.stdout.readline())
        meta = work / "kernel_meta"
        folder = meta / f"{short_host()}_{pid}"
        swapper = subprocess.Popen(
            [rt.python, "-c", SWAPPER, str(meta), folder.name, str(trap), str(stop), "150"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            **run_as(attacker, users),  # type: ignore[arg-type]
        )  # fmt: skip
        assert swapper.stdout is not None
        assert swapper.stdout.readline().strip() == "ready"
        out, err = proc.communicate("go\n", timeout=180)
        stop.touch()
        swaps, swap_err = swapper.communicate(timeout=30)
    finally:
        for p in (proc, swapper):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert swapper.returncode == 0, swap_err
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    swapped, landed = (int(n) for n in swaps.split())
    return results, (swapped, landed), folder, err


def _judge(results: list[dict], folder: Path, trap: Path, swaps: tuple[int, int], err: str) -> None:
    """No output in the attacker's folder; each compile either kept its outputs whole in the
    victim's real folder (the binary's SHA-256 is the one its json names) or was refused in
    one line naming the folder (it was the link when opened)."""
    redirected = sorted(p.name for p in trap.rglob("*") if p.is_file())
    outputs = sum(len(r.get("files", [])) for r in results if r["status"] == "debug")
    assert redirected == [], (
        f"{len(redirected)} files in the attacker's folder ({outputs} outputs kept): {redirected}"
    )
    assert "Traceback" not in err, err
    assert len(results) == SWAP_COMPILES, results
    assert swaps[1] >= 1, f"nothing was written while swapped ({swaps[0]} swaps): no attack"
    kept = 0
    for r in results:
        if r["status"] != "debug":
            line = r["error"]
            assert "\n" not in line and "Traceback" not in line, line
            assert "debug output folder" in line and "symbolic link" in line, line
            assert str(folder) in line, line
            continue
        files = [Path(f) for f in r["files"]]
        assert files and all(f.parent == folder and f.is_file() for f in files), r
        doc = json.loads((folder / f"{r['kernel_name']}.json").read_text())
        binary = folder / f"{doc['binFileName']}{doc['binFileSuffix']}"
        assert hashlib.sha256(binary.read_bytes()).hexdigest() == doc["sha256"], binary
        kept += 1
    assert kept, f"no compile kept its outputs while the folder was swapped: {results}"


def test_a_process_folder_swapped_for_a_link_mid_compile_redirects_nothing(
    users: Users, other_runtime: Runtime
) -> None:
    """A member (bob) keeps swapping alice's ``kernel_meta/<host>_<pid>`` for a link to his
    folder and back (:data:`SWAPPER`) while alice runs debug compiles in process: each
    compile opens the folder once and writes every output relative to that descriptor, so
    none reaches bob's folder (all of the first compile's did), and each compile's outputs
    are whole in her folder or it is refused in one line (the link stood there when it
    opened the folder)."""
    rt = other_runtime
    work, trap = _shared_work(users)
    requests = _debug_requests(users, work)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": rt.pythonpath, "HOME": str(users.base)}
    argv = [LOCAL_MANY, str(work / "cache"), *requests]
    results, swaps, folder, err = _run_swapped(
        users, rt, argv, users.alice, users.bob, work, trap, env
    )
    _judge(results, folder, trap, swaps, err)


def test_a_daemons_hand_back_into_a_swapped_process_folder_redirects_nothing(
    users: Users, other_runtime: Runtime
) -> None:
    """The same swap loop (run by alice, a member) on the folder where bob's client writes
    the debug outputs a daemon handed back: the client opens it once and writes each file
    relative to it, so none reaches alice's folder."""
    rt = other_runtime
    daemon, _, _, bob = _setup(users, rt)
    try:
        work, trap = _shared_work(users)
        requests = _debug_requests(users, work)
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": rt.pythonpath, "HOME": str(bob),
               "CACHEMGR_DAEMON_USER": users.alice}  # fmt: skip
        argv = [CLIENT_MANY, str(daemon.socket_path), str(users.base), *requests]
        results, swaps, folder, err = _run_swapped(
            users, rt, argv, users.bob, users.alice, work, trap, env
        )
    finally:
        daemon.stop()
    _judge(results, folder, trap, swaps, err)
    assert all(r.get("via") == "daemon" for r in results if r["status"] == "debug"), results
