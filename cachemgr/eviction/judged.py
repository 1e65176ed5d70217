"""Main jsons judged before (docs/eviction.md#cost): a record, per chip folder, of the main
jsons a gc read and found plainly free of the shapes that make GE abort
(:func:`cachemgr.eviction.fatalscan.plainly_not_fatal`), so that the next gc of that folder
reads only the main jsons that are new or may have changed.

A judgment is used again only when nobody but this user and root can have changed the json's
bytes since, as the scan's ``lstat`` of it shows (no extra system call):

* the file is this user's (``st_uid`` is the effective uid) and neither its group nor others
  may write it (``st_mode & 0o022 == 0``; with an ACL the group bits are its mask, which
  bounds every named entry): only its owner and root may write it or ``chmod`` it. A
  writer who may write the file but does not own it could otherwise change its bytes under
  an unchanged modification time: a ``write`` stamps the time before it copies the bytes,
  and a writer can stall the copy (its buffer mapped from a file of its own FUSE mount);
* it is the file judged, unchanged: the same inode, size and modification time (ns). A
  write sets the modification time to now; a publish renames a new file (a new inode) into
  place; only the owner or root can set an older time back (``utimensat(2)``);
* it was judged after its last write was over: its modification time is more than
  :data:`SETTLED_NS` older than a change the scan had already seen in that folder (the
  folder's own ctime, and the ctime of every json listed up to it), which the file system
  stamped with the same clock as the file's — on NFS the server's, never this host's.

Any other json (a member's, a group-writable one such as the ``0660`` files cachemgr
publishes into a shared cache) is read at every gc, as before. The record is this user's own
file (``$XDG_CACHE_HOME/cachemgr/judged/``, docs/design.md#the-users-own-files): never in the
shared cache, so a member can neither write nor plant one; it is tied to the chip folder
(path, device, inode), to the rules (a digest of :mod:`cachemgr.storage.gefatal` and
:mod:`cachemgr.eviction.fatalscan`) and to the Python that hashed its keys; anything that
does not match is ignored. What the record does not cover: root or this user rewriting a
json in place and setting its old modification time back, or the file system's clock
stepping back past a recorded time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from array import array
from pathlib import Path

from cachemgr.eviction import fatalscan
from cachemgr.storage import gefatal, secretfile

log = logging.getLogger(__name__)

#: A json's last write must be this much older than a change the scan saw before the read
#: (ns): a write of at most ``entry.MAX_JSON_BYTES`` by this user's own writers is over by then.
SETTLED_NS = 2 * 10**9
#: The most keys one record holds (8 bytes each on disk, ~64 in memory while a gc runs):
#: the jsons of a larger folder past this many are read at every gc (docs/eviction.md#memory).
MAX_KEYS = 1 << 18
#: Bump when the record's format or meaning changes (an old record is then ignored).
FORMAT = 1
_HEADER_MAX = 4096


def record_dir() -> Path:
    """``$XDG_CACHE_HOME/cachemgr/judged`` (default ``~/.cache/cachemgr/judged``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cachemgr" / "judged"


def _rules() -> str:
    """A digest of the code that judges a json (a record made by other rules is ignored)."""
    digest = hashlib.sha256(str(FORMAT).encode())
    for module in (gefatal, fatalscan):
        try:
            digest.update(Path(str(module.__file__)).read_bytes())
        except OSError:
            digest.update(str(module.__name__).encode())
    return digest.hexdigest()


def _key(st: os.stat_result) -> int:
    """The 64-bit key of a json's inode, size and modification time (Python's hash of a
    tuple of ints is not salted: the same in every process of one Python version)."""
    return hash((st.st_ino, st.st_size, st.st_mtime_ns))


class JudgedRecord:
    """The record of one chip folder: the keys a previous gc left (:meth:`known`) and those
    this gc judged again (:meth:`keep`), written back by :meth:`save`."""

    def __init__(self, path: Path, header: dict[str, object], old: set[int]) -> None:
        self.path = path
        self.header = header
        self._old = old
        self._new = array("q")
        self._uid = os.geteuid()
        self.reused = 0  # jsons not read because the record knew them

    @classmethod
    def open(cls, chip_dir: Path, chip_fd: int) -> JudgedRecord:
        """The record of the chip folder ``chip_dir`` (open as ``chip_fd``): its previous
        keys when a private, matching record is there, none otherwise."""
        st = os.fstat(chip_fd)
        ident = f"{chip_dir}\0{st.st_dev}\0{st.st_ino}".encode("utf-8", "surrogateescape")
        path = record_dir() / (hashlib.sha256(ident).hexdigest()[:32] + ".keys")
        header: dict[str, object] = {
            "format": FORMAT,
            "chip_dir": str(chip_dir),
            "dev": st.st_dev,
            "ino": st.st_ino,
            "rules": _rules(),
            "python": list(sys.version_info[:2]),
            "hash": sys.hash_info.algorithm,
        }
        return cls(path, header, _load(path, header))

    def trusted(self, st: os.stat_result) -> bool:
        """Can only this user (or root) have written the file ``st`` describes?"""
        return st.st_uid == self._uid and not st.st_mode & 0o022

    def known(self, st: os.stat_result) -> bool:
        """Was the json ``st`` describes judged plainly not fatal, unchanged since, by a
        previous gc? (It is then kept for the next one.)"""
        if not self._old or not self.trusted(st):
            return False
        key = _key(st)
        if key not in self._old:
            return False
        self.reused += 1
        if len(self._new) < MAX_KEYS:
            self._new.append(key)
        return True

    def keep(self, st: os.stat_result, seen_ns: int) -> None:
        """Record the json ``st`` describes, just read and judged plainly not fatal, when it
        is trusted and its last write was over well before ``seen_ns`` (the latest change
        stamp the scan had seen before reading it)."""
        if len(self._new) < MAX_KEYS and self.trusted(st) and st.st_mtime_ns < seen_ns - SETTLED_NS:
            self._new.append(_key(st))

    def save(self) -> None:
        """Write the keys kept by this gc as the record for the next one (a record that
        cannot be written only costs the next gc its reads: one debug line)."""
        header = dict(self.header, keys=len(self._new))
        data = json.dumps(header, sort_keys=True).encode() + b"\n" + self._new.tobytes()
        try:
            secretfile.write_own(self.path, data)
        except OSError as exc:
            log.debug("cannot save the record of judged jsons %s: %s", self.path, exc)


def _load(path: Path, header: dict[str, object]) -> set[int]:
    """The keys of the record at ``path`` when it is private (``secretfile.read_own``) and
    its header is ``header``; empty otherwise."""
    raw = secretfile.read_own_or_none(path, MAX_KEYS * 8 + _HEADER_MAX, log)
    if raw is None:
        return set()
    head, sep, body = raw.partition(b"\n")
    try:
        found = json.loads(head) if sep else None
    except ValueError:
        found = None
    if not isinstance(found, dict) or found.pop("keys", None) != len(body) // 8:
        return set()
    if found != header or len(body) % 8:
        log.debug("ignoring %s: made for another folder, rules or Python", path)
        return set()
    keys = array("q")
    keys.frombytes(body)
    return set(keys)
