"""A real tmpfs or ext4 image for a test: mounted at a new folder, unmounted afterwards (root
only)."""

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


@contextlib.contextmanager
def ext4_image(mnt: Path, size_mib: int = 16) -> Iterator[Path]:
    """Make the folder ``mnt`` and mount a fresh ext4 filesystem of ``size_mib`` MiB there (an
    image file beside it, loop-mounted): a filesystem no other process allocates inodes on.
    Lazily unmounted and the image removed on exit. Skips the test with the reason where it
    cannot (not root, no ``mkfs.ext4``, no loop device)."""
    if os.geteuid() != 0:
        pytest.skip("mounting an ext4 image needs root")
    image = mnt.with_name(mnt.name + ".img")
    with image.open("wb") as f:
        f.truncate(size_mib << 20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot make an ext4 image here: {made.stderr.strip()}")
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-o", "loop", str(image), str(mnt)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot loop-mount an ext4 image here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        image.unlink(missing_ok=True)
