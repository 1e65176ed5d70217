"""What a fresh user met on a clean clone (the review's findings), each on the real CLI
against real cache folders: one clean line per mistake, ``-q`` errors only, the labels and
units the docs give (docs/commands.md)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import ROOT, SOC, run_cli
from tests.daemon_util import Daemon

EXAMPLES = ROOT / "examples" / "requests"


def test_completion_without_a_shell_is_one_clean_line(clean_env: dict[str, str]) -> None:
    proc = run_cli("completion", env=clean_env)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "\\n" not in lines[0] and "\\t" not in lines[0], proc.stderr
    assert "bash, fish, zsh" in lines[0], lines[0]


def _compile(cache: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``cachemgr compile`` of the example requests, in this process, into ``cache``."""
    return run_cli("compile", "--local", "--cache-dir", str(cache), *args, env=env, cwd=EXAMPLES)


def test_force_says_it_cleared_other_entries(clean_env: dict[str, str], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert _compile(cache, "add_c.json", "mul_c.json", env=clean_env).returncode == 0
    chip = cache / "kernel_cache" / SOC
    forced = _compile(cache, "--mode", "force", "add_c.json", env=clean_env)
    assert forced.returncode == 0, forced.stderr
    assert f"cachemgr: note: force cleared 2 entries of {chip}" in forced.stderr, forced.stderr
    assert forced.stdout.startswith("compiled"), forced.stdout
    quiet = _compile(cache, "-q", "--mode", "force", "add_c.json", env=clean_env)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    as_json = _compile(cache, "--json", "--mode", "force", "mul_c.json", env=clean_env)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["status"] == "compiled"  # stdout: the object alone


def test_status_names_the_cache_the_daemon_serves(daemon: Daemon, cache_root: Path) -> None:
    sock = ("--socket", str(daemon.socket_path))
    line = run_cli("status", *sock, env=daemon.env)
    assert line.returncode == 0, line.stderr
    kernel_cache = cache_root / "kernel_cache"
    assert f"serves {kernel_cache}" in line.stdout.splitlines()[0], line.stdout
    as_json = run_cli("status", "--json", *sock, env=daemon.env)
    assert json.loads(as_json.stdout)["kernel_cache_dir"] == str(kernel_cache), as_json.stdout


def test_limits_with_an_option_first_names_the_subcommands(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    proc = run_cli("limits", "--cache-dir", str(cache), env=clean_env)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    (line,) = proc.stderr.splitlines()
    assert "give a subcommand: show or set" in line, line
    assert f"`cachemgr limits show --cache-dir {cache}`" in line, line
    assert "No such option" not in line
    assert not cache.exists()
    shown = run_cli("limits", "show", "--cache-dir", str(cache), env=clean_env)  # as advised
    assert shown.returncode == 0, shown.stderr


def test_quiet_compile_of_a_bad_request_prints_its_error_only(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"op_type": "Add"')
    cache = ("--local", "--cache-dir", str(tmp_path / "cache"))
    loud = run_cli("compile", *cache, str(bad), env=clean_env)
    assert loud.returncode == 2 and loud.stdout.startswith("failed"), loud.stdout
    quiet = run_cli("-q", "compile", *cache, str(bad), env=clean_env)
    assert quiet.returncode == 2 and quiet.stdout == "", quiet.stdout
    (line,) = quiet.stderr.splitlines()
    assert line.startswith("cachemgr: error: ") and "bad.json" in line, line


def test_readme_says_what_exit_2_leaves_behind(clean_env: dict[str, str], tmp_path: Path) -> None:
    """A good and a bad request: the good one is compiled into the new cache, exit 2 — what
    the README's exit-code paragraph must say (it said "nothing is created or deleted")."""
    bad = tmp_path / "bad.json"
    bad.write_text('{"op_type": "Add"')
    cache = tmp_path / "new"
    proc = _compile(cache, "add_c.json", str(bad), env=clean_env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.startswith("compiled"), proc.stdout
    assert list((cache / "kernel_cache" / SOC).glob("te_add_*.o"))
    readme = " ".join((ROOT / "README.md").read_text().split())
    said = readme[readme.index("Exit codes: 0 ok") :].split("## ")[0]
    assert "nothing is created or deleted)" not in said, said
    assert "answers each request on its own" in said and "exits 2 when any" in said, said
