"""What a process holds open, read from ``/proc/<pid>/fd`` (Linux): for tests that wait until
a process has a folder open, or check that nothing was left open."""

from __future__ import annotations

import os


def fd_targets(pid: int | str = "self") -> list[str]:
    """The targets of process ``pid``'s open descriptors (``readlink`` of each
    ``/proc/<pid>/fd/N``: a path, ``'<path> (deleted)'`` for an unlinked or unnamed file,
    ``socket:[…]``…); empty when the process is gone or cannot be read. A descriptor closed
    while listed (the listing's own) is left out."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    found = []
    for fd in fds:
        try:
            found.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return found
