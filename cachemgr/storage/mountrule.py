"""Which mount holds a folder and which access-time rule it follows, from
``/proc/self/mountinfo`` text, on the standard library's ``os`` alone
(docs/interop.md#ges-eviction-and-access-times; ``proc(5)`` for the format).

Every rule here exists once: :mod:`cachemgr.storage.fsprobe` builds its ``Mount`` values
from :func:`parse` and picks one with :func:`best_mount`; :mod:`cachemgr.storage.atimes`
takes the rule (:func:`rule_of`), the nearest existing folder (:func:`existing`) and the
words of its report (:data:`GE_EFFECT`, :func:`line`) from here — so that a start-up fast
path may say the same without importing ``pathlib``, ``dataclasses`` or ``typing`` (each
costs start-up: docs/performance.md). Mounts are plain ``(mount_point, fstype, options)``
tuples.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: typing costs start-up
    from collections.abc import Sequence

#: The mounts of this process (``proc(5)``).
MOUNTINFO = "/proc/self/mountinfo"
#: One mount: where it is mounted, its filesystem type, its options (mount and superblock).
MountTuple = tuple[str, str, tuple[str, ...]]

NOATIME = "noatime"
RELATIME = "relatime"
STRICTATIME = "strictatime"
NFS = "nfs"
UNKNOWN = "unknown"

#: What each rule means for GE's own eviction (the words after the filesystem's name).
GE_EFFECT = {
    NOATIME: "reads leave access times alone, so GE's own eviction works here too",
    RELATIME: (
        "GE's own eviction removes nothing here (its scan reads each json, which moves the "
        "access time it then finds changed), except entries last read by another program "
        "30 min to 24 h ago; cachemgr keeps it within its limit"
    ),
    STRICTATIME: (
        "GE's own eviction removes nothing here (its scan reads each json, which moves the "
        "access time it then finds changed); cachemgr keeps it within its limit"
    ),
    NFS: (
        "access times follow the NFS server's mount options and this host's attribute cache, "
        "so whether GE's own eviction removes anything cannot be told here; cachemgr keeps "
        "it within its limit"
    ),
    UNKNOWN: (
        "its mount is not in /proc/self/mountinfo, so what GE's own eviction does here is "
        "unknown; cachemgr keeps it within its limit"
    ),
}


def parse(text: str) -> list[MountTuple]:
    """The mounts of a ``/proc/<pid>/mountinfo`` text (``proc(5)``); malformed lines skipped.

    Options are the mount's and the superblock's together (NFS puts ``local_lock=`` in the
    latter). Octal escapes in mount points (``\\040`` for a space) are decoded.
    """
    mounts = []
    for text_line in text.splitlines():
        left, sep, right = text_line.partition(" - ")
        fields, rest = left.split(), right.split()
        if not sep or len(fields) < 6 or len(rest) < 3:
            continue
        opts = tuple(fields[5].split(",") + rest[2].split(","))
        mounts.append((_unescape(fields[4]), rest[0], opts))
    return mounts


def _unescape(field: str) -> str:
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def best_mount(path: str, points: Sequence[str]) -> int | None:
    """The index in ``points`` (mount points, in mountinfo's order) of the mount holding
    ``path`` (resolved): the longest mount point that contains it, the last one mounted there
    when several are; None when none does."""
    real = os.path.realpath(path)
    best: int | None = None
    best_len = -1
    for i, mount_point in enumerate(points):
        point = mount_point.rstrip("/") or "/"
        inside = real == point or real.startswith(point + "/") or point == "/"
        if inside and len(point) >= best_len:
            best, best_len = i, len(point)
    return best


def rule_of(fstype: str, options: Sequence[str]) -> str:
    """The access-time rule of one mount from its options (mount and superblock):
    ``noatime``, ``relatime``, else ``strictatime`` (the kernel shows no option for it);
    NFS mounts are :data:`NFS` whatever they say (the server decides)."""
    if fstype.startswith("nfs"):
        return NFS
    if NOATIME in options:
        return NOATIME
    if RELATIME in options:
        return RELATIME
    return STRICTATIME


def existing(path: str) -> str:
    """``path`` made absolute, or its nearest existing parent (a kernel cache not made yet is
    on its parent's filesystem)."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


def line(folder_name: str, fstype: str, rule: str, lazytime: bool) -> str:
    """One line: ``kernel_cache on ext4 relatime: GE's own eviction removes nothing…``
    (``folder_name`` is the kernel cache folder's last component)."""
    if rule == UNKNOWN:
        return f"{folder_name}: {GE_EFFECT[rule]}"
    kind = fstype if rule == NFS else f"{fstype} {rule}"
    lazy = ",lazytime" if lazytime else ""
    return f"{folder_name} on {kind}{lazy}: {GE_EFFECT[rule]}"


def folder_rule(folder: str, text: str) -> tuple[str, str, str, bool]:
    """``(mount_point, fstype, rule, lazytime)`` of the mount holding ``folder`` (or, when it
    does not exist yet, its nearest existing parent: :func:`existing`) in mountinfo ``text``;
    ``("", "", UNKNOWN, False)`` when none does."""
    mounts = parse(text)
    best = best_mount(existing(folder), [m[0] for m in mounts])
    if best is None:
        return "", "", UNKNOWN, False
    point, fstype, opts = mounts[best]
    return point, fstype, rule_of(fstype, opts), "lazytime" in opts


def mountinfo_text(path: str = MOUNTINFO) -> str:
    """The text of ``path`` (undecodable bytes kept as surrogates), "" when it cannot be
    read: :func:`folder_rule` then finds no mount (:data:`UNKNOWN`)."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except OSError:
        return ""
