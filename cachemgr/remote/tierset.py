"""The remote tiers in order, each behind a circuit breaker, with a bounded upload queue
(issue 15 items 5 and 7).

* :meth:`RemoteTiers.fetch` asks each remote in order; the first verified hit wins. A remote
  that fails (down, slow past its timeout, an error) counts a failure; after
  ``failures_before_open`` in a row its breaker opens and the remote is skipped for
  ``open_s`` seconds, then one request probes it (half-open); a success closes it. One
  warning line per state change, never one per request.
* A blob that fails verification is ``rejected`` — not signed by a key of ``[remote]
  trusted_keys``, signed by a retired key, tampered with, or carrying a file that is not one
  of the entry's parts (:mod:`cachemgr.remote.blob`) — counted by reason
  (``rejected_by_reason``), one warning line per remote, reason and signing key, and the
  lookup goes on: remote data is untrusted, it never fails a compile.
* :meth:`RemoteTiers.upload_later` queues an entry for upload and returns at once; the queue
  holds at most ``upload_queue`` entries, more are dropped and counted. One thread uploads.
  Only complete, verified entries go (:meth:`~cachemgr.storage.tiers.LocalTier.read`: entry.py's
  rules, no access time changed, nothing removed), signed with the site's key (no
  ``signing_key``: no uploads), and only when every file of the entry belongs to the daemon's
  own user or a user of ``[remote] upload_writers``: a member's planted entry stays on its
  site (``upload_refused``, one warning line per owner; docs/remote.md#keys). Entries the
  daemon *saw* (written by a CANN process) are first asked for (``EXISTS``/``HEAD``) and
  not sent when the remote has them; an entry whose main json is unchanged since its last
  upload is not sent again.
* A remote that refuses our credentials (Redis ``WRONGPASS``/``NOAUTH``, HTTP 401/403) is
  ``disabled`` until the daemon reloads or restarts: retrying cannot help (one error line).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachemgr.remote import blob, signing
from cachemgr.remote.config import UPLOADS_OFF, RemoteConfig, RemoteSpec, load_keys
from cachemgr.storage.tiers import EntryFiles, LocalTier, TierStat

log = logging.getLogger(__name__)

OK, FAILING, DISABLED = "ok", "failing", "disabled"
COUNTERS = (
    "hits",
    "misses",
    "errors",
    "rejected",
    "bytes_in",
    "bytes_out",
    "uploads",
    "present",  # a seen entry the remote had already: not sent again
)
#: Entries remembered as uploaded (by their main json's identity) so that an entry seen twice
#: (the compile's own upload and the watcher's event, or each reconciliation) goes once.
UPLOADED_MEMORY = 65_536
#: A job of the upload queue: (kernel cache, soc_version, kernel, seen) or a flush of indexes.
Job = tuple[Path, str, str, bool] | str
FLUSH = "flush"


@dataclass
class Breaker:
    """A circuit breaker for one remote (issue 15 item 7).

    ``ok`` → (``failures_before_open`` failures in a row) → ``failing`` for ``open_s``
    seconds, then one probe at a time; a success → ``ok``.
    """

    name: str
    failures_before_open: int
    open_s: float
    clock: Callable[[], float] = time.monotonic
    state: str = OK
    failures: int = 0
    open_until: float = 0.0
    #: the last failure's (or the disabling) reason, one line; "" while ok
    why: str = ""
    _probing: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def allow(self) -> bool:
        """True when a request may go to the remote now (closed, or the one probe)."""
        with self._lock:
            if self.state == OK:
                return True
            if self.state == DISABLED or self.clock() < self.open_until or self._probing:
                return False
            self._probing = True
            return True

    def success(self) -> None:
        """A request succeeded: close the breaker (one info line if it was open)."""
        with self._lock:
            was, self.state, self.failures, self._probing = self.state, OK, 0, False
            self.why = ""
        if was != OK:
            log.warning("remote %s is back: using it again", self.name)

    def disable(self, why: str) -> None:
        """The remote refused our credentials: skip it until reload (one error line)."""
        with self._lock:
            was, self.state, self.why = self.state, DISABLED, why
        if was != DISABLED:
            log.error("remote %s disabled (%s): fix its credentials, then reload", self.name, why)

    def failure(self, why: str) -> None:
        """A request failed: open the breaker after too many in a row (one warning line)."""
        with self._lock:
            if self.state == DISABLED:
                return
            self.failures += 1
            self.why = why
            self._probing = False
            opening = self.state == OK and self.failures >= self.failures_before_open
            if self.state == FAILING or opening:
                self.open_until = self.clock() + self.open_s
            if opening:
                self.state = FAILING
        if opening:
            log.warning(
                "remote %s failing (%s): skipped for %g s, then probed", self.name, why, self.open_s
            )


class RemoteTiers:
    """The configured remotes (see the module docstring).

    :param tiers: the remote tier objects in lookup order (each has ``name``, ``spec``,
        ``read_only``, ``fetch``, ``put``, ``stat``, ``close``).
    :param config: the breaker and queue tunables, ``upload_writers``.
    :param keys: the site's keys (the tiers hold the same: :func:`make_tier`); default none.
    """

    def __init__(
        self, tiers: Sequence[Any], config: RemoteConfig, keys: signing.Keys | None = None
    ) -> None:
        self.tiers = list(tiers)
        self.keys = keys or signing.Keys()
        #: whose files may be uploaded: the daemon's own user and ``upload_writers``
        self.upload_uids = frozenset({os.geteuid(), *config.upload_uids})
        self.upload_refused = 0
        self.rejected_by: dict[str, dict[str, int]] = {t.name: {} for t in tiers}
        self._logged: set[tuple[str, ...]] = set()  # (remote, reason, key) / (uid,) said once
        self.breakers = {
            t.name: Breaker(t.name, config.failures_before_open, config.open_s) for t in tiers
        }
        self.counts: dict[str, dict[str, int]] = {t.name: dict.fromkeys(COUNTERS, 0) for t in tiers}
        self.dropped = 0
        self._lock = threading.Lock()
        self._queue: queue.Queue[Job | None] = queue.Queue(config.upload_queue)
        self._thread: threading.Thread | None = None
        #: (kernel cache, soc, kernel) → (inode, mtime ns) of the main json last uploaded
        self._uploaded: OrderedDict[tuple[str, str, str], tuple[int, int]] = OrderedDict()

    @classmethod
    def from_config(
        cls, config: RemoteConfig, *, strict_key: bool = False, stat_only: bool = False
    ) -> RemoteTiers | None:
        """The tiers of ``config``, or None when no remote is configured. Without a
        ``signing_key`` uploads are off (one warning line).

        :param strict_key: a ``signing_key`` that cannot be used raises (the daemon); else
            uploads are off with one warning line (:func:`~cachemgr.remote.config.load_keys`).
        :param stat_only: the tiers only answer :meth:`stat_all` (``verify``): no key is read
            and no trusted key is needed.
        :raises ConfigError: no trusted key (and no ``trust_unsigned``): reading is refused;
            ``strict_key`` and a bad private key.
        """
        if not config.remotes:
            return None
        keys = signing.Keys() if stat_only else load_keys(config, strict_key)
        writes = any(not s.read_only for s in config.remotes)
        if not stat_only and writes and config.signing_key is None:
            log.warning("%s", UPLOADS_OFF)
        return cls([make_tier(s, keys) for s in config.remotes], config, keys)

    def _count(self, name: str, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name][key] += n

    def fetch(
        self, soc_version: str, kernel: str, use: bool = True
    ) -> tuple[EntryFiles, str] | None:
        """The first verified hit and its remote's name, or None. Never raises for a remote's
        failure or garbage (counted and logged instead).

        :param use: a fetch to serve a request (True) moves the entry up in the remote's
            index ("used anywhere"); a warm fetch (False) does not.
        """
        for tier in self.tiers:
            breaker = self.breakers[tier.name]
            if not breaker.allow():
                continue
            try:
                got = tier.fetch(soc_version, kernel, use=use)
            except blob.BadBlob as exc:
                breaker.success()  # the server answered: garbage is not an outage
                self._reject(tier.name, soc_version, kernel, exc.reason, exc.key, str(exc))
                continue
            except Exception as exc:  # any failure of a remote is isolated (item 7)
                self._failed(tier, exc)
                continue
            breaker.success()
            if got is None:
                self._count(tier.name, "misses")
                continue
            self._count(tier.name, "hits")
            self._count(tier.name, "bytes_in", got.size)
            note_use = getattr(tier, "note_use", None)
            if use and note_use is not None and not tier.read_only:  # used anywhere (item 6)
                note_use(soc_version, kernel)
                self._enqueue(FLUSH)
            return got, tier.name
        return None

    def _failed(self, tier: Any, exc: BaseException) -> None:
        """Count a failed request; credentials refused disable the remote, anything else
        goes to its breaker."""
        self._count(tier.name, "errors")
        fatal = getattr(tier, "fatal", None)
        if fatal is not None and fatal(exc):
            self.breakers[tier.name].disable(_one_line(exc))
        else:
            self.breakers[tier.name].failure(_one_line(exc))

    def recent(
        self, soc_version: str, limit: int, why: list[str] | None = None
    ) -> tuple[list[str], str] | None:
        """The chip's kernel names most recently used anywhere (uploaded or fetched), newest
        first, at most ``limit``, from the first remote whose index answers; with its name.
        None when no remote could tell.

        :param why: when given, one line per remote that did not answer is appended to it:
            its URL and the reason (``ConnectionError: … Connection
            refused``, or why it was skipped).
        """
        reasons = why if why is not None else []
        for tier in self.tiers:
            breaker = self.breakers[tier.name]
            if not hasattr(tier, "recent"):
                reasons.append(f"{_shown(tier)}: has no index")
                continue
            if not breaker.allow():
                reasons.append(f"{_shown(tier)}: skipped, {breaker.state} ({breaker.why})")
                continue
            try:
                names = tier.recent(soc_version, limit)
            except Exception as exc:
                self._failed(tier, exc)
                reasons.append(f"{_shown(tier)}: {_one_line(exc)}")
                continue
            breaker.success()
            return names, tier.name
        return None

    def reject(self, name: str, soc_version: str, kernel: str, why: str) -> None:
        """A fetched entry that the local store refused (its json does not match its
        binaries): counted as ``rejected`` (reason ``entry``) with one warning line."""
        self._reject(name, soc_version, kernel, "entry", "", why)

    def _reject(
        self, name: str, soc_version: str, kernel: str, reason: str, key: str, why: str
    ) -> None:
        """Count a rejected blob by reason; one warning line per remote, reason and signing
        key (an attacker's flood of blobs is one line), debug after that."""
        with self._lock:
            self.counts[name]["rejected"] += 1
            by = self.rejected_by.setdefault(name, {})
            by[reason] = by.get(reason, 0) + 1
            first = (name, reason, key) not in self._logged
            self._logged.add((name, reason, key))
        level = logging.WARNING if first else logging.DEBUG
        more = " (further ones of this remote, reason and key: debug)" if first else ""
        log.log(level, "remote %s: %s/%s rejected (%s): %s%s", name, soc_version, kernel,
                reason, why, more)  # fmt: skip

    @property
    def writable(self) -> bool:
        """True when some remote takes uploads and this site can sign them."""
        return self.keys.signer_name is not None and any(not t.read_only for t in self.tiers)

    def upload_later(
        self, kernel_cache_dir: Path, soc_version: str, kernel: str, seen: bool = False
    ) -> bool:
        """Queue the local entry for upload to every writable remote; never blocks.

        :param seen: the daemon saw the entry appear (a CANN process wrote it, or another
            host): the remote is asked first and the entry not sent when it has it.
        :returns: False when the queue was full (the entry is dropped and counted).
        """
        if not self.writable:
            return False
        return self._enqueue((kernel_cache_dir, soc_version, kernel, seen), count=True)

    def _enqueue(self, job: Job, count: bool = False) -> bool:
        self._start()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            if count:
                with self._lock:
                    self.dropped += 1
            return False
        return True

    def note_local(self, kernel_cache_dir: Path, soc_version: str, kernel: str) -> None:
        """The local entry came from a remote: remember it as uploaded (it is not sent back
        when the daemon sees it appear)."""
        ident = _json_ident(kernel_cache_dir, soc_version, kernel)
        if ident is not None:
            self._remember((str(kernel_cache_dir), soc_version, kernel), ident)

    def _remember(self, key: tuple[str, str, str], ident: tuple[int, int]) -> None:
        with self._lock:
            self._uploaded[key] = ident
            self._uploaded.move_to_end(key)
            while len(self._uploaded) > UPLOADED_MEMORY:
                self._uploaded.popitem(last=False)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._upload_loop, name="cachemgr-upload", daemon=True
                )
                self._thread.start()

    def _upload_loop(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                if not isinstance(job, str):  # else FLUSH
                    kernel_cache_dir, soc_version, kernel, seen = job
                    self.upload_now(kernel_cache_dir, soc_version, kernel, seen)
                if self._queue.empty():  # a burst is over: write the remotes' indexes once
                    self.flush_indexes()
            except Exception:  # the uploader must outlive any one entry
                log.exception("upload job %s failed", job)
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def upload_now(
        self, kernel_cache_dir: Path, soc_version: str, kernel: str, seen: bool = False
    ) -> int:
        """Upload one complete, verified local entry to every writable remote whose breaker
        allows (see :meth:`upload_later` for ``seen``).

        :returns: how many remotes took it (or had it).
        """
        key = (str(kernel_cache_dir), soc_version, kernel)
        ident = _json_ident(kernel_cache_dir, soc_version, kernel)
        if ident is None:
            return 0
        with self._lock:
            if self._uploaded.get(key) == ident:  # this very json went already
                return 0
        owners: set[int] = set()
        item = LocalTier(kernel_cache_dir).read(soc_version, kernel, owners=owners)
        if item is None:
            log.debug("not uploading %s/%s: not a complete, verified entry", soc_version, kernel)
            return 0
        if not self._writers_trusted(soc_version, kernel, owners):
            return 0
        done = 0
        for tier in self.tiers:
            breaker = self.breakers[tier.name]
            if tier.read_only or not breaker.allow():
                continue
            try:
                if seen and tier.lookup(soc_version, kernel):
                    breaker.success()
                    self._count(tier.name, "present")
                    done += 1
                    continue
                tier.put(item)
            except Exception as exc:
                self._failed(tier, exc)
                continue
            breaker.success()
            self._count(tier.name, "uploads")
            self._count(tier.name, "bytes_out", item.size)
            done += 1
        if done:
            self._remember(key, ident)
        return done

    def _writers_trusted(self, soc_version: str, kernel: str, owners: set[int]) -> bool:
        """True when every file of the entry belongs to the daemon's user or an
        ``upload_writers`` user; else counted (``upload_refused``), one warning line per
        owner."""
        strangers = sorted(owners - self.upload_uids)
        if not strangers:
            return True
        with self._lock:
            self.upload_refused += 1
            first = (str(strangers[0]),) not in self._logged
            self._logged.add((str(strangers[0]),))
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "not uploading %s/%s: a file of it belongs to %s, not a user of [remote] "
            "upload_writers (it stays on this site)",
            soc_version,
            kernel,
            _user(strangers[0]),
        )
        return False

    def flush_indexes(self) -> None:
        """Write each remote's pending index changes (HTTP index shards; Redis needs none)."""
        for tier in self.tiers:
            flush = getattr(tier, "flush_index", None)
            if flush is None or tier.read_only or not self.breakers[tier.name].allow():
                continue
            try:
                flush()
            except Exception as exc:
                self._failed(tier, exc)

    def drain(self, timeout_s: float = 30.0) -> bool:
        """Wait until the upload queue is empty (tests, shutdown). True when it emptied."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per remote: the counters, ``state`` (ok / failing / disabled) and its URL
        (redacted); plus ``upload_dropped``."""
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            for tier in self.tiers:
                row: dict[str, Any] = dict(self.counts[tier.name])
                row["rejected_by_reason"] = dict(sorted(self.rejected_by[tier.name].items()))
                row["state"] = self.breakers[tier.name].state
                row["url"] = tier.spec.url
                row["read_only"] = tier.read_only
                out[tier.name] = row
        return out

    def enable_all(self) -> None:
        """After a reload: remotes disabled for refused credentials are tried again."""
        for breaker in self.breakers.values():
            with breaker._lock:
                if breaker.state == DISABLED:
                    breaker.state, breaker.failures = OK, 0

    def stat_all(self) -> list[TierStat]:
        """Each remote's own :meth:`stat` (cheap: no blob is read); a failing one says so."""
        rows = []
        for tier in self.tiers:
            try:
                row = tier.stat()
                row.state = self.breakers[tier.name].state
            except Exception as exc:
                row = TierStat(tier.name, state=FAILING, detail={"error": _one_line(exc)})
            rows.append(row)
        return rows

    def close(self) -> None:
        """Stop the uploader (after the queued uploads) and close the connections."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
        else:
            self.flush_indexes()
        for tier in self.tiers:
            tier.close()


def make_tier(spec: RemoteSpec, keys: signing.Keys | None = None) -> Any:
    """The tier object for one spec, signing and verifying with ``keys``.

    :raises ConfigError: a kind not built yet.
    """
    from cachemgr.errors import ConfigError

    if spec.kind == "redis":
        from cachemgr.remote.redis_tier import RedisTier

        return RedisTier(spec, keys=keys)
    if spec.kind == "http":
        from cachemgr.remote.http_tier import HttpTier

        return HttpTier(spec, keys=keys)
    raise ConfigError(f"remote storage {spec.display}: {spec.scheme}:// is not supported yet")


def _json_ident(kernel_cache_dir: Path, soc_version: str, kernel: str) -> tuple[int, int] | None:
    """(inode, mtime ns) of the entry's main json, None when it is not there."""
    try:
        st = os.lstat(kernel_cache_dir / soc_version / f"{kernel}.json")
    except (OSError, ValueError):
        return None
    return (st.st_ino, st.st_mtime_ns)


def _shown(tier: Any) -> str:
    """A remote as errors name it: its URL (no credentials, no attributes)."""
    spec = getattr(tier, "spec", None)
    return spec.url if isinstance(spec, RemoteSpec) else str(tier.name)


def _user(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` for a uid without a name."""
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{type(exc).__name__}: {text}"
