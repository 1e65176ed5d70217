"""cachemgr: the kernel compile cache manager for Ascend CANN build hosts.

``from cachemgr import Client`` gives the daemon's client (imported on first use, so the CLI
starts fast).
"""

from __future__ import annotations

from cachemgr.constants import VERSION as __version__

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: typing costs ~2.5 ms of every command's start-up
    from typing import Any

__all__ = ["Client", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Client":
        from cachemgr.client import Client

        return Client
    raise AttributeError(f"module 'cachemgr' has no attribute {name!r}")
