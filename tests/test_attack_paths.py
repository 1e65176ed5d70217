"""Attack review: paths a caller makes. A member sent a header 1,900 folders deep with a
compile; mirroring it into the worker's build folder recursed once per folder
(``Path.mkdir(parents=True)``), the worker hit ``RecursionError`` and its build folder, with
the half-made tree, stayed in the daemon's temp folder until the daemon stopped. Every walk
over a caller-made path is iterative, and a build folder is never left behind
(docs/security.md, section 10).
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from cachemgr.compile import inputs
from tests.compile_util import request_data
from tests.daemon_util import wait_for
from tests.test_attack_buildfolder import _post, build_folders
from tests.test_deputy import _crafted, _setup
from tests.users_util import Runtime, Users

#: Folders between the source and the header: deeper than Python's recursion limit (1,000).
DEPTH = 1900


def _deepest(folder: Path) -> int:
    """How many folders deep the tree under ``folder`` goes (walked iteratively, by name
    relative to an open descriptor: the paths are longer than a system call takes)."""
    deepest = 0
    stack = [(os.open(folder, os.O_RDONLY | os.O_DIRECTORY), 0)]
    while stack:
        fd, depth = stack.pop()
        deepest = max(deepest, depth)
        try:
            for entry in os.scandir(fd):
                if entry.is_dir(follow_symlinks=False):
                    sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                    stack.append((sub, depth + 1))
        finally:
            os.close(fd)
    return deepest


@pytest.mark.parametrize("fits", [True, False], ids=["compiles", "too-long-to-mirror"])
def test_a_header_1900_folders_deep_is_one_line_and_leaves_no_build_folder(
    users: Users, other_runtime: Runtime, fits: bool
) -> None:
    """1,900 folders deep: it compiles (its mirror fits in a path) or, padded so its copy in
    the build folder could not be opened, fails with one line naming the limit; either way
    no ``RecursionError``, no build folder left, and the worker compiles the next job."""
    rt = other_runtime
    daemon, _, _, bob = _setup(users, rt, "[daemon]\nworkers = 1\n")
    uid = pwd.getpwnam(users.alice).pw_uid
    sock = str(daemon.socket_path)
    try:
        rel = "/".join(["d"] * DEPTH) + "/deep.h"
        if not fits:  # 4,090 bytes in all: under the request's 4,096, over PATH_MAX mirrored
            rel = "p" * (4090 - len(f"{bob}/{rel}") - 1) + "/" + rel
        kernel = f'#include "{rel}"\nvoid scale_kernel(float *x) {{ x[0] *= SCALE; }}\n'
        body = json.loads(_crafted(str(bob / "k.c"), kernel))
        header = base64.b64encode(b"#define SCALE 2\n").decode()
        body["inputs"]["headers"] = [{"path": f"{bob}/{rel}", "data": header}]
        answer = _post(users, rt, str(bob), sock, json.dumps(body))
        data = json.loads(answer["body"])
        if fits:
            assert data["status"] == "compiled", answer
        else:
            message = data.get("error", "")
            assert data["status"] == "failed" and "\n" not in message, answer
            assert "deep.h" in message and "PATH_MAX" in message, message
        assert "RecursionError" not in daemon.log() and "Traceback" not in daemon.log()
        wait_for(lambda: len(build_folders(uid)) <= 1, 10, "at most the worker's build folder")
        # the worker serves the next job, and the deep tree goes with the folders it needs not
        honest = _crafted(str(bob / "h.c"), "void scale_kernel(float *x) { x[0] *= 3; }\n")
        again = _post(users, rt, str(bob), sock, honest)
        assert json.loads(again["body"])["status"] == "compiled", again
        (folder,) = build_folders(uid)  # the worker's one build folder, and no other
        assert _deepest(folder) < 50, f"{folder} keeps the deep tree"
    finally:
        daemon.stop()
    assert not build_folders(uid), "a build folder of the daemon stayed after it stopped"


def _chain(folder: Path, links: int) -> Path:
    """A chain of ``links`` symbolic links, each to the next, ending in a real C source."""
    folder.mkdir()
    (folder / "k.c").write_text("void add_kernel(float *x) { x[0] += 1; }\n")
    target = "k.c"
    for n in range(links):
        os.symlink(target, folder / f"l{n}")
        target = f"l{n}"
    return folder / target


def test_a_chain_of_1200_links_is_one_line_not_a_recursion(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """``os.path.realpath``/``Path.resolve`` recurse once per link: a kernel source (or a
    header a compiler lists) at the end of a member's chain of 1,200 links ended the CLI in
    ``RecursionError`` ('internal error', exit 70) and the daemon's check of what a compile
    read in a failed compile. The kernel follows links for us (at most 40 in a row)."""
    chain = _chain(tmp_path / "links", 1200)
    data = request_data("add_c")
    data["kernel_source"] = str(chain)
    req = tmp_path / "req.json"
    req.write_text(json.dumps(data))
    cmd = [sys.executable, "-m", "cachemgr", "compile", "--local", str(req)]
    cmd += ["--cache-dir", str(tmp_path / "c")]
    out = subprocess.run(cmd, env=clean_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "kernel_source" in lines[0] and "symbolic links" in lines[0], lines
    assert not inputs.is_system(str(chain), ("/usr/include/",))
    short = _chain(tmp_path / "short", 3)  # a few links: followed to the file
    assert inputs.is_system(str(short), (str(tmp_path / "short") + "/",))
