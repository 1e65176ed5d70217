"""The daemon's own settings: the ``[daemon]`` table of the config file (see
``config/cachemgr.toml``), each with its default and unit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from cachemgr.errors import ConfigError

#: ``[daemon] lock_fallback`` values (SPEC §9).
LOCK_FALLBACKS = ("refuse", "local")


@dataclass(frozen=True)
class DaemonConfig:
    """Timings in seconds; ``workers`` 0 = CPU count; ``tcp_port`` 0 = no TCP listener."""

    reconcile_interval_s: float = 300.0  # full rescan of every chip folder (other hosts' writes)
    reconcile_jitter_s: float = 30.0  # random spread so hosts sharing a root do not align
    reap_interval_s: float = 600.0  # temp files, dead locks, orphans, kernel_meta of dead pids
    evict_debounce_s: float = 2.0  # crossing the limit schedules eviction this much later
    # ...but however many file events follow, no later than this after the first (issue 12)
    evict_max_delay_s: float = 10.0
    # how often the inotify watches are checked against the folders (re-armed after an
    # rm -rf, new chip folders armed); also the governance heartbeat
    watch_check_interval_s: float = 2.0
    # chip folders without an inotify watch (kernel limits, or the budget below) are
    # rescanned this often
    poll_interval_s: float = 10.0
    # most folders watched with inotify (the kernel cache counts as one); 0 = no cap of ours
    inotify_watches: int = 0
    # WATCHDOG=1 is withheld when the main loop, the request server or governance made no
    # progress for this long (seconds)
    heartbeat_timeout_s: float = 60.0
    # loggers logged at debug level whatever -v says, comma-separated (e.g. "cachemgr.evicted":
    # the names of evicted kernels, which the one-line eviction summary leaves out)
    debug_loggers: str = ""
    counters_save_interval_s: float = 60.0
    workers: int = 0
    tcp_host: str = "127.0.0.1"
    tcp_port: int = 0
    max_body_bytes: int = 1 << 20
    stop_timeout_s: float = 600.0  # SIGTERM: how long running compiles may take to finish
    # SPEC §9: what to do when fcntl locks do not work on the cache root (checked at start):
    # "refuse" to start, or "local": serve a cache on local disk instead, and say so
    lock_fallback: str = "refuse"
    # the root of that local cache; "" = $CACHE_DIRECTORY (systemd) or ~/.cache/cachemgr
    local_cache_dir: str = ""
    # how long a compile waits for another process (or host) compiling the same kernel, then
    # compiles it itself (seconds); 0 = twice the compile timeout plus a minute
    lock_wait_s: float = 0.0
    # completed debug outputs in kernel_meta are the users' and stay (issue 11 item 7); > 0:
    # a dead process's output folder whose newest file is older than this goes (seconds)
    kernel_meta_retention_s: float = 0.0
    # the user the daemon runs as (e.g. "cachemgr"): the CLI, given this config, trusts its
    # socket besides the caller's own and root's (issue 10, item 7); "" = none
    user: str = ""
    # issue 10: the secret the TCP listener requires (a 0600 file of the daemon's user);
    # without it the TCP listener does not start
    tcp_token_file: str = ""
    # connections held at once, in all and per caller uid; a silent connection is closed
    # after idle_timeout_s (seconds)
    max_connections: int = 512
    max_connections_per_caller: int = 128
    idle_timeout_s: float = 30.0
    # compile jobs one caller (uid) may have queued or running; more → 429
    max_queued_per_caller: int = 1000
    # the highest priority a caller other than the daemon's user (or root) may ask for
    max_caller_priority: int = 0

    @classmethod
    def from_table(cls, table: Mapping[str, Any] | None, where: str = "[daemon]") -> DaemonConfig:
        """Build from the config file's ``[daemon]`` table.

        :raises ConfigError: unknown key, or a value of the wrong type or sign (names both).
        """
        table = dict(table or {})
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, raw in table.items():
            if key not in known:
                raise ConfigError(f"{where}: unknown setting {key!r} (known: {', '.join(known)})")
            default = known[key].default
            values[key] = _coerce(key, raw, default, where)
        fallback = values.get("lock_fallback", cls.lock_fallback)
        if fallback not in LOCK_FALLBACKS:
            raise ConfigError(
                f"{where}: lock_fallback={fallback!r} is invalid; accepted: "
                + ", ".join(repr(v) for v in LOCK_FALLBACKS)
            )
        return cls(**values)


def _coerce(key: str, raw: Any, default: Any, where: str) -> Any:
    if isinstance(default, str):
        if not isinstance(raw, str):
            raise ConfigError(f"{where}: {key}={raw!r} must be a string")
        return raw
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ConfigError(f"{where}: {key}={raw!r} must be a number")
    if raw < 0:
        raise ConfigError(f"{where}: {key}={raw!r} must be ≥ 0")
    if isinstance(default, int) and not isinstance(default, bool):
        if int(raw) != raw:
            raise ConfigError(f"{where}: {key}={raw!r} must be a whole number")
        return int(raw)
    return float(raw)
