"""A kernel compiled outside the cache goes to the output folder (``--out-dir``, default the
current directory): with ``--mode disable``, or when the chip folder is not writable by this
user (compiled outside the cache). An output folder the user cannot write is refused before
the compiler runs — one line naming the folder and where it came from, exit 2 — as the
``kernel_meta`` folder of a debug compile already was (``compile/kernel_meta.py``,
``check_output_dir``). It used to fail after the compile, with a raw ``[Errno 13]``. A hit
needs no output folder and is still served. Real users (root only), real CLI processes, a
real counting compiler.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from tests import mount_util
from tests.compile_util import calls, counting_cc
from tests.conftest import SOC
from tests.shared_util import kernel_request
from tests.users_util import Runtime, Users, run_as


def _compile(
    users: Users, rt: Runtime, name: str, cwd: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [rt.python, "-m", "cachemgr", "compile", "--local", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env={
            "PATH": os.environ.get("PATH", ""),
            "PYTHONPATH": rt.pythonpath,
            "HOME": str(users.base),
        },
        **run_as(name, users),  # type: ignore[arg-type]
    )


def _one_line_exit_2(proc: subprocess.CompletedProcess[str], folder: Path) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"output folder {folder} (--out-dir" in lines[0], lines[0]
    assert "cannot be written by user" in lines[0] and "Errno" not in lines[0]


def _config_and_request(
    users: Users, rt: Runtime, define: int, body: str = ""
) -> tuple[Path, Path]:
    """A config naming a logging wrapper compiler in ``users.base/cc`` (running ``body``
    before it compiles; every user's compile appends to its log) and a request file for
    the add kernel with define ``define``."""
    cc_dir = users.base / "cc"
    cc = counting_cc(cc_dir, body=body)
    (cc_dir / "calls.log").touch()
    (cc_dir / "calls.log").chmod(0o666)
    cfg = users.base / "c.toml"
    cfg.write_text(f'[compilers]\ncc = "{cc}"\n')
    request = kernel_request(define)
    request["kernel_source"] = str(rt.kernels / "c" / "add.c")
    req = users.base / "req.json"
    req.write_text(json.dumps(request))
    return cfg, req


def test_an_unwritable_output_folder_is_refused_before_compiling(
    users: Users, other_runtime: Runtime
) -> None:
    cc_dir = users.base / "cc"
    cfg, req = _config_and_request(users, other_runtime, 11)
    locked = users.base / "root-only"  # bob's current directory, which he cannot write
    locked.mkdir(mode=0o755)
    root = users.base / "shared"
    chip = root / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    for path in (root, root / "kernel_cache", chip):
        shutil.chown(path, users.alice, users.group)
        path.chmod(0o2775)
    common = ("--config", str(cfg), "--cache-dir", str(root), str(req))
    bob = users.bob

    # --mode disable: the kernel would go to the current directory
    proc = _compile(users, other_runtime, bob, locked, "--mode", "disable", *common)
    _one_line_exit_2(proc, locked)
    assert calls(cc_dir) == []  # refused before the compiler ran

    # a chip folder bob may not write (GE's 0750-style folder): compiled outside the cache,
    # so into the output folder — the current directory, or the one --out-dir names
    chip.chmod(0o2755)
    proc = _compile(users, other_runtime, bob, locked, *common)
    _one_line_exit_2(proc, locked)
    proc = _compile(users, other_runtime, bob, users.base, "--out-dir", str(locked), *common)
    _one_line_exit_2(proc, locked)
    assert calls(cc_dir) == []

    # a writable output folder: compiled outside the cache, returned there (not cached)
    mine = users.base / "bob-out"
    mine.mkdir()
    shutil.chown(mine, bob)
    proc = _compile(users, other_runtime, bob, locked, "--out-dir", str(mine), *common)
    assert proc.returncode == 0, proc.stderr
    assert len(calls(cc_dir)) == 1 and [p.suffix for p in mine.iterdir()].count(".o") == 1

    # a hit needs no output folder: alice (the chip folder's owner) compiles it into the
    # cache, then bob gets the hit from his unwritable current directory
    proc = _compile(users, other_runtime, users.alice, users.base, "--json", *common)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["status"] == "compiled", proc.stdout
    proc = _compile(users, other_runtime, bob, locked, "--json", *common)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["status"] == "hit", proc.stdout
    assert len(calls(cc_dir)) == 2


def _tmpfs(mnt: Path) -> contextlib.AbstractContextManager[Path]:
    """A 4 MiB tmpfs at ``mnt`` (root only; the caller is root: the ``users`` fixture is)."""
    return mount_util.tmpfs(mnt, "size=4m,mode=0755")


def test_a_full_root_and_an_unwritable_output_folder_say_so_in_one_line(
    users: Users, other_runtime: Runtime
) -> None:
    """A cache root that is full (or fills while the kernel compiles) hands the kernel to the
    output folder; bob's current directory, which he cannot write, used to end that compile
    with a raw ``[Errno 13] Permission denied`` after compiling. Now: a root already full (or
    read-only) is refused before compiling (exit 2), one that fills during the compile fails
    in one line naming the folder and what to do (exit 1, as a failed compile)."""
    bob = users.bob
    locked = users.base / "root-only"  # bob's current directory, which he cannot write
    locked.mkdir(mode=0o755)
    with _tmpfs(users.base / "mnt") as root:
        chip = root / "kernel_cache" / SOC
        chip.mkdir(parents=True)
        for path in (root, root / "kernel_cache", chip):
            shutil.chown(path, bob)
        # the compiler fills the cache's filesystem while it compiles: the publish fails
        body = f"cat /dev/zero > {root}/filler 2>/dev/null"
        cfg, req = _config_and_request(users, other_runtime, 21, body)
        cc_dir = users.base / "cc"
        common = ("--config", str(cfg), "--cache-dir", str(root), str(req))

        proc = _compile(users, other_runtime, bob, locked, *common)
        assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
        assert "Errno" not in proc.stderr, proc.stderr
        # one line for the kernel (the other says the full root cannot take the counters)
        lines = [ln for ln in proc.stderr.splitlines() if "counters" not in ln]
        assert len(lines) == 1 and "cachemgr: error:" in lines[0], proc.stderr
        assert "not cached: no space left in" in lines[0], lines[0]
        assert f"output folder {locked} (--out-dir" in lines[0], lines[0]
        assert "give --out-dir a folder you can write" in lines[0], lines[0]
        assert len(calls(cc_dir)) == 1
        assert (root / "filler").exists()

        # the root is full now: refused before the compiler runs, as an unwritable chip folder
        proc = _compile(users, other_runtime, bob, locked, *common)
        _one_line_exit_2(proc, locked)
        assert len(calls(cc_dir)) == 1

        # a writable output folder: compiled, handed back there, not cached
        mine = users.base / "bob-out"
        mine.mkdir()
        shutil.chown(mine, bob)
        proc = _compile(users, other_runtime, bob, locked, "--out-dir", str(mine), *common)
        assert proc.returncode == 0, proc.stderr
        assert "not cached" in proc.stderr
        assert [p.suffix for p in mine.iterdir()].count(".o") == 1

        # a read-only root: refused before compiling too
        (root / "filler").unlink()
        subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)
        proc = _compile(users, other_runtime, bob, locked, *common)
        _one_line_exit_2(proc, locked)
        assert len(calls(cc_dir)) == 2
