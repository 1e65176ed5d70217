"""kernel_meta (docs/design.md#debug-compiles-and-kernel_meta): one folder per compiling process,
artefacts, orphan reaping."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cachemgr.compile import kernel_meta
from cachemgr.compile.request import load_request
from cachemgr.constants import short_host
from tests.compile_util import write_request


def _folder(meta: Path, name: str, owner: dict | None) -> Path:
    folder = meta / name
    folder.mkdir(parents=True)
    (folder / "te_add_1.o").write_bytes(b"x")
    if owner is not None:
        (folder / kernel_meta.OWNER_FILE).write_text(json.dumps(owner))
    return folder


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_process_dir_is_per_process(tmp_path: Path) -> None:
    meta = tmp_path / "kernel_meta"
    with kernel_meta.open_process_dir(meta) as opened:
        folder = opened.path
    assert folder == meta / f"{short_host()}_{os.getpid()}"
    owner = json.loads((folder / kernel_meta.OWNER_FILE).read_text())
    assert owner == {
        "host": short_host(),
        "pid": os.getpid(),
        "start": kernel_meta.process_start_time(os.getpid()),
    }
    with kernel_meta.open_process_dir(meta) as again:
        assert again.path == folder
    code = (
        "import sys; from cachemgr.compile import kernel_meta; "
        "print(kernel_meta.open_process_dir(sys.argv[1]).path)"
    )
    other = subprocess.run(
        [sys.executable, "-c", code, str(meta)], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert Path(other) != folder and Path(other).parent == meta


def test_reap_orphans_removes_only_leftovers_of_dead_processes_of_this_host(tmp_path: Path) -> None:
    """A completed debug output is the user's and is never reaped; only the
    build folders and temp files of dead processes of this host (and a folder with nothing
    else left) are."""
    meta = tmp_path / "kernel_meta"
    host = short_host()
    with kernel_meta.open_process_dir(meta) as opened:
        mine = opened.path
    dead_pid = _dead_pid()
    dead = _folder(meta, f"{host}_{dead_pid}", {"host": host, "pid": dead_pid, "start": "1"})
    (dead / ".build-te_add_1-x").mkdir()
    (dead / ".build-te_add_1-x" / "te_add_1.o").write_bytes(b"half")
    (dead / "te_add_1.json.h.1.abc.temp").write_bytes(b"half")
    empty_pid = _dead_pid()
    empty = meta / f"{host}_{empty_pid}"
    empty.mkdir()
    (empty / kernel_meta.OWNER_FILE).write_text(
        json.dumps({"host": host, "pid": empty_pid, "start": "1"})
    )
    (empty / ".build-te_mul_2-y").mkdir()
    sleepers = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)
    ]
    try:
        a, b = (s.pid for s in sleepers)
        live = _folder(
            meta,
            f"{host}_{a}",
            {"host": host, "pid": a, "start": kernel_meta.process_start_time(a)},
        )
        (live / ".build-running").mkdir()
        reused = _folder(meta, f"{host}_{b}", {"host": host, "pid": b, "start": "1"})
        other_host = _folder(meta, f"otherhost_{dead_pid}", {"host": "otherhost", "pid": dead_pid})
        not_ours = _folder(meta, f"{host}_{_dead_pid()}", None)
        (meta / "matmul_add.json").write_text("{}")  # CANN's own file at the top
        removed = kernel_meta.reap_orphans(meta)
        assert sorted(removed) == sorted(
            [
                dead / ".build-te_add_1-x",
                dead / "te_add_1.json.h.1.abc.temp",
                empty / ".build-te_mul_2-y",
                empty,
            ]
        )
        for kept in (mine, live, live / ".build-running", other_host, not_ours, reused):
            assert kept.exists()
        assert (meta / "matmul_add.json").exists()
        assert (dead / "te_add_1.o").read_bytes() == b"x", "a completed output stays"
        assert (reused / "te_add_1.o").exists()
        old = time.time() - 7200
        os.utime(dead / "te_add_1.o", (old, old))
        assert kernel_meta.reap_orphans(meta, retention_s=3600) == [dead], "explicit retention"
        assert reused.exists(), "its newest file is young"
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
    assert kernel_meta.reap_orphans(tmp_path / "absent") == []


def test_compute_document_describes_the_request(tmp_path: Path) -> None:
    req = load_request(write_request(tmp_path, example="gemm_c", op_name="matmul_1"))
    doc = kernel_meta.compute_document(req, "te_matmul_abc")
    assert doc["kernelName"] == "te_matmul_abc" and doc["opType"] == "MatMul"
    assert [t["shape"] for t in doc["inputs"]] == [[64, 128], [128, 32]]
    assert doc["outputs"][0]["dtype"] == "float32"
    nodes = doc["graph"]["nodes"]
    op = next(n for n in nodes if n["type"] == "MatMul")
    assert op["name"] == "matmul_1" and op["inputs"] == ["input_0", "input_1"]
    assert op["attrs"] == {"transpose_x1": False, "transpose_x2": False}
    assert doc["kernel"]["defines"] == {"M": 64, "K": 128, "N": 32}


def test_reaping_a_planted_tree_deeper_than_the_recursion_limit(tmp_path: Path) -> None:
    """Attack review: a member plants, in ``kernel_meta`` (group-writable), a dead process's
    folder whose ``.build-*`` folder nests 1500 deep; ``shutil.rmtree`` (3.11) raised
    ``RecursionError`` out of ``reap_orphans`` (no ``OSError``: the daemon's reclaim pass
    stopped with a traceback). It is reaped like any other leftover."""
    meta = tmp_path / "kernel_meta"
    host = short_host()
    dead_pid = _dead_pid()
    dead = _folder(meta, f"{host}_{dead_pid}", {"host": host, "pid": dead_pid, "start": "1"})
    build = dead / ".build-te_add_1-x"
    build.mkdir()
    cur = os.open(build, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1500):
        os.mkdir("a", dir_fd=cur)
        nxt = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
        os.close(cur)
        cur = nxt
    os.close(cur)
    assert kernel_meta.reap_orphans(meta) == [build]
    assert not build.exists()
    assert (dead / "te_add_1.o").exists(), "a completed output stays"


@pytest.mark.parametrize("owner", ["nested", "huge"])
def test_a_planted_owner_record_is_no_owner(tmp_path: Path, owner: str) -> None:
    """Attack review: a member plants a process folder in a shared ``kernel_meta`` whose
    ``.owner`` is ``[[[…]]]`` (``RecursionError`` out of the reaper: the daemon's first scan
    ended with a traceback) or 100 GiB sparse (read whole into the daemon's memory). Such a
    record is no owner: the folder is not judged a dead process's and stays."""
    meta = tmp_path / "kernel_meta"
    folder = _folder(meta, f"{short_host()}_{_dead_pid()}", None)
    record = folder / kernel_meta.OWNER_FILE
    if owner == "nested":
        record.write_text("[" * 30000 + "]" * 30000)
    else:
        with open(record, "wb") as giant:
            giant.truncate(100 << 30)
    assert kernel_meta.reap_orphans(meta) == []
    assert folder.exists()


def test_an_output_moved_across_filesystems_lands_in_the_opened_folder(tmp_path: Path) -> None:
    """A debug output built on another filesystem (the temp folder on tmpfs) is copied in
    chunks to a temp name and renamed, both relative to the opened process folder: the
    folder renamed and a link put in its place after opening changes nothing."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a filesystem other than the test folder's")
    build = Path(tempfile.mkdtemp(dir=shm))
    try:
        src = build / "te_x.o"
        data = os.urandom(3 * kernel_meta.COPY_CHUNK_BYTES + 17)
        src.write_bytes(data)
        meta, trap = tmp_path / "kernel_meta", tmp_path / "trap"
        trap.mkdir()
        with kernel_meta.open_process_dir(meta) as folder:
            moved = meta / "elsewhere"
            folder.path.rename(moved)
            folder.path.symlink_to(trap)
            kernel_meta.move_in(src, folder)
        assert list(trap.iterdir()) == []
        assert (moved / "te_x.o").read_bytes() == data
        assert stat.S_IMODE((moved / "te_x.o").stat().st_mode) == 0o664
        assert not src.exists()
        assert sorted(p.name for p in moved.iterdir()) == [kernel_meta.OWNER_FILE, "te_x.o"]
    finally:
        shutil.rmtree(build, ignore_errors=True)
