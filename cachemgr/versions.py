"""Toolkit upgrades: compare the installed CANN versions with ``op_cache.ini``'s stamps
(layer 5; SPEC §5, [GE]).

Where the installed versions come from (GE's ``TeConfigInfo::InitAdkAndOppVersion``):

* ``adk_version`` — ``version.info`` of the compiler package: ``$ASCEND_HOME_PATH/compiler/``
  then ``$ASCEND_HOME_PATH/``, then the same under ``$ASCEND_TOOLKIT_HOME``;
* ``ops_version`` — ``$ASCEND_OPP_PATH/version.info``;
* either can be set in the config file: table ``[toolkit]``, keys ``adk_version`` and
  ``ops_version`` (origin ``option``), which wins over the files.

``version.info`` is read as GE reads it: lines ``key=value``, blanks around both trimmed,
empty lines and ``#`` lines skipped, the first key exactly ``Version`` gives the version
(e.g. ``Version=7.0.RC1`` or ``Version=7.6.0.1.220``; other keys such as ``version_dir`` are
ignored).

The rule (SPEC §5): when the ini's ``adk_version``/``ops_version`` differ from the installed
ones — or the ini has no stamps, which is how GE treats a missing ini — **every** chip folder
is purged and the ini restamped (other lines kept). GE purges only the chip it compiles for,
a known gap. With no toolkit found (either version unknown) the cache is left alone and the
result says so: cachemgr does not copy GE's "unknown version → delete the cache".

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

from cachemgr import layout
from cachemgr.errors import ConfigError
from cachemgr.ini import ADK_KEY, OPS_KEY, OpCacheIni, UnreadableIniError
from cachemgr.safedir import SafeDir

log = logging.getLogger(__name__)

VERSION_INFO = "version.info"
#: Where ``adk_version``'s ``version.info`` is looked for, under each toolkit home [GE].
ADK_RELATIVE = ("compiler/version.info", "version.info")
ADK_ENV_VARS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
OPS_ENV_VAR = "ASCEND_OPP_PATH"
#: The config file's table that overrides the installed versions.
CONFIG_TABLE = "toolkit"


class VersionStatus(Enum):
    """Outcome of comparing the installed toolkit with the ini's stamps."""

    MATCH = "match"  # stamps name the installed toolkit: nothing to do
    UPGRADED = "upgraded"  # stamps differ: purge every chip folder, restamp
    UNSTAMPED = "unstamped"  # no ini or no stamps: cache of unknown version: purge, stamp
    NO_TOOLKIT = "no_toolkit"  # installed versions unknown: leave the cache alone
    NO_CACHE = "no_cache"  # no kernel cache folder yet: nothing to compare
    UNREADABLE = "unreadable"  # the ini may not be read: stamps unknown, cache left alone


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

    @property
    def needs_purge(self) -> bool:
        return self.status in (VersionStatus.UPGRADED, VersionStatus.UNSTAMPED)

    def to_json(self) -> dict[str, Any]:
        inst = self.installed
        return {
            "status": self.status.value,
            "detail": self.detail,
            "installed": {
                "adk_version": {"value": inst.adk.value, "source": inst.adk.source},
                "ops_version": {"value": inst.ops.value, "source": inst.ops.source},
            },
            "ini": {"adk_version": self.ini_adk, "ops_version": self.ini_ops},
            "dry_run": self.dry_run,
            "restamped": self.restamped,
            "purged": [p.to_json() for p in self.purged],
        }


def read_version_info(path: Path) -> str | None:
    """The ``Version=`` value of a CANN ``version.info``, GE's way; None if absent/unreadable.

    Never follows a symlink to a missing file into an error: any OS error gives None.
    """
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        if key.strip() == "Version":
            return value.strip() or None
    return None


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
    adk = _override(sections, ADK_KEY)
    if adk is None:
        adk = Found(None, "not found: " + " / ".join(f"${v}" for v in ADK_ENV_VARS) + " unset")
        for var in ADK_ENV_VARS:
            if env.get(var):
                adk = _first_version(Path(env[var]), ADK_RELATIVE, var)
                if adk.value:
                    break
    ops = _override(sections, OPS_KEY)
    if ops is None:
        ops = Found(None, f"not found: ${OPS_ENV_VAR} unset")
        if env.get(OPS_ENV_VAR):
            ops = _first_version(Path(env[OPS_ENV_VAR]), (VERSION_INFO,), OPS_ENV_VAR)
    return Installed(adk, ops)


