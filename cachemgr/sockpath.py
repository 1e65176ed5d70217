"""Where the daemon's Unix socket is by default, as plain strings on ``os`` alone
(docs/daemon.md): ``$CACHEMGR_SOCKET``, else ``cachemgr.sock`` in ``$RUNTIME_DIRECTORY``
(systemd), ``$XDG_RUNTIME_DIR/cachemgr`` or ``/tmp/cachemgr-<uid>``.

:mod:`cachemgr.client` builds its ``Path`` values from these; the start-up fast path of
``stats`` (:mod:`cachemgr.localstats`) asks them without importing the client.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: typing costs start-up
    from collections.abc import Mapping

#: The socket's file name in the runtime folder.
SOCKET_NAME = "cachemgr.sock"


def runtime_dir(env: Mapping[str, str]) -> str:
    """Folder of the daemon's socket: ``$RUNTIME_DIRECTORY`` (its first entry) under systemd,
    else ``$XDG_RUNTIME_DIR/cachemgr``, else ``/tmp/cachemgr-<uid>``."""
    if env.get("RUNTIME_DIRECTORY"):
        return env["RUNTIME_DIRECTORY"].split(":")[0]
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], "cachemgr")
    return f"/tmp/cachemgr-{os.getuid()}"


def default_socket(env: Mapping[str, str]) -> str:
    """``$CACHEMGR_SOCKET``, else ``<runtime dir>/cachemgr.sock`` (:func:`runtime_dir`)."""
    if env.get("CACHEMGR_SOCKET"):
        return env["CACHEMGR_SOCKET"]
    return os.path.join(runtime_dir(env), SOCKET_NAME)
