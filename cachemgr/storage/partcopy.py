"""Copying a compiled file into a chip folder in chunks, hashing it on the way.

A compiled kernel may be large (a member's source with a big initialised array compiles to a
900 MB object). Read whole, each publish held it in the daemon's memory (once to hash, once
to write); here a file goes to its temp name beside its final name in chunks of
:data:`cachemgr.storage.fsutil.READ_CHUNK_BYTES`, and its SHA-256 is computed from the very
bytes written, so what is published is what was checked (docs/daemon.md, "Bounded memory").
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path
from typing import NamedTuple

from cachemgr.storage import fsutil, madeahead


class Copied(NamedTuple):
    """A file copied to a temp name: the temp's path, the hex SHA-256 and size (bytes) of
    the bytes written."""

    tmp: Path
    sha256: str
    size: int


def source_size(src: Path) -> int:
    """The size (bytes) of a file to be copied, not following a link.

    :raises OSError: it is gone or not a regular file (``EINVAL``).
    """
    st = os.lstat(src)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", str(src))
    return st.st_size


def copy_temp(
    dest: Path,
    src: Path,
    mode: int | None = None,
    dir_fd: int | None = None,
    sync: bool = False,
    made: int | None = None,
) -> Copied:
    """Copy the regular file ``src`` (never a link: ``O_NOFOLLOW``) to a fresh temp name
    beside ``dest`` in chunks, hashing what is written; the caller renames the temp into
    place (:func:`cachemgr.storage.fsutil.publish_temp`) once the digest is the one wanted.

    :param mode: the temp's mode whatever the umask; default the shared mode of its folder
        (:func:`cachemgr.storage.fsutil.file_mode_in`: ``0660`` under a ``2770`` folder).
    :param dir_fd: the open folder of ``dest`` (every call is then relative to it).
    :param sync: fsync the temp before returning (cache entries do not: a hit verifies).
    :param made: an unnamed file made ahead in that folder (:func:`.madeahead.make`), taken
        over (closed here): the copy goes to it and it gets the temp name, instead of a file
        made now; where it cannot be named, a temp file is made as without it.
    :raises OSError: ``src`` cannot be read, or the temp cannot be written (e.g.
        ``ENOSPC``); no temp file is left behind.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        try:  # a copy is not a use: the access time stays where the owner may keep it
            src_fd = os.open(src, flags | getattr(os, "O_NOATIME", 0))
        except PermissionError:
            src_fd = os.open(src, flags)
    except BaseException:
        madeahead.discard(made)
        raise
    try:
        if not stat.S_ISREG(os.fstat(src_fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(src))
        if mode is None:
            mode = fsutil.file_mode_for(dest, dir_fd)
        if made is not None:
            taken, made = made, None
            copied = _copy_made(dest, src_fd, mode, dir_fd, sync, taken)
            if copied is not None:
                return copied
            os.lseek(src_fd, 0, os.SEEK_SET)  # not named: copied again to a named temp
        return _copy_fd(dest, src_fd, mode, dir_fd, sync)
    finally:
        madeahead.discard(made)
        os.close(src_fd)


def _copy_made(
    dest: Path, src_fd: int, mode: int, dir_fd: int | None, sync: bool, made: int
) -> Copied | None:
    """The copy into the unnamed file ``made``, named with a temp name beside ``dest``
    (:func:`cachemgr.storage.madeahead.fill`; ``made`` closed), or None when it could not be
    named."""
    tmp = fsutil.temp_path(dest)
    copied: list[tuple[str, int]] = []
    if madeahead.fill(
        made, dir_fd, fsutil.at(tmp, dir_fd), lambda out: copied.append(_copy(src_fd, out)),
        mode, sync,
    ):  # fmt: skip
        return Copied(tmp, *copied[0])
    return None


def _copy_fd(dest: Path, src_fd: int, mode: int, dir_fd: int | None, sync: bool) -> Copied:
    tmp = fsutil.temp_path(dest)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        out = os.open(fsutil.at(tmp, dir_fd), flags, mode, dir_fd=dir_fd)
    except OSError as exc:
        exc.filename = str(tmp)  # the full name for messages
        raise
    try:
        try:
            sha256, size = _copy(src_fd, out)
            os.fchmod(out, mode)  # the group's modes whatever the caller's umask
            if sync:
                os.fsync(out)
        finally:
            os.close(out)
    except BaseException:
        fsutil.safe_unlink(tmp, dir_fd=dir_fd)
        raise
    return Copied(tmp, sha256, size)


def _copy(src_fd: int, out: int) -> tuple[str, int]:
    """Copy ``src_fd`` to ``out`` in chunks from where each stands: the hex SHA-256 and
    size (bytes) of what was written.

    :raises OSError: a read or write failed.
    """
    digest, size = hashlib.sha256(), 0
    while chunk := os.read(src_fd, fsutil.READ_CHUNK_BYTES):
        digest.update(chunk)
        size += len(chunk)
        fsutil.write_all(out, chunk)
    return digest.hexdigest(), size
