"""``CACHEMGR_DIRECT=0`` turns direct mode off (:mod:`cachemgr.main`): no memo is read or
written, every ``compile`` takes the full click path with the same answer; and the operator
is told where the memos live (``compile --help``). Real ``python -m cachemgr`` processes on
a real cache, as ``tests/test_direct.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_direct import Kit, _no_seconds


@pytest.mark.parametrize("off", ["0", "off"])
def test_switch_off_takes_the_full_path_with_the_same_answer(tmp_path: Path, off: str) -> None:
    kit = Kit(tmp_path)
    lean = kit.primed()
    hits = kit.hits()
    full = kit.run(CACHEMGR_DIRECT=off)
    assert full.code == 0 and full.err == "", full.err
    assert not full.direct, "CACHEMGR_DIRECT=0: still answered from the memo"
    assert _no_seconds(full.out) == _no_seconds(lean.out)
    assert kit.hits() == hits + 1


def test_switch_off_writes_no_memo(tmp_path: Path) -> None:
    kit = Kit(tmp_path)
    first = kit.run(CACHEMGR_DIRECT="0")
    assert first.code == 0 and first.status() == "compiled", first.err
    for _ in range(2):
        again = kit.run(CACHEMGR_DIRECT="0")
        assert again.code == 0 and again.status() == "hit" and not again.direct, again.err
    assert kit.memos() == []
    on = kit.run()  # the switch is read on each run: without it the full hit writes one
    assert on.status() == "hit" and kit.memos()


def test_compile_help_says_where_memos_live_and_how_to_turn_them_off() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cachemgr", "compile", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"},
    ).stdout
    flat = " ".join(out.split())
    assert "$XDG_CACHE_HOME/cachemgr/direct/" in flat
    assert "CACHEMGR_DIRECT=0" in flat
    assert "rm -rf ~/.cache/cachemgr/direct" in flat
