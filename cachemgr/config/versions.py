"""Toolkit upgrades: compare the installed CANN versions with ``op_cache.ini``'s stamps
(layer 5; docs/design.md#size-limits-and-eviction, [GE]).

Where the installed versions come from — GE's own rule (``common/te_config_info.cc``,
``TeConfigInfo::InitAdkAndOppVersion`` and ``GetVersionFromVersionFile``):

* ``adk_version`` — relative to GE's library (``TeConfigInfo::InitLibPath``: the real path of
  the ``.so`` holding GE's cache code, ``libop_compile_adapter.so``, older ``libte_fusion.so``):
  ``<lib dir>/../version.info``, else ``<lib dir>/../../compiler/version.info``. cachemgr finds
  that library under ``$ASCEND_HOME_PATH`` (then ``$ASCEND_TOOLKIT_HOME``) in the standard
  layouts — ``lib64/``, ``compiler/lib64/`` (``ascend-toolkit/latest/...``) and
  ``<arch>-linux/lib64/`` (``cann/<arch>-linux/...``) — following links as ``realpath`` does.
  With no library found it reads ``compiler/version.info`` then ``version.info`` under the
  home (what GE's rule gives on the older layout) and says so in the source. The search
  is :mod:`cachemgr.config.toolkit`'s, on ``os`` alone, so that the lean ``config`` finds
  the same files: a home is taken as written (no glob characters of its own);
* ``ops_version`` — ``$ASCEND_OPP_PATH/version.info``;
* either can be set in the config file: table ``[toolkit]``, keys ``adk_version`` and
  ``ops_version`` (origin ``option``), which wins over the files.

``version.info`` is read as GE reads it: lines ``key=value``, key and value trimmed of spaces
and tabs, lines starting with ``#`` skipped, the first key exactly ``Version`` gives the version.

The rule, as GE's ``TeCacheSpaceManager::DelCachedFiles`` (``cache/te_cache_space_manager.cc``):

* ini **missing** → purge every chip folder (GE: only the chip it compiles for, a known gap),
  then create the ini with the installed stamps;
* ini that GE uses (both stamps present, ``ini.ge_reading``) and a stamp differs → purge every
  chip folder, restamp (other lines kept);
* an ini that exists without stamps (hand-written, or caught in the middle of GE's
  non-atomic rewrite) → never a purge;
* installed version unknown → never a purge (GE would delete; cachemgr does not copy that).

Before each chip folder is purged, the ini is read again under that folder's eviction lock;
the purge happens only when the reading is unchanged. Every purge is reported with its reason
and its number of entries.

This module does not import the eviction engine (same layer, independent): the caller passes
the purge function (``cachemgr.eviction.purge_chip``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from cachemgr.config import layout, toolkit
from cachemgr.config.ini import ADK_KEY, MAX_INI_BYTES, OPS_KEY, OpCacheIni, UnreadableIniError
from cachemgr.errors import CacheMgrError, ConfigError
from cachemgr.storage import fsutil
from cachemgr.storage.safedir import SafeDir
from cachemgr.words import noun, plural

log = logging.getLogger(__name__)

#: The config file's table that overrides the installed versions.
CONFIG_TABLE = "toolkit"


class VersionStatus(Enum):
    """Outcome of comparing the installed toolkit with the ini's stamps."""

    MATCH = "match"  # stamps name the installed toolkit: nothing to do
    UPGRADED = "upgraded"  # both stamps present and one differs: purge every chip, restamp
    NO_INI = "no_ini"  # no op_cache.ini: purge every chip folder, create it with stamps
    UNSTAMPED = "unstamped"  # an ini GE does not use (no stamps): never a purge
    NO_TOOLKIT = "no_toolkit"  # installed versions unknown: leave the cache alone
    NO_CACHE = "no_cache"  # no kernel cache folder yet: nothing to compare
    UNREADABLE = "unreadable"  # the ini may not be read: stamps unknown, never a purge


@dataclass(frozen=True)
class Found:
    """A version and where it came from (``config <file> [toolkit]``, a version.info path)."""

    value: str | None
    source: str


