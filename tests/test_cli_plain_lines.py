"""What the CLI says, said once, plainly and in words (docs/commands.md): a warning the library
logs and also hands back is printed once, a kernel compiled outside the cache says where its
files went, a cache named on a pseudo filesystem is one line naming the value and its origin,
and no count reads ``chip folder(s)``. Real CLI runs on real cache folders."""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT, SOC, run_cli

ADD = ROOT / "examples" / "requests" / "add_c.json"


def _time_macro_request(folder: Path) -> Path:
    """A request whose source uses ``__TIME__``: compiled, returned, never cached."""
    (folder / "k.c").write_text("const char *t = __TIME__;\nvoid k(float *a) { a[0] = 1; }\n")
    request = json.loads(ADD.read_text())
    request.update(kernel_source="k.c", kernel_entry="k", defines={})
    path = folder / "time.json"
    path.write_text(json.dumps(request))
    return path


def test_an_uncached_kernels_warning_is_printed_once_and_says_where_it_went(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    """The warning came twice (``WARNING cachemgr.compile.publisher: …`` from logging, then
    ``cachemgr: warning: …``) and neither said that the kernel landed in the current
    folder."""
    work = tmp_path / "work"
    work.mkdir()
    request = _time_macro_request(work)
    cache = ["--local", "--cache-dir", str(tmp_path / "cache")]
    proc = run_cli("compile", str(request), *cache, env=clean_env, cwd=work)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "not cached" in ln]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("cachemgr: warning: ") and "__TIME__" in lines[0]
    assert lines[0].endswith(f"; its files are in {work} (the current folder)"), lines[0]
    assert list(work.glob("te_add_*.o")), sorted(work.iterdir())
    quiet = run_cli("-q", "compile", str(request), *cache, env=clean_env, cwd=work)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def test_a_debug_or_disabled_compile_says_where_its_files_went(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    """A debug build (``kernel_meta`` under the current folder, as CANN writes it) and
    ``op_compiler_cache_mode=disable`` (the current folder) landed there without a word."""
    work = tmp_path / "work"
    work.mkdir()
    cache = ["--local", "--cache-dir", str(tmp_path / "cache")]
    debug = run_cli("compile", str(ADD), "--op-debug-level", "2", *cache, env=clean_env, cwd=work)
    assert debug.returncode == 0, debug.stderr
    (note,) = debug.stderr.splitlines()
    meta = next((work / "kernel_meta").iterdir())
    assert note.startswith("cachemgr: note: te_add_") and "(op_debug_level=2 bypasses" in note
    assert note.endswith(f"its files are in {meta} (under the current folder)"), note
    disabled = run_cli("compile", str(ADD), "--mode", "disable", *cache, env=clean_env, cwd=work)
    assert disabled.returncode == 0, disabled.stderr
    (note,) = disabled.stderr.splitlines()
    assert "not cached (op_compiler_cache_mode=disable)" in note, note
    assert note.endswith(f"its files are in {work} (the current folder)"), note
    as_json = run_cli("compile", "--json", str(ADD), "--mode", "disable", *cache, env=clean_env,
                      cwd=work)  # fmt: skip
    assert as_json.returncode == 0 and as_json.stderr == "", as_json.stderr
    cached = run_cli("compile", str(ADD), *cache, env=clean_env, cwd=work)
    assert cached.returncode == 0 and cached.stderr == "", cached.stderr  # in the cache


def test_a_chip_folder_gc_skips_is_said_once_on_stderr(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    """A folder planted where GE's eviction lock belongs: gc logged a WARNING and printed
    the same failure line after it."""
    root = tmp_path / "cache"
    (root / "kernel_cache" / SOC / "op_cache_file_del.lock" / "x").mkdir(parents=True)
    proc = run_cli("gc", "--local", "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    said = [ln for ln in proc.stderr.splitlines() if "where GE's eviction lock belongs" in ln]
    assert len(said) == 1 and said[0].startswith("cachemgr: "), proc.stderr
    assert "WARNING" not in proc.stderr


@pytest.mark.parametrize(
    ("how", "value", "origin"),
    [
        ("--cache-dir", "/proc/cachemgr-test", "(from option --cache-dir)"),
        ("--cache-dir", "/proc", "(from option --cache-dir)"),
        ("ASCEND_CACHE_PATH", "/sys/kernel/cachemgr-test", "(from env)"),
    ],
)
def test_a_cache_on_a_pseudo_filesystem_is_one_line_naming_the_value(
    clean_env: dict[str, str], how: str, value: str, origin: str
) -> None:
    """``--cache-dir /proc/x`` was ``error: No such file or directory: /proc/x`` (exit 1),
    naming neither the setting nor where it came from; ``stats`` even listed the cache."""
    named = how.startswith("--")
    env = clean_env if named else {**clean_env, how: value}
    for args in (["compile", str(ADD), "--local"], ["gc", "--local"], ["stats", "--local"],
                 ["verify"]):  # fmt: skip
        proc = run_cli(*args, *([how, value] if named else []), env=env)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        (line,) = proc.stderr.splitlines()
        name = "op_compiler_cache_dir" if named else how
        assert line.startswith(f"cachemgr: error: {name}={value} {origin} is on /"), line
        assert "pseudo filesystem" in line and "name a folder on a disk" in line, line
    assert not os.path.lexists(value) or value == "/proc"


#: a count written as ``folder(s)``, ``entry(ies)``
_HEDGED = re.compile(r"[a-z]\((s|es|ies)\)")


def test_no_message_hedges_its_count_with_parenthesised_plurals() -> None:
    """``1 chip folder(s)``: every message counts in words (``cachemgr/words.py``). Scans
    every string the code builds (docstrings and comments are not messages)."""
    found = []
    for path in sorted((ROOT / "cachemgr").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and _HEDGED.search(node.value)
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert found == [], "\n".join(found)
