"""Build folders of killed processes (``cachemgr-build-*`` in the temp folder): a process
killed with SIGKILL never removes its own; the next queue's first build folder reclaims the
dead ones — only this user's real folders whose liveness lock it can take."""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachemgr.compile import tempdirs
from cachemgr.compile.queue import CompileQueue
from tests.compile_util import ROOT, calls, counting_cc, make_settings, request, wait_for
from tests.users_util import Users

#: A queue that compiles one real gcc kernel (a miss: it uses a build folder), says so, and
#: waits to be killed.
CHILD = """
import os, sys, time
from pathlib import Path
from cachemgr.compile.queue import CompileQueue
from tests.compile_util import make_settings, request
tmp = Path(sys.argv[1])
q = CompileQueue(make_settings(tmp, dict(os.environ)), workers=1, output_dir=tmp / "out")
print(q.compile(request(tmp)).status, flush=True)
time.sleep(3600)
"""


@pytest.fixture
def tmpdir_(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private temp folder for this test's processes (never the host's /tmp)."""
    folder = tmp_path / "T"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=60)


def _builds(tmpdir: Path) -> set[Path]:
    return set(tmpdir.glob("cachemgr-build-*"))


def _start(tmp: Path, env: dict[str, str], procs: list[subprocess.Popen[str]]) -> Path:
    """A child queue that compiled a kernel and lives on; its build folder."""
    tmpdir = Path(env["TMPDIR"])
    before = _builds(tmpdir)
    tmp.mkdir()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp)],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(child)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "compiled"  # blocks until the compile is done
    (made,) = _builds(tmpdir) - before
    assert (made / ".src").is_dir(), "the mirror of the compile's sources stays for reuse"
    return made


def _killed(tmp: Path, env: dict[str, str], procs: list[subprocess.Popen[str]]) -> Path:
    """The build folder a SIGKILLed queue left behind."""
    made = _start(tmp, env, procs)
    procs[-1].send_signal(signal.SIGKILL)
    procs[-1].wait(timeout=60)
    assert made.is_dir(), "a killed process cannot remove its own folder"
    return made


def _next_queue_compiles(tmp_path: Path, env: dict[str, str]) -> None:
    with CompileQueue(make_settings(tmp_path, env), workers=1, output_dir=tmp_path / "out") as q:
        assert q.compile(request(tmp_path)).status == "compiled"


def test_a_killed_queues_build_folder_is_reclaimed_by_the_next_queue(
    tmp_path: Path, clean_env, tmpdir_: Path, children, caplog: pytest.LogCaptureFixture
) -> None:
    dead = _killed(tmp_path / "c1", dict(os.environ), children)
    with caplog.at_level(logging.INFO, logger="cachemgr.compile.tempdirs"):
        _next_queue_compiles(tmp_path, clean_env)
    assert not dead.exists()
    assert _builds(tmpdir_) == set(), "the next queue removed its own folder on close"
    lines = [r.getMessage() for r in caplog.records if "dead processes" in r.getMessage()]
    builds = [line for line in lines if "cachemgr-build-" in line]
    assert len(builds) == 1, lines
    assert re.fullmatch(r"removed 1 cachemgr-build-\* folders of .* \(\d+ bytes\)", builds[0])
    # its folder of binaries waiting to be published went too (empty: they were published)
    assert all(re.search(r"cachemgr-(build|pending)-\*", line) for line in lines), lines


def test_a_live_queues_build_folder_stays(
    tmp_path: Path, clean_env, tmpdir_: Path, children
) -> None:
    env = dict(os.environ)
    live = _start(tmp_path / "c1", env, children)
    dead = _killed(tmp_path / "c2", env, children)
    _next_queue_compiles(tmp_path, clean_env)
    assert not dead.exists(), "the dead one went"
    assert (live / ".src").is_dir(), "the live one (its lock held) stays whole"
    assert children[0].poll() is None


def _planted(folder: Path) -> list[Path]:
    """A folder that looks like a dead owner's build folder (its lock file not held)."""
    folder.mkdir()
    (folder / ".cachemgr-live.lock").touch()
    (folder / "sub").mkdir()
    (folder / "sub" / "kernel.c").write_text("int x;\n")
    (folder / "keep.o").write_bytes(b"\0" * 100)
    return [folder / ".cachemgr-live.lock", folder / "sub" / "kernel.c", folder / "keep.o"]