@dataclass(frozen=True)
class Installed:
    """The installed toolkit's ``adk_version`` and ``ops_version`` with their sources."""

    adk: Found
    ops: Found

    @property
    def complete(self) -> bool:
        return bool(self.adk.value and self.ops.value)


class PurgeResult(Protocol):
    """What the purge function returns (``cachemgr.eviction.PurgeReport``)."""

    def to_json(self) -> dict[str, Any]: ...


@dataclass
class VersionCheck:
    """Result of :func:`sync_toolkit`.

    :ivar detail: one line for humans saying what was found and done.
    :ivar purged: one purge result per chip folder (empty unless purged).
    :ivar restamped: True when the ini was (re)written with the installed stamps.
    """

    status: VersionStatus
    installed: Installed
    ini_adk: str | None
    ini_ops: str | None
    detail: str
    dry_run: bool = False
    purged: list[PurgeResult] = field(default_factory=list)
    restamped: bool = False

    #: the ini's bytes the decision was made on (re-checked under each eviction lock)
    ini_bytes: bytes | None = None
    #: stamp lines (1-based) GE reads but cannot rewrite (``OpCacheIni.
    #: stamp_lines_ge_cannot_rewrite``), rewritten the way GE writes them unless a dry run
    stamp_lines: list[int] = field(default_factory=list)

    @property
    def needs_purge(self) -> bool:
        return self.status in (VersionStatus.UPGRADED, VersionStatus.NO_INI)

    @property
    def purged_entries(self) -> int:
        """Entries removed by the purge, over every chip folder."""
        return sum(int(p.to_json().get("entries", 0)) for p in self.purged)

    def to_json(self) -> dict[str, Any]:
        inst = self.installed
        return {
            "status": self.status.value,
            "reason": self.status.value if self.needs_purge else "",
            "purged_entries": self.purged_entries,
            "detail": self.detail,
            "installed": {
                "adk_version": {"value": inst.adk.value, "source": inst.adk.source},
                "ops_version": {"value": inst.ops.value, "source": inst.ops.source},
            },
            "ini": {"adk_version": self.ini_adk, "ops_version": self.ini_ops},
            "dry_run": self.dry_run,
            "restamped": self.restamped,
            "purged": [p.to_json() for p in self.purged],
            "stamp_lines_rewritten": self.stamp_lines,
        }


def _override(sections: Mapping[str, Mapping[str, Any]], key: str) -> Found | None:
    table = sections.get(CONFIG_TABLE) or {}
    if key not in table:
        return None
    value = table[key]
    if not isinstance(value, str) or not value.strip() or "\n" in value or "\r" in value:
        raise ConfigError(
            f"[{CONFIG_TABLE}] {key}={value!r} (from config file) is invalid; "
            "accepted: a non-empty one-line string"
        )
    return Found(value.strip(), f"config [{CONFIG_TABLE}] {key}")


def installed_versions(
    env: Mapping[str, str], sections: Mapping[str, Mapping[str, Any]] | None = None
) -> Installed:
    """Read the installed ``adk_version`` and ``ops_version`` (config table wins over files).

    :param env: the environment (``ASCEND_HOME_PATH``, ``ASCEND_TOOLKIT_HOME``,
        ``ASCEND_OPP_PATH``).
    :param sections: the config file's tables (``Settings.sections``).
    :raises ConfigError: a ``[toolkit]`` value that is not a non-empty one-line string.
    """
    sections = sections or {}
    adk = _override(sections, ADK_KEY) or Found(*toolkit.adk_version(env))
    ops = _override(sections, OPS_KEY) or Found(*toolkit.ops_version(env))
    return Installed(adk, ops)


