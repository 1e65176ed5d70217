"""One chip folder's entries, bytes and main-json access-time range, counted as it is listed,
on the standard library's ``os`` alone (docs/design.md#files-of-an-entry,
#size-limits-and-eviction; docs/commands.md#what-stats-counts).

Every rule here exists once: :mod:`cachemgr.eviction.usage` (``stats`` and ``limits`` of the
full CLI and the daemon) counts with :func:`usage_stream` and words access times with
:func:`iso`; :mod:`cachemgr.storage.kinds` takes the two name rules from here — so that a
start-up fast path may count the same without importing ``pathlib``, ``dataclasses``,
``datetime`` or ``typing`` (each costs start-up: docs/performance.md).
"""

from __future__ import annotations

import os
import stat
import time

#: Names NFS clients give to removed files still open somewhere
#: (docs/design.md#sharing-and-locking): never ours to remove or report; they go when the last
#: descriptor closes.
NFS_SILLY_PREFIX = ".nfs"

#: Suffixes (before ``.json``) of files that belong to the kernel named before them. ``_pre``
#: is not one: a ``<name>_pre.json`` is an entry of its own (docs/design.md#files-of-an-entry).
PART_STEM_SUFFIXES = ("_mix_aic", "_mix_aiv", "_loc", "_compute")


def usage_stream(dir_fd: int) -> tuple[int, int, int | None, int | None]:
    """Entries, apparent bytes and the oldest/newest main-json access time (ns) of the open
    chip folder ``dir_fd``, counted as it is listed: nothing per file is kept (the daemon
    answers ``stats`` for 1,000,000 entries without ~1 GB of scan objects). No file is opened
    and no access time moved.

    The same rules as ``entry.scan_chip`` (docs/design.md#files-of-an-entry,
    #size-limits-and-eviction): regular files with one link (or NFS's ``.nfs*`` names) count; a
    ``<stem>.json`` is an entry unless its stem is a part suffix away from another such json
    (``<kernel>_mix_aic.json`` beside ``<kernel>.json``), which costs one ``lstat`` per
    part-like json.

    :raises OSError: the folder cannot be listed.
    """
    entries = used = 0
    oldest: int | None = None
    newest: int | None = None
    with os.scandir(dir_fd) as it:
        for de in it:
            try:
                if not de.is_file(follow_symlinks=False):
                    continue
                st = de.stat(follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile, or unreadable: scan_chip counts neither
            name = de.name
            if not counted(name, st):
                continue
            used += st.st_size
            if not name.endswith(".json") or is_part_json(dir_fd, name[: -len(".json")]):
                continue
            entries += 1
            atime = st.st_atime_ns
            oldest = atime if oldest is None or atime < oldest else oldest
            newest = atime if newest is None or atime > newest else newest
    return entries, used, oldest, newest


def counted(name: str, st: os.stat_result) -> bool:
    """A file ``scan_chip`` counts: one link, or an NFS ``.nfs*`` name (security.md item 2)."""
    return st.st_nlink <= 1 or name.startswith(NFS_SILLY_PREFIX)


def counted_file(name: str, st: os.stat_result) -> bool:
    """``st`` (an ``lstat``) is a regular file ``scan_chip`` counts (:func:`counted`): what
    a caller that has not yet checked the type asks."""
    return stat.S_ISREG(st.st_mode) and counted(name, st)


def is_part_json(dir_fd: int, stem: str) -> bool:
    """True when ``<stem>.json`` is a sub-part of an entry whose main json is present."""
    for suffix in PART_STEM_SUFFIXES:
        if not stem.endswith(suffix):
            continue
        main = stem[: -len(suffix)] + ".json"
        try:
            st = os.lstat(main, dir_fd=dir_fd)
        except OSError:
            continue
        if counted_file(main, st):
            return True
    return False


def iso(ns: int | None) -> str | None:
    """An access time (ns since the epoch) as ISO 8601 UTC to the second
    (``2026-12-02T04:33:23+00:00``), as ``datetime.fromtimestamp(ns / 1e9, UTC)
    .isoformat(timespec="seconds")`` gives it (the float's microseconds rounded half to even,
    then cut to the second); None for None."""
    if ns is None:
        return None
    whole, frac = divmod(ns / 1e9, 1.0)
    seconds = int(whole) + (round(frac * 1e6) >= 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(seconds))
