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
    with _mounted(mnt, ["-t", "tmpfs", "-o", options, "tmpfs"], f"a tmpfs ({options})"):
        yield mnt


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
    try:
        with _mounted(mnt, ["-o", "loop", str(image)], "an ext4 image (loop)"):
            yield mnt
    finally:
        image.unlink(missing_ok=True)


@contextlib.contextmanager
def _mounted(mnt: Path, source: list[str], what: str) -> Iterator[None]:
    """``mount SOURCE… MNT`` on the new folder ``mnt``, lazily unmounted on exit; skips the
    test naming ``what`` and the mount's own refusal where it cannot."""
    mnt.mkdir()
    done = subprocess.run(["mount", *source, str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount {what} here: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
