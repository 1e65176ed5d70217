"""Compiler backends (layer 6, docs/design.md#compilers): one interface, one module per compiler.

``get_backend(language, config)`` picks the backend: ``c``/``cpp`` → :mod:`.host` (gcc/clang),
``cuda`` → :mod:`.cuda` (nvcc → cubin), ``cce`` → :mod:`.template` (CANN ``ccec``/``bisheng``
through a command template; the table is :mod:`.registry`). See :mod:`.base` for the contract.
"""

from cachemgr.compilers.base import (
    DEBUG_FLAGS,
    EMITS,
    LANGUAGES,
    CompileJob,
    CompilerBackend,
    CompileResult,
    CompilerIdentity,
)
from cachemgr.compilers.registry import BACKENDS, get_backend

__all__ = [
    "BACKENDS",
    "DEBUG_FLAGS",
    "EMITS",
    "LANGUAGES",
    "CompileJob",
    "CompileResult",
    "CompilerBackend",
    "CompilerIdentity",
    "get_backend",
]
