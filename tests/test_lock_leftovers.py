"""What gc and ls say about the files of a chip folder that are no entry's, and the
``<kernel>.lock`` files that removed entries leave.

* An entry removed under its lock (evicted, bad, GE-fatal) takes its lock file with it when
  the rule of ``files.reap_lock`` allows it at that moment — held, the json gone, the ctime at
  least an hour old and not group/other-writable (GE's ``TeCacheUtils::LockAndOpenCacheFile``,
  ``cache/te_cache_utils.cc``, ``chmod``s between its ``fopen`` and its ``F_SETLK``, ignores a
  failed ``chmod`` and never re-checks the inode after locking) — instead of staying for the
  next reclaim pass. A lock file's ctime cannot be set back, so "an hour old" is
  ``files.LOCK_REAP_AGE_S = 0`` here; a young one stays (GE twin), and so does one a member's
  GE may have open without being able to ``chmod`` it (real users).
* ``gc`` names the header manifests it reclaimed, ``ls`` the kinds of the bytes that are in
  no entry: a manifest's bytes were labelled "locks, temps, orphans" (``ls``) and left
  unnamed beside "0 lock files" (``gc``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from cachemgr.eviction import fatal, files, gc_chip
from cachemgr.storage.locks import FcntlLock
from tests import ge_twin
from tests.conftest import SOC, run_cli
from tests.test_direct import write_scale_project
from tests.test_eviction import HOUR, MIB, ge_users_lock, make_entry
from tests.users_util import Runtime, Users, run_as, run_python_as


def _entries_with_locks(chip: Path, n: int) -> None:
    """``n`` entries of 1 MiB accessed ``n`` h down to 1 h ago, each with its lock file as a
    GE process of another user leaves it (``test_eviction.ge_users_lock``)."""
    now = time.time()
    for i in range(n):
        make_entry(chip, f"te_k_{i:02d}", MIB, now - n * HOUR + i * HOUR)
        ge_users_lock(chip / f"te_k_{i:02d}.lock")


def test_an_evicted_entrys_old_lock_file_goes_in_the_same_run(
    chip: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _entries_with_locks(chip, 12)
    monkeypatch.setattr(files, "LOCK_REAP_AGE_S", 0)  # every lock file "an hour old"
    report = gc_chip(chip, 10, 50)
    gone = {f"te_k_{i:02d}" for i in range(7)}
    assert set(report.evicted) == gone
    locks = {p.stem for p in chip.glob("te_k_*.lock")}
    assert locks == {f"te_k_{i:02d}" for i in range(7, 12)}, "evicted entries' locks left"
    assert report.bytes_after == 5 * MIB


def test_a_young_lock_file_of_an_evicted_entry_stays(chip: Path) -> None:
    """GE's twin locked these entries' files just now (``LockAndOpenCacheFile``: the ctime
    is now): a GE process may be between its ``fopen`` and its ``F_SETLK``."""
    for i in range(4):
        ge_twin.write_entry(chip, f"te_k_{i}", size=4096)
        for name in (f"te_k_{i}.json", f"te_k_{i}.o"):
            t = time.time() - 2 * HOUR
            os.utime(chip / name, (t, t))
    report = gc_chip(chip, 1, 1, 0, force_ratio=True)
    assert report.evicted and all((chip / f"{k}.lock").exists() for k in report.evicted)


def test_a_bad_entrys_old_lock_file_goes_with_it(
    chip: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _entries_with_locks(chip, 1)
    (chip / "te_k_00.o").unlink()  # its json names a binary that is not there: bad
    monkeypatch.setattr(files, "LOCK_REAP_AGE_S", 0)
    report = gc_chip(chip, -1, 50)
    assert report.reclaimed.bad_entries == 1
    assert not (chip / "te_k_00.lock").exists()


def _compiled_with_header(tmp_path: Path, env: dict[str, str]) -> Path:
    """A kernel with a header compiled into ``<tmp>/cache`` by the CLI: an entry and the
    header manifest beside it. Returns the chip folder."""
    project = tmp_path / "proj"
    write_scale_project(project)
    cache = str(tmp_path / "cache")
    out = run_cli("compile", "--cache-dir", cache, "req.json", env=env, cwd=project)
    assert out.returncode == 0 and out.stdout.startswith("compiled"), out.stderr
    chip = tmp_path / "cache" / "kernel_cache" / SOC
    assert len(list(chip.glob("*.manifest"))) == 1, sorted(p.name for p in chip.iterdir())
    return chip


def test_ls_names_header_manifest_bytes_as_such(tmp_path: Path, clean_env) -> None:
    chip = _compiled_with_header(tmp_path, clean_env)
    (manifest,) = chip.glob("*.manifest")
    out = run_cli("ls", "--bytes", "--cache-dir", str(tmp_path / "cache"), env=clean_env)
    assert out.returncode == 0, out.stderr
    total = out.stderr.strip().splitlines()[-2]
    size = manifest.stat().st_size
    assert total.endswith(f"({size} B not in entries: header manifests)"), total


def test_gc_names_the_header_manifests_it_reclaims(tmp_path: Path, clean_env) -> None:
    chip = _compiled_with_header(tmp_path, clean_env)
    (manifest,) = chip.glob("*.manifest")
    size = manifest.stat().st_size
    for part in chip.glob("te_scale_*"):  # GE's eviction: json and binary, never the rest
        if part.suffix in (".json", ".o"):
            part.unlink()
    out = run_cli("gc", "--cache-dir", str(tmp_path / "cache"), env=clean_env)
    assert out.returncode == 0, out.stderr
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith(f"{SOC}:")]
    assert "0 lock files, 1 header manifest," in line and f"({size} B)" in line, line
    assert not list(chip.glob("*.manifest"))


def test_a_ge_fatal_entrys_old_lock_file_goes_with_it(
    chip: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry GE wrote (its twin: the lock file GE's own) whose json makes GE abort
    (``sha256`` a number: ``TeCacheManager::VerifyBinFileSha256`` reads it as a string),
    removed as the daemon removes it on sight (``fatal.remove_if_fatal``: no reclaim pass
    follows that would reap the lock file)."""
    assert ge_twin.write_entry(chip, "te_abort_0").files
    ge_users_lock(chip / "te_abort_0.lock")
    path = chip / "te_abort_0.json"
    data = json.loads(path.read_bytes())
    data["sha256"] = 12345
    ge_twin.copy_to_cache(json.dumps(data).encode(), path)
    monkeypatch.setattr(files, "LOCK_REAP_AGE_S", 0)
    done = fatal.remove_if_fatal(chip, "te_abort_0")
    assert done.fatal is not None and done.removed
    assert not list(chip.glob("te_abort_0*")), sorted(p.name for p in chip.iterdir())


