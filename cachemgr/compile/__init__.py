"""From a compile request to a published entry (above storage and config).

``request`` (the request and its options), ``extraflags``, ``inputs`` (the bytes a compile
reads), ``keys`` (what makes a kernel unique), ``policy`` (jit / cache mode / debug as pure
functions), ``kernel_meta``, ``precompiled``, ``build`` (run one compile), ``publisher``
(write the entry), ``queue`` (the pool and single-flight) and ``results`` (the typed
outcomes). Imports :mod:`cachemgr.compilers`, :mod:`cachemgr.remote`, storage and config;
never the daemon, the client or the CLI (``.importlinter``).
"""