def _first_version(home: Path, relatives: tuple[str, ...], var: str) -> Found:
    for rel in relatives:
        value = read_version_info(home / rel)
        if value:
            return Found(value, str(home / rel))
    tried = ", ".join(str(home / rel) for rel in relatives)
    return Found(None, f"not found: no Version= in {tried} (from ${var})")


def compare(cache: layout.CacheLayout, installed: Installed) -> VersionCheck:
    """Compare without changing anything.

    :raises ConfigError: the ini path is a folder, a symlink or unreadable.
    """
    if not installed.complete:
        missing = [f.source for f in (installed.adk, installed.ops) if not f.value]
        detail = "toolkit version unknown (" + "; ".join(missing) + "); cache left alone"
        return VersionCheck(VersionStatus.NO_TOOLKIT, installed, None, None, detail)
    if not cache.kernel_cache_dir.is_dir():
        detail = f"no kernel cache at {cache.kernel_cache_dir} yet; nothing to compare"
        return VersionCheck(VersionStatus.NO_CACHE, installed, None, None, detail)
    try:
        ini = OpCacheIni.load(cache.ini_path)
    except UnreadableIniError as exc:  # never a purge for it (docs/security.md item 3)
        detail = f"{exc}; its version stamps are unknown, cache left alone"
        return VersionCheck(VersionStatus.UNREADABLE, installed, None, None, detail)
    have = f"adk_version={installed.adk.value}, ops_version={installed.ops.value}"
    if ini.adk_version is None or ini.ops_version is None:
        status = VersionStatus.UNSTAMPED
        detail = f"{cache.ini_path} has no version stamps; installed toolkit {have}"
    elif (ini.adk_version, ini.ops_version) == (installed.adk.value, installed.ops.value):
        status = VersionStatus.MATCH
        detail = f"cache stamps match the installed toolkit ({have})"
    else:
        status = VersionStatus.UPGRADED
        detail = (
            f"toolkit changed: ini has adk_version={ini.adk_version}, "
            f"ops_version={ini.ops_version}; installed {have}"
        )
    return VersionCheck(status, installed, ini.adk_version, ini.ops_version, detail)


def sync_toolkit(
    cache: layout.CacheLayout,
    installed: Installed,
    purge: Callable[[Path], PurgeResult],
    dry_run: bool = False,
) -> VersionCheck:
    """Purge every chip folder and restamp the ini when the toolkit changed (SPEC §5).

    :param purge: purges one chip folder (``cachemgr.eviction.purge_chip``); its errors
        (e.g. ``LockBusyError``) propagate and the ini is then not restamped, so the next
        run tries again.
    :param dry_run: only say what would be done.
    :raises ConfigError: an unreadable ini path.
    :raises CachePermissionError: the ini cannot be written.
    """
    check = compare(cache, installed)
    check.dry_run = dry_run
    if not check.needs_purge:
        log.info("%s", check.detail)
        return check
    chips = cache.chip_dirs()
    if dry_run:
        check.detail += f"; would purge {len(chips)} chip folder(s) and restamp"
        return check
    log.warning("%s; purging %d chip folder(s)", check.detail, len(chips))
    for chip in chips:
        check.purged.append(purge(chip))
    ini = OpCacheIni.load(cache.ini_path)
    ini.set(ADK_KEY, str(installed.adk.value))
    ini.set(OPS_KEY, str(installed.ops.value))
    # through the folder's descriptor: a kernel_cache swapped for a link meanwhile gets
    # nothing written through it (docs/security.md item 1)
    with SafeDir.open_kernel_cache(cache.kernel_cache_dir, create=True) as folder:
        ini.save(dir_fd=folder.fd)
    check.restamped = True
    check.detail += f"; purged {len(chips)} chip folder(s) and restamped {cache.ini_path}"
    return check