#: bob's gc of one chip folder with every lock file "an hour old"; prints its report's
#: evicted names and denied lines.
STICKY_GC = """
import json, sys
from cachemgr.eviction import files, gc_chip
files.LOCK_REAP_AGE_S = 0
r = gc_chip(sys.argv[1], 1, 0, 0, force_ratio=True)
print(json.dumps({"evicted": r.evicted, "denied": r.denied}))
"""


def test_a_lock_file_it_may_not_unlink_stays_and_the_eviction_is_not_denied(
    users: Users, other_runtime: Runtime
) -> None:
    """A sticky group folder: bob may remove his entry but not alice's lock file of it (a GE
    process of hers took it). The entry is evicted, reported so, and the lock file stays."""
    chip = users.base / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    for folder in (chip.parent, chip):
        shutil.chown(folder, "root", users.group)
        folder.chmod(0o3770)  # setgid, sticky
    make_entry(chip, "te_k_00", 4096, time.time() - 2 * HOUR)
    (chip / "te_k_00.lock").write_bytes(b"")
    for name in ("te_k_00.json", "te_k_00.o"):
        shutil.chown(chip / name, users.bob, users.group)
    shutil.chown(chip / "te_k_00.lock", users.alice, users.group)
    for path in chip.iterdir():
        path.chmod(0o660)
    out = run_python_as(users, other_runtime, users.bob, "-c", STICKY_GC, str(chip))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report == {"evicted": ["te_k_00"], "denied": []}, report
    assert (chip / "te_k_00.lock").exists() and not (chip / "te_k_00.json").exists()


