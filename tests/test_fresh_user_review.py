"""What a fresh user met on a clean clone (the review's findings), each on the real CLI
against real cache folders: one clean line per mistake, ``-q`` errors only, the labels and
units the docs give (docs/commands.md)."""

from __future__ import annotations

from tests.conftest import run_cli


def test_completion_without_a_shell_is_one_clean_line(clean_env: dict[str, str]) -> None:
    proc = run_cli("completion", env=clean_env)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "\\n" not in lines[0] and "\\t" not in lines[0], proc.stderr
    assert "bash, fish, zsh" in lines[0], lines[0]