def test_another_users_build_folder_stays(
    tmp_path: Path, clean_env, tmpdir_: Path, children, users: Users
) -> None:
    theirs = tmpdir_ / "cachemgr-build-theirs"
    files = _planted(theirs)
    for path in [theirs, *theirs.rglob("*")]:
        shutil.chown(path, users.bob)
    with open(files[0]) as f:  # its lock can be taken: only the owner tells it apart
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    dead = _killed(tmp_path / "c1", dict(os.environ), children)
    _next_queue_compiles(tmp_path, clean_env)
    assert not dead.exists()
    assert all(f.exists() for f in files), "another user's folder is never touched"


def test_a_planted_link_is_not_followed(tmp_path: Path, clean_env, tmpdir_: Path, children) -> None:
    files = _planted(tmp_path / "victim")
    link = tmpdir_ / "cachemgr-build-x"
    link.symlink_to(tmp_path / "victim")
    inner = tmp_path / "victim" / "cachemgr-build-y"  # a folder reached only through the link
    files += _planted(inner)
    dead = _killed(tmp_path / "c1", dict(os.environ), children)
    _next_queue_compiles(tmp_path, clean_env)
    assert not dead.exists()
    assert link.is_symlink()
    assert all(f.exists() for f in files), "nothing behind the link was removed"


#: A queue that compiles a kernel outside the cache (``disable``) into ``argv[2]`` with the
#: wrapper compiler ``argv[3]`` (which stops before compiling, until it is killed).
CHILD_OUT = """
import os, sys
from pathlib import Path
from cachemgr.compile.queue import CompileQueue
from tests.compile_util import make_settings, request
tmp, out, cc = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
settings = make_settings(tmp, dict(os.environ), compilers={"cc": cc})
q = CompileQueue(settings, workers=1, output_dir=out)
q.compile(request(tmp, options={"op_compiler_cache_mode": "disable"}))
"""


def test_an_uncached_compile_builds_in_the_temp_folder_never_in_the_output_folder(
    tmp_path: Path, clean_env, tmpdir_: Path, children
) -> None:
    """A compile outside the cache builds in a private folder of the temp folder, and only
    its kernel is copied into the output folder: nothing is built, left or swept there (a
    member could swap a folder of the caller's under a build folder's name in a shared
    output folder and have it removed; attack review). A killed one's build folder is
    reclaimed from the temp folder by the next queue."""
    out = tmp_path / "out"
    wrap = counting_cc(tmp_path / "w", body="exec sleep 600")  # the compile never ends
    (tmp_path / "c1").mkdir()
    before = _builds(tmpdir_)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_OUT, str(tmp_path / "c1"), str(out), str(wrap)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    children.append(child)
    wait_for(lambda: calls(tmp_path / "w"), 60, "the wrapper compiler to start")
    (left,) = _builds(tmpdir_) - before
    assert not out.exists() or list(out.iterdir()) == []
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    os.kill(int(calls(tmp_path / "w")[0].split()[0]), signal.SIGKILL)  # the exec'd sleep
    assert left.is_dir()
    settings = make_settings(tmp_path, clean_env)
    with CompileQueue(settings, workers=1, output_dir=out) as q:
        outcome = q.compile(request(tmp_path, options={"op_compiler_cache_mode": "disable"}))
    assert outcome.status == "compiled", outcome.error
    assert not left.exists()
    assert {f.suffix for f in out.iterdir()} == {".json", ".o"}


def test_a_lockless_leftover_leaves_stdout_open(tmp_path: Path, tmpdir_: Path) -> None:
    """Reclaiming a lock-less folder closed descriptor 1 (``True`` taken for a lock's
    descriptor): the CLI lost its result line, the daemon's stdout became a lock file."""
    old = tmpdir_ / "cachemgr-build-old"
    (old / ".src").mkdir(parents=True)
    day_ago = time.time() - 25 * 3600
    os.utime(old, (day_ago, day_ago))
    code = (
        "import os, sys; from cachemgr.compile import tempdirs; "
        "before = os.fstat(1).st_ino; tempdirs.sweep('cachemgr-build-', sys.argv[1]); "
        "print('open' if os.fstat(1).st_ino == before else 'replaced', flush=True)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmpdir_)], cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60,
    )  # fmt: skip
    assert done.stdout.strip() == "open", done.stdout + done.stderr
    assert not old.exists()


