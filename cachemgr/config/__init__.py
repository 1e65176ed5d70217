"""Settings and CANN's own configuration (bottom tier, beside :mod:`cachemgr.storage`).

``options`` (typed settings with each value's origin), ``configfile`` (the TOML schema),
``ini`` (GE's ``op_cache.ini``), ``versions`` (toolkit stamps), ``layout`` (path arithmetic:
root, kernel cache, chip folder) and ``socs`` (the chip names CANN accepts). Imports only
:mod:`cachemgr.errors` and the file primitives of :mod:`cachemgr.storage` (``fsutil``,
``safedir``); the layer order module by module is in ``.importlinter``.
"""
