"""Which backend compiles which kernel language (docs/design.md#compilers).

The one place that knows every backend module: :mod:`.base` defines the contract and never
imports a backend, the backends import :mod:`.base`, and this module imports them all — so
the imports point one way (``.importlinter``: registry above the backends above base).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from cachemgr.compilers.base import CompilerBackend
from cachemgr.compilers.cuda import CudaBackend
from cachemgr.compilers.host import HostBackend
from cachemgr.compilers.template import TemplateBackend
from cachemgr.errors import InvalidInputError

#: Kernel language (the request's ``language``) → its backend class; keys are
#: :data:`~cachemgr.compilers.base.LANGUAGES`.
BACKENDS: Mapping[str, type[CompilerBackend]] = MappingProxyType(
    {
        "c": HostBackend,
        "cpp": HostBackend,
        "cuda": CudaBackend,
        "cce": TemplateBackend,
    }
)


def get_backend(language: str, config: Mapping[str, object] | None = None) -> CompilerBackend:
    """The backend that compiles ``language``: c/cpp → host, cuda → cuda, cce → template.

    :param language: the request's ``language``.
    :param config: the ``[compilers]`` settings the backend reads (executables, templates).
    :raises InvalidInputError: naming an unknown language.
    :raises ConfigError: when the template backend's ``cce_command`` is missing or malformed.
    """
    try:
        cls = BACKENDS[language]
    except (KeyError, TypeError):
        raise InvalidInputError(
            f"unknown kernel language {language!r} (known: {sorted(BACKENDS)})"
        ) from None
    return cls(config)
