"""Commands started with stdout closed (``cachemgr compile req.json >&-``, ``gc``): nothing is
written to it and the command exits with its real code, as ``click.echo`` skips a closed
stream (``main._write`` does the same on the direct path). They died with exit 70 on
``sys.stdout.isatty()`` (``sys.stdout`` is None then) in the click path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_direct import Kit


def _run(argv: list[str], kit: Kit, closed: bool, **env: str) -> tuple[int, str]:
    """``cachemgr *argv`` in the kit's project, stdout closed or captured; (exit code,
    stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "cachemgr", *argv],
        env={**kit.env, **env},
        cwd=kit.project,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=(lambda: os.close(1)) if closed else None,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stderr


@pytest.mark.parametrize("direct", ["0", "1"])
def test_compile_and_gc_with_stdout_closed_exit_as_with_it_open(
    tmp_path: Path, direct: str
) -> None:
    kit = Kit(tmp_path)
    miss = _run(kit.argv, kit, closed=True, CACHEMGR_DIRECT=direct)
    assert miss == (0, ""), miss
    assert any(p.suffix == ".o" for p in kit.chip.iterdir()), "the miss published nothing"
    for argv in (kit.argv, ["gc", "--cache-dir", str(kit.cache)]):
        assert _run(argv, kit, closed=True, CACHEMGR_DIRECT=direct) == (0, ""), argv
    dry = ["gc", "--dry-run", "--cache-dir", str(kit.cache)]
    closed = _run(dry, kit, closed=True, CACHEMGR_DIRECT=direct)
    assert closed == _run(dry, kit, closed=False, CACHEMGR_DIRECT=direct), closed
    assert closed[0] == 0 and "Traceback" not in closed[1]
