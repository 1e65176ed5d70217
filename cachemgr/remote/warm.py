"""Warming a host from the remote tiers (issue 15 item 6): ``cachemgr warm`` and the daemon's
``[remote] prefetch`` download the entries most recently used anywhere for this host's chips
into the local chip folders, so that CANN processes (ATC, torch_npu), which read only their
local folder, hit kernels compiled on another site without any change to the job.

Each entry is

* listed by a remote's index per chip (:meth:`RemoteTiers.recent`: Redis' sorted set, the
  HTTP tier's merged shards), newest first — or named by the caller (``--list FILE``);
* skipped when the chip folder already has it whole (a verified lookup, no access time set);
* fetched and verified (the blob's digest, every part's sha256, caps, names:
  :mod:`cachemgr.remote.blob`); a warm fetch is not a *use*: it does not move the entry up
  in the remote's index (hosts warming themselves would otherwise keep old entries on top);
* kept within the chip folder's size limit: the folder stays at or under its eviction
  target (``max_op_cache_size`` × ``remain_cache_size_ratio`` / 100), so warming never
  triggers an eviction of what the host itself uses; ``max_op_cache_size = -1``: no cap;
* written the way GE writes a compile result (``compiler/opcompiler/op_compile_adapter/
  source/cache/te_cache_manager.cc``, ``TeCacheManager::SetCompileResult`` and
  ``CopyCompileRetIntoCacheDir``): nothing is done when the entry is there; the entry's
  ``<kernel>.lock`` is taken without waiting (``TeCacheUtils::LockAndOpenCacheFile``: busy →
  not cached, here: skipped); the binary, then the header, then the json last, each through a
  temp name and ``rename`` (``TeFileUtils::CopyFileToCacheDir``) — :meth:`Store.publish`,
  which also checks each binary against the json's ``sha256`` before writing anything.

The kernel cache's ``op_cache.ini`` is created with the installed toolkit's stamps when it is
missing: GE purges a chip folder whose kernel cache has no ini (``te_cache_space_manager.cc``
``DelCachedFiles``), which would wipe what was just warmed.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachemgr.config import versions
from cachemgr.errors import CacheMgrError, InvalidInputError, LockBusyError
from cachemgr.remote.tierset import RemoteTiers
from cachemgr.storage import entry, fsutil, safeio
from cachemgr.storage.safedir import SafeDir
from cachemgr.storage.store import EntryHold, check_kernel_name
from cachemgr.storage.tiers import LocalTier

log = logging.getLogger(__name__)

#: Entries per chip that ``warm`` considers when neither ``--limit`` nor ``--list`` is given.
DEFAULT_LIMIT = 1000


@dataclass
class WarmReport:
    """What warming one chip folder did (names by outcome; ``bytes`` written)."""

    soc_version: str
    chip_dir: Path
    source: str
    listed: int = 0
    fetched: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    over_limit: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    not_stored: list[str] = field(default_factory=list)
    bytes: int = 0
    cap_bytes: int | None = None
    seconds: float = 0.0
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        """Counts and names, for ``warm --json`` and the daemon's log."""
        return {
            "soc_version": self.soc_version,
            "chip_dir": str(self.chip_dir),
            "source": self.source,
            "listed": self.listed,
            "fetched": len(self.fetched),
            "present": len(self.present),
            "missing": len(self.missing),
            "over_limit": len(self.over_limit),
            "busy": len(self.busy),
            "not_stored": len(self.not_stored),
            "bytes": self.bytes,
            "cap_bytes": self.cap_bytes,
            "seconds": round(self.seconds, 3),
            "fetched_names": self.fetched,
            **({"error": self.error} if self.error else {}),
        }


#: The largest ``--list`` file read (bytes): 16 MiB is ~100,000 kernel names.
MAX_LIST_BYTES = 16 << 20


def read_list(path: Path) -> list[str]:
    """Kernel names from a file, one a line (blank lines and ``#`` comments skipped).

    :raises InvalidInputError: the file cannot be read, or a line is not a kernel name
        (naming the file and line).
    """
    try:
        text = safeio.read_regular(path, MAX_LIST_BYTES, follow=True).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else exc.strerror
        why = str(exc) if isinstance(exc, safeio.UnsafeFileError) else why
        raise InvalidInputError(f"--list {path}: cannot read ({why})") from exc
    names: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        try:
            check_kernel_name(name)
        except InvalidInputError as exc:
            raise InvalidInputError(f"--list {path} line {number}: {exc}") from exc
        names.append(name)
    return list(dict.fromkeys(names))


