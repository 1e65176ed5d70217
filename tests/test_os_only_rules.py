"""The settings/report rules a start-up fast path shares with the full CLI live in leaf
modules on ``os`` alone (docs/performance.md: ``pathlib``, ``dataclasses``, ``typing``,
``logging``, ``json`` and ``datetime`` each cost start-up): each is imported by a fresh
interpreter here and must bring nothing else, and each gives the same answers as the full
modules built on it, on this host's real mounts and real folders."""

from __future__ import annotations

import glob
import json
import os
import random
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

import pytest

from cachemgr import plainjson
from cachemgr.config import core, toolkit
from cachemgr.config.ini import OpCacheIni
from cachemgr.eviction.usage import chip_stats
from cachemgr.storage import atimes, chipcount, fsprobe, mountrule
from cachemgr.storage.entry import scan_chip

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
    "cachemgr.config",
    "_json",  # json's C accelerator (no import of its own): plainjson's strings
}
#: The os-only leaves.
LEAVES = [
    "cachemgr.storage.mountrule",
    "cachemgr.storage.chipcount",
    "cachemgr.stats_view",
    "cachemgr.words",
    "cachemgr.config.core",
    "cachemgr.sockpath",
    "cachemgr.plainjson",
    "cachemgr.config.reportorder",
    "cachemgr.config.defaultrows",
    "cachemgr.storage.exposure",
    "cachemgr.config.toolkit",
]


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
    modules and the other leaves (no pathlib, re, dataclasses, typing, logging, json,
    datetime, enum)."""
    extra = newly_imported(module) - LEAF_MAY_IMPORT - set(LEAVES)
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


def test_iso_is_datetimes_to_the_second() -> None:
    """chipcount.iso words an access time as datetime does (its rounding to microseconds
    included: ``.9999996`` s is the next second), for real file times and edge values."""
    rng = random.Random(25)
    edges = [0, 1, 999_999_499, 999_999_500, 999_999_501, 1_999_999_999, 10**18 + 999_999_600]
    values = edges + [rng.randrange(0, 4 * 10**18) for _ in range(2000)]
    values += [os.stat(p).st_atime_ns for p in Path("/usr/bin").iterdir() if p.is_file()][:500]
    for ns in values:
        want = datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="seconds")
        assert chipcount.iso(ns) == want, ns
    assert chipcount.iso(None) is None


def test_chip_count_is_the_scan_and_the_stats_row(tmp_path: Path) -> None:
    """The os-only count of a real chip folder (entries with parts, a temp, a lock, a file
    with two links, a link, a sub-folder) gives entry.scan_chip's figures, and stats' row of
    it (eviction.usage) is built from it."""
    chip = tmp_path / "kernel_cache" / "Ascend910B"
    chip.mkdir(parents=True)
    for i in range(4):
        (chip / f"te_k{i}.json").write_text("{}")
        (chip / f"te_k{i}.o").write_bytes(os.urandom(100 + i))
        os.utime(chip / f"te_k{i}.json", ns=(1_000_000_000_000_000_000 + i, 10**18))
    (chip / "te_k1_mix_aic.json").write_text("{}")  # a part of te_k1: not an entry
    (chip / "te_lone_mix_aiv.json").write_text("{}")  # no te_lone.json: an entry
    (chip / "te_k2.o.host.1.abcd1234.temp").write_bytes(b"half")
    (chip / "te_k3.lock").write_bytes(b"")
    os.link(chip / "te_k3.o", tmp_path / "elsewhere")  # two links: counted by neither
    (chip / "te_link.json").symlink_to(chip / "te_k0.json")
    (chip / "sub").mkdir()
    fd = os.open(chip, os.O_RDONLY | os.O_DIRECTORY)
    try:
        entries, used, oldest, newest = chipcount.usage_stream(fd)
    finally:
        os.close(fd)
    scan = scan_chip(chip)
    times = [g.atime_ns for g in scan.entries.values()]
    assert (entries, used) == (len(scan.entries), scan.used_bytes) == (5, used)
    assert (oldest, newest) == (min(times), max(times))
    from cachemgr.config import options

    settings = options.resolve(cli={"op_compiler_cache_dir": str(tmp_path)}, writable=False)
    row = chip_stats(chip, settings)
    assert (row["entries"], row["bytes"]) == (entries, used)
    assert (row["oldest_access"], row["newest_access"]) == (
        chipcount.iso(oldest),
        chipcount.iso(newest),
    )


#: Pieces of op_cache.ini lines, plain and not, to build files of.
INI_PIECES = [
    "[op_compiler_cache]",
    "[other]",
    "adk_version=7.0.0",
    "ops_version=8.0.RC1",
    "adk_version=",
    "ops_version= 7",
    "max_op_cache_size=500",
    "max_op_cache_size=-1",
    "max_op_cache_size=0",
    "max_op_cache_size=05",
    "max_op_cache_size=2147483648",
    "remain_cache_size_ratio=80",
    "remain_cache_size_ratio=101",
    "remain_cache_size_ratio=+8",
    "Max_op_cache_size=5",
    "# comment",
    "",
    "key=value",
]


def test_plain_ge_ini_is_a_subset_of_what_the_strict_reader_takes(tmp_path: Path) -> None:
    """Every op_cache.ini the os-only form check takes (config.core.plain_ge_ini) is one the
    strict reader (config.ini.OpCacheIni) reads without a problem, GE uses, and with the same
    limits and stamps; GE's own first file (stamps only) and an operator's limits are taken."""
    rng = random.Random(2025)
    files = [
        b"[op_compiler_cache]\nadk_version=8.0.RC1\nops_version=8.0.RC1\n",
        b"[op_compiler_cache]\nadk_version=7\nops_version=7\nmax_op_cache_size=-1\n"
        b"remain_cache_size_ratio=100\n",
    ]
    for _ in range(3000):
        stamps = ["adk_version=7.0.0", "ops_version=8.0.RC1"] if rng.random() < 0.7 else []
        body = stamps + rng.sample(INI_PIECES, rng.randrange(0, 4))
        rng.shuffle(body)
        lines = (["[op_compiler_cache]"] if rng.random() < 0.8 else []) + body
        end = rng.choice(["\n", "\n", "\r\n"])
        files.append((end.join(lines) + (end if rng.random() < 0.9 else "")).encode())
    taken = 0
    for data in files:
        values = core.plain_ge_ini(data)
        if values is None:
            continue
        taken += 1
        ini = OpCacheIni(tmp_path / "op_cache.ini", data)
        assert ini.problems == [] and ini.ge.used, data
        assert (ini.adk_version, ini.ops_version) == (values["adk_version"], values["ops_version"])
        limits = ini.limits()
        if "max_op_cache_size" in values:
            assert limits is not None
            assert (limits.max_op_cache_size, limits.remain_cache_size_ratio) == (
                int(values["max_op_cache_size"]),
                int(values["remain_cache_size_ratio"]),
            )
        else:
            assert limits is None
    assert taken >= 50  # the check took files of every kind above, not none
    assert core.plain_ge_ini(files[0]) is not None and core.plain_ge_ini(files[1]) is not None


def _plain_value(rng: random.Random, depth: int = 0) -> object:
    """A random value of what ``config --json`` holds: dicts, lists, strings of any
    characters (controls, quotes, Chinese, surrogates, separators), ints, floats, bools,
    None."""
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        alphabet = 'ab "\\/\n\t\x00\x1b\x7f\u2028é缓存\udcff\U0001f600'
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(6)))
    if kind == 1:
        return rng.choice([0, -1, 500, 2**31 - 1, 10**30, True, False])
    if kind == 2:
        return rng.choice([0.0, -0.0, 1800.0, 1e-7, 1.5e300, float("inf"), -float("inf")])
    if kind == 3:
        return None
    if kind == 4:
        return rng.choice(["", "auto", "/tmp/缓存/kernel_cache"])
    if kind == 5:
        return [_plain_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 6:
        return tuple(_plain_value(rng, depth + 1) for _ in range(rng.randrange(3)))
    return {
        str(_plain_value(rng, 3)): _plain_value(rng, depth + 1) for _ in range(rng.randrange(4))
    }


def test_plain_json_is_json_dumps() -> None:
    """``plainjson.dumps`` writes what ``json.dumps`` writes — indented or not, ASCII or
    not — on generated values of the types ``config --json`` holds (NaN included), and
    refuses any other type rather than guess."""
    rng = random.Random(28)
    values = [_plain_value(rng) for _ in range(3000)] + [float("nan"), {"k": [float("nan")]}]
    for value in values:
        for indent in (None, 0, 2, 4):  # 4: a kernel json (storage.store)
            for ascii_only in (True, False):
                want = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
                assert plainjson.dumps(value, indent, ascii_only) == want, (value, indent)
    for other in (Path("/x"), {1: "a"}, {"a": {1.5}}, b"bytes"):
        with pytest.raises(TypeError):
            plainjson.dumps(other)


def test_toolkit_paths_are_spelt_as_pathlib_spells_them() -> None:
    """``toolkit.path_text`` is ``str(PurePosixPath(...))`` (the sources ``config`` shows
    read as they did on pathlib), on generated paths of slashes, dots and names."""
    rng = random.Random(2026)
    for _ in range(20000):
        text = "".join(
            rng.choice(["/", ".", "..", "a", "b.c", "//"]) for _ in range(rng.randrange(9))
        )
        assert toolkit.path_text(text) == str(PurePosixPath(text)), text


@pytest.mark.parametrize("home", ["HOME", "HOME/", "HOME/./", "HOME//x/..", ".", "sub"])
def test_toolkit_library_folders_are_globs(
    home: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where GE's library is looked for (``toolkit._library_dirs``) is what ``glob.glob`` of
    ``Path(home) / pattern`` finds, sorted, on a real tree: folders and links to folders
    ending ``-linux`` with and without ``lib64`` (a dangling ``lib64`` link counts, as for
    glob), a hidden one, a file and a dangling link of that ending, plain ``lib64``
    and ``compiler/lib64``."""
    base = tmp_path / "tk"
    for name in ("x86_64-linux", "aarch64-linux", ".hidden-linux", "-linux", "empty-linux"):
        (base / name).mkdir(parents=True)
    for name in ("x86_64-linux", "aarch64-linux", ".hidden-linux", "-linux"):
        (base / name / "lib64").mkdir()
    (base / "real").mkdir()
    (base / "real" / "lib64").symlink_to(base / "gone")
    (base / "linked-linux").symlink_to(base / "real")
    (base / "file-linux").write_text("")
    (base / "dangling-linux").symlink_to(base / "nowhere")
    (base / "lib64").mkdir()
    (base / "compiler").mkdir()
    (base / "sub" / "y-linux" / "lib64").mkdir(parents=True)
    monkeypatch.chdir(base)
    text = home.replace("HOME", str(base))
    for pattern in toolkit.GE_LIBRARY_DIRS:
        want = sorted(glob.glob(str(Path(text) / pattern)))
        assert toolkit._library_dirs(text, pattern) == want, pattern
