"""The benchmark harness's protocol: sections keyed by case name, rewritten one at a time."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import types
from pathlib import Path

import pytest

from bench import harness, install
from bench.harness import Row
from cachemgr.constants import VERSION


def test_merge_replaces_only_its_section() -> None:
    rows = [Row("c", "wall", 3.0, "s", "floor", 1.0, 3.0, "≤ 2.0× floor", False, "n")]
    info = {"cpu": "x"}
    first = harness.merge("", "a", harness.section("a", rows, info, "ext4", quick=False))
    both = harness.merge(first, "b", harness.section("b", rows, info, "ext4", quick=True))
    assert both.startswith("# Benchmarks") and "<!-- bench:a -->" in both
    assert "<!-- /bench:b -->" in both and "MISSED (at 3.00×)" in both
    ok = [Row("c", "wall", 1.0, "s", "floor", 1.0, 1.0, "≤ 2.0× floor", True, "")]
    again = harness.merge(both, "a", harness.section("a", ok, info, "ext4", quick=False))
    a_part = again.split("<!-- bench:a -->")[1].split("<!-- /bench:a -->")[0]
    b_part = again.split("<!-- bench:b -->")[1].split("<!-- /bench:b -->")[0]
    assert "all targets met" in a_part and "MISSED" in b_part
    assert again.count("<!-- bench:") == 2


def test_discover_finds_case_modules_and_refuses_unknown_names() -> None:
    names = [m.NAME for m in harness.discover()]
    assert "eviction" in names
    with pytest.raises(SystemExit, match="no case module named 'nope'"):
        harness.discover("nope")


def test_ratio_row_gives_min_max_over_paired_runs_and_the_load() -> None:
    floor = [sys.executable, "-c", "pass"]
    heavier = [sys.executable, "-c", "import json, logging, pathlib, dataclasses"]
    since = harness.load_average()
    cpu: dict[str, list[float]] = {}
    commands = {"floor": (floor, {}), "heavier": (heavier, {})}
    times = harness.timed_runs(commands, rounds=5, cpu=cpu)
    assert len(times["floor"]) == len(times["heavier"]) == 5
    for name, used in cpu.items():  # a child's CPU time is within its wall time
        assert len(used) == 5 and all(0 < c <= t for c, t in zip(used, times[name], strict=True))
    row = harness.ratio_row(
        "start-up", "imports", times["heavier"], "python -c pass", times["floor"],
        target=100.0, load=harness.load_note(since),
    )  # fmt: skip
    pairs = [a / b for a, b in zip(times["heavier"], times["floor"], strict=True)]
    assert row.ratio_min == min(pairs) and row.ratio_max == max(pairs)
    assert row.ratio == statistics.median(pairs) and row.met is True
    assert row.value == statistics.median(times["heavier"]) * 1e3 and row.unit == "ms"
    assert re.fullmatch(r"\d+\.\d→\d+\.\d", row.load)
    line = harness.table([row]).splitlines()[-1]
    assert f"{row.ratio:.2f}× ({min(pairs):.2f}–{max(pairs):.2f})" in line
    assert f"| {row.load} |" in line and "≤ 100× python -c pass" in line
    with pytest.raises(ValueError, match="5 samples vs 4 baseline samples"):
        harness.ratio_row("c", "m", times["heavier"], "floor", times["floor"][:4])


def test_rows_without_their_own_load_get_the_cases(tmp_path: Path) -> None:
    module = types.ModuleType("bench.cases_probe")
    module.NAME = "probe"  # type: ignore[attr-defined]
    module.run = lambda work, quick: [  # type: ignore[attr-defined]
        Row("c", "m", 1.0, "s"),
        Row("c", "m2", 1.0, "s", load="0.5"),
    ]
    rows = harness.run_case(module, quick=True, work_root=tmp_path)
    assert re.fullmatch(r"\d+\.\d→\d+\.\d \(case\)", rows[0].load) and rows[1].load == "0.5"


def test_a_measured_child_writes_byte_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This host sets PYTHONDONTWRITEBYTECODE: a measured child must not inherit it."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    seen = tmp_path / "seen.json"
    probe = (
        "import json, os, sys; json.dump([os.environ.get('PYTHONDONTWRITEBYTECODE'), "
        f"sys.dont_write_bytecode], open({str(seen)!r}, 'w'))"
    )
    harness.timed_runs({"probe": ([sys.executable, "-c", probe], dict(os.environ))}, rounds=1)
    assert json.loads(seen.read_text()) == [None, False]


def test_warm_bytecode_compiles_the_measured_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "warmpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text("VALUE = 1\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "elsewhere"))  # scripts/test's
    harness.warm_bytecode(Path(sys.executable), ["warmpkg"], site_packages=False)
    tag = sys.implementation.cache_tag
    assert (package / "__pycache__" / f"mod.{tag}.pyc").is_file()
    assert (package / "__pycache__" / f"__init__.{tag}.pyc").is_file()


def test_installed_cachemgr_is_the_checkout_installed_without_edit_hooks(tmp_path: Path) -> None:
    found = install.installed_cachemgr(tmp_path)
    assert found.kind == "installed" and found.venv.is_relative_to(tmp_path)
    code = "import json, cachemgr, click; print(json.dumps([cachemgr.__file__, click.__file__]))"
    out = subprocess.run(
        [str(found.python), "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    for module_file in json.loads(out.stdout):
        assert Path(module_file).is_relative_to(found.venv), module_file
    site = next(found.venv.glob("lib/python3*/site-packages"))
    assert not list(site.glob("__editable__*"))
    assert list((site / "cachemgr" / "__pycache__").glob("main.*.pyc"))  # byte code warm
    version = subprocess.run([str(found.script), "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and VERSION in version.stdout
    assert install.installed_cachemgr(tmp_path) is found  # once per run


def test_a_missed_absolute_target_is_not_reported_as_a_ratio() -> None:
    row = Row("c", "p50", 1.2, "ms", "floor", 0.8, 1.5, "≤ 1 ms", False)
    assert "| MISSED |" in harness.table([row])
    ratio = Row("c", "p50", 1.2, "ms", "floor", 0.8, 1.5, "≤ 1.2× floor", False)
    assert "| MISSED (at 1.50×) |" in harness.table([ratio])
