"""A miss makes its files before a caller waits for them (docs/performance.md, *Miss
overhead*): the publish's while its compiler runs, unnamed (``O_TMPFILE``) in the chip
folder, named only once whole, gone with the compile when it fails; the next mirror's once
a job is answered. The caller's own work runs beside the compiler process, and an error in
it stops that process; a file that cannot be named is written as a named temp."""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from cachemgr.client import Client
from cachemgr.compile import build
from cachemgr.compile.queue import CompileQueue
from cachemgr.compilers import process
from cachemgr.storage import fsutil, madeahead, partcopy
from tests.compile_util import SOC, counting_cc, make_settings, request, scale_request, wait_for
from tests.daemon_util import daemon_env, own_tmp, start_daemon
from tests.proc_util import fd_targets

#: How long the wrapper compiler waits for the files made while it runs (seconds).
_WAIT_S = 10


def _watching_cc(folder: Path, chip: Path, then: str = "") -> Path:
    """A wrapper compiler that, once started, waits (at most :data:`_WAIT_S`) until its
    parent holds at least three unnamed files of the chip folder ``chip`` open, writes how
    many it saw to ``<folder>/seen``, runs ``then`` and compiles."""
    body = (
        f"i=0; n=0\n"
        f"while [ $i -lt {_WAIT_S * 20} ]; do\n"
        f'  n=$(ls -l /proc/$PPID/fd 2>/dev/null | grep -c "{chip}/#.* (deleted)")\n'
        f'  [ "$n" -ge 3 ] && break\n'
        f"  i=$((i+1)); sleep 0.05\n"
        f"done\n"
        f'echo "$n" > {folder / "seen"}\n'
        f"{then}"
    )
    return counting_cc(folder, body=body)


def _open_in(chip: Path) -> list[str]:
    """What this process holds open in ``chip`` (its fd links)."""
    return [target for target in fd_targets() if target.startswith(f"{chip}/")]


def test_a_miss_makes_its_three_files_while_the_compiler_runs(
    tmp_path: Path, clean_env: Mapping[str, str]
) -> None:
    chip = tmp_path / "cache" / "kernel_cache" / SOC
    cc = _watching_cc(tmp_path / "w", chip)
    settings = make_settings(tmp_path, clean_env, compilers={"cc": str(cc)})
    with CompileQueue(settings, workers=1) as q:
        out = q.compile(request(tmp_path))
        assert out.status == "compiled", out.error
        assert int((tmp_path / "w" / "seen").read_text()) >= 3  # binary, json, manifest
        assert q.compile(request(tmp_path)).status == "hit"
    names = sorted(p.name for p in chip.iterdir())
    assert not [n for n in names if n.endswith(fsutil.TEMP_SUFFIX)], names
    assert any(n.endswith(".manifest") for n in names), names
    assert _open_in(chip) == []  # every file made ahead was named or closed


def test_a_failed_compile_leaves_none_of_its_files_made_ahead(
    tmp_path: Path, clean_env: Mapping[str, str]
) -> None:
    chip = tmp_path / "cache" / "kernel_cache" / SOC
    cc = _watching_cc(tmp_path / "w", chip, then="echo 'error: no' >&2; exit 1\n")
    settings = make_settings(tmp_path, clean_env, compilers={"cc": str(cc)})
    with CompileQueue(settings, workers=1) as q:
        out = q.compile(request(tmp_path))
    assert out.status == "failed"
    assert int((tmp_path / "w" / "seen").read_text()) >= 3
    left = sorted(p.name for p in chip.iterdir()) if chip.exists() else []
    assert [n for n in left if not n.endswith(".lock")] == [], left
    assert _open_in(chip) == []


