"""Attack review: what a subverted compiler leaves in its worker's build folder.

The build folder is the one place a compile's processes may write (the allow-list view binds
it read-write), and it is reused: emptied after each job for the worker's next one, another
caller's. A compiler taken over by its input (stand-in: a script, as in ``test_deputy.py``)
runs as the daemon user, so it may leave folders the daemon cannot list or empty (modes
``000`` and ``500``). Emptying raised ``PermissionError`` in the worker thread, which died: a
daemon with one worker answered nothing again. A folder it could not list made the check of
what a compiler left raise too, for that job and every later job of that worker.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from tests.daemon_util import wait_for
from tests.test_deputy import RAW, SECRET, _crafted, _setup
from tests.users_util import Runtime, Users, run_as

HOSTILE = {
    # a read-only folder holding a file inside the sources' mirror, which is kept and pruned
    "readonly_mirror": 'mkdir -p "$d/.src/zz" && : > "$d/.src/zz/f" && chmod 500 "$d/.src/zz"',
    # a folder nobody may list beside the outputs
    "unreadable": 'mkdir -p "$d/zz/deeper" && chmod 000 "$d/zz"',
    # folders nested deeper than Python's recursion limit
    "deep": 'p="$d/zz"; for i in $(seq 1500); do p="$p/a"; done; mkdir -p "$p"',
}

CC = """#!/bin/sh
prev=""; for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
case "$*" in *-DHOSTILE=1*) d=$(dirname "$out"); HOSTILE_STEP ;; esac
exec /usr/bin/gcc "$@"
"""


def _post(users: Users, rt: Runtime, bob_dir: str, sock: str, body: str) -> dict:
    """POST /compile as bob; its status and body (never more than 60 s: a wedged daemon
    fails the test instead of hanging it)."""
    out = subprocess.run(
        [rt.python, "-c", RAW, sock, body],
        env={"PATH": "/usr/bin:/bin", "HOME": bob_dir},
        cwd=bob_dir,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        **run_as(users.bob, users),  # type: ignore[arg-type]
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_build_folder_the_daemon_cannot_empty_never_kills_its_worker(
    users: Users, other_runtime: Runtime, kind: str
) -> None:
    """A hostile compile leaves an undeletable or unlistable folder in its build folder; the
    daemon (one worker) still compiles the next caller's kernel, and that folder is gone."""
    rt = other_runtime
    tools = users.base / "tools"
    tools.mkdir()
    cc = tools / "cc"
    cc.write_text(CC.replace("HOSTILE_STEP", HOSTILE[kind]))
    cc.chmod(0o755)
    config = f'[compilers]\ncc = "{cc}"\n[daemon]\nworkers = 1\n'
    daemon, _, _, bob = _setup(users, rt, config)
    uid = pwd.getpwnam(users.alice).pw_uid
    try:
        sock = str(daemon.socket_path)
        kernel = "void scale_kernel(float *x) { x[0] *= 2; }\n"
        hostile = _crafted(str(bob / "h.c"), kernel, extra_flags=["-DHOSTILE=1"])
        first = _post(users, rt, str(bob), sock, hostile)
        assert first["code"] == 200, first
        honest = _crafted(str(bob / "k.c"), kernel.replace("2", "3"))
        second = _post(users, rt, str(bob), sock, honest)
        assert json.loads(second["body"])["status"] == "compiled", second
        assert daemon.proc.poll() is None
        assert daemon.client.health()["status"] == "ok"
        wait_for(lambda: not _left(uid, "zz"), 10, "the hostile folder to be removed")
    finally:
        daemon.stop()
    assert not _left(uid, ""), "a build folder of the daemon stayed after it stopped"


def build_folders(uid: int, tmp: Path | None = None) -> list[Path]:
    """The build folders (``cachemgr-build-*``) of ``uid`` in ``tmp`` (the temp folder).
    Other tests' daemons and CLIs make and remove theirs there all the while: one gone between
    the listing and its ``lstat`` is not there, so not ``uid``'s (it failed a full run with
    ``FileNotFoundError`` on someone else's folder)."""
    found = []
    for path in (tmp or Path(tempfile.gettempdir())).glob("cachemgr-build-*"):
        try:
            if path.lstat().st_uid == uid:
                found.append(path)
        except FileNotFoundError:
            continue
    return found


