"""Every writer checks its locks (docs/design.md#sharing-and-locking).

The daemon probes the cache root's fcntl locks before it serves; a CLI command that writes
into the cache without a daemon (``compile``, ``gc``, ``purge``, ``verify --repair``) runs the
same check — :func:`cachemgr.daemon.rootcheck.check_root` with the config's ``[daemon]
lock_fallback`` — so on a filesystem that ignores locks it refuses or falls back to the local
cache exactly as the daemon does. The probe's answer is cached per mount (device, mount point,
type and options from ``/proc/self/mountinfo``) in ``$XDG_CACHE_HOME/cachemgr/lockprobe.json``
for :data:`PROBE_TTL_S`, so the CLI pays the probe (a child process) once a day per mount, not
per run; a remount with other options is another mount and is probed again.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cachemgr.cli.common import warning
from cachemgr.config import options
from cachemgr.config.options import Settings
from cachemgr.daemon import rootcheck
from cachemgr.daemon.config import DaemonConfig
from cachemgr.storage import fsprobe, secretfile

log = logging.getLogger(__name__)

#: How long a probe's answer is trusted for one mount (seconds).
PROBE_TTL_S = 24 * 3600.0


def probe_cache_file(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/cachemgr/lockprobe.json`` (default ``~/.cache/cachemgr/``)."""
    env = os.environ if env is None else env
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else None
    if base is None:
        base = Path(env.get("HOME") or os.path.expanduser("~")) / ".cache"
    return base / "cachemgr" / "lockprobe.json"


def mount_key(folder: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> str:
    """The identity of the mount holding ``folder`` (or its nearest existing parent)."""
    path = Path(folder)
    while not path.exists() and path.parent != path:
        path = path.parent
    st = os.stat(path)
    try:
        mount = fsprobe.mount_of(path, fsprobe.parse_mountinfo(mountinfo.read_text()))
    except OSError:
        mount = None
    where = (
        "" if mount is None else f" {mount.mount_point} {mount.fstype} {','.join(mount.options)}"
    )
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}{where}"


def cached_probe(folder: Path, cache_file: Path | None = None) -> fsprobe.LockProbe:
    """:func:`cachemgr.storage.fsprobe.probe_locks`, answered from the per-mount cache if fresh."""
    cache_file = cache_file or probe_cache_file()
    key = mount_key(folder)
    cache = _load(cache_file)
    hit = cache.get(key)
    now = time.time()
    if (
        isinstance(hit, dict)
        and isinstance(hit.get("ok"), bool)
        and now - hit.get("at", 0) < PROBE_TTL_S
    ):
        return fsprobe.LockProbe(Path(folder), hit["ok"], _remembered(hit, key, cache_file, now))
    probe = fsprobe.probe_locks(folder)
    cache[key] = {"ok": probe.ok, "detail": probe.detail, "at": now, "folder": str(folder)}
    try:
        secretfile.write_own(cache_file, json.dumps(cache, sort_keys=True).encode())
    except OSError as exc:  # a cache we cannot write only costs the next run a probe
        log.debug("cannot save the lock probe cache %s: %s", cache_file, exc)
    return probe


def _remembered(hit: Mapping[str, Any], mount: str, cache_file: Path, now: float) -> str:
    """A remembered answer said as one: which mount (``mount``: device, mount point, type,
    options), when and on which folder it was probed, and where it is kept — the folder of
    this run was not probed (its detail names the folder of that earlier run)."""
    at = hit.get("at", 0)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "at an unknown time"
    ago = f"{max(0.0, now - at) / 3600:.1f} h ago" if at else ""
    folder = f" on {hit['folder']}" if hit.get("folder") else ""
    works = "work" if hit.get("ok") else "do not work"
    return (
        f"fcntl locks {works} on mount {mount}: a result remembered in {cache_file}, probed "
        f"{when} ({ago}){folder}, not a probe of this folder (probe said: {hit.get('detail')})"
    )


def _writable(folder: Path) -> bool:
    """Can this user create files in ``folder`` (or, when it does not exist yet, make it in
    its nearest existing parent)?"""
    path = Path(folder)
    while not path.exists() and path.parent != path:
        path = path.parent
    return os.access(path, os.W_OK | os.X_OK)


#: The largest lock-probe cache file read (bytes); it holds a line per filesystem.
MAX_CACHE_FILE_BYTES = 1 << 20


def _load(path: Path) -> dict[str, Any]:
    """The remembered answers ({} when missing, not private or bad:
    docs/design.md#the-users-own-files)."""
    return secretfile.read_own_json(path, MAX_CACHE_FILE_BYTES, log)


def checked_for_writing(
    settings: Settings, cli_values: Mapping[str, object], config_file: Path | None
) -> Settings:
    """The settings a writing CLI command may use: the same access and lock checks as
    ``cachemgr serve`` (and its ``lock_fallback``), with the probe cached per mount.

    A root on a read-only filesystem, or a kernel cache this user may not write, is left as
    it is: nothing is written there (hits are served, compiles return their kernel outside
    the cache).

    :raises LocksUnavailable: locks do not work and ``lock_fallback`` is ``"refuse"``.
    :raises CachePermissionError: this user cannot write the local fallback cache.
    :raises ConfigError: a bad ``[daemon]`` table.
    """
    kcache = settings.layout.kernel_cache_dir
    if fsprobe.root_problem(kcache) or not _writable(kcache):
        return settings  # nothing is written there: compiles go outside the cache, and gc
        # and purge name the folder they may not change (docs/design.md#sharing-and-locking)
    where = f"config {config_file or os.environ.get('CACHEMGR_CONFIG', '')} [daemon]"
    config = DaemonConfig.from_table(settings.sections.get("daemon"), where)

    def resolve(values: Mapping[str, object]) -> Settings:
        if values == cli_values:
            return settings
        return options.resolve(cli=values, config_file=config_file)

    checked = rootcheck.check_root(
        cli_values, resolve, config, probe_locks=cached_probe, access=False
    )
    if checked.fallback_note:
        warning(checked.fallback_note)
    return checked.settings
