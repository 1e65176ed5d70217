"""The layers contract (STYLE.md): lower layers never import higher ones."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_layers_kept() -> None:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    proc = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_library_type_checks_strict() -> None:
    """mypy --strict over cachemgr/ ([tool.mypy] in pyproject.toml; scripts/test runs it too)."""
    exe = shutil.which("mypy") or str(Path(sys.executable).parent / "mypy")
    proc = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Success: no issues found" in proc.stdout


def test_every_lazy_subcommand_loads() -> None:
    import click

    from cachemgr.cli import COMMANDS, cli

    ctx = click.Context(cli)
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        assert isinstance(command, click.Command) and command.name == name
