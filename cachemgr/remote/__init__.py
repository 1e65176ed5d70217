"""The remote tier: Redis and HTTP cache servers shared across sites.

:mod:`cachemgr.remote.config` reads ``[remote] storage`` (TOML), ``CACHEMGR_REMOTE_STORAGE``
and ``--remote`` into :class:`~cachemgr.remote.config.RemoteSpec` values, passwords redacted
wherever a spec is shown.
"""
