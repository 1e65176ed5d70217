"""The benchmark harness's protocol: sections keyed by case name, rewritten one at a time."""

from __future__ import annotations

import pytest

from bench import harness
from bench.harness import Row


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