def test_work_beside_the_compiler_runs_while_it_runs_and_its_error_stops_it(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "pid"
    script = tmp_path / "slow.sh"
    script.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 60\n")
    script.chmod(0o755)
    seen: list[int] = []

    def meanwhile() -> None:
        deadline = time.monotonic() + _WAIT_S
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline, "the process never started"
            time.sleep(0.01)
        seen.append(int(pid_file.read_text()))
        os.kill(seen[0], 0)  # running now
        raise RuntimeError("stop it")

    with pytest.raises(RuntimeError, match="stop it"):
        process.run_in_group([str(script)], 60.0, tmp_path, "testing", meanwhile=meanwhile)
    with pytest.raises(ProcessLookupError):  # its group was killed and it was reaped
        os.kill(seen[0], 0)


def test_a_file_made_where_it_cannot_be_named_is_written_as_a_named_temp(
    tmp_path: Path,
) -> None:
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem to make the file on")
    shm = os.open(other, os.O_RDONLY | os.O_DIRECTORY)
    try:
        made = [madeahead.make(shm), madeahead.make(shm)]
    finally:
        os.close(shm)
    if None in made:
        pytest.skip("/dev/shm makes no O_TMPFILE")
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:  # a link across filesystems fails (EXDEV): each is written as before instead
        tmp = fsutil.write_temp(tmp_path / "a.json", b"{}", dir_fd=folder, sync=False, made=made[0])
        src = tmp_path / "src.o"
        src.write_bytes(b"\x7fELF" * 100)
        copied = partcopy.copy_temp(tmp_path / "b.o", src, dir_fd=folder, made=made[1])
    finally:
        os.close(folder)
    assert tmp.read_bytes() == b"{}"
    assert copied.tmp.read_bytes() == src.read_bytes() and copied.size == 400
    for fd in made:  # taken over: closed
        with pytest.raises(OSError):
            os.fstat(fd)  # type: ignore[arg-type]


def _spares(pid: int | str = "self") -> list[int]:
    """Inodes of the unnamed files process ``pid`` holds in a worker's build folder."""
    found = []
    for target in fd_targets(pid):
        match = re.search(r"/cachemgr-build-[^/]+/#(\d+) \(deleted\)$", target)
        if match:
            found.append(int(match.group(1)))
    return found


def test_a_worker_makes_its_next_mirrors_file_once_a_job_is_answered(
    tmp_path: Path, clean_env: Mapping[str, str]
) -> None:
    inodes = tmp_path / "w" / "inodes"
    body = f'for a in "$@"; do case "$a" in *.c) stat -c %i "$a" >> {inodes};; esac; done'
    cc = counting_cc(tmp_path / "w", body=body)
    settings = make_settings(tmp_path, clean_env, compilers={"cc": str(cc)})
    with CompileQueue(settings, workers=1) as q:
        assert q.compile(request(tmp_path, "a")).status == "compiled"
        wait_for(lambda: len(_spares()) == 1, 10, "a file made for the next job's mirror")
        (spare,) = _spares()
        assert q.compile(request(tmp_path, "b", defines={"N": 9})).status == "compiled"
        # the second job's source was written to that file (named in the mirror then)
        assert int(inodes.read_text().split()[1]) == spare
        wait_for(lambda: len(_spares()) == 1, 10, "the next one")
    assert _spares() == []  # closed with the queue


def _project(folder: Path, n: int, headers: int) -> Path:
    """A ``scale_kernel`` source including ``headers`` headers of its folder."""
    folder.mkdir(parents=True)
    for h in range(headers):
        (folder / f"h{h}.h").write_text(f"#define H{h} {h}\n")
    includes = "".join(f'#include "h{h}.h"\n' for h in range(headers))
    source = folder / "k.c"
    source.write_text(includes + f"void scale_kernel(float *x) {{ x[0] *= {n}.0f + H0; }}\n")
    return source


def test_the_files_made_ahead_stay_within_a_share_of_the_descriptor_limit(
    tmp_path: Path,
) -> None:
    """Each worker keeps up to 16 files made for its next job's mirror, between jobs: 24
    workers after jobs of 20 headers held 247 descriptors of a daemon limited to 256, for
    good — every compile after that failed with ``EMFILE`` ("Too many open files"). All
    workers together now keep at most one eighth of the soft limit."""
    if shutil.which("prlimit") is None:
        pytest.skip("prlimit (util-linux) is not installed")
    limit = 256
    cfg = tmp_path / "c.toml"
    cfg.write_text("[daemon]\nworkers = 24\n")
    d = start_daemon(
        tmp_path,
        "--cache-dir",
        str(tmp_path / "cache"),
        "--config",
        str(cfg),
        env=own_tmp(daemon_env(tmp_path), tmp_path),
        prefix=("prlimit", f"--nofile={limit}:{limit}", "--"),
    )
    client = Client(d.socket_path, timeout_s=120, local_hits=False)
    answers: list[object] = []

    def compile_one(n: int) -> None:
        source = _project(tmp_path / f"p{n}", n, 20)
        try:
            answers.append(client.compile(scale_request(str(source))).to_json()["status"])
        except Exception as exc:  # the failure is the finding: kept for the assertion
            answers.append(str(exc))

    try:
        for batch in range(2):  # every worker ends a job of 21 inputs (and makes spares)
            threads = [
                threading.Thread(target=compile_one, args=(batch * 100 + i,)) for i in range(24)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
        compile_one(999)  # the daemon idle: a compile as any other
        assert answers[-1] == "compiled", answers[-1]
        assert set(answers) == {"compiled"}, sorted(set(map(str, answers)))
        assert len(_spares(d.proc.pid)) <= limit // build.SPARES_SHARE
    finally:
        d.stop()
