"""Warming a host from the remote tiers: ``cachemgr warm`` and the daemon's
``[remote] prefetch`` download the entries most recently used anywhere for this host's chips
into the local chip folders, so that CANN processes (ATC, torch_npu), which read only their
local folder, hit kernels compiled on another site without any change to the job.

Each entry is

* listed by a remote's index per chip (:meth:`RemoteTiers.recent`: Redis' sorted set, the
  HTTP tier's merged shards), newest first — or named by the caller (``--list FILE``). An
  index row whose entry the remote no longer has (its server evicted it: Redis
  ``allkeys-lru``) is dropped from that index (:meth:`RemoteTiers.forget`) and does not
  count toward ``--limit``: the next rows fill it, so ``--limit N`` considers N entries that
  are there (docs/remote.md#warming-a-host);
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
    #: index rows dropped because their remote no longer has the entry
    dropped_rows: list[str] = field(default_factory=list)
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
            "dropped_rows": len(self.dropped_rows),
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
        of the remotes' index that the remote still has (gone rows are dropped, and the
        next ones fill their places).
    :param cap_bytes: the folder's used bytes may grow up to this many (None: no cap).
    :raises InvalidInputError: ``soc_version`` is not a flat folder name.
    """
    check_kernel_name(soc_version)
    started = time.monotonic()
    chip = kernel_cache_dir / soc_version
    listed_by = ""
    if names is None:
        why: list[str] = []
        found = remotes.recent(soc_version, limit, why)
        if found is None:
            report = WarmReport(soc_version, chip, "none", cap_bytes=cap_bytes)
            report.error = "no remote index answered: " + ("; ".join(why) or "no remote")
            return report
        names, listed_by = found
    source = f"index of remote {listed_by}" if listed_by else "list"
    report = WarmReport(soc_version, chip, source, listed=len(names), cap_bytes=cap_bytes)
    ctx = _Warming(remotes, LocalTier(kernel_cache_dir), report, _used_bytes(chip), cap_bytes)
    for kernel in names:
        ctx.one(soc_version, kernel, listed_by)
    more_rows = len(names) >= limit  # the index had as many rows as asked: maybe more
    while listed_by and more_rows and ctx.counted < limit:  # next rows fill the gone ones' places
        more = remotes.recent(soc_version, len(ctx.tried) + limit - ctx.counted)
        tried = set(ctx.tried)
        fresh = [n for n in more[0] if n not in tried] if more else []
        if more is None or more[1] != listed_by or not fresh:
            break  # the index has no more rows (or another remote answers now)
        more_rows = len(more[0]) >= len(ctx.tried) + limit - ctx.counted
        for kernel in fresh:
            if ctx.counted >= limit:
                break
            report.listed += 1
            ctx.one(soc_version, kernel, listed_by)
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


@dataclass
class _Warming:
    """The state of warming one chip folder: what was tried, the bytes used, the report."""

    remotes: RemoteTiers
    local: LocalTier
    report: WarmReport
    used: int
    cap_bytes: int | None
    tried: list[str] = field(default_factory=list)

    @property
    def counted(self) -> int:
        """Entries that count toward ``--limit``: every one tried but those not there."""
        return len(self.tried) - len(self.report.missing)

    def one(self, soc_version: str, kernel: str, listed_by: str) -> None:
        """Warm one entry (see the module docstring); ``listed_by``: the remote whose index
        named it ("" for ``--list``), whose row is dropped when that remote lacks it."""
        report = self.report
        self.tried.append(kernel)
        try:
            check_kernel_name(kernel)
        except InvalidInputError as exc:  # an index is untrusted: a bad name is skipped
            log.warning("warm %s: the remote index names %s", soc_version, exc)
            report.missing.append(kernel)
            return
        if self.local.check(soc_version, kernel, touch=False).hit:
            report.present.append(kernel)
            return
        missed: list[str] = []
        got = self.remotes.fetch(soc_version, kernel, use=False, missed=missed)
        if listed_by in missed and self.remotes.forget(listed_by, soc_version, kernel):
            report.dropped_rows.append(kernel)
            log.info("warm %s: %s gone from %s: index row dropped", soc_version, kernel, listed_by)
        if got is None:
            report.missing.append(kernel)
            return
        item, remote = got
        if self.cap_bytes is not None and self.used + item.size > self.cap_bytes:
            report.over_limit.append(kernel)
            return
        outcome = _write_like_ge(self.remotes, self.local, item, remote)
        getattr(report, outcome).append(kernel)
        if outcome == "fetched":
            self.used += item.size
            report.bytes += item.size
            self.remotes.note_local(self.local.kernel_cache_dir, soc_version, kernel)


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
    """The chip folder's used bytes (docs/design.md#size-limits-and-eviction: regular files'
    apparent sizes); 0 if absent."""
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
