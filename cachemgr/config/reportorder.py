"""The order ``cachemgr config`` prints the settings' rows in, for both ways of answering it:
the report of the full path (:func:`cachemgr.console.config_report`) and the lean one on
``os`` alone (:mod:`cachemgr.quickconfig`), and the words after the lock wait's value. A
leaf module on ``os`` alone."""

from __future__ import annotations

from cachemgr import constants  # a leaf module of constants

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: typing costs start-up
    from typing import Any

#: The order ``config`` prints in (docs/design.md#options-and-their-origins, #where-the-cache-lives,
#: #size-limits-and-eviction, #debug-compiles-and-kernel_meta), then anything else (sorted).
SHOWN = (
    "op_compiler_cache_mode",
    "op_compiler_cache_dir",
    "host_id",
    "kernel_cache_dir",
    "governed_kernel_caches",
    "ini_path",
    "max_op_cache_size",
    "remain_cache_size_ratio",
    "min_age_s",
    "soc_version",
    "jit_compile",
    "op_debug_level",
    "op_debug_config",
    "debug_dir",
    "kernel_meta_dir",
)
#: The rows the report adds after the settings': the installed toolkit's versions, the remote
#: tiers (then the config file's tables), and each governed kernel cache's filesystem.
TOOLKIT_ROWS = ("installed_adk_version", "installed_ops_version")
REMOTE_ROW = "remote_storage"
FILESYSTEMS = "kernel_cache_filesystems"
#: The row whose value 0 means "automatic" (:func:`explain_lock_wait`).
LOCK_WAIT = "daemon.lock_wait_s"


def explain_lock_wait(row: dict[str, Any] | None) -> str:
    """``daemon.lock_wait_s = 0`` means "automatic" (from the daemon's compile timeout, which
    no setting changes: :data:`constants.COMPILE_TIMEOUT_S`): add what it is, in seconds, to
    the row as ``effective`` (JSON) and return the words shown after the value ("" when the
    value is set)."""
    if row is None or row["value"]:
        return ""
    timeout = constants.COMPILE_TIMEOUT_S
    seconds = constants.automatic_lock_wait_s(timeout)
    row["effective"] = seconds
    return f"automatic: 2 × compile timeout {timeout:g} s + 60 s = {seconds:g} s"
