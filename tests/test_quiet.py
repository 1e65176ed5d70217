"""``-q`` means errors only, in every command (docs/commands.md, "Options every command
shares"): no reports, no toolkit line, no warnings — and exit codes unchanged; a failure
that sets the exit code still says why, as an error line. Real CLI runs on real caches."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import ROOT, SOC, publish, run_cli

REQUEST = str(ROOT / "examples" / "requests" / "add_c.json")
MIB = 1 << 20


def _cache(tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    for i in range(3):
        publish(root / "kernel_cache" / SOC, f"te_add_{i}", bytes([i]) * MIB)
    return root


def test_gc_q_prints_nothing(tmp_path: Path, clean_env: dict[str, str]) -> None:
    root = _cache(tmp_path)
    args = ["gc", "--local", "--cache-dir", str(root)]
    loud = run_cli(*args, env=clean_env)
    quiet = run_cli(*args, "-q", env=clean_env)
    assert loud.returncode == quiet.returncode == 0, loud.stderr + quiet.stderr
    assert "toolkit" in loud.stdout and "total:" in loud.stdout, loud.stdout
    assert (quiet.stdout, quiet.stderr) == ("", ""), quiet


def test_gc_q_says_only_why_it_exits_1(tmp_path: Path, clean_env: dict[str, str]) -> None:
    """Over the limit with every entry young: exit 1 either way; ``-q`` keeps the reason,
    as an error line, and nothing else."""
    root = _cache(tmp_path)
    env = {**clean_env, "ASCEND_MAX_OP_CACHE_SIZE": "1"}  # MiB: the 3 MiB cached are over
    args = ["gc", "--local", "--min-age", "3600", "--cache-dir", str(root)]
    loud = run_cli(*args, env=env)
    quiet = run_cli(*args, "-q", env=env)
    assert loud.returncode == quiet.returncode == 1, loud.stderr + quiet.stderr
    (said,) = [ln for ln in loud.stderr.splitlines() if "still over its limit" in ln]
    # one label for exit 1 (error, with -q or not), the sizes in KiB/MiB as stats says them
    assert said.startswith("cachemgr: error: ") and "of 1.0 MiB)" in said, said
    assert quiet.stdout == "", quiet.stdout
    (line,) = quiet.stderr.splitlines()
    assert line.startswith("cachemgr: error: ") and "still over its limit" in line, line


def test_compile_q_prints_no_warning(tmp_path: Path, clean_env: dict[str, str]) -> None:
    """A folder planted where the entry's lock file belongs: compiled outside the cache with
    a warning (exit 0) — and with ``-q`` nothing at all."""
    root = tmp_path / "cache"
    first = run_cli(
        "compile", "--local", "--json", "--cache-dir", str(root), REQUEST, env=clean_env
    )
    assert first.returncode == 0, first.stderr
    kernel = json.loads(first.stdout.splitlines()[0])["kernel_name"]
    planted = root / "kernel_cache" / SOC / f"{kernel}.lock"
    planted.unlink()
    planted.mkdir()
    (planted / "notes").write_text("a member's")
    args = ["compile", "--local", "--replace", "--cache-dir", str(root), REQUEST]
    loud = run_cli(*args, env=clean_env, cwd=tmp_path)
    quiet = run_cli(*args, "-q", env=clean_env, cwd=tmp_path)
    assert loud.returncode == quiet.returncode == 0, loud.stderr + quiet.stderr
    assert "warning:" in loud.stderr and "compiled" in loud.stdout, loud
    assert (quiet.stdout, quiet.stderr) == ("", ""), quiet


def test_compile_q_keeps_the_error(tmp_path: Path, clean_env: dict[str, str]) -> None:
    bad = tmp_path / "bad.c"
    bad.write_text("void add_kernel(void) { undefined_name; }\n")
    request = json.loads(Path(REQUEST).read_text())
    request["kernel_source"] = str(bad)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(request))
    args = ["compile", "--local", "-q", "--cache-dir", str(tmp_path / "cache"), str(path)]
    quiet = run_cli(*args, env=clean_env)
    assert quiet.returncode == 1, quiet
    assert "cachemgr: error:" in quiet.stderr and "undefined_name" in quiet.stderr, quiet.stderr
