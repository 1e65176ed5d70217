"""Temp files and atomic writes (layer 0).

Writes go to a unique ``*.temp`` name in the destination folder (:func:`temp_path`,
:func:`write_temp`) and are ``rename()``-d into place (:func:`publish_temp`,
:func:`atomic_write_bytes`; docs/design.md#writing-and-reading-an-entry), so a reader sees
either nothing or a whole file; a temp name says which process wrote it
(:func:`temp_writer`, :func:`temp_writer_dead`).
"""

from __future__ import annotations

import os
from pathlib import Path

from cachemgr.constants import short_host
from cachemgr.storage import madeahead
from cachemgr.storage.kinds import at
from cachemgr.storage.modes import _folder_mode, file_mode_in
from cachemgr.storage.remove import safe_unlink

#: Suffix of a write in progress (docs/design.md#files-of-an-entry).
TEMP_SUFFIX = ".temp"


def temp_path(dest: Path) -> Path:
    """Return a unique temp name beside ``dest``: ``<dest name>.<host>.<pid>.<random>.temp``.

    The host and pid make a leftover attributable; the random part makes concurrent writers
    in one process distinct.
    """
    token = os.urandom(4).hex()  # as secrets.token_hex(4), without importing secrets
    return dest.with_name(f"{dest.name}.{short_host()}.{os.getpid()}.{token}{TEMP_SUFFIX}")


def temp_writer(name: str) -> tuple[str, int] | None:
    """``(host, pid)`` of the process that made temp file ``name`` (see :func:`temp_path`), or
    None when the name is not of that shape (e.g. a CANN writer's own ``*.temp``)."""
    if not name.endswith(TEMP_SUFFIX):
        return None
    parts = name[: -len(TEMP_SUFFIX)].rsplit(".", 3)
    if len(parts) != 4 or not parts[2].isdigit() or len(parts[3]) != 8:
        return None
    return parts[1], int(parts[2])


def temp_writer_dead(name: str) -> bool:
    """True when temp file ``name`` was made by a process of *this* host that no longer runs:
    a write that can never finish (a ``kill -9`` mid-publish), reclaimable at once whatever
    its age. Temps of other hosts, of live pids, or of unknown shape give False
    (the one-hour rule of docs/design.md#size-limits-and-eviction applies to them)."""
    writer = temp_writer(name)
    if writer is None or writer[0] != short_host():
        return False
    return not pid_alive(writer[1])


def pid_alive(pid: int) -> bool:
    """True when a process ``pid`` exists on this host (``EPERM``: it exists, not ours)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_temp(
    dest: Path,
    data: bytes,
    mode: int | None = None,
    dir_fd: int | None = None,
    sync: bool = True,
    made: int | None = None,
) -> Path:
    """Write ``data`` to a fresh temp file beside ``dest``, fsync it (unless ``sync`` is
    False), and return its path.

    :param mode: the file's mode whatever the umask; default the shared mode of its
        folder (:func:`file_mode_in`: ``0664``, or ``0660`` where others may not read it).

    The caller renames it into place (see :func:`publish_temp`). On any error the temp file
    is removed before the error propagates.

    :param dir_fd: the open folder of ``dest`` (every call is then relative to it).
    :param sync: fsync before returning. Cache entries pass False: every hit verifies their
        sha256, so a file a power loss left torn is a miss, never served
        (docs/compiling.md, "Durability").
    :param made: an unnamed file made ahead in that folder (:func:`.madeahead.make`), taken
        over (closed here): the bytes go to it and it gets the temp name, instead of a file
        made now; where it cannot be named, a temp file is made as without it.
    :raises OSError: on write failure (e.g. ``ENOSPC``); nothing is left behind.
    """
    tmp = temp_path(dest)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        if mode is None:
            mode = file_mode_in(_folder_mode(dest, dir_fd))
    except OSError as exc:
        madeahead.discard(made)
        exc.filename = str(tmp)  # the full name for messages
        raise
    if made is not None and madeahead.fill(
        made, dir_fd, at(tmp, dir_fd), lambda fd: write_all(fd, data), mode, sync
    ):
        return tmp  # its bytes written to the file made ahead, now named
    try:
        fd = os.open(at(tmp, dir_fd), flags, mode, dir_fd=dir_fd)
    except OSError as exc:
        exc.filename = str(tmp)  # the full name for messages
        raise
    try:
        try:
            write_all(fd, data)
            # umask 002 style whatever the caller's umask (docs/design.md#sharing-and-locking)
            os.fchmod(fd, mode)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        safe_unlink(tmp, dir_fd=dir_fd)
        raise
    return tmp


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``.

    :raises OSError: the write failed (e.g. ``ENOSPC``).
    """
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def publish_temp(tmp: Path, dest: Path, dir_fd: int | None = None) -> None:
    """Atomically move a temp file written by :func:`write_temp` to ``dest``.

    :param dir_fd: the open folder of both (``renameat``).
    :raises OSError: if the rename fails; the temp file is removed first.
    """
    try:
        os.rename(at(tmp, dir_fd), at(dest, dir_fd), src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        safe_unlink(tmp, dir_fd=dir_fd)
        raise


def atomic_write_bytes(
    dest: Path, data: bytes, mode: int | None = None, dir_fd: int | None = None, sync: bool = True
) -> None:
    """Write ``data`` to ``dest`` atomically (temp file in the same folder, then rename).

    :param mode: see :func:`write_temp` (default: the folder's shared file mode).

    :param dir_fd: the open folder of ``dest`` (see :mod:`cachemgr.storage.safedir`).
    :param sync: fsync the data before the rename (see :func:`write_temp`).
    :raises OSError: on failure; ``dest`` is unchanged and no temp file is left.
    """
    publish_temp(write_temp(dest, data, mode, dir_fd, sync), dest, dir_fd)
