"""The daemon's state folder: ``$STATE_DIRECTORY`` (systemd ``StateDirectory=``) or the user
state dir. Counters are not kept here but in the kernel cache (:mod:`cachemgr.storage.counters`,
docs/design.md#counters); the socket's place is in :mod:`cachemgr.client`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

import platformdirs

log = logging.getLogger(__name__)


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$STATE_DIRECTORY`` under systemd, else the user state dir (``~/.local/state/cachemgr``)."""
    env = os.environ if env is None else env
    if env.get("STATE_DIRECTORY"):
        return Path(env["STATE_DIRECTORY"].split(":")[0])
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]) / "cachemgr"
    home = env.get("HOME")
    if home:
        return Path(home) / ".local" / "state" / "cachemgr"
    return Path(platformdirs.user_state_dir("cachemgr"))


def remotes_state_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the remotes' breakers leave their shared state (:mod:`cachemgr.remote.breakerfile`):
    ``<state dir>/remotes``, one user's, so runs on a host skip a failing remote together."""
    return state_dir(env) / "remotes"
