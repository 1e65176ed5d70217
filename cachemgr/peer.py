"""Who is on the other end of a Unix socket: ``SO_PEERCRED`` (pid, uid, gid), as the kernel
recorded it when the peer called ``connect``/``listen``.

The daemon identifies every caller this way (logged with each compile, used for per-caller
limits); the client checks that the process serving a socket is the user it expects. The
values cannot be forged by the peer (see unix(7), ``SO_PEERCRED``). The one place they are
read (the daemon's per-request caller, :mod:`cachemgr.daemon.peer`, is built from
:func:`of_socket`), and the one place uids and gids become names.
"""

from __future__ import annotations

import grp
import os
import pwd
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: fsutil imports this module for the names
    import socket

_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}


@dataclass(frozen=True)
class Peer:
    """The credentials of a connected peer process."""

    pid: int
    uid: int
    gid: int

    def describe(self) -> str:
        """``pid 123 uid 1001 (alice) gid 1001 (ascend)`` for logs."""
        return (
            f"pid {self.pid} uid {self.uid} ({user_name(self.uid)}) "
            f"gid {self.gid} ({group_name(self.gid)})"
        )


def of_socket(sock: socket.socket) -> Peer | None:
    """The peer's credentials for a connected ``AF_UNIX`` socket; None for other families.

    :raises OSError: the socket is closed or not connected.
    """
    import socket

    if sock.family != socket.AF_UNIX:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return Peer(*_UCRED.unpack(raw))


def user_name(uid: int | None = None) -> str:
    """The user name of ``uid`` (default: this process's effective user), or the number as
    text when it has none."""
    uid = os.geteuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid: int) -> str:
    """The group name of ``gid``, or the number as text when it has none."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def uid_of(user: str) -> int:
    """The uid of a user name (or of a number given as text).

    :raises KeyError: no such user.
    """
    if user.isdigit():
        return int(user)
    return pwd.getpwnam(user).pw_uid
