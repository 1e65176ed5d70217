"""A real tmpfs for a test: mounted at a new folder, unmounted afterwards (root only)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(mnt: Path, options: str) -> Iterator[Path]:
    """Make the folder ``mnt`` and mount a tmpfs there with ``options`` (e.g.
    ``"size=16m,mode=0755"``); lazily unmounted on exit. Skips the test with the reason where
    it cannot mount (not root, or a kernel or container that forbids it)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs ({options}) here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
