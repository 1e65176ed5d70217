"""The layers contract (docs/design.md#design-layout-of-the-code): lower layers never import higher
ones."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


#: An upward import per package boundary the contracts state (importer, imported).
UPWARD = [
    ("cachemgr/storage/fsutil.py", "cachemgr.compile.queue"),
    ("cachemgr/storage/store.py", "cachemgr.eviction.gc"),
    ("cachemgr/config/options.py", "cachemgr.compile.request"),
    ("cachemgr/compile/keys.py", "cachemgr.daemon.service"),
    ("cachemgr/compile/request.py", "cachemgr.client"),
    ("cachemgr/compilers/base.py", "cachemgr.compile.keys"),
    ("cachemgr/compilers/base.py", "cachemgr.compilers.host"),
    ("cachemgr/eviction/plan.py", "cachemgr.compile.results"),
    ("cachemgr/remote/blob.py", "cachemgr.eviction.collect"),
    ("cachemgr/daemon/watch.py", "cachemgr.cli.common"),
    ("cachemgr/config/layout.py", "cachemgr.storage.entry"),
    ("cachemgr/compile/request.py", "cachemgr.compile.queue"),
    ("cachemgr/errors.py", "cachemgr.storage.fsutil"),
]


@pytest.mark.parametrize(("importer", "imported"), UPWARD)
def test_an_upward_import_breaks_a_contract(tmp_path: Path, importer: str, imported: str) -> None:
    """The contracts cover every package: one import pointing up, added to
    a copy of the package, makes lint-imports fail naming both modules."""
    shutil.copytree(
        ROOT / "cachemgr", tmp_path / "cachemgr", ignore=shutil.ignore_patterns("*.pyc")
    )
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    with (tmp_path / importer).open("a") as f:
        f.write(f"\nimport {imported}  # pointing up: the contracts must refuse it\n")
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(
        [exe, "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0, proc.stdout
    source = importer.removesuffix(".py").replace("/", ".")
    assert f"{source} -> {imported}" in proc.stdout, proc.stdout
