"""Giving GE's modes back never changes a file that was moved in from outside the cache
(docs/security.md#3b-outsiders-read-nothing-ges-modes-are-given-back-on-sight).

The attack: member alice moves dave's ``team/plan.txt`` (``0640``, in a ``2770`` group
folder without the sticky bit, on the cache's filesystem) into a chip folder, waits for the
daemon (``CAP_FOWNER``) to give it ``g+rw``, moves it back and writes dave's file. The daemon
runs as the unit runs it (``tests/unit_util.py``), GE is the GE twin run as alice; GE's own
``0640`` files written meanwhile are still given back."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from cachemgr.storage import groupmodes
from tests import ge_twin
from tests.daemon_util import wait_for
from tests.test_ge_on_sight import ON_SIGHT_S, SOC, _given_back, _root_2770, _unit_daemon
from tests.test_ge_shared import twin_as
from tests.users_util import Runtime, Users, run_as

#: dave's file was last written this long ago (past the rename slack, younger than the
#: orphan reclaim's age: the daemon must not remove it while it is in the chip folder).
AGE_S = 60


@contextlib.contextmanager
def _dave(users: Users) -> Iterator[str]:
    """A third member of the group, whose file is the victim."""
    name = "cmd" + users.alice[3:]
    subprocess.run(["useradd", "-M", "-N", "-G", users.group, name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)


def _daves_file(users: Users, dave: str, folder: Path, name: str, age_s: float) -> Path:
    path = folder / name
    path.write_text(f"dave's {name}\n")
    shutil.chown(path, dave, users.group)
    path.chmod(0o640)
    if age_s:
        when = time.time() - age_s
        os.utime(path, (when, when))
    return path


def _as_alice(users: Users, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, timeout=60, check=False,
        **run_as(users.alice, users),  # type: ignore[arg-type]
    )  # fmt: skip


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_file_moved_in_keeps_its_modes_and_the_member_cannot_write_it(
    users: Users, other_runtime: Runtime
) -> None:
    rt = other_runtime
    root = _root_2770(users)
    chip = root / "kernel_cache" / SOC
    team = users.base / "team"
    team.mkdir()
    shutil.chown(team, "root", users.group)
    team.chmod(0o2770)  # a group folder on the root's filesystem, no sticky bit
    with _dave(users) as dave:
        daemon = _unit_daemon(users, rt, root, users.bob)
        try:
            assert twin_as(users, rt, users.alice, "write", str(chip), "te_ge_0").returncode == 0
            wait_for(lambda: _given_back(chip), ON_SIGHT_S, "GE's chip folder given back")
            # an old file, and one dave just wrote (its ctime near its mtime even moved in)
            victims = [
                _daves_file(users, dave, team, "plan.txt", AGE_S),
                _daves_file(users, dave, team, "plan.o", 0),
            ]
            moved = _as_alice(users, "".join(f"mv {v} {chip / v.name} && " for v in victims) + ":")
            assert moved.returncode == 0, moved.stderr
            # GE's entry written after the moves: once it is given back, the watcher has
            # handled the moves before it
            assert twin_as(users, rt, users.alice, "write", str(chip), "te_ge_1").returncode == 0
            ge_files = lambda: [p for p in chip.glob("te_ge_1*") if not p.name.endswith(".temp")]  # noqa: E731
            wait_for(
                lambda: ge_files() and all(_mode(p) & 0o060 == 0o060 for p in ge_files()),
                ON_SIGHT_S,
                "GE's later files given back",
            )
            assert [oct(_mode(chip / v.name)) for v in victims] == ["0o640", "0o640"]
            back = _as_alice(
                users,
                " ; ".join(
                    f"mv {chip / v.name} {v} && echo 'alice was here' >> {v} && echo WROTE"
                    for v in victims
                ),
            )
            assert "WROTE" not in back.stdout, back.stdout + back.stderr
            for v in victims:
                assert _mode(v) == 0o640 and v.stat().st_uid != os.geteuid()
                assert v.read_text() == f"dave's {v.name}\n"
            assert daemon.proc.poll() is None, daemon.log()
        finally:
            daemon.stop()


def test_giving_a_folder_back_changes_only_the_caches_own_files_written_in_place(
    tmp_path: Path,
) -> None:
    """The reconciliation's pass over a folder (and a refused operation's names): root
    holds ``CAP_FOWNER``, as the unit's daemon does."""
    kc = tmp_path / "cache" / "kernel_cache"
    chip = kc / SOC
    outside = tmp_path / "team"
    for folder in (chip, kc, outside):
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o2770)
    old = time.time() - 3600

    def written(folder: Path, name: str, data: bytes = b"x", age_s: float = 0) -> Path:
        path = folder / name
        path.write_bytes(data)
        if age_s:
            os.utime(path, (time.time() - age_s,) * 2)
        path.chmod(0o640)
        return path

    ge_twin.copy_to_cache(b'{"binFileName": "te_a"}', chip / "te_a.json")  # GE's, 0640
    lock = written(chip, "te_a.lock", b"", 3600)  # GE re-chmods an old lock at each open
    ini = written(kc, "op_cache.ini", b"[op_compiler_cache]\n")
    kept = [
        written(chip, "plan.txt"),  # not a name of the cache
        written(kc, "notes.txt"),
        written(chip, "te_c.lock", b"not a lock"),  # locks are empty
    ]
    for name in ("te_b.json", "te_b.o"):  # renamed in from outside, written an hour ago
        os.utime(written(outside, name), (old, old))
        os.rename(outside / name, chip / name)
        kept.append(chip / name)
    assert groupmodes.give_back_folder(chip) == 2
    assert groupmodes.give_back_folder(kc, kernel_cache=True) == 1
    assert [_mode(p) for p in (chip / "te_a.json", lock, ini)] == [0o660] * 3
    assert [(p.name, _mode(p)) for p in kept] == [(p.name, 0o640) for p in kept]
    # a refused operation's names: the same rule
    assert not groupmodes.give_back_names(chip, [p.name for p in kept if p.parent == chip])
    assert [(p.name, _mode(p)) for p in kept] == [(p.name, 0o640) for p in kept]
