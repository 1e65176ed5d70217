"""Chip folders kept open between the hits of one caller (layer 0¾, over
:mod:`cachemgr.storage.safedir`).

A hit reaches its chip folder without following a link (docs/security.md item 1): the
root opened as configured, then ``kernel_cache`` and ``<soc>`` each with ``O_NOFOLLOW``
relative to the one above — five calls (three opens, two closes) and a last close, on every
hit. A caller that hits the same folder again and again (:mod:`cachemgr.localhit`) keeps
the folder open instead and, before each use, checks that the path still leads to it the
same way: ``lstat`` of ``<root>/kernel_cache`` and of ``<root>/kernel_cache/<soc>`` (links
followed in the root's own path, as the walk's first open does; none below it) must give
the very folders the walk opened (device and inode; the chip folder's inode cannot be
reused while it is open), both folders. A link put in either place, a folder renamed,
removed or replaced: the path leads elsewhere (or nowhere) and the folder is walked again,
with the walk's own refusals (:class:`~cachemgr.storage.safedir.UnsafePathError`,
``FileNotFoundError``). Two calls instead of six; every read still goes through the open
folder, so a change after the check cannot redirect it (as after a walk).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from pathlib import Path

from cachemgr.storage.safedir import SafeDir

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Folders kept open by one :class:`ChipFolders` (descriptors; a client hits a few chips).
MAX_HELD = 16


class Held:
    """One chip folder kept open: ``fd`` for the ``*at()`` calls. Give it back with
    :meth:`ChipFolders.release`."""

    __slots__ = ("chip", "chip_id", "chip_path", "fd", "kcache", "kcache_id", "retired", "users")

    def __init__(
        self, chip: Path, fd: int, kcache_id: tuple[int, int], chip_id: tuple[int, int]
    ) -> None:
        self.chip, self.fd = chip, fd
        self.chip_path, self.kcache = str(chip), str(chip.parent)
        self.kcache_id, self.chip_id = kcache_id, chip_id
        self.users, self.retired = 0, False

    def still(self) -> bool:
        """True when the path leads to this very folder, through no link below the root."""
        try:
            k = os.stat(self.kcache, follow_symlinks=False)
            c = os.stat(self.chip_path, follow_symlinks=False)
        except OSError:
            return False
        return (
            (k.st_dev, k.st_ino) == self.kcache_id
            and (c.st_dev, c.st_ino) == self.chip_id
            and stat.S_ISDIR(k.st_mode)
            and stat.S_ISDIR(c.st_mode)
        )


class ChipFolders:
    """The chip folders one caller keeps open (at most :data:`MAX_HELD`; thread-safe: a
    folder is closed only once no thread uses it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Path, Held] = {}

    def acquire(self, chip_dir: Path) -> Held:
        """``chip_dir`` open, reached as :meth:`SafeDir.open_chip` reaches it (module
        docstring); give it back with :meth:`release`.

        :raises UnsafePathError: ``kernel_cache`` or the chip folder is a link or no folder.
        :raises FileNotFoundError: a part is missing. :raises OSError: e.g. ``EACCES``.
        """
        with self._lock:
            held = self._held.get(chip_dir)
            if held is not None:
                held.users += 1
        if held is not None:
            if held.still():
                return held
            self.release(held, retire=True)
        held = _walk(chip_dir)
        with self._lock:
            old = self._held.pop(chip_dir, None)
            if old is not None:
                self._retire(old)
            while len(self._held) >= MAX_HELD:
                self._retire(self._held.pop(next(iter(self._held))))
            self._held[chip_dir] = held
            held.users += 1
        return held

    def release(self, held: Held, retire: bool = False) -> None:
        """Give ``held`` back (``retire``: it no longer leads where it did; closed once no
        thread uses it)."""
        with self._lock:
            held.users -= 1
            if retire and self._held.get(held.chip) is held:
                del self._held[held.chip]
                self._retire(held)
            elif held.retired and not held.users:
                os.close(held.fd)

    def _retire(self, held: Held) -> None:
        """Under the lock: ``held`` is no longer handed out; closed now or by its last user."""
        held.retired = True
        if not held.users:
            os.close(held.fd)

    def close(self) -> None:
        """Close every folder no thread uses now (the others by their last user)."""
        with self._lock:
            for held in self._held.values():
                self._retire(held)
            self._held.clear()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at exit the descriptors go anyway
            self.close()


def _walk(chip_dir: Path) -> Held:
    """``<root>/kernel_cache/<soc>`` walked as :meth:`SafeDir.open_chip` walks it, the two
    folders' identities taken from their descriptors; where a step fails,
    :meth:`SafeDir.open_chip` says why (its own refusal)."""
    try:
        root = os.open(chip_dir.parent.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        SafeDir.open_chip(chip_dir).close()  # raises: its own error
        raise
    try:
        kfd = os.open(chip_dir.parent.name, _DIR, dir_fd=root)
        try:
            fd = os.open(chip_dir.name, _DIR, dir_fd=kfd)
            kst = os.fstat(kfd)
        finally:
            os.close(kfd)
    except OSError:
        SafeDir.open_chip(chip_dir).close()  # raises: its own error
        raise
    finally:
        os.close(root)
    try:
        cst = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    return Held(chip_dir, fd, (kst.st_dev, kst.st_ino), (cst.st_dev, cst.st_ino))
