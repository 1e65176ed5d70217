"""Removing files of a chip folder the way SPEC §5 asks: whole entries, json first; files that
are already gone are normal; a file we may not remove is reported and the run goes on."""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from cachemgr import fsutil
from cachemgr.entry import EntryGroup
from cachemgr.safedir import SafeDir

log = logging.getLogger(__name__)

#: errno values meaning "not ours to remove now": skip the file, report it, go on (EBUSY:
#: an NFS server refusing to remove a file another host holds open, SPEC §9).
DENIED_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.EBUSY})
#: Names NFS clients give to removed files still open somewhere; they go by themselves.
NFS_SILLY_PREFIX = ".nfs"


@dataclass
class Removal:
    """What one removal did: files and bytes removed by this call, files refused.

    ``denied`` holds ``"<name>: <reason>"`` lines; ``json_gone`` tells whether the entry's
    main json is gone afterwards (removed by us or by someone else).
    """

    files: int = 0
    bytes: int = 0
    denied: list[str] = field(default_factory=list)
    json_gone: bool = True


def deletion_order(group: EntryGroup) -> list[str]:
    """An entry's file names in SPEC §5's deletion order: the main json first (a visible json
    means a complete entry, so it must go first), then binaries and header, then the
    sub-jsons and ``_pre.json``."""
    main = group.json_name
    rest = sorted(n for n in group.files if n != main)
    return [
        main,
        *(n for n in rest if not n.endswith(".json")),
        *(n for n in rest if n.endswith(".json")),
    ]


def denied_line(name: str, exc: OSError) -> str:
    """``"<name>: <strerror>"`` for a file that could not be removed."""
    return f"{name}: {exc.strerror or exc}"


def unlink_quiet(chip_fd: int, name: str) -> bool:
    """Remove ``name`` relative to the chip folder's descriptor; False when already gone.

    :raises OSError: anything but ENOENT/ESTALE (e.g. ``EPERM`` for an immutable file,
        ``EISDIR`` for a folder).
    """
    try:
        os.unlink(name, dir_fd=chip_fd)
    except OSError as exc:
        if exc.errno in fsutil.GONE_ERRNOS:
            return False
        raise
    return True


def remove_group(chip_fd: int, group: EntryGroup) -> Removal:
    """Remove an entry's files json first. A refused json stops the entry (nothing else is
    removed, so the entry stays whole); a refused part is reported and the rest goes on.

    The caller holds the entry's lock if it has one and re-checked the access time.
    """
    out = Removal()
    for name in deletion_order(group):
        try:
            if unlink_quiet(chip_fd, name):
                out.files += 1
                out.bytes += group.files[name].size
        except OSError as exc:
            if exc.errno not in DENIED_ERRNOS and exc.errno != errno.EISDIR:
                raise
            out.denied.append(denied_line(name, exc))
            if name == group.json_name:
                out.json_gone = False
                return out
    return out


def reap_lock(path: Path, chip_fd: int | None = None) -> bool:
    """Remove a lock file nobody holds: take it without waiting, then unlink it while held
    (``FcntlLock.release(unlink=True)``; waiters on the old inode retry on a new file).
    A link or special file planted under the name is removed without being opened.

    :param chip_fd: the open chip folder of ``path``.
    :returns: True if removed, False when someone holds it.
    :raises OSError: when the lock file cannot be opened (e.g. ``EACCES``).
    """
    lock = fsutil.FcntlLock(path, chip_fd)
    if not lock.acquire(blocking=False):
        return False
    lock.release(unlink=True)
    return True


def open_dir(chip_dir: Path) -> int:
    """A read-only descriptor of a chip folder, for ``*at()`` calls, reached from the cache
    root without following a link at any step (docs/security.md item 1); the caller closes it.

    :raises UnsafePathError: ``kernel_cache`` or the chip folder is a symbolic link.
    :raises OSError: ``ENOENT`` when missing, ``EACCES``.
    """
    return SafeDir.open_chip(chip_dir).fd  # the caller owns (and closes) the descriptor
