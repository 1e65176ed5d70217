"""The client authenticates the daemon before it sends anything.

A Unix socket is only as trustworthy as the folder it sits in: whoever may create names in
that folder may put a fake daemon there, which would receive the caller's requests and answer
"hit" with its own files. The default fallback ``/tmp/cachemgr-<uid>`` is such a name anyone
can create first. So a client connects only when:

* the socket's folder belongs to a trusted user and others cannot replace names in it: not
  writable by group or others, unless it is sticky (``/tmp``-like: a name is replaced only by
  its owner);
* the socket file is a socket, not a symbolic link to one (its target's folder would go
  unchecked), and belongs to a trusted user;
* after connecting, the process that serves it is a trusted user (``SO_PEERCRED``), which
  closes the race between the checks and ``connect``.

Trusted users: the caller itself, root, and the daemon's user when one is named —
``Client(daemon_user=…)``, ``$CACHEMGR_DAEMON_USER``, or ``[daemon] user`` of the config
file for the CLI (the README's deployment: the daemon runs as ``cachemgr``).
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Mapping
from pathlib import Path

from cachemgr import peer
from cachemgr.errors import CacheMgrError
from cachemgr.sockpath import DAEMON_USER_ENV  # the variable naming the daemon's user


class UntrustedDaemon(CacheMgrError):
    """The socket, its folder or the process behind it belongs to a user the client does not
    trust: nothing was sent. One line naming the path, the owner and the fix."""

    exit_code = 2


def trusted_uids(daemon_user: str | None = None, env: Mapping[str, str] | None = None) -> set[int]:
    """The caller's uid, root, and the daemon's user (``daemon_user``, else
    ``$CACHEMGR_DAEMON_USER``).

    :raises UntrustedDaemon: the named daemon user does not exist (names where it came from).
    """
    env = os.environ if env is None else env
    uids = {os.getuid(), 0}
    name, origin = daemon_user, "daemon_user"
    if not name and env.get(DAEMON_USER_ENV):
        name, origin = env[DAEMON_USER_ENV], f"${DAEMON_USER_ENV}"
    if name:
        try:
            uids.add(peer.uid_of(name))
        except KeyError:
            raise UntrustedDaemon(f"{origin}={name!r}: no such user") from None
    return uids


def check_path(path: Path, uids: set[int]) -> None:
    """Check the socket's folder and file before connecting (see the module docstring).

    A missing socket is not checked here (``connect`` then says so).

    :raises UntrustedDaemon: the folder or the file belongs to another user, or the folder
        is writable by others and not sticky, or the file is a symbolic link (not followed:
        its target's folder is not the one checked) or not a socket.
    """
    folder = path.parent
    try:
        dst = os.stat(folder)
    except FileNotFoundError:
        return
    if dst.st_uid not in uids:  # its owner or root may remove it, not the caller (sticky /tmp)
        owner = peer.user_name(dst.st_uid)
        # root may remove it itself; anyone else asks its owner or root (sticky /tmp)
        remove = "remove it" if os.geteuid() == 0 else f"ask {owner} or root to remove it"
        raise UntrustedDaemon(
            f"refusing daemon socket {path}: its folder {folder} belongs to {owner}, not to "
            f"you or the daemon's user; someone else may run a fake daemon there: set "
            f"{DAEMON_USER_ENV}={owner} if that user runs your daemon, else "
            f"{remove} (meanwhile: --local, or XDG_RUNTIME_DIR set to a folder of your own)"
        )
    if dst.st_mode & 0o022 and not dst.st_mode & stat.S_ISVTX:
        raise UntrustedDaemon(
            f"refusing daemon socket {path}: its folder {folder} has mode "
            f"{stat.S_IMODE(dst.st_mode):04o}, so others may replace the socket; "
            "make it 0750 or 0700"
        )
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):  # the checks above are of the link's folder, not its target's
        raise UntrustedDaemon(
            f"refusing daemon socket {path}: it is a symbolic link (to {_target(path)}), "
            "which is not followed; name the socket itself"
        )
    if not stat.S_ISSOCK(st.st_mode):
        raise UntrustedDaemon(f"refusing daemon socket {path}: it is not a socket")
    if st.st_uid not in uids:
        raise UntrustedDaemon(
            f"refusing daemon socket {path}: it belongs to {peer.user_name(st.st_uid)}, not "
            f"to you or the daemon's user; set {DAEMON_USER_ENV} if that user runs your daemon"
        )


def _target(link: Path) -> str:
    """Where the symbolic link ``link`` points, as it says (``?`` when it cannot be read)."""
    try:
        return os.readlink(link)
    except OSError:
        return "?"


def check_peer(sock: socket.socket, path: Path, uids: set[int]) -> None:
    """After ``connect``: the serving process must run as a trusted user.

    :raises UntrustedDaemon: naming the serving process's pid and user.
    """
    cred = peer.of_socket(sock)
    if cred is not None and cred.uid not in uids:
        raise UntrustedDaemon(
            f"refusing daemon socket {path}: it is served by pid {cred.pid} of "
            f"{peer.user_name(cred.uid)}, not by you or the daemon's user"
        )
