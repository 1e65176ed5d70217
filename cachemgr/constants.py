"""Values defined once for the whole package.

A leaf module (it imports nothing of cachemgr): every layer may read it. ``pyproject.toml``
takes the package's version from :data:`VERSION` (``[tool.setuptools.dynamic]``), so the
version is written in this one place.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: typing costs ~2.5 ms of every command's start-up
    from typing import Final

#: The package's version: ``cachemgr --version``, the daemon's ``GET /status``, the wheel.
VERSION: Final = "0.1.0"

#: One MB as GE counts a cache limit: MiB, in bytes (``SIZE_MB_UNIT = 1048576`` in GE's
#: ``compiler/opcompiler/op_compile_adapter/source/cache/te_cache_space_manager.cc``).
MIB: Final = 1 << 20

#: Largest number of seconds any setting or option takes (about 31 years): beyond it timers,
#: deadlines and ``time_t`` overflow (``[daemon] reconcile_interval_s = 1e308`` stopped
#: ``serve`` with an internal error; ``--timeout inf`` failed after reading the request).
MAX_SECONDS: Final = 1e9

#: Default wall-time limit of one compiler process (seconds): the daemon's, and ``compile
#: --timeout``'s default.
COMPILE_TIMEOUT_S: Final = 600.0


def automatic_lock_wait_s(compile_timeout_s: float) -> float:
    """What ``[daemon] lock_wait_s = 0`` means: a compile waits twice the compile timeout
    plus a minute (seconds) for another process compiling the same kernel."""
    return 2 * compile_timeout_s + 60


#: ``max_op_cache_size`` that turns size eviction off (GE's ``te_cache_space_manager.cc``;
#: docs/design.md#size-limits-and-eviction).
NEVER_EVICT: Final = -1


def shared_file_mode(folder_mode: int) -> int:
    """The mode (permission bits) of a file cachemgr creates in a folder of mode
    ``folder_mode``: ``0660`` — group read/write whatever the umask — plus others' read only
    when the folder is setgid and gives others read (a ``2775`` root: ``0664``; a ``2770``
    or a plain ``0755`` one: ``0660``): only a folder shared on purpose says who may read
    the cache (docs/shared-cache.md#outsiders-read-nothing). The one rule of
    :func:`cachemgr.storage.modes.file_mode_in` and of a direct hit's stats file, here
    because the direct path imports nothing heavier."""
    return 0o660 | (folder_mode & 0o004 if folder_mode & 0o2000 else 0)


def short_host() -> str:
    """This host's short name: ``gethostname()`` up to the first dot, ``host`` when empty.

    It names ``kernel_meta/<host>_<pid>`` folders, temp files (``<name>.<host>.<pid>...``),
    lock probes and the default ``host_id``. Read once per process (kept in
    ``_short_host``; not ``functools.cache``: functools and its imports cost every
    command's start-up ~2 ms).
    """
    global _short_host
    if _short_host is None:
        # os.uname().nodename is gethostname(2) on Linux (glibc reads it from uname), without
        # importing socket
        _short_host = os.uname().nodename.split(".")[0] or "host"
    return _short_host


_short_host: str | None = None


#: The most hits one ``POST /hits`` may report (a client's local hits since its last report,
#: made at most once a second: one process serves a few thousand hits a second;
#: docs/daemon.md#hits-a-client-reports).
MAX_HITS_PER_REPORT: Final = 100_000
