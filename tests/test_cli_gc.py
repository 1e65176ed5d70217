"""The real CLI: ``cachemgr gc | stats | purge`` (docs/design.md#size-limits-and-eviction) and their
bad-input contract."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from cachemgr.eviction import MIB
from tests.conftest import SOC, run_cli
from tests.test_eviction import HOUR, gc_in_another_process, kernels, make_entry, names, set_old
from tests.test_versions import toolkit_env, version_info

STAMPS = "[op_compiler_cache]\nadk_version=7.0.RC1\nops_version=7.0.RC1\n"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """``<tmp>/root`` with ``kernel_cache/Ascend910B1``: 12 entries of 1 MiB (k00 oldest,
    all accessed more than an hour ago) and an ini with limits 10 MB / 50 %."""
    chip = tmp_path / "root" / "kernel_cache" / SOC
    now = time.time()
    for i in range(12):
        make_entry(chip, f"te_k_{i:02d}", MIB, now - 12 * HOUR + i * HOUR)
    ini = chip.parent / "op_cache.ini"
    ini.write_text(STAMPS + "max_op_cache_size=10\nremain_cache_size_ratio=50\n")
    return tmp_path / "root"


def gc(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("gc", "--cache-dir", str(root), *args, env=env)


def one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_gc_json_reports_exactly_what_went(root: Path, clean_env: dict[str, str]) -> None:
    proc = gc(root, clean_env, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    chip = data["chip_folders"][SOC]
    assert sorted(chip["evicted"]) == [f"te_k_{i:02d}" for i in range(7)]
    assert (chip["bytes_before"], chip["bytes_after"]) == (12 * MIB, 5 * MIB)
    assert chip["evicted_entries"] == 7 and chip["evicted_bytes"] == 7 * MIB
    assert chip["kept_by_aging_guard"] == 0 and chip["reclaimed"]["orphans"] == 0
    assert data["limits"]["max_op_cache_size"]["origin"] == "op_cache.ini"
    assert data["toolkit"]["status"] == "no_toolkit"
    assert kernels(root / "kernel_cache" / SOC) == {f"te_k_{i:02d}" for i in range(7, 12)}


def test_gc_text_ratio_min_age_and_dry_run(root: Path, clean_env: dict[str, str]) -> None:
    chip = root / "kernel_cache" / SOC
    (root / "kernel_cache" / "op_cache.ini").write_text(
        STAMPS + "max_op_cache_size=20\nremain_cache_size_ratio=50\n"
    )
    proc = gc(root, clean_env, "--ratio", "50", "--dry-run")  # forced: 12 -> 10 MiB
    assert proc.returncode == 0, proc.stderr
    assert f"{SOC}: 12.0 MiB -> 10.0 MiB" in proc.stdout and "would evict 2 entries" in proc.stdout
    assert "toolkit version unknown (" in proc.stdout, proc.stdout
    assert "): no toolkit-upgrade purge" in proc.stdout and "left alone" not in proc.stdout
    assert "toolkit: toolkit" not in proc.stdout, proc.stdout  # the word once
    assert len(kernels(chip)) == 12
    proc = gc(root, clean_env, "--ratio", "50", "--min-age", str(6.5 * HOUR))
    assert "evicted 2 entries" in proc.stdout, proc.stdout
    proc = gc(root, clean_env, "--ratio", "10", "--min-age", str(6.5 * HOUR))
    # 2 MiB target, but only entries accessed > 6.5 h ago may go: k02..k05, then the guard
    assert "evicted 4 entries" in proc.stdout and "kept by aging guard 4" in proc.stdout
    assert kernels(chip) == {f"te_k_{i:02d}" for i in range(6, 12)}


def test_gc_on_a_mistyped_cache_dir_warns(tmp_path: Path, clean_env: dict[str, str]) -> None:
    missing = tmp_path / "no" / "such"
    proc = gc(missing, clean_env)
    assert proc.returncode == 0, proc.stderr
    assert f"no kernel cache at {missing / 'kernel_cache'}" in proc.stderr
    assert "--cache-dir" in proc.stderr  # where the path came from


def test_gc_on_missing_chip_folder_is_nothing_to_do(root: Path, clean_env: dict[str, str]) -> None:
    proc = gc(root, clean_env, "--soc", "Ascend310P3")
    assert proc.returncode == 0, proc.stderr
    assert "Ascend310P3: no chip folder" in proc.stdout
    assert not (root / "kernel_cache" / "Ascend310P3").exists()


def test_second_gc_while_one_runs_skips(
    root: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    chip = root / "kernel_cache" / SOC
    with gc_in_another_process(chip, tmp_path):
        proc = gc(root, clean_env)
        assert proc.returncode == 0, proc.stderr
        assert "skipped: another evictor holds op_cache_file_del.lock" in proc.stdout
        assert len(kernels(chip)) == 12
    assert len(kernels(chip)) == 5


@pytest.mark.parametrize(
    ("args", "needle"),
    [(("--ratio", "101"), "--ratio='101'"), (("--ratio", "x"), "--ratio='x'"),
     (("--min-age", "-5"), "--min-age='-5'")],
)  # fmt: skip
def test_gc_bad_option_is_one_line_exit_2(
    root: Path, clean_env: dict[str, str], args: tuple[str, ...], needle: str
) -> None:
    one_line_error(gc(root, clean_env, *args), needle, "from option")
    assert len(kernels(root / "kernel_cache" / SOC)) == 12


def test_gc_with_bad_ini_warns_and_says_it_uses_the_fallback(
    root: Path, clean_env: dict[str, str]
) -> None:
    (root / "kernel_cache" / "op_cache.ini").write_text(STAMPS + "max_op_cache_size=ten\n")
    env = {**clean_env, "ASCEND_MAX_OP_CACHE_SIZE": "8", "ASCEND_REMAIN_CACHE_SIZE_RATIO": "50"}
    proc = gc(root, env, "--json")
    assert proc.returncode == 0, proc.stderr
    assert "max_op_cache_size=ten is not an integer" in proc.stderr
    assert "gc applies the fallback limits max_op_cache_size=8 MiB (env)" in proc.stderr
    data = json.loads(proc.stdout)
    assert data["limits"]["problems"] and data["chip_folders"][SOC]["evicted_entries"] == 8


def test_minus_one_in_ini_evicts_nothing_but_reclaims(
    root: Path, clean_env: dict[str, str]
) -> None:
    chip = root / "kernel_cache" / SOC
    (root / "kernel_cache" / "op_cache.ini").write_text(
        STAMPS + "max_op_cache_size=-1\nremain_cache_size_ratio=50\n"
    )
    (chip / "te_gone.o").write_bytes(b"x")
    set_old(chip / "te_gone.o", 2 * HOUR)
    dry = gc(root, clean_env, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would reclaim 1 orphan, 0 temp files" in dry.stdout  # a dry run reclaims nothing
    assert "te_gone.o" in names(chip)
    proc = gc(root, clean_env)
    assert proc.returncode == 0, proc.stderr
    assert "size eviction off (max_op_cache_size=-1)" in proc.stdout
    assert "reclaimed 1 orphan, 0 temp files" in proc.stdout  # plurals right
    assert "would reclaim" not in proc.stdout
    assert len(kernels(chip)) == 12 and "te_gone.o" not in names(chip)


def test_toolkit_upgrade_purges_every_chip_folder(
    root: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    other = root / "kernel_cache" / "Ascend310P3"
    make_entry(other, "te_other", 4096, time.time() - HOUR)
    env = {**clean_env, **toolkit_env(tmp_path, "8.0.RC1", "8.0.RC1")}
    proc = gc(root, env, "--soc", SOC)
    assert proc.returncode == 0, proc.stderr
    assert "toolkit changed" in proc.stdout and "entries in 2 chip folders" in proc.stdout
    assert f"{SOC}: purged 12 entries" in proc.stdout and "reason: upgraded" in proc.stdout
    # in the same units as the chip folder's own line, never raw bytes
    assert re.search(rf"{SOC}: purged 12 entries \([\d.]+ (KiB|MiB)\), reason", proc.stdout)
    assert not kernels(other) and not kernels(root / "kernel_cache" / SOC)
    assert "adk_version=8.0.RC1" in (root / "kernel_cache" / "op_cache.ini").read_text()
    version_info(tmp_path / "Ascend" / "latest" / "compiler", "8.0.RC1")  # unchanged
    proc = gc(root, env)
    assert "cache stamps match" in proc.stdout


def test_dry_run_totals_include_the_toolkit_purge(
    root: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """After a toolkit change gc purges every entry before it evicts: the dry run says so,
    and its totals are the real run's (not the 7 entries eviction alone would take)."""
    chip = root / "kernel_cache" / SOC
    (chip / "te_gone.o").write_bytes(b"x" * 100)  # an orphan: the purge takes it too
    set_old(chip / "te_gone.o", 2 * HOUR)
    env = {**clean_env, **toolkit_env(tmp_path, "8.0.RC1", "8.0.RC1")}
    dry = gc(root, env, "--json", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert len(kernels(chip)) == 12 and "te_gone.o" in names(chip)  # nothing removed
    real = gc(root, env, "--json")
    assert real.returncode == 0, real.stderr
    assert not kernels(chip)
    dry_totals, real_totals = (json.loads(p.stdout)["totals"] for p in (dry, real))
    assert real_totals["purged_entries"] == 12 and real_totals["freed_bytes"] == 12 * MIB + 100
    assert dry_totals == real_totals
    make_entry(chip, "te_k_new", MIB, time.time() - 12 * HOUR)
    (root / "kernel_cache" / "op_cache.ini").write_text(STAMPS)  # the toolkit changes again
    text = gc(root, env, "--dry-run")
    assert "would purge 1 entry in 1 chip folder and stamp the ini" in text.stdout, text.stdout
    assert "total: would free 1.0 MiB in 1 chip folder; would purge 1 entry, would evict 0" in (
        text.stdout
    )


def test_stats_json_keys_chip_folders_by_soc(root: Path, clean_env: dict[str, str]) -> None:
    proc = run_cli("stats", "--json", "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    row = data["chip_folders"][SOC]
    assert (row["entries"], row["bytes"], row["limit_mb"], row["ratio_pct"]) == (
        12,
        12 * MIB,
        10,
        50,
    )
    assert row["fill_pct"] == 120.0
    assert row["oldest_access"] < row["newest_access"]
    assert set(data) >= {"chip_folders", "limits", "kernel_cache_dir"}
    text = run_cli("stats", "-v", "--cache-dir", str(root), env=clean_env)
    shown = re.sub(r": +", ": ", text.stdout)  # the labels' alignment aside
    assert f"{SOC}: 12 entries, 12.0 MiB of 10.0 MiB (120.0 % full)" in shown, text.stdout
    assert "Limit: 10 MiB per chip folder, 50 % kept after an eviction" in shown, text.stdout
    assert len(kernels(root / "kernel_cache" / SOC)) == 12


def test_purge_refuses_without_yes_off_a_terminal(root: Path, clean_env: dict[str, str]) -> None:
    chip = root / "kernel_cache" / SOC
    proc = run_cli("purge", "--soc", SOC, "--cache-dir", str(root), env=clean_env, input="")
    one_line_error(proc, "--yes", "not a terminal")
    one_line_error(run_cli("purge", "--cache-dir", str(root), env=clean_env), "--soc", "--all")
    assert len(kernels(chip)) == 12
    proc = run_cli("purge", "--all", "--yes", "--json", "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["chip_folders"][SOC]["entries"] == 12
    # lock files stay until dead and an hour old (a GE process may hold one)
    assert not kernels(chip) and all(n.endswith(".lock") for n in os.listdir(chip))


def test_through_the_daemon_gc_names_the_limits_that_apply(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """New-user review: with ASCEND_MAX_OP_CACHE_SIZE in the shell, gc through a daemon
    warned "gc applies the fallback limits max_op_cache_size=2 MiB (env)" and then evicted
    to the daemon's 500 MiB. The caller's environment binds only a local run: through the
    daemon one line says the daemon's limits apply; --local applies the shell's."""
    from tests.daemon_util import daemon_env, start_daemon

    root = tmp_path / "root"
    chip = root / "kernel_cache" / SOC
    for i in range(3):
        make_entry(chip, f"te_k_{i:02d}", MIB, time.time() - 12 * HOUR)
    daemon = start_daemon(tmp_path, "--cache-dir", str(root), env=daemon_env(tmp_path))
    try:
        sock = ("--socket", str(daemon.socket_path))
        for value in ("2", "2GB"):  # a plain limit, and one GE reads as 2 (a "problem")
            env = {**clean_env, "ASCEND_MAX_OP_CACHE_SIZE": value}
            proc = gc(root, env, "--dry-run", *sock)
            assert proc.returncode == 0, proc.stderr
            assert "the daemon's limits apply, not this shell's ASCEND_MAX_OP_CACHE_SIZE=2" in (
                proc.stderr
            ), proc.stderr
            assert "gc applies the fallback" not in proc.stderr
            assert "limit 500.0 MiB" in proc.stdout, proc.stdout
        local = gc(root, {**clean_env, "ASCEND_MAX_OP_CACHE_SIZE": "2"}, "--dry-run", "--local")
        assert local.returncode == 0 and "daemon's limits" not in local.stderr, local.stderr
        assert "limit 2.0 MiB" in local.stdout, local.stdout
    finally:
        daemon.stop()


def test_dry_run_predicts_the_manifests_that_go_with_their_last_entry(
    root: Path, clean_env: dict[str, str]
) -> None:
    """``--ratio 0 --min-age 0`` evicts every entry, and with them every header manifest
    (each goes with the last entry it names: docs/eviction.md): the dry run counts those
    manifests and their bytes as the run then removes them."""
    from cachemgr.storage import manifest

    chip = root / "kernel_cache" / SOC
    for i in range(4):  # the last one names two entries, one evicted only by the run itself
        kernels_named = [f"te_k_{i:02d}"] + ([f"te_k_{i + 8:02d}"] if i == 3 else [])
        for kernel in kernels_named:
            headers = {f"/src/{kernel}/k.h": "0" * 64}
            manifest.record(chip / f"k{i}_{'a' * 64}.manifest", kernel, headers)
    sizes = sum(p.stat().st_size for p in chip.glob("*.manifest"))
    args = ("--json", "--ratio", "0", "--min-age", "0")
    dry = gc(root, clean_env, *args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert len(list(chip.glob("*.manifest"))) == 4, "a dry run removes nothing"
    real = gc(root, clean_env, *args)
    assert real.returncode == 0, real.stderr
    assert not list(chip.glob("*.manifest")) and not kernels(chip)
    dry_doc, real_doc = (json.loads(p.stdout) for p in (dry, real))
    dry_chip, real_chip = (d["chip_folders"][SOC] for d in (dry_doc, real_doc))
    assert real_chip["reclaimed"]["manifests"] == 4
    assert dry_chip["reclaimed"] == real_chip["reclaimed"]
    assert real_chip["reclaimed"]["bytes"] == sizes
    assert dry_chip["bytes_after"] == real_chip["bytes_after"] == 0
    assert dry_doc["totals"] == real_doc["totals"]
