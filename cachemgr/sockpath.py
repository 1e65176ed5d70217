"""Where the daemon's Unix socket is by default, as plain strings on ``os`` alone
(docs/daemon.md): ``$CACHEMGR_SOCKET``, else ``cachemgr.sock`` in ``$RUNTIME_DIRECTORY``
(systemd), ``$XDG_RUNTIME_DIR/cachemgr`` or ``/tmp/cachemgr-<uid>``.

:mod:`cachemgr.client` builds its ``Path`` values from these; the start-up fast path of
``stats`` (:mod:`cachemgr.localstats`) asks them without importing the client, and both ways
of answering ``cachemgr config`` (:func:`cachemgr.console.config_report`,
:mod:`cachemgr.quickconfig`) show the socket and the daemon's user from :func:`client_rows`.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: typing costs start-up
    from collections.abc import Mapping, MutableMapping
    from typing import Any

#: The socket's file name in the runtime folder.
SOCKET_NAME = "cachemgr.sock"
#: The variables that place the socket, first that wins first (:func:`default_socket`).
SOCKET_ENV = ("CACHEMGR_SOCKET", "RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR")
#: The variable naming the daemon's user, whose socket a client trusts (docs/daemon.md).
DAEMON_USER_ENV = "CACHEMGR_DAEMON_USER"
#: ``cachemgr config``'s rows of both: the socket, and the config file's ``[daemon] user``.
SOCKET_ROW = "socket"
DAEMON_USER_ROW = "daemon.user"


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


def socket_origin(env: Mapping[str, str]) -> tuple[str, str]:
    """Where :func:`default_socket` took the socket from: ``("env", VARIABLE)``, or
    ``("default", "/tmp/cachemgr-<uid>")`` when no variable of :data:`SOCKET_ENV` is set."""
    for var in SOCKET_ENV:
        if env.get(var):
            return "env", var
    return "default", "/tmp/cachemgr-<uid>"


def client_rows(rows: MutableMapping[str, dict[str, Any]], env: Mapping[str, str]) -> None:
    """Set ``cachemgr config``'s :data:`SOCKET_ROW` (the socket a command without
    ``--socket`` asks: :func:`default_socket`) and make ``rows``' :data:`DAEMON_USER_ROW` the
    daemon user a client trusts: the config file's ``[daemon] user``, else
    ``$CACHEMGR_DAEMON_USER`` (origin ``env``), as :func:`cachemgr.sockcheck.trusted_uids`
    takes them — the README's clients set both variables (docs/daemon.md)."""
    origin, source = socket_origin(env)
    rows[SOCKET_ROW] = {"value": default_socket(env), "origin": origin, "source": source}
    named, row = env.get(DAEMON_USER_ENV), rows[DAEMON_USER_ROW]
    if named and not row["value"]:
        rows[DAEMON_USER_ROW] = {"value": named, "origin": "env", "source": DAEMON_USER_ENV}
    elif named:
        over = f"{DAEMON_USER_ENV}={named} (the config file's [daemon] user comes first)"
        row["passed_over"] = [*row.get("passed_over", ()), over]