@pytest.mark.parametrize(("mode", "swept"), [(0o775, False), (0o1777, True), (0o755, True)])
def test_nothing_is_swept_where_others_may_rename(tmp_path: Path, mode: int, swept: bool) -> None:
    """In a folder others may rename in (group-writable, not sticky) a member could rename a
    folder of ours under the prefix and have the sweep remove it (attack review): nothing
    is swept there. Sticky (as /tmp) or private folders are swept."""
    parent = tmp_path / "shared"
    parent.mkdir()
    mine = parent / "results"  # an old folder of ours with work in it...
    mine.mkdir()
    (mine / "thesis.txt").write_text("precious\n")
    day_ago = time.time() - 3 * 24 * 3600
    os.utime(mine, (day_ago, day_ago))
    planted = parent / "cachemgr-build-evil"
    mine.rename(planted)  # ...renamed under the prefix, as another member of the group can
    parent.chmod(mode)
    try:
        tempdirs.sweep("cachemgr-build-", parent)
    finally:
        parent.chmod(0o755)
    assert (planted / "thesis.txt").exists() is not swept


def test_a_lockless_folder_goes_only_once_a_day_old(
    tmp_path: Path, clean_env, tmpdir_: Path
) -> None:
    old, young = tmpdir_ / "cachemgr-build-old", tmpdir_ / "cachemgr-build-young"
    for folder in (old, young):  # an older cachemgr's folders: no lock file
        (folder / ".src").mkdir(parents=True)
        (folder / ".src" / "kernel.c").write_text("int x;\n")
    day_ago = time.time() - 25 * 3600
    os.utime(old, (day_ago, day_ago))
    _next_queue_compiles(tmp_path, clean_env)
    assert not old.exists()
    assert (young / ".src" / "kernel.c").exists(), "it may be a live older process's"


_MAKER = """
import os, sys, time
from cachemgr.compile import tempdirs
parent, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
os.environ["TMPDIR"] = parent
import tempfile; tempfile.tempdir = parent
made = failed = lost = 0
while time.monotonic() < deadline:
    try:
        live = tempdirs.make("cachemgr-build-")
    except OSError as exc:
        failed += 1
        print("make failed:", exc, flush=True)
        continue
    made += 1
    (live.path / "src.c").write_text("int x;")  # a swept folder fails here or below
    if not (live.path / "src.c").exists():
        lost += 1
    live.close()
print(f"made={made} failed={failed} lost={lost}", flush=True)
"""


def test_a_concurrent_sweep_never_takes_a_folder_being_made(tmp_path: Path) -> None:
    """CI failure (demo, ``[Errno 11]``): the CLI's sweep opened and flocked a new build
    folder's lock between the daemon's ``O_EXCL`` create and its own ``flock``; the daemon's
    compile failed with EAGAIN and the sweep removed the folder. The lock file now appears
    under its name only with its lock already held. Two real processes race for 3 s."""
    parent = tmp_path / "tmp"
    parent.mkdir(mode=0o700)
    maker = subprocess.Popen(
        [sys.executable, "-c", _MAKER, str(parent), "3"], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    sweeps = 0
    while maker.poll() is None:
        tempdirs.sweep("cachemgr-build-", parent)
        sweeps += 1
    out = maker.communicate(timeout=60)[0]
    assert maker.returncode == 0, out
    assert out.splitlines()[-1].endswith("failed=0 lost=0"), out
    assert sweeps > 100, f"only {sweeps} sweeps raced the maker: the test proved nothing"


def test_a_dead_queues_folder_nested_deeper_than_the_recursion_limit_is_reclaimed(
    tmp_path: Path, clean_env, tmpdir_: Path
) -> None:
    """Attack review: a subverted compiler nests folders 1500 deep in its build folder and
    its daemon is killed. The next queue's sweep measured the leftover with ``os.fwalk``
    (recursive in 3.11): ``RecursionError``, not ``OSError``, came out of ``build_dir`` and
    every compile of that queue failed. It is reclaimed, and the next queue compiles."""
    dead = tmpdir_ / "cachemgr-build-dead"
    dead.mkdir()
    (dead / tempdirs.LIVE_LOCK).write_bytes(b"")  # nobody holds it: its owner is dead
    cur = os.open(dead, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1500):
        os.mkdir("a", dir_fd=cur)
        nxt = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
        os.close(cur)
        cur = nxt
    os.close(cur)
    _next_queue_compiles(tmp_path, clean_env)
    assert not dead.exists()
