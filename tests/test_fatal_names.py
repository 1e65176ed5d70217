"""A json that makes GE abort takes only its own entry's files with it: a crafted main json
whose ``jsonList`` names another, valid entry's json (``{"jsonList": [{"jsonFileName":
"<victim>.json"}, 5]}``, GE-fatal for its ``5``) is removed alone — the victim, which it
does not own by name, stays whole and a hit (docs/interop.md#entries-that-abort-ge). Both ways
a fatal json is met: the running daemon's watcher, and ``gc``'s reclaim."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cachemgr.storage.store import Store
from tests import ge_twin
from tests.conftest import ROOT, SOC, run_cli
from tests.daemon_util import start_daemon, wait_first_scan, wait_for

INI = "[op_compiler_cache]\nadk_version=8.0.RC1\nops_version=8.0.RC1\n"
VICTIM = "te_victim_0"


def _cache(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "cache"
    chip = root / "kernel_cache" / SOC
    assert ge_twin.write_entry(chip, VICTIM, header=True).files
    (root / "kernel_cache" / "op_cache.ini").write_text(INI)
    return root, chip


def _plant_evil(chip: Path) -> Path:
    """The member's crafted json, written as GE writes (temp + rename)."""
    evil = chip / "evil.json"
    doc = {"jsonList": [{"jsonFileName": VICTIM + ".json"}, 5]}
    ge_twin.copy_to_cache(json.dumps(doc).encode(), evil)
    return evil


def _victim_whole(chip: Path, files: list[str]) -> None:
    assert all((chip / name).exists() for name in files), sorted(p.name for p in chip.iterdir())
    assert Store(chip).lookup(VICTIM, touch=False).hit
    twin = subprocess.run(
        [sys.executable, "-m", "tests.ge_twin", "hit", str(chip), VICTIM],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert twin.returncode == 0, twin  # GE's own lookup: a hit


def test_the_watcher_removes_the_crafted_json_and_not_the_entry_it_names(tmp_path: Path) -> None:
    root, chip = _cache(tmp_path)
    files = sorted(p.name for p in chip.iterdir() if not p.name.endswith(".lock"))
    daemon = start_daemon(tmp_path, "--cache-dir", str(root))
    try:
        wait_first_scan(daemon)
        evil = _plant_evil(chip)
        wait_for(lambda: not evil.exists(), 5.0, "the crafted json to be removed")
        wait_for(lambda: daemon.client.stats().counters["ge_fatal_removed"] == 1, 5.0, "count")
        _victim_whole(chip, files)
        removed = [ln for ln in daemon.log().splitlines() if "GE aborts" in ln]
        assert len(removed) == 1 and "evil" in removed[0] and VICTIM not in removed[0], removed
    finally:
        daemon.stop()


def test_gc_removes_the_crafted_json_and_not_the_entry_it_names(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    root, chip = _cache(tmp_path)
    files = sorted(p.name for p in chip.iterdir() if not p.name.endswith(".lock"))
    evil = _plant_evil(chip)
    proc = run_cli("gc", "--json", "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["chip_folders"][SOC]["reclaimed"]["ge_fatal"] == 1
    assert not evil.exists()
    _victim_whole(chip, files)