#: GE's ``TeCacheUtils::LockAndOpenCacheFile`` (``cache/te_cache_utils.cc``) in a member's
#: process: ``fopen(a+)``, ``chmod(0640)`` whose failure GE only logs, then — once told to go
#: on (stdin), as a process preempted between the two — ``F_SETLK`` without re-checking the
#: inode. Prints whether the chmod worked, then the lock's result and the locked inode's links.
GE_LOCK_PAUSED = """
import fcntl, os, sys
f = open(sys.argv[1], "a+")
try:
    os.chmod(sys.argv[1], 0o640)
    print("chmod ok", flush=True)
except OSError:
    print("chmod failed", flush=True)
sys.stdin.readline()
fcntl.lockf(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
print("locked", os.fstat(f.fileno()).st_nlink, flush=True)
sys.stdin.readline()
"""


def _members_chip(users: Users) -> Path:
    """A setgid group chip folder holding entry ``te_k_00``'s lock file as cachemgr makes it
    there: alice's, ``0660`` (its json already removed: the entry evicted)."""
    chip = users.base / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    for folder in (chip.parent, chip):
        shutil.chown(folder, "root", users.group)
        folder.chmod(0o2770)
    lock = chip / "te_k_00.lock"
    lock.write_bytes(b"")
    shutil.chown(lock, users.alice, users.group)
    lock.chmod(0o660)
    return chip


@pytest.mark.parametrize("remover", ["release_removed", "reap_lock"])
def test_a_member_ge_between_fopen_and_lock_keeps_the_lock_file_it_could_not_chmod(
    users: Users, other_runtime: Runtime, monkeypatch: pytest.MonkeyPatch, remover: str
) -> None:
    """Bob's GE opens alice's ``0660`` lock file, its ``chmod`` fails (``EPERM``: the ctime is
    not refreshed) and it is preempted; cachemgr removes the entry and releases its lock
    (``release_removed``) or the reclaim pass finds the lock file dead (``reap_lock``), with
    every lock file "an hour old". The lock file must stay: were it unlinked, bob would lock
    the orphan inode while the next writer locks a new file — two writers in one entry."""
    chip = _members_chip(users)
    monkeypatch.setattr(files, "LOCK_REAP_AGE_S", 0)
    bob = subprocess.Popen(
        [other_runtime.python, "-c", GE_LOCK_PAUSED, str(chip / "te_k_00.lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        **run_as(users.bob, users),  # type: ignore[arg-type]
    )
    try:
        assert bob.stdout is not None and bob.stdin is not None
        assert bob.stdout.readline().strip() == "chmod failed"  # GE goes on all the same
        chip_fd = files.open_dir(chip)
        try:
            if remover == "release_removed":
                lock = FcntlLock(Path("te_k_00.lock"), chip_fd)
                assert lock.acquire(blocking=False)
                files.release_removed(lock, "te_k_00.json", chip_fd)
            else:
                assert not files.reap_lock(
                    chip / "te_k_00.lock", chip / "te_k_00.json", chip_fd=chip_fd
                )
            assert (chip / "te_k_00.lock").exists(), "a lock file a member's GE has open went"
            bob.stdin.write("go\n")
            bob.stdin.flush()
            assert bob.stdout.readline().split() == ["locked", "1"]
            writer = FcntlLock(Path("te_k_00.lock"), chip_fd)
            assert not writer.acquire(blocking=False), "two writers hold te_k_00's lock"
        finally:
            os.close(chip_fd)
    finally:
        bob.kill()
        bob.wait()


def test_an_old_lock_file_only_its_owner_may_write_still_goes(chip: Path) -> None:
    """GE's own ``0640`` lock file (its ``chmod`` worked, so any open since set the ctime) is
    reaped once it is old and unheld; a group- or other-writable one never is."""
    for name, mode in (("te_a.lock", 0o640), ("te_b.lock", 0o660), ("te_c.lock", 0o602)):
        ge_users_lock(chip / name)
        (chip / name).chmod(mode)
    chip_fd = files.open_dir(chip)
    try:
        done = {
            name: files.reap_lock(chip / name, chip / "te_x.json", 0, chip_fd=chip_fd)
            for name in ("te_a.lock", "te_b.lock", "te_c.lock")
        }
    finally:
        os.close(chip_fd)
    assert done == {"te_a.lock": True, "te_b.lock": False, "te_c.lock": False}
