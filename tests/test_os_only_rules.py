"""The settings/report rules a start-up fast path shares with the full CLI live in leaf
modules on ``os`` alone (docs/performance.md: ``pathlib``, ``dataclasses``, ``typing``,
``logging``, ``json`` and ``datetime`` each cost start-up): each is imported by a fresh
interpreter here and must bring nothing else, and each gives the same answers as the full
modules built on it, on this host's real mounts and real folders."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cachemgr.storage import atimes, fsprobe, mountrule

#: What an os-only leaf may import besides itself: what ``site`` imports at every start-up
#: (``os`` and what it needs; run with ``-S`` here, so listed), ``time`` (built in) and
#: cachemgr's package ``__init__`` modules with their constants.
OS_LEVEL = {"__future__", "_collections_abc", "_stat", "genericpath", "os", "os.path"}
LEAF_MAY_IMPORT = {
    *OS_LEVEL,
    "posixpath",
    "stat",
    "time",
    "cachemgr",
    "cachemgr.constants",
    "cachemgr.storage",
}
#: The os-only leaves.
LEAVES = ["cachemgr.storage.mountrule"]


def newly_imported(module: str) -> set[str]:
    """The modules a fresh ``python -S`` imports for ``import module`` (beyond its own
    start-up)."""
    code = (
        "import sys; before = set(sys.modules); "
        f"import {module}; "
        "print('\\n'.join(sorted(set(sys.modules) - before)))"
    )
    root = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.run(
        [sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {root!r}); " + code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(proc.stdout.split())


@pytest.mark.parametrize("module", LEAVES)
def test_import_budget_of_os_only_leaves(module: str) -> None:
    """Import budget: an os-only leaf imports nothing but itself and cachemgr's package
    modules (no pathlib, re, dataclasses, typing, logging, json, datetime, enum)."""
    extra = newly_imported(module) - LEAF_MAY_IMPORT - {module}
    assert extra == set(), f"{module} imports {sorted(extra)}"


def findmnt(path: Path) -> tuple[str, str, tuple[str, ...]]:
    """util-linux's own answer: the mount point, type and options of the mount holding
    ``path``."""
    out = subprocess.run(
        ["findmnt", "-n", "-o", "TARGET,FSTYPE,OPTIONS", "-T", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[0], out[1], tuple(out[2].split(","))


@pytest.mark.parametrize("where", ["tmp", "proc", "dev_shm", "not_yet_made"])
def test_mount_rule_matches_findmnt_and_atimes(where: str, tmp_path: Path) -> None:
    """mountrule names the mount util-linux's findmnt names for a folder (a missing one by its
    nearest existing parent), and atimes (the full CLI's report) says what it says."""
    folder = {
        "tmp": tmp_path,
        "proc": Path("/proc/self"),
        "dev_shm": Path("/dev/shm"),
        "not_yet_made": tmp_path / "a" / "b" / "kernel_cache",
    }[where]
    if where == "dev_shm" and not folder.is_dir():
        pytest.skip("no /dev/shm here")
    text = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="surrogateescape")
    point, fstype, rule, lazytime = mountrule.folder_rule(str(folder), text)
    real_point, real_type, real_opts = findmnt(tmp_path if where == "not_yet_made" else folder)
    assert (point, fstype) == (real_point, real_type)
    assert rule == mountrule.rule_of(real_type, real_opts)
    assert lazytime == ("lazytime" in real_opts)
    full = atimes.cache_atimes(folder)
    assert (full.mount_point, full.fstype, full.rule) == (point, fstype, rule)
    assert full.line() == mountrule.line(folder.name, fstype, rule, lazytime)
    mount = fsprobe.mount_of(folder, fsprobe.parse_mountinfo(text))
    assert mount is not None and mount.mount_point == point


def test_mount_rule_of_escaped_and_stacked_mount_points(tmp_path: Path) -> None:
    """A mount point with a space (``\\040`` in mountinfo) and two mounts stacked on one
    point: the folder is on the last one mounted there, with its rule and words."""
    inside = tmp_path / "with space" / "kernel_cache"
    inside.mkdir(parents=True)
    top = str(tmp_path / "with space").replace(" ", "\\040")
    text = (
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        f"30 22 0:50 / {top} rw,relatime - tmpfs tmpfs rw\n"
        f"31 30 0:51 / {top} rw,noatime - xfs /dev/sdb1 rw,lazytime\n"
        "garbage line\n"
    )
    assert mountrule.folder_rule(str(inside), text) == (
        str(tmp_path / "with space"),
        "xfs",
        mountrule.NOATIME,
        True,
    )
    assert mountrule.line("kernel_cache", "xfs", mountrule.NOATIME, True) == (
        "kernel_cache on xfs noatime,lazytime: " + mountrule.GE_EFFECT[mountrule.NOATIME]
    )
    assert mountrule.folder_rule(str(inside), "") == ("", "", mountrule.UNKNOWN, False)
    assert os.path.isdir(inside)