def warm_chip(
    remotes: RemoteTiers,
    kernel_cache_dir: Path,
    soc_version: str,
    names: Sequence[str] | None,
    limit: int,
    cap_bytes: int | None,
    sections: Mapping[str, Mapping[str, Any]] | None = None,
) -> WarmReport:
    """Warm one chip folder (see the module docstring).

    :param names: the kernels to fetch (``--list``); None: the ``limit`` most recently used
        of the remotes' index.
    :param cap_bytes: the folder's used bytes may grow up to this many (None: no cap).
    :raises InvalidInputError: ``soc_version`` is not a flat folder name.
    """
    check_kernel_name(soc_version)
    started = time.monotonic()
    chip = kernel_cache_dir / soc_version
    source = "list"
    if names is None:
        why: list[str] = []
        found = remotes.recent(soc_version, limit, why)
        if found is None:
            report = WarmReport(soc_version, chip, "none", cap_bytes=cap_bytes)
            report.error = "no remote index answered: " + ("; ".join(why) or "no remote")
            return report
        names, source = found[0], f"index of remote {found[1]}"
    report = WarmReport(soc_version, chip, source, listed=len(names), cap_bytes=cap_bytes)
    local = LocalTier(kernel_cache_dir)
    used = _used_bytes(chip)
    for kernel in names:
        try:
            check_kernel_name(kernel)
        except InvalidInputError as exc:  # an index is untrusted: a bad name is skipped
            log.warning("warm %s: the remote index names %s", soc_version, exc)
            report.missing.append(kernel)
            continue
        if local.check(soc_version, kernel, touch=False).hit:
            report.present.append(kernel)
            continue
        got = remotes.fetch(soc_version, kernel, use=False)
        if got is None:
            report.missing.append(kernel)
            continue
        item, remote = got
        if cap_bytes is not None and used + item.size > cap_bytes:
            report.over_limit.append(kernel)
            continue
        outcome = _write_like_ge(remotes, local, item, remote)
        getattr(report, outcome).append(kernel)
        if outcome == "fetched":
            used += item.size
            report.bytes += item.size
            remotes.note_local(kernel_cache_dir, soc_version, kernel)
    if report.fetched:
        _ensure_ini(kernel_cache_dir, sections or {})
    report.seconds = time.monotonic() - started
    log.info(
        "warmed %s from %s: %d fetched (%d bytes), %d present, %d missing, %d over the limit",
        soc_version,
        source,
        len(report.fetched),
        report.bytes,
        len(report.present),
        len(report.missing),
        len(report.over_limit),
    )
    return report


def _write_like_ge(remotes: RemoteTiers, local: LocalTier, item: Any, remote: str) -> str:
    """Publish one fetched entry under its lock taken without waiting (GE's way); returns
    the :class:`WarmReport` list it belongs to."""
    store = local.store(item.soc_version)
    try:
        SafeDir.open_chip(store.chip_dir, create=True).close()  # no link followed
        lock = store.entry_lock(item.kernel)
        if not lock.acquire(blocking=False):
            return "busy"
    except LockBusyError:
        return "busy"
    except (OSError, CacheMgrError) as exc:
        log.warning("warm %s/%s: %s", item.soc_version, item.kernel, exc)
        return "not_stored"
    try:
        local.put(item, held=EntryHold(store.chip_dir, item.kernel, lock))
    except InvalidInputError as exc:
        remotes.reject(remote, item.soc_version, item.kernel, str(exc))
        return "not_stored"
    except (OSError, CacheMgrError) as exc:
        log.warning("warm %s/%s: not stored: %s", item.soc_version, item.kernel, exc)
        return "not_stored"
    finally:
        lock.release()
    return "fetched"


def _used_bytes(chip: Path) -> int:
    """The chip folder's used bytes (SPEC §5: regular files' apparent sizes); 0 if absent."""
    try:
        return entry.scan_chip(chip).used_bytes
    except FileNotFoundError:
        return 0


def _ensure_ini(kernel_cache_dir: Path, sections: Mapping[str, Mapping[str, Any]]) -> None:
    if fsutil.lstat_or_none(kernel_cache_dir / "op_cache.ini") is not None:
        return
    try:
        versions.ensure_ini(kernel_cache_dir, versions.installed_versions(os.environ, sections))
    except (OSError, CacheMgrError) as exc:
        log.warning("could not create %s/op_cache.ini: %s", kernel_cache_dir, exc)
