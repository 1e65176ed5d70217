"""Reading the request files a caller names safely; the kernel source and
its headers are read the same way by :func:`cachemgr.compile.inputs.read_input`.

A caller may name, or swap in behind a cached check, a FIFO (blocks a reader forever), a
device (never ends), a symbolic link to something else, or a huge file. So such files are
opened ``O_NONBLOCK | O_NOFOLLOW`` (the last component must not be a link: the caller's path
was resolved when it was checked), ``fstat``-ed — a regular file of at most ``max_bytes`` or
nothing is read — and read in chunks of :data:`CHUNK_BYTES`.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Read and hash in chunks of this many bytes.
CHUNK_BYTES = 1 << 20
#: Default size cap of a file named by a request (bytes): 64 MiB.
DEFAULT_MAX_BYTES = 64 << 20


class UnsafeFileError(OSError):
    """Not a regular file, a symbolic link, or over the size cap: not read. ``str()`` is one
    line naming the path and why."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


@contextmanager
def open_regular(
    path: Path | str, max_bytes: int = DEFAULT_MAX_BYTES, *, follow: bool = False
) -> Iterator[tuple[int, os.stat_result]]:
    """Open ``path`` for reading as described in the module docstring; yield ``(fd, st)``.
    ``follow``: a symbolic link as the last component is followed (a file the operator
    names, such as the config file: links are how configuration is deployed).

    :raises UnsafeFileError: a symbolic link (``ELOOP``), not a regular file (FIFO, socket,
        device, folder), or larger than ``max_bytes`` (``EFBIG``).
    :raises OSError: it cannot be opened (``ENOENT``, ``EACCES``…).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFileError(
                errno.ELOOP, "is a symbolic link; not followed", str(path)
            ) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(errno.EINVAL, f"is not a regular file ({_kind(st)})", str(path))
        if st.st_size > max_bytes:
            raise UnsafeFileError(
                errno.EFBIG, f"is {st.st_size} bytes, over the {max_bytes}-byte cap", str(path)
            )
        yield fd, st
    finally:
        os.close(fd)


def read_regular(
    path: Path | str, max_bytes: int = DEFAULT_MAX_BYTES, *, follow: bool = False
) -> bytes:
    """The content of a regular file of at most ``max_bytes`` (see :func:`open_regular`);
    a file that grew past the cap while being read is refused too.

    :raises UnsafeFileError: see :func:`open_regular`.
    :raises OSError: it cannot be opened or read.
    """
    with open_regular(path, max_bytes, follow=follow) as (fd, _):
        chunks, total = [], 0
        while chunk := os.read(fd, CHUNK_BYTES):
            total += len(chunk)
            if total > max_bytes:
                raise UnsafeFileError(errno.EFBIG, f"grew over the {max_bytes}-byte cap", str(path))
            chunks.append(chunk)
    return b"".join(chunks)


def _kind(st: os.stat_result) -> str:
    mode = st.st_mode
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a folder"),
    ):
        if test(mode):
            return name
    return f"mode {mode:o}"
