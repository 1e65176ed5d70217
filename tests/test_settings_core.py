"""The settings core (:mod:`cachemgr.config.core`): the rules of where the kernel cache is and
which limits apply, on ``os`` alone, that :func:`cachemgr.config.options.resolve` and the
start-up fast paths share. Its import budget is checked in a real interpreter; its GE
integer parsing against the regular expressions of GE's grammar."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from cachemgr.config import core, options

#: What importing the core may load: cachemgr's leaf modules, nothing of the standard
#: library that a fresh interpreter has not loaded already.
CORE_BUDGET = {"cachemgr", "cachemgr.config", "cachemgr.config.core", "cachemgr.constants"}


def _new_modules(statement: str) -> set[str]:
    """The modules ``statement`` loads in a fresh interpreter, beyond those it starts with."""
    code = (
        "import sys; before = set(sys.modules)\n"
        f"{statement}\n"
        "print('\\n'.join(sorted(set(sys.modules) - before)))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return set(proc.stdout.split())


def test_settings_core_imports_nothing_but_cachemgr_leaves() -> None:
    assert _new_modules("import cachemgr.config.core") == CORE_BUDGET


ACL = core.ACL_CACHE_DIR

#: std::stoi's accepted prefix: C white space, a sign, decimal digits (GE's grammar).
_STOI = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def _reference_stoi(text: str) -> int | None:
    match = _STOI.match(text)
    if match is None or len(match.group(1)) > 20:
        return None
    value = int(match.group(1))
    return value if -(2**31) <= value <= 2**31 - 1 else None


@pytest.mark.parametrize(
    "text",
    ["500", " 500", "\t-1", "+7", "300MB", "1.5", "", "MB", "-", "+", " + 5", "٣", "0x10",
     "2147483647", "2147483648", "-2147483648", "9" * 25, "\v\f\r\n12", "12 34", "-0"],
)  # fmt: skip
def test_ge_integers_follow_the_c_grammar(text: str) -> None:
    assert core.ge_stoi(text) == _reference_stoi(text)
    if _STOI.match(text) is None:
        assert core.ge_atoi(text) == 0
    else:
        assert isinstance(core.ge_atoi(text), int)


@pytest.mark.parametrize(
    ("option", "env", "kind"),
    [
        ("/o", {ACL: "/a", "ASCEND_CACHE_PATH": "/c"}, "op_compiler_cache_dir"),
        ("", {ACL: "/a", "ASCEND_CACHE_PATH": "/c"}, ACL),
        ("", {ACL: "", "ASCEND_CACHE_PATH": "/c"}, "ASCEND_CACHE_PATH"),
        ("", {"HOME": "/h"}, "HOME"),
    ],
)  # fmt: skip
def test_resolve_takes_the_cache_folder_the_core_chooses(
    option: str, env: dict[str, str], kind: str, tmp_path: Path
) -> None:
    """The full resolution and the core name the same winner and the same names passed
    over (one rule, two callers)."""
    got = core.cache_folder_choice(option, "option", "--cache-dir", env)
    assert got[0] == kind
    env = {k: str(tmp_path) + v if v else v for k, v in env.items()}
    cli = {"op_compiler_cache_dir": str(tmp_path) + option if option else None, "host_id": ""}
    settings = options.resolve(cli=cli, env=env, writable=False)
    kc = settings["kernel_cache_dir"]
    chosen = core.cache_folder_choice(
        str(cli["op_compiler_cache_dir"] or ""), "option", "--cache-dir", env
    )
    assert (kc.origin, kc.source, kc.passed_over) == (chosen[2], chosen[3], chosen[4])


def test_stored_config_rows_are_the_live_ones() -> None:
    """``config`` without a config file shows the stored table rows and remote row
    (:mod:`cachemgr.config.defaultrows`): they must be what the schema and the remote tiers
    give today (rerun ``scripts/defaultrows.py`` when this fails)."""
    from cachemgr.config import configfile, defaultrows
    from cachemgr.console import live_remote_row

    live = configfile.empty().rows()
    assert live == defaultrows.TABLE_ROWS
    assert list(live) == list(defaultrows.TABLE_ROWS)
    assert live_remote_row({}, {}) == defaultrows.NO_REMOTE_ROW
    assert live_remote_row(None, {"CACHEMGR_REMOTE_STORAGE": " "}) == defaultrows.NO_REMOTE_ROW


def test_stored_rows_import_nothing() -> None:
    assert _new_modules("import cachemgr.config.defaultrows") == {
        "cachemgr",
        "cachemgr.config",
        "cachemgr.config.defaultrows",
        "cachemgr.constants",
    }
