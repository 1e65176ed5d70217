"""Which access-time rule the filesystem of a kernel cache follows, and what that means for
CANN GE's own eviction (docs/interop.md#ges-eviction-and-access-times).

GE's eviction (``cache/te_cache_space_manager.cc``, ``hicann/ge``
``compiler/opcompiler/op_compile_adapter/source/``) takes each main json's access time
(``GetFilesAccessTime``: ``stat``), then *reads* the json
(``TeFileUtils::GetJsonValueFromJsonFile``) to find its binary, and just before deleting an
entry checks that the access time is unchanged (``AgingCacheFileByAccessTime``:
``accessTime == mapIter->first``). Whether its own read changed it is the mount's rule
(``mount(8)``):

* ``noatime`` — reads never move access times: GE's re-check holds, GE evicts;
* ``relatime`` (Linux's default) — a read moves the access time when it is not later than the
  file's modification or change time, or a day old. A new entry (access = change time), an
  entry hit by GE or cachemgr (both set the access time with ``utime``, which sets the change
  time after it) and one untouched for a day all have it moved by GE's read, so GE evicts
  only entries last read by another program 30 min to 24 h ago: in practice nothing;
* ``strictatime`` (neither option shown) — every read moves it: GE evicts nothing;
* ``lazytime`` only delays writing the times to disk; what ``stat`` sees is the same;
* NFS — the server keeps the access times, by its own mount options, and this host caches
  attributes: whether GE's re-check holds cannot be told from the client.

cachemgr's own eviction never reads a json it does not have to (and then without moving its
access time where it may), so it keeps the cache within its limit on every one of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachemgr.storage import fsprobe, mountrule

MOUNTINFO = Path("/proc/self/mountinfo")

# The rules and their words live in mountrule (os alone), so a start-up fast path shares them.
NOATIME = mountrule.NOATIME
RELATIME = mountrule.RELATIME
STRICTATIME = mountrule.STRICTATIME
NFS = mountrule.NFS
UNKNOWN = mountrule.UNKNOWN
#: What each rule means for GE's own eviction (the words after the filesystem's name).
GE_EFFECT = mountrule.GE_EFFECT


@dataclass(frozen=True)
class CacheAtimes:
    """The access-time rule of the mount holding one kernel cache folder.

    :ivar kernel_cache_dir: the folder asked about.
    :ivar mount_point: where its filesystem is mounted ("" when not found).
    :ivar fstype: the filesystem type (``ext4``, ``tmpfs``, ``nfs4``…; "" when not found).
    :ivar rule: :data:`NOATIME`, :data:`RELATIME`, :data:`STRICTATIME`, :data:`NFS` or
        :data:`UNKNOWN`.
    :ivar lazytime: the mount has ``lazytime`` (times written to disk later; no change here).
    """

    kernel_cache_dir: Path
    mount_point: str
    fstype: str
    rule: str
    lazytime: bool = False

    @property
    def ge_effect(self) -> str:
        """What the rule means for GE's own eviction, in words."""
        return GE_EFFECT[self.rule]

    def line(self) -> str:
        """One line: ``kernel_cache on ext4 relatime: GE's own eviction removes nothing…``
        (:func:`cachemgr.storage.mountrule.line`)."""
        return mountrule.line(self.kernel_cache_dir.name, self.fstype, self.rule, self.lazytime)

    def to_json(self) -> dict[str, Any]:
        """``{kernel_cache_dir, mount_point, fstype, atime, lazytime, ge_eviction, line}``."""
        return {
            "kernel_cache_dir": str(self.kernel_cache_dir),
            "mount_point": self.mount_point,
            "fstype": self.fstype,
            "atime": self.rule,
            "lazytime": self.lazytime,
            "ge_eviction": self.ge_effect,
            "line": self.line(),
        }


def rule_of(mount: fsprobe.Mount) -> str:
    """The access-time rule of one mount from its options
    (:func:`cachemgr.storage.mountrule.rule_of`: ``noatime``, ``relatime``, else
    ``strictatime``; NFS mounts are :data:`NFS` whatever they say)."""
    return mountrule.rule_of(mount.fstype, mount.options)


def cache_atimes(kernel_cache_dir: Path, mountinfo: Path = MOUNTINFO) -> CacheAtimes:
    """The access-time rule of the mount holding ``kernel_cache_dir`` (or, when it does not
    exist yet, its nearest existing parent), from ``mountinfo``; :data:`UNKNOWN` when that
    cannot be read or names no mount holding it. Never raises."""
    kernel_cache_dir = Path(kernel_cache_dir)
    try:
        text = mountinfo.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return CacheAtimes(kernel_cache_dir, "", "", UNKNOWN)
    point, fstype, rule, lazytime = mountrule.folder_rule(str(kernel_cache_dir), text)
    return CacheAtimes(kernel_cache_dir, point, fstype, rule, lazytime)


def governed_atimes(kernel_caches: list[Path], mountinfo: Path = MOUNTINFO) -> list[CacheAtimes]:
    """:func:`cache_atimes` of each governed kernel cache, in the order given."""
    return [cache_atimes(kc, mountinfo) for kc in kernel_caches]