def compare(cache: layout.CacheLayout, installed: Installed) -> VersionCheck:
    """Compare without changing anything (the rule in the module docstring).

    :raises ConfigError: the ini path is a folder, a symlink or unreadable.
    """
    if not installed.complete:
        missing = [f.source for f in (installed.adk, installed.ops) if not f.value]
        detail = "toolkit version unknown (" + "; ".join(missing) + "): no toolkit-upgrade purge"
        return VersionCheck(VersionStatus.NO_TOOLKIT, installed, None, None, detail)
    if not cache.kernel_cache_dir.is_dir():
        detail = f"no kernel cache at {cache.kernel_cache_dir} yet; nothing to compare"
        return VersionCheck(VersionStatus.NO_CACHE, installed, None, None, detail)
    try:
        ini = OpCacheIni.load(cache.ini_path)
    except UnreadableIniError as exc:  # never a purge for it (docs/security.md item 3)
        detail = f"{exc}; its version stamps are unknown: no toolkit-upgrade purge"
        return VersionCheck(VersionStatus.UNREADABLE, installed, None, None, detail)
    have = f"adk_version={installed.adk.value}, ops_version={installed.ops.value}"
    stamps = ini.ge.stamps
    if not ini.exists:
        status = VersionStatus.NO_INI
        detail = f"{cache.ini_path} is missing (GE purges then); installed toolkit {have}"
        return VersionCheck(status, installed, None, None, detail, ini_bytes=None)
    if stamps is None:
        status = VersionStatus.UNSTAMPED
        detail = (
            f"{cache.ini_path} has no version stamps GE uses; installed toolkit {have}; "
            "cache kept (an ini without stamps never causes a purge)"
        )
    elif stamps == (installed.adk.value, installed.ops.value):
        status = VersionStatus.MATCH
        detail = f"cache stamps match the installed toolkit ({have})"
    else:
        status = VersionStatus.UPGRADED
        detail = (
            f"toolkit changed: ini has adk_version={stamps[0]!r}, ops_version={stamps[1]!r}; "
            f"installed {have}"
        )
    adk, ops = stamps if stamps else (ini.adk_version, ini.ops_version)
    data = _ini_bytes(cache.ini_path)
    return VersionCheck(status, installed, adk, ops, detail, ini_bytes=data)


def _ini_bytes(path: Path) -> bytes | None:
    try:
        return fsutil.read_bytes_noatime(path, max_bytes=MAX_INI_BYTES)
    except OSError:
        return None


def still_needs_purge(cache: layout.CacheLayout, check: VersionCheck) -> bool:
    """Re-read the ini (the caller holds a chip folder's eviction lock): True only when the
    reading that decided the purge is unchanged — still missing, or the same bytes."""
    if check.status is VersionStatus.NO_INI:
        return fsutil.lstat_or_none(cache.ini_path) is None
    return _ini_bytes(cache.ini_path) == check.ini_bytes


def sync_toolkit(
    cache: layout.CacheLayout,
    installed: Installed,
    purge: Callable[..., PurgeResult],
    dry_run: bool = False,
    estimate: Callable[[Path], PurgeResult] | None = None,
) -> VersionCheck:
    """Purge every chip folder and (re)stamp the ini when GE would (module docstring).

    :param purge: purges one chip folder (``cachemgr.eviction.purge_chip``), called as
        ``purge(chip, still_needed=...)``: it re-checks under the eviction lock. Its errors
        (e.g. ``LockBusyError``) propagate and the ini is then not restamped, so the next run
        tries again.
    :param dry_run: only say what would be done.
    :param estimate: with ``dry_run``, measures what ``purge`` would remove from one chip
        folder (``cachemgr.eviction.purgeplan.purge_estimate``): the estimates go in
        ``purged``, so a dry run's totals include the purge
        (docs/eviction.md#toolkit-purges-in-the-report).
    :raises ConfigError: an unreadable ini path.
    :raises CachePermissionError: the ini cannot be written.
    """
    check = compare(cache, installed)
    check.dry_run = dry_run
    check.stamp_lines = _stamp_lines(cache, check)
    if not check.needs_purge:
        if check.stamp_lines and not dry_run:
            _rewrite_stamp_lines(cache, installed, check)
        log.debug("%s", check.detail)  # said by the caller: gc's report, the daemon's log once
        return check
    chips = cache.chip_dirs()
    folders = plural(len(chips), "chip folder")
    if dry_run:
        what = folders
        if estimate is not None:
            check.purged = [estimate(chip) for chip in chips]
            what = f"{plural(check.purged_entries, 'entry', 'entries')} in {folders}"
        check.detail += f"; would purge {what} and stamp the ini"
        return check
    log.info("%s; purging %s", check.detail, folders)
    for chip in chips:
        check.purged.append(purge(chip, still_needed=lambda: still_needs_purge(cache, check)))
    if not still_needs_purge(cache, check):
        check.detail += f"; the ini changed meanwhile, not restamped ({cache.ini_path})"
        check.stamp_lines = []
    else:
        stamp_ini(cache, installed)
        check.restamped = True
        if check.stamp_lines:
            _log_stamp_lines(cache, check)
    check.detail += (
        f"; purged {plural(check.purged_entries, 'entry', 'entries')} in {folders} "
        f"(reason: {check.status.value})"
        + (f" and stamped {cache.ini_path}" if check.restamped else "")
    )
    return check


