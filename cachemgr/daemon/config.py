"""The daemon's own settings: the ``[daemon]`` table of the config file (see
``config/cachemgr.toml``). The model lives with the other tables' in
:mod:`cachemgr.config.configfile` (one schema for the whole file)."""

from __future__ import annotations

from cachemgr.config.configfile import LOCK_FALLBACKS, DaemonConfig

__all__ = ["LOCK_FALLBACKS", "DaemonConfig"]
