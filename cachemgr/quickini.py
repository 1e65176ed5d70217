"""``op_cache.ini``'s limits for the os-only fast paths (:mod:`cachemgr.quickstats`,
:mod:`cachemgr.quickconfig`), as ``options._resolve_limits`` gives them when the ini is in
the plain form GE writes (:func:`cachemgr.config.core.plain_ge_ini`), or absent; and the
signal both raise when they do not answer exactly (:class:`Declined`). On the standard
library's ``os`` alone; the ini is read as a direct hit reads its files
(:func:`cachemgr.direct.read_at`: no link, no other kind, capped, access time kept).
"""

from __future__ import annotations

import os

from cachemgr import direct
from cachemgr.config import core

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: typing costs start-up
    from collections.abc import Mapping

#: The origin of a limit ``op_cache.ini`` gives (``options.ORIGIN_INI``).
ORIGIN_INI = core.INI_NAME
#: Largest ``op_cache.ini`` read here (bytes): GE's is a few lines; a larger one is declined.
MAX_INI_BYTES = 4096


class Declined(Exception):
    """The fast path does not answer exactly: the full path does."""


def limits(
    kcache: str, env: Mapping[str, str]
) -> tuple[tuple[int, str, str], tuple[int, str, str], list[str]]:
    """The limits as ``options._resolve_limits`` gives them: ``op_cache.ini``'s when GE uses
    its two limits, else the environment's and the defaults (:func:`core.env_limits`); an
    ini not in GE's plain form (:func:`core.plain_ge_ini`) is declined, for its words."""
    ini = os.path.join(kcache, core.INI_NAME)
    try:
        os.lstat(ini)
    except FileNotFoundError:
        return core.env_limits(env)
    fd = os.open(kcache, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        data = direct.read_at(fd, core.INI_NAME, MAX_INI_BYTES)
    except direct.Decline as exc:  # a link, a folder, another kind, unreadable: warned about
        raise Declined(str(exc)) from None
    finally:
        os.close(fd)
    values = core.plain_ge_ini(data)
    if values is None:
        raise Declined("an op_cache.ini not in GE's plain form")
    if core.MAX_KEY not in values:
        return core.env_limits(env)
    max_mb, ratio = int(values[core.MAX_KEY]), int(values[core.RATIO_KEY])
    return (max_mb, ORIGIN_INI, ini), (ratio, ORIGIN_INI, ini), []
