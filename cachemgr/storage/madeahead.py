"""Files made before their bytes are known, and named once they are whole (layer 0).

Making a file is the dear part of writing one on the reference host's ext4 (``discard``):
an ``open(O_CREAT)`` or ``O_TMPFILE`` took 280-370 µs, writing 2 KiB, ``fchmod``, ``link`` and
``rename`` 4-28 µs each (p50 of 300 rounds, docs/performance.md). A publish makes three (the
binary's and the json's temp files, the header manifest's), each after the compile. So a
publisher makes them *while the compiler runs* (:func:`make`: ``O_TMPFILE``, a file with no
name, invisible to every other process and freed by the kernel when closed unnamed, also
after a ``kill -9``), and once the bytes are written gives each the very temp name a named
write would have had (:func:`name_as`), from where the same ``rename`` puts it in place —
json last, as before (docs/design.md#writing-and-reading-an-entry).

Where a filesystem has no ``O_TMPFILE`` (NFS, older kernels) or ``/proc`` is not mounted,
nothing is made ahead (:func:`make` gives None) or naming fails (``OSError``), and the
caller writes a named temp file as it always did.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path


def make(dir_fd: int) -> int | None:
    """An unnamed regular file (mode ``0600``, open for reading and writing) in the folder
    ``dir_fd``, or None when none can be made there now — unsupported, or any other refusal
    (a full or read-only filesystem, a folder we may not write): the publish that would have
    used it meets that refusal itself, with its own error, when it writes the named file.
    Never raises."""
    tmpfile = getattr(os, "O_TMPFILE", None)
    if tmpfile is None:  # not Linux
        return None
    try:
        return os.open(".", os.O_RDWR | tmpfile | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError:
        return None


def name_as(fd: int, dir_fd: int | None, name: str | Path) -> None:
    """Give the unnamed file ``fd`` the name ``name`` in the folder ``dir_fd``:
    ``linkat`` of ``/proc/self/fd/<fd>`` with ``AT_SYMLINK_FOLLOW`` (open(2): needs no
    privilege, unlike ``AT_EMPTY_PATH``). ``name`` must be free: nothing is replaced
    (``dir_fd`` None: ``name`` is a path).

    :raises FileExistsError: ``name`` is taken.
    :raises OSError: e.g. ``ENOENT`` where ``/proc`` is not mounted.
    """
    # a src_dir_fd (ignored by the kernel: the path is absolute) makes os.link call
    # linkat(2), which follows /proc/self/fd/<fd> (AT_SYMLINK_FOLLOW); with neither folder
    # given it calls link(2), which links the /proc link itself and fails (EXDEV)
    os.link(f"/proc/self/fd/{fd}", name, src_dir_fd=fd, dst_dir_fd=dir_fd, follow_symlinks=True)


def fill(
    fd: int,
    dir_fd: int | None,
    name: str | Path,
    write: Callable[[int], object],
    mode: int,
    sync: bool,
) -> bool:
    """Write the unnamed file ``fd`` (``write(fd)``), give it ``mode`` whatever the umask
    (fsync it when ``sync``), then name it ``name`` in the folder ``dir_fd``
    (:func:`name_as`); ``fd`` is closed either way. False when it could not be named — its
    bytes go with it, and the caller writes a named temp file instead.

    :raises OSError: the write failed (e.g. ``ENOSPC``): nothing is left.
    """
    try:
        write(fd)
        os.fchmod(fd, mode)
        if sync:
            os.fsync(fd)
        try:
            name_as(fd, dir_fd, name)
        except OSError:
            return False
        return True
    finally:
        os.close(fd)


def discard(fd: int | None) -> None:
    """Close the unnamed file ``fd`` unused (None: nothing): the kernel frees it."""
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


class Reserved:
    """Unnamed files made ahead for one publish into the folder ``dir_fd``, by the name of
    the part each is for. :meth:`take` hands one over (its new owner closes it); every one
    not taken is closed by :meth:`close` — never named, so nothing of it is left.

    :param dir_fd: the folder they are made in (an entry lock's open chip folder: it stays
        open while the lock, and so this reservation, is held).
    """

    def __init__(self, dir_fd: int | None) -> None:
        self.dir_fd = dir_fd
        self._fds: dict[str, int] = {}

    def make(self, names: list[str]) -> None:
        """Make one unnamed file for each of ``names`` (none where :func:`make` cannot)."""
        if self.dir_fd is None:
            return
        for name in names:
            if name in self._fds:
                continue
            fd = make(self.dir_fd)
            if fd is None:
                return  # the filesystem will not: the publish writes named temps
            self._fds[name] = fd

    def take(self, name: str, dir_fd: int | None) -> int | None:
        """The file made for ``name``, if one was and ``dir_fd`` is the folder it was made
        in (else None: the part is written to a named temp). The caller closes it."""
        if dir_fd is None or dir_fd != self.dir_fd:
            return None
        return self._fds.pop(name, None)

    def close(self) -> None:
        """Close every file not taken (idempotent): the kernel frees them."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            discard(fd)
