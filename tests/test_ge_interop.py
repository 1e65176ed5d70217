# ruff: noqa: E501  (the table of odd inis reads best one case per line)
"""cachemgr next to CANN GE on one kernel cache: GE's rules for inis, stamps,
entries, pre-build jsons, headers and lock files. Every GE-format entry here is written by
the GE twin (``tests/ge_twin.py``), so nothing needs outside data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cachemgr.cli import human
from cachemgr.config import layout
from cachemgr.config.ini import IniLimits, OpCacheIni
from cachemgr.config.versions import VersionStatus, installed_versions, sync_toolkit
from cachemgr.eviction import files, gc_chip, purge_chip
from cachemgr.storage import entry, fsutil
from cachemgr.storage.store import Store
from tests import ge_twin
from tests.conftest import ROOT, SOC, run_cli

HOUR = 3600
MIB = 1 << 20
REQUESTS = ROOT / "examples" / "requests"


def fake_toolkit(base: Path, adk: str = "8.0.RC1", ops: str = "8.0.RC1", kind: str = "old") -> dict:
    """A CANN install without binaries: GE's library file and the ``version.info`` files where
    GE looks (``te_config_info.cc``). ``old``: ``ascend-toolkit/<v>/compiler/lib64`` with a
    ``latest`` link; ``new``: ``cann/<arch>-linux/lib64``. Returns the env a CANN host sets."""
    if kind == "old":
        real = base / "ascend-toolkit" / adk
        (real / "compiler" / "lib64").mkdir(parents=True)
        (real / "compiler" / "lib64" / "libte_fusion.so").write_bytes(b"\x7fELF")
        (real / "compiler" / "version.info").write_text(f"Version={adk}\n")
        (real / "version.info").write_text("Version=decoy-home\n")
        (base / "ascend-toolkit" / "latest").symlink_to(real)
        home = base / "ascend-toolkit" / "latest"
    else:
        home = base / "cann"
        arch = home / "x86_64-linux"
        (arch / "lib64").mkdir(parents=True)
        (arch / "lib64" / "libop_compile_adapter.so").write_bytes(b"\x7fELF")
        (arch / "version.info").write_text(f"# CANN\nVersion={adk}\n")
        (home / "version.info").write_text("Version=decoy-home\n")
    (home / "opp").mkdir(exist_ok=True)
    (home / "opp" / "version.info").write_text(f"Version={ops}\nversion_dir=x\n")
    return {"ASCEND_HOME_PATH": str(home), "ASCEND_OPP_PATH": str(home / "opp")}


def set_old(path: Path, age_s: float) -> None:
    t = time.time() - age_s
    os.utime(path, (t, t))


def gc_json(root: Path, env: dict[str, str], *args: str) -> dict:
    proc = run_cli("gc", "--json", "--cache-dir", str(root), *args, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


# --- the first gc on a CANN host keeps a fresh cache -----------------------------


def test_first_gc_on_a_cann_host_keeps_fresh_kernels_and_ge_keeps_them_too(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**clean_env, **fake_toolkit(tmp_path / "Ascend")}
    root = tmp_path / "root"
    reqs = [str(REQUESTS / "add_c.json"), str(REQUESTS / "softmax_c.json")]
    proc = run_cli("compile", *reqs, "--cache-dir", str(root), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kc = root / "kernel_cache"
    chip = kc / SOC
    before = sorted(p.name for p in chip.glob("*.json"))
    assert len(before) == 2
    # the first publish created the ini with the installed stamps, as GE's init does
    assert OpCacheIni.load(kc / "op_cache.ini").ge.stamps == ("8.0.RC1", "8.0.RC1")
    text = run_cli("gc", "--ratio", "80", "--cache-dir", str(root), env=env)
    assert text.returncode == 0 and "cache stamps match" in text.stdout, text.stdout
    assert sorted(p.name for p in chip.glob("*.json")) == before
    # and the next CANN process (GE's DelCachedFiles) keeps them as well
    assert ge_twin.init(kc, SOC, "8.0.RC1", "8.0.RC1") == "kept"
    assert sorted(p.name for p in chip.glob("*.json")) == before


def test_an_ini_without_stamps_never_causes_a_purge(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**clean_env, **fake_toolkit(tmp_path / "Ascend")}
    root = tmp_path / "root"
    chip = root / "kernel_cache" / SOC
    for i in range(3):
        ge_twin.write_entry(chip, f"te_add_{i}")
    # hand-written as the CANN docs allow, or caught in the middle of GE's rewrite
    for text in ("[op_compiler_cache]\nmax_op_cache_size=500\nremain_cache_size_ratio=80\n", ""):
        (root / "kernel_cache" / "op_cache.ini").write_text(text)
        report = gc_json(root, env)
        assert report["toolkit"]["status"] == "unstamped" and not report["toolkit"]["purged"]
        assert len(list(chip.glob("*.json"))) == 3


def test_a_missing_ini_purges_says_why_and_how_many_then_stamps(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**clean_env, **fake_toolkit(tmp_path / "Ascend")}
    root = tmp_path / "root"
    for i in range(3):
        ge_twin.write_entry(root / "kernel_cache" / SOC, f"te_add_{i}")
    ge_twin.write_entry(root / "kernel_cache" / "Ascend310P3", "te_mul_0")
    text = run_cli("gc", "--dry-run", "--cache-dir", str(root), env=env)
    assert "would purge 4 entries in 2 chip folders" in text.stdout
    report = gc_json(root, env)
    tk = report["toolkit"]
    assert (tk["status"], tk["reason"], tk["purged_entries"]) == ("no_ini", "no_ini", 4)
    assert {Path(p["chip_dir"]).name: p["entries"] for p in tk["purged"]} == {
        SOC: 3,
        "Ascend310P3": 1,
    }
    assert OpCacheIni.load(root / "kernel_cache" / "op_cache.ini").ge.stamps == (
        "8.0.RC1",
        "8.0.RC1",
    )
    for i in range(2):
        ge_twin.write_entry(root / "kernel_cache" / SOC, f"te_new_{i}")
    ge_twin.write_entry(root / "kernel_cache" / SOC, "te_new_0")
    text = run_cli("gc", "--cache-dir", str(root), env=env)
    assert (
        "cache stamps match" in text.stdout
        and len(list((root / "kernel_cache" / SOC).glob("*.json"))) == 2
    )


def test_a_purge_counts_in_the_chip_and_total_lines(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    """12 entries purged (reason no_ini) are in the chip folder's line, the total line and
    ``--json`` (per chip folder and ``totals``), not ``0 B -> 0 B``, ``freed 0 B``."""
    env = {**clean_env, **fake_toolkit(tmp_path / "Ascend")}
    root = tmp_path / "root"
    chip = root / "kernel_cache" / SOC
    for i in range(12):
        ge_twin.write_entry(chip, f"te_add_{i:02d}", size=7000)
    size = ge_twin.directory_size(chip)  # every file: jsons, binaries, lock files
    text = run_cli("gc", "--cache-dir", str(root), env=env)
    assert text.returncode == 0, text.stdout + text.stderr
    line = next(ln for ln in text.stdout.splitlines() if ln.startswith(f"{SOC}: ") and "->" in ln)
    assert line.startswith(f"{SOC}: {human.size(size)} -> 0 B "), line
    assert "purged 12 entries" in line and "reason no_ini" in line, line
    total = text.stdout.splitlines()[-1]
    assert total.startswith(f"total: freed {human.size(size)} in 1 chip folder; "), total
    assert total.endswith("purged 12 entries, evicted 0 entries"), total
    for i in range(12):  # again, for --json
        ge_twin.write_entry(chip, f"te_add_{i:02d}", size=7000)
    (root / "kernel_cache" / "op_cache.ini").unlink()
    report = gc_json(root, env)
    folder = report["chip_folders"][SOC]
    purged = report["toolkit"]["purged"][0]
    assert (folder["purged_entries"], folder["purged_bytes"]) == (12, purged["bytes"])
    assert folder["purge_reason"] == "no_ini" and purged["bytes"] >= 12 * 7000
    totals = report["totals"]
    assert (totals["purged_entries"], totals["purged_bytes"]) == (12, purged["bytes"])
    assert totals["freed_bytes"] >= purged["bytes"] and totals["evicted_entries"] == 0


def test_stamp_lines_ge_cannot_rewrite_are_rewritten_its_way_and_said(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    """Stamps GE reads (trimmed) but cannot rewrite (``GetNewVersionString`` compares the text
    before ``=``): after an upgrade GE purges on every start. cachemgr's gc rewrites them as
    GE writes them, keeps the entries, says so in one log line and in its report."""
    spaced = (
        "[op_compiler_cache]\nadk_version = 8.0.RC1\n  ops_version=8.0.RC1\n"
        "max_op_cache_size = 500\nremain_cache_size_ratio=80\n"
    )
    # GE alone: every start after an upgrade purges again, its restamp never matches
    kc = tmp_path / "ge" / "kernel_cache"
    kc.mkdir(parents=True)
    (kc / "op_cache.ini").write_text(spaced)
    for _ in range(2):
        ge_twin.write_entry(kc / SOC, "te_add_0")
        assert ge_twin.init(kc, SOC, "8.0.RC2", "8.0.RC2") == "purged-upgrade"
    # cachemgr first (the installed toolkit matches the stamps): rewritten, entries kept
    env = {**clean_env, **fake_toolkit(tmp_path / "Ascend")}
    root = tmp_path / "root"
    ini = root / "kernel_cache" / "op_cache.ini"
    ge_twin.write_entry(root / "kernel_cache" / SOC, "te_add_0")
    ini.write_text(spaced)
    dry = gc_json(root, env, "--dry-run")
    assert dry["toolkit"]["stamp_lines_rewritten"] == [2, 3] and ini.read_text() == spaced
    proc = run_cli("-v", "gc", "--cache-dir", str(root), env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"{ini}: rewrote stamp lines 2, 3 the way GE writes them" in proc.stdout
    logged = [ln for ln in proc.stderr.splitlines() if "rewrote stamp lines 2, 3" in ln]
    assert len(logged) == 1 and str(ini) in logged[0], proc.stderr
    assert ini.read_text() == spaced.replace("adk_version = ", "adk_version=").replace(
        "  ops_version", "ops_version"
    )  # the limits' lines keep their spacing
    assert (root / "kernel_cache" / SOC / "te_add_0.json").exists()
    assert gc_json(root, env)["toolkit"]["stamp_lines_rewritten"] == []  # nothing left to do
    # now GE's own restamp after an upgrade works: one purge, then the cache is kept
    kc = root / "kernel_cache"
    assert ge_twin.init(kc, SOC, "8.0.RC2", "8.0.RC2") == "purged-upgrade"
    ge_twin.write_entry(kc / SOC, "te_add_0")
    assert ge_twin.init(kc, SOC, "8.0.RC2", "8.0.RC2") == "kept"


def test_the_ini_is_read_again_under_the_eviction_lock(tmp_path: Path) -> None:
    kc = tmp_path / "kernel_cache"
    for i in range(3):
        ge_twin.write_entry(kc / SOC, f"te_add_{i}")
    (kc / "op_cache.ini").write_text("[op_compiler_cache]\nadk_version=7\nops_version=7\n")
    installed = installed_versions(fake_toolkit(tmp_path / "Ascend", "8", "8"))

    def purge_after_ge_restamped(chip: Path, still_needed: object) -> object:
        # another process (GE's UpdateOpCacheIniFile) restamped the ini before we got the lock
        (kc / "op_cache.ini").write_text("[op_compiler_cache]\nadk_version=8\nops_version=8\n")
        return purge_chip(chip, still_needed=still_needed)  # type: ignore[arg-type]

    check = sync_toolkit(layout.CacheLayout(kc), installed, purge_after_ge_restamped)
    assert check.status is VersionStatus.UPGRADED
    assert check.purged[0].to_json()["skipped"] and check.purged_entries == 0
    assert len(list((kc / SOC).glob("*.json"))) == 3 and not check.restamped


# --- the same limits as GE on every ini ------------------------------------------

STAMPS = "adk_version=1\nops_version=2\n"
SEC = "[op_compiler_cache]\n"

#: (ini text, the limits GE computes — derived by hand from te_cache_space_manager.cc
#: LoadIniFile / GetCacheInitFileCfg / UpdateOpCacheSizeCfg — or None: GE falls back)
ODD_INIS = {
    "unit suffixes": (SEC + STAMPS + "max_op_cache_size=2000MB\nremain_cache_size_ratio=80%\n", (2000, 80)),
    "spaces": ("[ op_compiler_cache ]\n adk_version = 1 \n\tops_version=\t2\nmax_op_cache_size = 300 \nremain_cache_size_ratio= 50\n", (300, 50)),
    "tabs around =": (SEC + STAMPS + "max_op_cache_size\t=\t700\nremain_cache_size_ratio\t=\t60\n", (700, 60)),
    "crlf": ((SEC + STAMPS + "max_op_cache_size=100\nremain_cache_size_ratio=50\n").replace("\n", "\r\n"), (100, 50)),
    "duplicate keys": (SEC + STAMPS + "max_op_cache_size=100\nremain_cache_size_ratio=50\nmax_op_cache_size=200\n", (200, 50)),
    "section after": (SEC + STAMPS + "max_op_cache_size=100\nremain_cache_size_ratio=50\n[zzz]\nfoo=1\n", (100, 50)),
    "section sorting first": ("[abc]\nfoo=1\n" + SEC + STAMPS + "max_op_cache_size=100\nremain_cache_size_ratio=50\n", None),
    "empty section sorting first": ("[abc]\n" + SEC + STAMPS + "max_op_cache_size=100\nremain_cache_size_ratio=50\n", (100, 50)),
    "comments": (SEC + STAMPS + "# max_op_cache_size=1\n; remain_cache_size_ratio=1\nmax_op_cache_size=100 # MB\nremain_cache_size_ratio=50\n", (100, 50)),
    "indented comment": (SEC + STAMPS + " # x\nmax_op_cache_size=100\nremain_cache_size_ratio=50\n", (100, 50)),
    "empty value": (SEC + STAMPS + "max_op_cache_size=\nremain_cache_size_ratio=50\n", None),
    "no stamps": (SEC + "max_op_cache_size=100\nremain_cache_size_ratio=50\n", None),
    "one stamp empty": (SEC + "adk_version=1\nops_version=\nmax_op_cache_size=100\nremain_cache_size_ratio=50\n", None),
    "never evict": (SEC + STAMPS + "max_op_cache_size=-1\nremain_cache_size_ratio=50\n", (-1, 50)),
    "zero max": (SEC + STAMPS + "max_op_cache_size=0\nremain_cache_size_ratio=50\n", None),
    "minus two": (SEC + STAMPS + "max_op_cache_size=-2\nremain_cache_size_ratio=50\n", None),
    "ratio 0": (SEC + STAMPS + "max_op_cache_size=100\nremain_cache_size_ratio=0\n", None),
    "ratio 101": (SEC + STAMPS + "max_op_cache_size=100\nremain_cache_size_ratio=101\n", None),
    "hex": (SEC + STAMPS + "max_op_cache_size=0x10\nremain_cache_size_ratio=50\n", None),
    "exponent": (SEC + STAMPS + "max_op_cache_size=1e3\nremain_cache_size_ratio=50\n", (1, 50)),
    "plus sign": (SEC + STAMPS + "max_op_cache_size=+64\nremain_cache_size_ratio=+10\n", (64, 10)),
    "out of int": (SEC + STAMPS + "max_op_cache_size=99999999999\nremain_cache_size_ratio=50\n", None),
    "words": (SEC + STAMPS + "max_op_cache_size=lots\nremain_cache_size_ratio=50\n", None),
    "keys before the header": ("max_op_cache_size=10\n" + SEC + STAMPS + "remain_cache_size_ratio=50\n", (10, 50)),
    "header without ]": (SEC + STAMPS + "max_op_cache_size=100\n[broken\nremain_cache_size_ratio=50\n", None),
    "bom": ("\ufeff" + SEC + STAMPS + "max_op_cache_size=100\nremain_cache_size_ratio=50\n", None),
    "upper-case keys": (SEC + STAMPS + "MAX_OP_CACHE_SIZE=100\nremain_cache_size_ratio=50\n", None),
    "no final newline": (SEC + STAMPS + "max_op_cache_size=100\nremain_cache_size_ratio=50", (100, 50)),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ODD_INIS))
def test_cachemgr_computes_the_limits_ge_computes(tmp_path: Path, case: str) -> None:
    text, ge_limits = ODD_INIS[case]
    data = text.encode()
    path = tmp_path / "op_cache.ini"
    path.write_bytes(data)
    ini = OpCacheIni.load(path)
    assert ini.limits() == (IniLimits(*ge_limits) if ge_limits else None)
    assert ge_twin.read_ini(data)[2] == ge_limits  # the twin, parsing on its own, agrees
    clean = (
        "never evict",
        "no final newline",
        "section after",
        "spaces",
        "empty section sorting first",
        "indented comment",
        "tabs around =",
    )
    if case not in clean:
        assert ini.problems, "a doubtful ini is warned about"


def test_config_applies_and_warns_about_a_unit_suffix(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    kc = tmp_path / "c" / "kernel_cache"
    kc.mkdir(parents=True)
    (kc / "op_cache.ini").write_text(ODD_INIS["unit suffixes"][0])
    proc = run_cli("config", "--json", "--cache-dir", str(tmp_path / "c"), env=clean_env)
    assert proc.returncode == 2 and "max_op_cache_size=2000MB" in proc.stderr
    data = json.loads(proc.stdout)
    assert (data["max_op_cache_size"]["value"], data["max_op_cache_size"]["origin"]) == (
        2000,
        "op_cache.ini",
    )
    assert data["remain_cache_size_ratio"]["value"] == 80


# --- version stamps read where GE reads them -------------------------------------


@pytest.mark.parametrize("kind", ["old", "new"])
def test_installed_versions_are_found_next_to_ge_library(
    clean_env: dict[str, str], tmp_path: Path, kind: str
) -> None:
    env = fake_toolkit(tmp_path / "Ascend", "8.5.0", "8.5.1", kind)
    found = installed_versions(env)
    assert (found.adk.value, found.ops.value) == ("8.5.0", "8.5.1")  # not the decoy
    where = "compiler/version.info" if kind == "old" else "x86_64-linux/version.info"
    assert found.adk.source.startswith(str(tmp_path)) and where in found.adk.source
    proc = run_cli("config", "--json", "--cache-dir", str(tmp_path / "c"), env={**clean_env, **env})
    rows = json.loads(proc.stdout)
    assert rows["installed_adk_version"]["value"] == "8.5.0"
    assert where in rows["installed_adk_version"]["source"]
    assert rows["installed_ops_version"]["source"].endswith("opp/version.info")


def test_unknown_installed_version_never_purges(clean_env: dict[str, str], tmp_path: Path) -> None:
    root = tmp_path / "root"
    ge_twin.write_entry(root / "kernel_cache" / SOC, "te_add_0")  # and no ini at all
    env = {**clean_env, "ASCEND_HOME_PATH": str(tmp_path / "nothing")}
    report = gc_json(root, env)
    assert report["toolkit"]["status"] == "no_toolkit" and not report["toolkit"]["purged"]
    assert (root / "kernel_cache" / SOC / "te_add_0.json").exists()


# --- GE's pre-build entries are entries ------------------------------------------


def test_pre_build_entries_are_kept_counted_aged_and_hit(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    chip = root / "kernel_cache" / SOC
    pre = ["te_Mul_cd58_pre", "te_Mul_d766_pre"]
    for name in pre:
        assert ge_twin.write_pre(chip, name).files
        set_old(chip / f"{name}.json", 2 * HOUR)
    ge_twin.write_entry(chip, "te_add_0")
    for args in (["gc"], ["verify", "--repair"]):
        proc = run_cli(*args, "--cache-dir", str(root), env=clean_env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert all((chip / f"{n}.json").exists() for n in pre), args
    scan = entry.scan_chip(chip)
    assert set(scan.entries) == {*pre, "te_add_0"} and not scan.orphans
    stats = json.loads(run_cli("stats", "--json", "--cache-dir", str(root), env=clean_env).stdout)
    assert stats["chip_folders"][SOC]["entries"] == 3
    # a hit that uses a _pre.json refreshes its access time, as GE's MatchPreCompileCache
    before = os.stat(chip / f"{pre[0]}.json").st_atime
    assert Store(chip).lookup(pre[0]).hit
    assert os.stat(chip / f"{pre[0]}.json").st_atime > before + HOUR
    # under the limit they are evicted by access time like any entry: the oldest goes first
    report = gc_chip(chip, 1, 0, 0, force_ratio=True)
    assert report.evicted == [pre[1], "te_add_0", pre[0]]


def test_ge_counts_pre_build_jsons_never_evicts_them_and_cachemgr_keeps_the_limit(
    tmp_path: Path,
) -> None:
    """GE's ``GetFilesAccessTime`` skips a ``_pre.json`` before its ageing step, so GE's own
    eviction never removes one while its bytes count toward the limit: left to GE they only
    grow. cachemgr evicts them by access time (docs/eviction.md#pre-build-entries)."""
    chip = tmp_path / "kernel_cache" / SOC
    names = [f"te_mul_{i:02d}_pre" for i in range(12)]
    for i, name in enumerate(names):  # ~200 KiB each (a long prebuilt_options string)
        assert ge_twin.write_pre(chip, name, options="x" * 200_000).files
        set_old(chip / f"{name}.json", 2 * HOUR + i)
    before = ge_twin.directory_size(chip)
    assert before > 2 * MIB
    # GE: over its 1 MiB limit, it takes the eviction lock and ages... nothing
    assert ge_twin.evict(chip, MIB, 50) == []
    assert ge_twin.directory_size(chip) == before
    report = gc_chip(chip, 1, 50, 1800)  # cachemgr: the same limit and aging guard
    assert len(report.evicted) >= 7 and ge_twin.directory_size(chip) <= MIB // 2, report
    assert set(report.evicted) == set(names[-len(report.evicted) :])  # the oldest went


def test_ls_shows_the_op_type_of_pre_build_entries(
    clean_env: dict[str, str], tmp_path: Path, fixture_cache: Path
) -> None:
    """GE names a pre-build entry ``te_<op type>_<hash>_pre`` (``te_json_assemble.cc``
    ``GeneratePreBuildKernelName``; newer GE lower-cases it); its json records no op type."""
    root = tmp_path / "root"
    chip = root / "kernel_cache" / SOC
    ge_twin.write_pre(chip, "te_add_abc123_pre")
    ge_twin.write_pre(chip, "te_batchmatmulv2_9f0e_pre")
    ge_twin.write_entry(chip, "te_add_abc123")
    real = "te_Mul_cd58ce363a48125986d4fd8ef5c8df0e4f0d554e9fc856072d28d6799222c408_pre"
    (chip / f"{real}.json").write_bytes(
        (fixture_cache / "kernel_cache" / SOC / f"{real}.json").read_bytes()
    )
    rows = json.loads(run_cli("ls", "--json", "--cache-dir", str(root), env=clean_env).stdout)
    assert {r["kernel"]: r["op_type"] for r in rows} == {
        "te_add_abc123_pre": "add",
        "te_batchmatmulv2_9f0e_pre": "batchmatmulv2",
        "te_add_abc123": "add",
        real: "Mul",
    }
    text = run_cli("ls", "--cache-dir", str(root), env=clean_env).stdout
    line = next(ln for ln in text.splitlines() if "te_add_abc123_pre" in ln)
    assert line.split()[2] == "add", line


def test_the_daemon_keeps_pre_build_entries(tmp_path: Path) -> None:
    from tests.daemon_util import daemon_env, start_daemon

    root = tmp_path / "root"
    chip = root / "kernel_cache" / SOC
    ge_twin.write_pre(chip, "te_Mul_cd58_pre")
    set_old(chip / "te_Mul_cd58_pre.json", 2 * HOUR)
    daemon = start_daemon(tmp_path, "--cache-dir", str(root), env=daemon_env(tmp_path))
    try:
        found = daemon.client.lookup(SOC, "te_Mul_cd58_pre")
        assert found["status"] == "hit", found
        daemon.client.request("POST", "/gc", {})
    finally:
        assert daemon.stop() == 0
    assert (chip / "te_Mul_cd58_pre.json").exists()  # start-up reclaim, /lookup, /gc kept it


# --- optional parts are optional; GE's validity rules --------------------------------


def test_an_entry_naming_a_header_it_does_not_have_is_valid(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    chip = root / "kernel_cache" / SOC
    ge_twin.write_entry(chip, "te_mul_nohdr", header_named=True)
    ge_twin.write_entry(chip, "te_mul_hdr", header=True)
    assert "headerFileSuffix" in json.loads((chip / "te_mul_nohdr.json").read_text())
    assert ge_twin.hit(chip, "te_mul_nohdr", touch=False)  # GE serves it
    for args in (["verify"], ["verify", "--repair"]):
        proc = run_cli(*args, "--cache-dir", str(root), env=clean_env)
        assert proc.returncode == 0 and "0 bad" in proc.stdout, proc.stdout
    found = Store(chip).lookup("te_mul_nohdr")
    assert found.hit and {p.name for p in found.files} == {"te_mul_nohdr.json", "te_mul_nohdr.o"}
    assert {p.name for p in Store(chip).lookup("te_mul_hdr").files} >= {"te_mul_hdr.h"}


def test_ge_validity_rules_upper_case_sha_and_empty_binary(tmp_path: Path) -> None:
    chip = tmp_path / "kernel_cache" / SOC
    ge_twin.write_entry(chip, "te_upper", upper_sha=True)
    ge_twin.write_entry(chip, "te_empty", size=0)
    for kind in ("plain", "mix", "dynamic"):
        ge_twin.write_entry(chip, f"te_{kind}", kind=kind)
    assert not ge_twin.hit(chip, "te_upper", touch=False)  # GE compares the string
    assert not ge_twin.hit(chip, "te_empty", touch=False)  # GE refuses an empty .o
    assert [p.kind for p in entry.check_entry(chip, "te_upper")[1]] == [entry.SHA256_MISMATCH]
    assert [p.kind for p in entry.check_entry(chip, "te_empty")[1]] == [entry.EMPTY_BINARY]
    for kind in ("plain", "mix", "dynamic"):
        assert entry.check_entry(chip, f"te_{kind}")[1] == [], kind
    assert ge_twin.hit(chip, "te_plain") and ge_twin.hit(chip, "te_dynamic")


# --- lock files that GE may hold are never unlinked ---------------------------------


def test_an_entry_lock_ge_has_open_is_never_unlinked(tmp_path: Path) -> None:
    chip = tmp_path / "kernel_cache" / SOC
    for i in range(4):
        ge_twin.write_entry(chip, f"te_k_{i}", size=4096)
        for name in (f"te_k_{i}.json", f"te_k_{i}.o"):
            set_old(chip / name, 2 * HOUR)
    lock = chip / "te_k_0.lock"
    inode = lock.stat().st_ino
    # a GE process opened te_k_0.lock (LockAndOpenCacheFile) and has not locked it yet
    ge = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os,time; fd=os.open({str(lock)!r}, os.O_RDWR); time.sleep(60)",
        ],
    )
    try:
        report = gc_chip(chip, 1, 1, 0, force_ratio=True)
        assert "te_k_0" in report.evicted
        gc_chip(chip, 1, 1, 0)  # reclaim: the entry is gone, its lock file young
        purge_chip(chip)
        assert lock.stat().st_ino == inode  # the same file: GE and we still exclude each other
        taken = fsutil.FcntlLock(lock)
        assert taken.acquire(blocking=False)
        taken.release()
    finally:
        ge.kill()
        ge.wait()
    assert files.LOCK_REAP_AGE_S >= HOUR
