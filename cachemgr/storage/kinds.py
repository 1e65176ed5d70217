"""What a name in the cache is, looked at without opening it (layer 0): ``lstat`` that
tolerates a file already gone (:data:`GONE_ERRNOS`), the plain file (a regular file with one
name, docs/security.md item 2) and what else a name may be, the name an ``*at()`` call takes
(:func:`at`), and the errors for a file of the wrong kind.

Removing a file that is already gone (``ENOENT``) or that another NFS host holds
(``ESTALE``) is normal, never fatal (docs/design.md#size-limits-and-eviction,
#sharing-and-locking).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from cachemgr.storage import chipcount

#: Errors that mean "the file is not there any more" — normal in a shared cache.
GONE_ERRNOS = frozenset({errno.ENOENT, errno.ESTALE})


# The two name rules live in chipcount (os alone), so a start-up fast path shares them.
NFS_SILLY_PREFIX = chipcount.NFS_SILLY_PREFIX
PART_STEM_SUFFIXES = chipcount.PART_STEM_SUFFIXES


def regular_files(folder: Path | int) -> Iterator[tuple[str, os.stat_result]]:
    """Name and ``lstat`` of each regular file directly in ``folder`` (a path, or a folder's
    open descriptor); links are not followed, and a file gone meanwhile is skipped.

    :raises OSError: the folder cannot be listed.
    """
    with os.scandir(folder) as it:
        for de in it:
            try:
                st = de.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield de.name, st


def at(path: Path, dir_fd: int | None) -> str | Path:
    """What to hand an ``*at()`` call: ``path``'s last name relative to ``dir_fd`` (the open
    folder of the cache it lies in, see :mod:`cachemgr.storage.safedir`), or ``path`` itself without
    one. ``path`` stays the full name for messages."""
    return path if dir_fd is None else path.name


def real_path(path: str | os.PathLike[str]) -> str:
    """The absolute path, every link followed, of the existing file or folder ``path``, as
    the kernel resolves it: opened with ``O_PATH`` (nothing read, no access time, a FIFO
    not opened), then named through ``/proc/self/fd``. Unlike ``os.path.realpath`` and
    ``Path.resolve``, which recurse once per link in a chain (a member's chain of 1,200
    links ended them in ``RecursionError``), the kernel follows at most 40 links in a row.

    :raises OSError: ``path`` does not exist, cannot be reached, or has too many links
        (``ELOOP``).
    """
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def lstat_or_none(path: Path, dir_fd: int | None = None) -> os.stat_result | None:
    """``os.lstat`` (relative to ``dir_fd`` when given) that returns None when the file is
    gone (ENOENT/ESTALE)."""
    try:
        return os.stat(at(path, dir_fd), dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in GONE_ERRNOS:
            return None
        raise


class NotRegularFileError(OSError):
    """A FIFO, socket or device where a regular file is expected (never read: it may block
    or never end)."""


class HardLinkError(NotRegularFileError):
    """A file of the cache with more than one name (``st_nlink > 1``): it may be another
    file's content planted under a cache name, so it is never used (docs/security.md item 2)."""


def plain_file(st: os.stat_result) -> bool:
    """A regular file with one name: the only kind cachemgr opens for writing, locks or
    ``chmod``s in the cache (docs/security.md item 2)."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def kind_of(st: os.stat_result) -> str:
    """What a file that is not a plain file is, for messages (``symbolic link``, ``FIFO``,
    ``hard link (3 names)``...)."""
    if stat.S_ISREG(st.st_mode):
        return f"hard link ({st.st_nlink} names)"
    mode = st.st_mode
    for test, name in (
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "special file"