def test_build_folders_skips_one_removed_while_it_lists(tmp_path: Path) -> None:
    """Folders made and removed beside the listing (as other tests' runs do in the shared temp
    folder) are skipped, never a ``FileNotFoundError``: 2,000 listings while another thread
    churns 20 folders."""
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            for n in range(20):
                (tmp_path / f"cachemgr-build-{n}").mkdir()
            for n in range(20):
                (tmp_path / f"cachemgr-build-{n}").rmdir()

    mine = tmp_path / "cachemgr-build-mine"
    mine.mkdir()
    churner = threading.Thread(target=churn)
    churner.start()
    try:
        for _ in range(2000):
            assert mine in build_folders(os.getuid(), tmp_path)
    finally:
        stop.set()
        churner.join()


def _left(uid: int, name: str) -> list[Path]:
    """The daemon user's build folders in the temp folder, or (``name``) what is so named
    directly in them or in their sources' mirror."""
    found = build_folders(uid)
    if not name:
        return found
    return [q for p in found for q in (p / name, p / ".src" / name) if os.path.lexists(q)]


def test_a_debug_compiles_read_only_leftover_never_stays_in_the_temp_folder(
    users: Users, other_runtime: Runtime
) -> None:
    """A member's debug compile builds in a private hand-back folder (``cachemgr-deliver-*``)
    of the daemon's temp folder; a hostile compile left a read-only folder with a file in it
    there, which neither the build folder's removal nor the hand-back's could remove: one
    folder left in the daemon's temp folder per request, until the disk was full."""
    rt = other_runtime
    tools = users.base / "tools"
    tools.mkdir()
    cc = tools / "cc"
    cc.write_text(CC.replace("HOSTILE_STEP", HOSTILE["readonly_mirror"].replace(".src/", "")))
    cc.chmod(0o755)
    daemon, _, _, bob = _setup(users, rt, f'[compilers]\ncc = "{cc}"\n')
    uid = pwd.getpwnam(users.alice).pw_uid
    tmp = Path(tempfile.gettempdir())
    try:
        kernel = "void scale_kernel(float *x) { x[0] *= 2; }\n"
        debug = {"options": {"op_debug_level": 2}, "extra_flags": ["-DHOSTILE=1"]}
        body = _crafted(str(bob / "h.c"), kernel, **debug)
        answer = _post(users, rt, str(bob), str(daemon.socket_path), body)
        assert answer["code"] == 200, answer
        assert json.loads(answer["body"])["status"] == "debug", answer

        def delivers() -> list[Path]:
            return [p for p in tmp.glob("cachemgr-deliver-*") if p.lstat().st_uid == uid]

        wait_for(lambda: not delivers(), 10, "the hand-back folder to be removed")
    finally:
        daemon.stop()


ENV_CC = """#!/bin/sh
case "$*" in *-DHOSTILE=1*) env >&2; exit 1 ;; esac
exec /usr/bin/gcc "$@"
"""


def test_a_compiler_in_the_view_sees_none_of_the_daemons_environment_secrets(
    users: Users, other_runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The view hid the daemon user's files but handed every compiler process the daemon's
    whole environment: a proxy URL with its password (or any credential a service's unit
    sets) came back to a member in the failed compile's error text, where a subverted
    compiler printed it. Only what a compiler needs (PATH, locale, library and toolkit
    variables) reaches the view."""
    rt = other_runtime
    monkeypatch.setenv("HTTPS_PROXY", f"http://svc:{SECRET}@127.0.0.1:9")
    monkeypatch.setenv("SERVICE_API_KEY", SECRET)
    tools = users.base / "tools"
    tools.mkdir()
    cc = tools / "cc"
    cc.write_text(ENV_CC)
    cc.chmod(0o755)
    daemon, _, _, bob = _setup(users, rt, f'[compilers]\ncc = "{cc}"\n')
    try:
        kernel = "void scale_kernel(float *x) { x[0] *= 2; }\n"
        body = _crafted(str(bob / "h.c"), kernel, extra_flags=["-DHOSTILE=1"])
        answer = _post(users, rt, str(bob), str(daemon.socket_path), body)
        assert json.loads(answer["body"])["status"] == "failed", answer
        assert "PATH=" in answer["body"], "the stand-in compiler printed no environment"
        assert SECRET not in answer["body"], "the daemon's environment came back"
        honest = _crafted(str(bob / "k.c"), kernel)
        again = _post(users, rt, str(bob), str(daemon.socket_path), honest)
        assert json.loads(again["body"])["status"] == "compiled", again
    finally:
        daemon.stop()
