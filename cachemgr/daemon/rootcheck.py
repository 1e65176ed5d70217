"""The daemon's start-up checks of its cache root (docs/design.md#sharing-and-locking).

Before it serves, the daemon checks that this user can write the kernel cache (a user outside
the sharing group gets one line naming the folder, the user, the group and the fix) and that
fcntl locks work there (:func:`cachemgr.storage.fsprobe.probe_locks`). When they do not, ``[daemon]
lock_fallback`` decides: ``"refuse"`` (the default) exits with a one-line error; ``"local"``
serves a cache on local disk instead and says so in the log and in systemd's ``STATUS=``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cachemgr.config import options
from cachemgr.daemon.config import DaemonConfig
from cachemgr.errors import CacheMgrError, CachePermissionError
from cachemgr.storage import fsprobe
from cachemgr.storage.safedir import SafeDir

log = logging.getLogger(__name__)

#: ``resolve(cli_values)`` → settings; the daemon's settings builder.
Resolver = Callable[[Mapping[str, object]], options.Settings]


class LocksUnavailable(CacheMgrError):
    """fcntl locks do not work on the cache root and ``lock_fallback`` is ``"refuse"``."""

    exit_code = 2


@dataclass(frozen=True)
class CheckedRoot:
    """What the daemon serves after the checks: the command-line values to resolve settings
    with (the local cache's root replaces ``--cache-dir`` after a fallback) and, after a
    fallback, the one-line note that says so."""

    cli_values: Mapping[str, object]
    settings: options.Settings
    fallback_note: str = ""


def local_cache_root(config: DaemonConfig, env: Mapping[str, str] | None = None) -> Path:
    """The local cache's root: ``[daemon] local_cache_dir``, else ``$CACHE_DIRECTORY``
    (systemd ``CacheDirectory=``), else ``$XDG_CACHE_HOME/cachemgr``, else
    ``~/.cache/cachemgr``."""
    env = os.environ if env is None else env
    if config.local_cache_dir:
        return Path(config.local_cache_dir)
    if env.get("CACHE_DIRECTORY"):
        return Path(env["CACHE_DIRECTORY"].split(":")[0])
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "cachemgr"
    return Path(env.get("HOME") or os.path.expanduser("~")) / ".cache" / "cachemgr"


def check_access(settings: options.Settings) -> None:
    """Refuse a kernel cache this user cannot write (docs/design.md#sharing-and-locking). A chip
    folder it cannot read or write is never refused: one warning here when it can be read (served,
    never evicted), else from the usage index's scan (skipped; docs/security.md item 3).

    :raises CachePermissionError: the first problem, one line (path, user, group, fix).
    :raises UnsafePathError: the kernel cache folder is a symbolic link (nothing is probed,
        reclaimed or created through it; docs/security.md item 1).
    """
    with contextlib.suppress(FileNotFoundError):  # created by the probe below
        SafeDir.open_kernel_cache(settings.layout.kernel_cache_dir).close()
    problems = fsprobe.access_problems(settings.layout.kernel_cache_dir)
    if problems:
        raise CachePermissionError(problems[0])
    for folder, line in fsprobe.chip_access_problems(settings.layout.kernel_cache_dir).items():
        if os.access(folder, os.R_OK | os.X_OK):  # one warning: the scan can read it
            log.warning("%s; its entries are served but it is never evicted", line)
        else:  # the usage index's scan warns about it, once
            log.info("%s; that chip folder will be skipped", line)
    for folder in fsprobe.world_writable(settings.layout.kernel_cache_dir):
        log.warning("%s is world-writable: anyone may replace entries; run chmod o-w", folder)


def check_root(
    cli_values: Mapping[str, object],
    resolve: Resolver,
    config: DaemonConfig,
    probe_locks: Callable[[Path], fsprobe.LockProbe] = fsprobe.probe_locks,
    access: bool = True,
) -> CheckedRoot:
    """Access check, then lock probe, then the fallback policy (module docstring).

    ``probe_locks`` is :func:`cachemgr.storage.fsprobe.probe_locks` (tests give it another
    ``mountinfo`` file to read). ``access`` False skips the access check of the cache (a
    CLI command handles a folder it may not write itself: compiles go outside the cache).

    :raises CachePermissionError: this user cannot write the kernel cache.
    :raises LocksUnavailable: locks do not work and the policy is ``"refuse"``, or the local
        cache fails the probe too.
    :raises ConfigError: the local cache's path is invalid.
    """
    settings = resolve(cli_values)
    if access:
        check_access(settings)
    kcache = settings.layout.kernel_cache_dir
    probe = probe_locks(kcache)
    if probe.ok:
        log.info("%s", probe.detail)
        return CheckedRoot(cli_values, settings)
    if config.lock_fallback != "local":
        raise LocksUnavailable(
            f"{probe.detail}; refusing to serve a cache that processes and hosts cannot "
            'lock (mount it NFSv4 with locking, or set [daemon] lock_fallback = "local" '
            "to serve a local cache instead)"
        )
    root = local_cache_root(config)
    local_values = {**cli_values, "op_compiler_cache_dir": str(root)}
    local = resolve(local_values)
    check_access(local)
    second = probe_locks(local.layout.kernel_cache_dir)
    if not second.ok:
        raise LocksUnavailable(f"{probe.detail}; the local fallback fails too: {second.detail}")
    note = (
        f"fcntl locks do not work on {kcache}; serving the local cache "
        f"{local.layout.kernel_cache_dir} instead (lock_fallback = local)"
    )
    log.warning("%s (%s)", note, probe.detail)
    return CheckedRoot(local_values, local, note)
