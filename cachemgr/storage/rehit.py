"""A verified lookup of an entry that was a hit before, in few steps (layer 4, beside
:mod:`cachemgr.storage.store`).

:meth:`cachemgr.storage.store.Store.lookup` reads an entry's main json, finds its parsed
form by those bytes (``entry.plainly_good``), SHA-256-verifies every binary, looks for the
optional header and sets each file's access time. A caller that asks for the same entry
again and again (:mod:`cachemgr.localhit`) keeps what the first hit found as a
:class:`Known` and :func:`again` makes the same checks with it, in the fewest calls:

* the main json read with the same reader rules (regular file, one name, ``O_NOATIME``,
  at most :data:`cachemgr.storage.entry.MAX_JSON_BYTES`) must be byte for byte the json
  the first hit parsed — so it parses to the same entry (a json with sub-jsons is never
  kept: theirs are read every time);
* every binary read with the same rules (at most
  :data:`cachemgr.storage.entry.MAX_BINARY_BYTES`, never more than
  :data:`cachemgr.storage.noatime.READ_CHUNK_BYTES` in memory) must have the json's
  ``sha256`` and, for ``.o``/``.so``, not be empty (docs/design.md#writing-and-reading-an-entry);
* the optional header must be present exactly when it was (then the hit's files are the
  same);
* each file's access time is set to the filesystem's now (``utimensat``, mtime kept), with
  :meth:`Store.lookup`'s own handling of a file this user does not own or a read-only
  filesystem.

Everything is done relative to the open chip folder the caller passes (docs/security.md
item 1). Any difference, and any file that needs the general reader (another user's file,
a file that grew while read, a big binary), gives None: the caller then runs
:meth:`Store.lookup`, which judges and, where bad, removes the entry.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from cachemgr import direct
from cachemgr.storage import entry, noatime
from cachemgr.storage.kinds import GONE_ERRNOS
from cachemgr.storage.store import LookupResult, forget_read_only, touch_files

# the reader's flags (noatime._opened_noatime): no link followed, never blocking on a FIFO
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOATIME", 0)


class Known(NamedTuple):
    """What one verified hit of an entry found: enough to check it again."""

    chip_dir: Path
    #: the main json's name and its bytes as read on that hit
    json_name: str
    raw: bytes
    #: each binary's name, its json's ``sha256``, and whether it must not be empty
    binaries: tuple[tuple[str, str, bool], ...]
    #: the optional header's name (None: the entry names none) and whether it was there
    header: str | None
    header_present: bool
    #: the hit's files (as :meth:`Store.lookup` answered) and their names, encoded
    files: tuple[Path, ...]
    names: tuple[bytes, ...]


def known(result: LookupResult, dir_fd: int) -> Known | None:
    """The :class:`Known` of the hit ``result`` found through the chip folder ``dir_fd``:
    its main json read once more, kept when it is the json ``result`` was parsed from;
    None for a miss, an entry with sub-jsons, or one that changed meanwhile."""
    desc = result.desc
    if not result.hit or desc is None or desc.sub_jsons or not result.files:
        return None
    chip_dir = result.files[0].parent
    try:
        raw = noatime.read_bytes_noatime(
            chip_dir / desc.json_name, dir_fd, single_link=True, max_bytes=entry.MAX_JSON_BYTES
        )
    except OSError:
        return None
    if entry.remembered(result.kernel, raw) != desc:
        return None  # changed since, or too big to be remembered by its bytes
    binaries = tuple(
        (b.bin_name, b.sha256, b.bin_name.endswith(entry.KERNEL_BIN_SUFFIXES))
        for b in desc.binaries
    )
    names = tuple(os.fsencode(f.name) for f in result.files)
    present = desc.header is not None and desc.header in {f.name for f in result.files}
    return Known(
        chip_dir, desc.json_name, raw, binaries, desc.header or None, present, result.files, names
    )


def again(k: Known, dir_fd: int) -> tuple[Path, ...] | None:
    """The files of the hit ``k`` when the entry still checks as it did (module docstring),
    its access times set; None when anything differs."""
    try:
        raw = _small(k.json_name, dir_fd, entry.MAX_JSON_BYTES)
        if raw is None:
            raw = noatime.read_bytes_noatime(
                k.chip_dir / k.json_name, dir_fd, single_link=True, max_bytes=entry.MAX_JSON_BYTES
            )
        if raw != k.raw:
            return None
        for name, digest, nonempty in k.binaries:
            data = _small(name, dir_fd, entry.MAX_BINARY_BYTES)
            if data is not None:
                actual, size = hashlib.sha256(data).hexdigest(), len(data)
            else:
                actual, size = noatime.sha256_noatime(
                    k.chip_dir / name, dir_fd, single_link=True, max_bytes=entry.MAX_BINARY_BYTES
                )
            if actual != digest or (nonempty and not size):
                return None
    except OSError:
        return None
    if k.header is not None and _present(k.header, dir_fd) != k.header_present:
        return None
    _touch(k, dir_fd)
    return k.files


def _small(name: str, dir_fd: int, max_bytes: int) -> bytes | None:
    """The bytes of the small entry file ``name``, read in one ``read`` by the rules of
    :func:`cachemgr.storage.noatime.read_bytes_noatime` (``O_NOATIME``, ``single_link``,
    ``max_bytes``); None when the general reader must read it: it is not this user's (no
    ``O_NOATIME``), not a regular file of one name, at least
    :data:`~cachemgr.storage.noatime.READ_CHUNK_BYTES`, or grew since its ``fstat`` (the
    general reader then reads it, or says what is wrong with it)."""
    try:
        fd = os.open(name, _FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        size = st.st_size
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_nlink > 1
            or size > max_bytes
            or size >= noatime.READ_CHUNK_BYTES
        ):
            return None
        data = os.read(fd, size + 1)
        return data if len(data) <= size else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _present(name: str, dir_fd: int) -> bool | None:
    """Whether the optional header ``name`` is there (``lstat``, as
    :meth:`Store.lookup` looks); None when that cannot be told (then ``Store.lookup``
    says what is wrong)."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        return False if exc.errno in GONE_ERRNOS else None
    return True


@functools.cache
def _utimensat_now() -> Callable[[int, bytes], int]:
    """``utimensat(dir_fd, name, {UTIME_NOW, UTIME_OMIT}, AT_SYMLINK_NOFOLLOW)``, called as
    direct mode calls it (:func:`cachemgr.direct.utimensat_now`: without ``ctypes``' own
    argument conversion), made once."""
    call: Callable[[int, bytes], int] = direct.utimensat_now()
    return call


def _touch(k: Known, dir_fd: int) -> None:
    """Each file's access time to the filesystem's now; from the first file ``utimensat``
    refuses on, :func:`~cachemgr.storage.store.touch_files` (not the owner, read-only,
    gone: its own handling)."""
    utimensat = _utimensat_now()
    for i, name in enumerate(k.names):
        if utimensat(dir_fd, name) != 0:
            touch_files(k.chip_dir, dir_fd, k.files[i:])
            return
    forget_read_only(k.chip_dir)
