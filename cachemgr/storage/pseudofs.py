"""Pseudo filesystems (``proc``, ``sysfs``, ``cgroup2``…): the kernel's views, where no file
can be stored. A cache root named there fails on its first ``mkdir`` with a bare ``No such
file or directory: /proc/x``; :func:`pseudo_filesystem` lets the settings say instead, in
one line, which value named it and where it came from (docs/configuration.md).
"""

from __future__ import annotations

import os
from pathlib import Path

#: Filesystem types (``/proc/self/mountinfo``, ``proc(5)``) that hold no files of ours.
PSEUDO_TYPES = frozenset(
    {
        "autofs", "binfmt_misc", "bpf", "cgroup", "cgroup2", "configfs", "debugfs", "devpts",
        "efivarfs", "fusectl", "mqueue", "nsfs", "proc", "pstore", "rpc_pipefs", "securityfs",
        "selinuxfs", "sysfs", "tracefs",
    }
)  # fmt: skip

MOUNTINFO = Path("/proc/self/mountinfo")


def pseudo_filesystem(folder: Path) -> tuple[str, str] | None:
    """``(mount point, type)`` when the existing folder ``folder`` lies on a pseudo
    filesystem, else None (also when it cannot be told). One ``statvfs`` for a folder on
    storage (it has blocks); ``/proc/self/mountinfo`` is read only for one without blocks.
    """
    try:
        if os.statvfs(folder).f_blocks:
            return None
        text = MOUNTINFO.read_text(errors="replace")
    except OSError:
        return None
    real = os.path.realpath(folder)
    best: tuple[str, str] | None = None
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if not sep or len(fields) < 5 or not rest:
            continue
        point = fields[4].replace("\\040", " ").rstrip("/") or "/"
        inside = point == "/" or real == point or real.startswith(point + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, rest[0])
    return best if best is not None and best[1] in PSEUDO_TYPES else None