def _stamp_lines(cache: layout.CacheLayout, check: VersionCheck) -> list[int]:
    """The stamp lines of an ini GE uses that GE could not rewrite (spaces around ``=``, an
    indented key): cachemgr rewrites them (docs/eviction.md#stamp-lines-ge-cannot-rewrite)."""
    if check.status not in (VersionStatus.MATCH, VersionStatus.UPGRADED):
        return []
    try:
        return OpCacheIni.load(cache.ini_path).stamp_lines_ge_cannot_rewrite()
    except ConfigError:
        return []


def _rewrite_stamp_lines(
    cache: layout.CacheLayout, installed: Installed, check: VersionCheck
) -> None:
    """Rewrite the stamps (the installed ones, which they equal) GE's way; an ini this user
    may not write keeps them, said in ``detail`` and one log line, and gc goes on."""
    try:
        stamp_ini(cache, installed)
    except (CacheMgrError, OSError) as exc:
        lines = ", ".join(map(str, check.stamp_lines))
        what = noun(len(check.stamp_lines), "stamp line")
        check.detail += f"; {what} {lines} GE cannot rewrite were left as they are: {exc}"
        log.info("%s: stamp lines %s not rewritten: %s", cache.ini_path, lines, exc)  # in detail
        check.stamp_lines = []
        return
    _log_stamp_lines(cache, check)


def _log_stamp_lines(cache: layout.CacheLayout, check: VersionCheck) -> None:
    """The one log line of a rewrite of stamp lines GE could not rewrite."""
    log.info(
        "%s: rewrote %s %s the way GE writes them (key=value from column 1): "
        "GE restamps only such lines and would purge the chip folders on every start",
        cache.ini_path,
        noun(len(check.stamp_lines), "stamp line"),
        ", ".join(map(str, check.stamp_lines)),
    )


def stamp_ini(cache: layout.CacheLayout, installed: Installed) -> None:
    """Write the installed stamps into ``<kernel cache>/op_cache.ini`` (created if missing,
    other lines kept), as GE's ``CreatOpCacheIniFile`` / ``UpdateOpCacheIniFile`` do.

    :raises ConfigError: unreadable ini path; :raises CachePermissionError: not writable.
    """
    ini = OpCacheIni.load(cache.ini_path)
    ini.set(ADK_KEY, str(installed.adk.value))
    ini.set(OPS_KEY, str(installed.ops.value))
    # through the folder's descriptor: a kernel_cache swapped for a link meanwhile gets
    # nothing written through it (docs/security.md item 1)
    with SafeDir.open_kernel_cache(cache.kernel_cache_dir, create=True) as folder:
        ini.save(dir_fd=folder.fd)


def ensure_ini(kernel_cache_dir: Path, installed: Installed) -> bool:
    """Create a missing ``op_cache.ini`` with the installed stamps (a publish calls this):
    GE purges a chip folder when it finds no ini, so without it the next CANN process on the
    host would wipe what cachemgr just published. Nothing is done when the ini exists or the
    toolkit is unknown. Returns True when the ini was created.

    :raises ConfigError, CachePermissionError: as :func:`stamp_ini`.
    """
    cache = layout.CacheLayout(Path(kernel_cache_dir))
    if not installed.complete or fsutil.lstat_or_none(cache.ini_path) is not None:
        return False
    stamp_ini(cache, installed)
    log.info("created %s with the installed toolkit's stamps", cache.ini_path)
    return True
