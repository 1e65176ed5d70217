"""Attack review: a member plants the ``kernel_meta/<host>_<pid>`` folder of a process to come.

``kernel_meta`` lives in the caller's base (``debug_dir``, ``ASCEND_WORK_PATH`` or the current
folder), which may be a folder the group shares. A member may make ``<host>_<pid>`` there
before the victim's process has that id (ids are few and predictable): a link to a private
folder of the victim, or a folder of the member's own. A debug compile wrote its ``.owner``
and its outputs through the link into the victim's private folder, or into the member's
folder. It is now refused in one line, and nothing is written there.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from cachemgr.constants import short_host
from tests.compile_util import scale_request
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
