"""Is the cache open to every local user? (layer 0; docs/shared-cache.md#outsiders-read-nothing)

Every binary and every json (with members' source paths) of a cache whose root is ``2775``
can be read by any local user. The documented root is ``2770`` (umask ``007``): CANN GE's own
modes (``0750`` folders, ``0640`` files) give others nothing either. ``cachemgr config`` and
``cachemgr status`` say so in one line when the kernel cache can be reached by others.

On the standard library's ``os`` (and ``stat``, which ``os`` imports) alone: the lean
``cachemgr config`` (:mod:`cachemgr.quickconfig`) says the same line from here.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: pathlib costs start-up
    from pathlib import Path

#: Where the fix is explained.
DOC = "docs/shared-cache.md#outsiders-read-nothing"


def _reachable(path: str) -> bool:
    """Can a user who is neither owner nor group member reach into ``path`` (absolute): ``o+x``
    on it and on every folder above it? (A ``0700`` home above a ``2775`` cache keeps it
    closed.)"""
    folder = path
    while True:
        try:
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        parent = os.path.dirname(folder)
        if parent == folder:
            return True
        folder = parent


def outsiders_warning(kernel_cache_dir: str | Path) -> str:
    """One line when users outside the group can reach the kernel cache (its folder, or the
    root while the kernel cache does not exist yet): the highest of the two folders that
    gives others anything, its mode and the fix; "" when it is closed to them. Never
    raises: a folder that cannot be looked at is not reported.

    :param kernel_cache_dir: ``<root>/kernel_cache`` (or ``kernel_cache_<host id>``).
    """
    kernel_cache_dir = os.fspath(kernel_cache_dir)
    root = os.path.dirname(kernel_cache_dir)
    inner = kernel_cache_dir if os.path.isdir(kernel_cache_dir) else root
    if not _reachable(inner):
        return ""
    for folder in (root, kernel_cache_dir):
        try:
            mode = os.stat(folder).st_mode
        except OSError:
            continue
        if mode & 0o005:
            how = "readable" if mode & stat.S_IROTH else "reachable"
            return (
                f"warning: {folder} is {how} by every local user (mode {stat.S_IMODE(mode):04o}):"
                f" chmod o-rwx {folder} ({DOC})"
            )
    return ""
