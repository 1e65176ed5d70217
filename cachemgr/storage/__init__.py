"""The cache on disk (bottom tier, beside :mod:`cachemgr.config`).

File primitives (``fsutil``, which re-exports ``kinds``, ``modes``, ``remove``, ``atomic``,
``noatime`` and ``locks``; ``safedir``, ``safeio``, ``fsprobe``, ``chiplock``), CANN's
entries (``entry``, ``manifest``), the verified store and its tiers (``store``, ``tiers``),
and what the cache reports about itself (``events``, ``counters``). Imports only
:mod:`cachemgr.errors`, :mod:`cachemgr.peer` and :mod:`cachemgr.config`'s ``layout``; never
the compile path, the daemon or the CLI (``.importlinter``).
"""
