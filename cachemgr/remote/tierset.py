"""The remote tiers in order, each behind a circuit breaker, with a bounded upload queue.

* :meth:`RemoteTiers.fetch` asks each remote in order; the first verified hit wins. A remote
  that fails (down, slow past its timeout, an error) counts a failure; after
  ``failures_before_open`` in a row its breaker opens and the remote is skipped for
  ``open_s`` seconds, then one request probes it (half-open); a success closes it. A lookup
  that times out opens it at once (a hung remote costs a process one timeout), and with a
  state folder the open window is shared by the user's runs on the host
  (:mod:`cachemgr.remote.breakerfile`). One warning line per state change — and for the
  first failure of a run, naming the remote's URL and the error — never one per request.
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
* An entry over a remote's cap is not read whole nor sent, and a server refusing one for its
  size (HTTP ``413``, a connection dropped while the server still answers a ping) is that
  entry's problem: counted ``oversized``, logged once per remote, never a breaker failure
  (docs/remote.md#sizes).
* :meth:`RemoteTiers.close` waits a bounded time for queued uploads (a CLI run:
  :data:`EXIT_WAIT_S`); the rest are dropped and counted.
* A remote that refuses our credentials (Redis ``WRONGPASS``/``NOAUTH``, HTTP 401/403) is
  ``disabled`` until the daemon reloads or restarts: retrying cannot help (one error line).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachemgr.remote import blob, signing
from cachemgr.remote.breakerfile import BreakerFile
from cachemgr.remote.config import UPLOADS_OFF, RemoteConfig, RemoteSpec, load_keys
from cachemgr.remote.uploadcap import EntryTooBig, upload_cap
from cachemgr.storage import fsutil
from cachemgr.storage.entry import sha256_hex
from cachemgr.storage.noatime import SHARED_WRITER
from cachemgr.storage.tiers import EntryFiles, LocalTier, TierStat
from cachemgr.words import plural

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
    "oversized",  # not sent (over the remote's cap) or refused by the server for its size
)
#: Seconds a CLI run waits for its queued uploads when it exits; the rest are dropped.
EXIT_WAIT_S = 0.4
#: Entries remembered as uploaded (by their main json's identity) so that an entry seen twice
#: (the compile's own upload and the watcher's event, or each reconciliation) goes once.
UPLOADED_MEMORY = 65_536
#: A job of the upload queue: (kernel cache, soc_version, kernel, seen, the parts' SHA-256 as
#: this process published them or None) or a flush of indexes.
Job = tuple[Path, str, str, bool, Mapping[str, str] | None] | str
FLUSH = "flush"


@dataclass
class Breaker:
    """A circuit breaker for one remote (docs/remote.md#failure-isolation).

    ``ok`` → (``failures_before_open`` failures in a row, or one lookup that timed out) →
    ``failing`` for ``open_s`` seconds, then one probe at a time; a success → ``ok``.
    One warning line for the first failure of a run (naming ``url`` too), one when it opens
    and one when it is back; the failures between are debug lines. With a ``store``, opening
    is written to the shared state file and a new breaker starts open while another run's
    window lasts (:mod:`cachemgr.remote.breakerfile`).
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
    store: BreakerFile | None = None
    #: the remote's URL (:attr:`RemoteSpec.url`), named beside ``name`` when it differs
    url: str = ""
    _probing: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        left = self.store.load(self.open_s) if self.store is not None else None
        if left is None:
            return
        seconds, self.why = left
        self.state, self.failures = FAILING, self.failures_before_open
        self.open_until = self.clock() + seconds
        log.warning(
            "remote %s failing (%s, seen by an earlier run): skipped for %.1f s more, then probed",
            self.name,
            self.why,
            seconds,
        )

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
            if self.store is not None:
                self.store.clear()

    def disable(self, why: str) -> None:
        """The remote refused our credentials: skip it until reload (one error line)."""
        with self._lock:
            was, self.state, self.why = self.state, DISABLED, why
        if was != DISABLED:
            log.error("remote %s disabled (%s): fix its credentials, then reload", self.name, why)

    def failure(self, why: str, trip: bool = False) -> None:
        """A request failed: open the breaker after too many in a row, or at once with
        ``trip`` (one warning line); an open breaker's window is saved to its store.

        :param trip: the failure cost a caller its timeout (a lookup timed out): every
            further lookup would cost the same, so the remote is skipped now.
        """
        with self._lock:
            if self.state == DISABLED:
                return
            self.failures += 1
            self.why = why
            self._probing = False
            opening = self.state == OK and (trip or self.failures >= self.failures_before_open)
            counting = self.state == OK and not opening  # a run that has not opened it yet
            if self.state == FAILING or opening:
                self.open_until = self.clock() + self.open_s
            if opening:
                self.state = FAILING
            reopened = self.state == FAILING
            failures, left = self.failures, self.failures_before_open - self.failures
        if opening:
            log.warning(
                "remote %s failing (%s): skipped for %g s, then probed", self.name, why, self.open_s
            )
        elif counting:  # the first of a run is said (an outage starts), the others debug
            log.log(
                logging.WARNING if failures == 1 else logging.DEBUG,
                "remote %s: %s (%d more in a row and it is skipped)",
                self._named(),
                why,
                left,
            )
        if reopened and self.store is not None:
            self.store.save(self.open_s, why)

    def _named(self) -> str:
        """``name (url)``, or the name alone when it is the URL (no ``name=``)."""
        return self.name if self.url in ("", self.name) else f"{self.name} ({self.url})"


class RemoteTiers:
    """The configured remotes (see the module docstring).

    :param tiers: the remote tier objects in lookup order (each has ``name``, ``spec``,
        ``read_only``, ``fetch``, ``put``, ``stat``, ``close``).
    :param config: the breaker and queue tunables, ``upload_writers``.
    :param state_dir: the user's folder for the breakers' shared state
        (:mod:`cachemgr.remote.breakerfile`); None: each breaker lives in this process only.
    :param keys: the site's keys (the tiers hold the same: :func:`make_tier`); default none.
    """

    def __init__(
        self,
        tiers: Sequence[Any],
        config: RemoteConfig,
        state_dir: Path | None = None,
        keys: signing.Keys | None = None,
    ) -> None:
        self.tiers = list(tiers)
        self.keys = keys or signing.Keys()
        #: whose files may be uploaded: the daemon's own user and ``upload_writers``
        self.upload_uids = frozenset({os.geteuid(), *config.upload_uids})
        self.upload_refused = 0
        self.rejected_by: dict[str, dict[str, int]] = {t.name: {} for t in tiers}
        self._logged: set[tuple[str, ...]] = set()  # (remote, reason, key) / (uid,) said once
        self.breakers = {
            t.name: Breaker(
                t.name,
                config.failures_before_open,
                config.open_s,
                store=_store(t, state_dir),
                url=_shown(t),
            )
            for t in tiers
        }
        self.counts: dict[str, dict[str, int]] = {t.name: dict.fromkeys(COUNTERS, 0) for t in tiers}
        self.dropped = 0
        self._lock = threading.Lock()
        self._queue: queue.Queue[Job | None] = queue.Queue(config.upload_queue)
        self._thread: threading.Thread | None = None
        #: (kernel cache, soc, kernel) → (inode, mtime ns) of the main json last uploaded
        self._uploaded: OrderedDict[tuple[str, str, str], tuple[int, int]] = OrderedDict()
        #: (remote, soc_version, kernel) whose value on the remote was rejected: it is not
        #: "present" there, and a verified local entry replaces it (bounded like _uploaded)
        self._bad_there: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._current: Job | None = None  # the job the uploader is doing now
        self._said_oversized: set[str] = set()  # remotes whose oversized entry was logged

    @classmethod
    def from_config(
        cls,
        config: RemoteConfig,
        state_dir: Path | None = None,
        *,
        strict_key: bool = False,
        stat_only: bool = False,
    ) -> RemoteTiers | None:
        """The tiers of ``config``, or None when no remote is configured (``state_dir``: see
        the class). Without a ``signing_key`` uploads are off (one warning line).

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
        tiers = [make_tier(s, keys) for s in config.remotes]
        return cls(tiers, config, state_dir, keys)

    def _count(self, name: str, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name][key] += n

    def fetch(
        self, soc_version: str, kernel: str, use: bool = True, missed: list[str] | None = None
    ) -> tuple[EntryFiles, str] | None:
        """The first verified hit and its remote's name, or None. Never raises for a remote's
        failure or garbage (counted and logged instead). A lookup that times out opens the
        remote's breaker at once: a hung remote costs a process one timeout.

        :param use: a fetch to serve a request (True) moves the entry up in the remote's
            index ("used anywhere"); a warm fetch (False) does not.
        :param missed: when given, the names of the remotes that answered "absent" are
            appended to it.
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
            except Exception as exc:  # any failure of a remote is isolated
                self._failed(tier, exc, lookup=True)
                continue
            breaker.success()
            if got is None:
                self._count(tier.name, "misses")
                if missed is not None:
                    missed.append(tier.name)
                continue
            self._count(tier.name, "hits")
            self._count(tier.name, "bytes_in", got.size)
            note_use = getattr(tier, "note_use", None)
            if use and note_use is not None and not tier.read_only:  # used anywhere
                note_use(soc_version, kernel)
                self._enqueue(FLUSH)
            return got, tier.name
        return None

    def _failed(self, tier: Any, exc: BaseException, lookup: bool = False) -> None:
        """Count a failed request; credentials refused disable the remote, anything else
        goes to its breaker — a lookup that timed out opens it at once (``lookup``)."""
        self._count(tier.name, "errors")
        fatal = getattr(tier, "fatal", None)
        if fatal is not None and fatal(exc):
            self.breakers[tier.name].disable(_one_line(exc))
        else:
            self.breakers[tier.name].failure(_one_line(exc), trip=lookup and _timed_out(tier, exc))

    def forget(self, name: str, soc_version: str, kernel: str) -> bool:
        """Drop remote ``name``'s index row of ``kernel``, whose entry that remote no longer
        has (the server evicted it); True when a row was dropped. Never raises for the
        remote's failure (counted; a read-only remote is never written)."""
        tier = next((t for t in self.tiers if t.name == name), None)
        forget = getattr(tier, "forget", None)
        if tier is None or forget is None or tier.read_only or not self.breakers[name].allow():
            return False
        try:
            dropped = bool(forget(soc_version, kernel))
        except Exception as exc:
            self._failed(tier, exc, lookup=True)
            return False
        self.breakers[name].success()
        return dropped

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
                self._failed(tier, exc, lookup=True)
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
            self._bad_there[(name, soc_version, kernel)] = None
            while len(self._bad_there) > UPLOADED_MEMORY:
                self._bad_there.popitem(last=False)
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
        self,
        kernel_cache_dir: Path,
        soc_version: str,
        kernel: str,
        seen: bool = False,
        digests: Mapping[str, str] | None = None,
    ) -> bool:
        """Queue the local entry for upload to every writable remote; never blocks.

        :param seen: the daemon saw the entry appear (a CANN process wrote it, or another
            host): the remote is asked first and the entry not sent when it has it.
        :param digests: this process published the entry: the SHA-256 of each part as
            written (:attr:`~cachemgr.storage.store.PublishResult.digests`); it goes only
            while the files read hold exactly those bytes (see :meth:`upload_now`).
        :returns: False when the queue was full (the entry is dropped and counted).
        """
        if not self.writable:
            return False
        return self._enqueue((kernel_cache_dir, soc_version, kernel, seen, digests), count=True)

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
            with self._lock:
                self._current = job
            try:
                if not isinstance(job, str):  # else FLUSH
                    kernel_cache_dir, soc_version, kernel, seen, digests = job
                    self.upload_now(kernel_cache_dir, soc_version, kernel, seen, digests)
                if self._queue.empty():  # a burst is over: write the remotes' indexes once
                    self.flush_indexes()
            except Exception:  # the uploader must outlive any one entry
                log.exception("upload job %s failed", job)
            finally:
                with self._lock:
                    self._current = None
                self._queue.task_done()
        self._queue.task_done()

    def upload_now(
        self,
        kernel_cache_dir: Path,
        soc_version: str,
        kernel: str,
        seen: bool = False,
        digests: Mapping[str, str] | None = None,
    ) -> int:
        """Upload one complete, verified local entry to every writable remote whose breaker
        allows (see :meth:`upload_later` for ``seen`` and ``digests``).

        Whose bytes are signed (docs/remote.md#keys): an entry this process published goes
        when every file read holds the bytes it wrote (``digests``); any other only when
        every file belongs to the daemon's user or an ``upload_writers`` user *and* neither
        its group nor others may write it — a member rewrites a group-writable file in place
        without changing its owner.

        :returns: how many remotes took it (or had it).
        """
        key = (str(kernel_cache_dir), soc_version, kernel)
        ident = _json_ident(kernel_cache_dir, soc_version, kernel)
        if ident is None:
            return 0
        with self._lock:
            if self._uploaded.get(key) == ident:  # this very json went already
                return 0
        writable = [t for t in self.tiers if not t.read_only]
        if not writable:
            return 0
        cap = max(upload_cap(t) for t in writable)
        writers: set[int] = set()
        try:  # never more than the biggest cap in memory
            item = LocalTier(kernel_cache_dir).read(
                soc_version, kernel, max_bytes=cap, writers=writers
            )
        except fsutil.FileTooLargeError:
            for tier in writable:
                self._oversized(tier, soc_version, kernel, f"over the {cap}-byte upload cap")
            return 0
        if item is None:
            log.debug("not uploading %s/%s: not a complete, verified entry", soc_version, kernel)
            return 0
        signable: bool | None = None  # judged once, for the first remote that lacks it
        done = 0
        for tier in writable:
            breaker = self.breakers[tier.name]
            if item.size > upload_cap(tier):  # not sent: no reader would take it
                self._oversized(tier, soc_version, kernel, f"{item.size} bytes, over the cap")
                continue
            if not breaker.allow():
                continue
            try:
                if (
                    seen
                    and not self._was_bad(tier.name, soc_version, kernel)
                    and tier.lookup(soc_version, kernel)
                ):  # a value there that a lookup rejected is no copy: replaced below
                    breaker.success()
                    self._count(tier.name, "present")
                    done += 1
                    continue
                if signable is None:
                    signable = self._signable(item, digests, writers)
                if not signable:
                    breaker.success()  # it answered the lookup, if one was asked
                    continue
                tier.put(item)
            except EntryTooBig as exc:  # the server answered: this entry's problem
                breaker.success()
                self._oversized(tier, soc_version, kernel, str(exc))
                continue
            except Exception as exc:
                if self._answers_otherwise(tier, exc):
                    self._oversized(tier, soc_version, kernel, f"the server dropped it: {exc}")
                else:
                    self._failed(tier, exc)
                continue
            breaker.success()
            with self._lock:
                self._bad_there.pop((tier.name, soc_version, kernel), None)
            self._count(tier.name, "uploads")
            self._count(tier.name, "bytes_out", item.size)
            done += 1
        if done:
            self._remember(key, ident)
        return done

    def _was_bad(self, name: str, soc_version: str, kernel: str) -> bool:
        """True when a lookup on remote ``name`` rejected its value of this entry (an
        outsider's or a damaged blob): the remote has no copy worth keeping."""
        with self._lock:
            return (name, soc_version, kernel) in self._bad_there

    def _signable(
        self, item: EntryFiles, digests: Mapping[str, str] | None, writers: set[int]
    ) -> bool:
        """True when ``item``'s bytes may be signed with the site's key (see
        :meth:`upload_now`): as this process published them (``digests``), else written
        only by trusted users (``writers``)."""
        if digests is not None:
            return self._as_published(item, digests)
        return self._writers_trusted(item.soc_version, item.kernel, writers)

    def _as_published(self, item: EntryFiles, digests: Mapping[str, str]) -> bool:
        """True when ``item`` holds exactly the parts this process published, each with the
        bytes it wrote; else counted (``upload_refused``), one warning line."""
        now = {name: sha256_hex(data) for name, data in item.files.items()}
        if now == dict(digests):
            return True
        changed = sorted(n for n in {*now, *digests} if now.get(n) != digests.get(n))
        self._refused(
            ("published",),
            f"not uploading {item.soc_version}/{item.kernel}: {changed[0]} is not what this "
            "daemon published (written since, by someone who may write the chip folder's "
            "files; it stays on this site)",
        )
        return False

    def _writers_trusted(self, soc_version: str, kernel: str, writers: set[int]) -> bool:
        """True when every file of the entry belongs to the daemon's user or an
        ``upload_writers`` user and nobody else may write it; else counted
        (``upload_refused``), one warning line per owner (or for the shared files)."""
        strangers = sorted(writers - self.upload_uids)
        if not strangers:
            return True
        who = strangers[0]
        why = (
            "its group or others may write a file of it, so its bytes may be any member's"
            if who == SHARED_WRITER
            else f"a file of it belongs to {_user(who)}, not a user of [remote] upload_writers"
        )
        self._refused((str(who),), f"not uploading {soc_version}/{kernel}: {why} "
                      "(it stays on this site)")  # fmt: skip
        return False

    def _refused(self, said: tuple[str, ...], line: str) -> None:
        """Count an upload refused for its writers; ``line`` at warning the first time for
        ``said``, at debug after."""
        with self._lock:
            self.upload_refused += 1
            first = said not in self._logged
            self._logged.add(said)
        log.log(logging.WARNING if first else logging.DEBUG, "%s", line)

    def _oversized(self, tier: Any, soc_version: str, kernel: str, why: str) -> None:
        """An entry not uploaded for its size: counted; logged once per remote (then at
        debug), never a failure of the remote."""
        self._count(tier.name, "oversized")
        first = tier.name not in self._said_oversized
        self._said_oversized.add(tier.name)
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "remote %s: %s/%s not uploaded (%s): its size, not an outage%s",
            tier.name,
            soc_version,
            kernel,
            _first_line(why),
            " (further ones: debug log)" if first else "",
        )

    def _answers_otherwise(self, tier: Any, exc: BaseException) -> bool:
        """After an upload failed (not a timeout, not refused credentials): True when the
        server still answers a ping — it dropped this one entry (a Redis value over its
        ``proto-max-bulk-len``, a body over nginx's ``client_max_body_size`` cut off), which
        is not an outage."""
        fatal = getattr(tier, "fatal", None)
        ping = getattr(tier, "ping", None)
        if ping is None or _timed_out(tier, exc) or (fatal is not None and fatal(exc)):
            return False
        try:
            ping()
        except Exception:
            return False
        self.breakers[tier.name].success()
        return True

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

    def close(self, wait_s: float = 30.0) -> int:
        """Stop the uploader after the queued uploads, waiting at most ``wait_s`` seconds,
        and close the connections. Uploads not done by then are dropped: counted in
        :attr:`dropped`, one warning line; their connections are left to the exiting process.

        :returns: how many uploads were dropped.
        """
        if self._thread is None:
            self.flush_indexes()
        else:
            deadline = time.monotonic() + wait_s
            with contextlib.suppress(queue.Full):
                self._queue.put(None, timeout=wait_s)
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if self._thread.is_alive():
                return self._abandon(wait_s)
        for tier in self.tiers:
            tier.close()
        return 0

    def _abandon(self, wait_s: float) -> int:
        """Drop the uploads still queued or under way (see :meth:`close`)."""
        jobs: list[Job | None] = []
        with self._lock:
            jobs.append(self._current)
            while True:
                try:
                    jobs.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            lost = sum(1 for j in jobs if isinstance(j, tuple))
            self.dropped += lost
        self._queue.put_nowait(None)  # the uploader stops when its request returns
        if lost:
            log.warning(
                "%s to the remotes not done within %g s: dropped (%s)",
                plural(lost, "upload"),
                wait_s,
                ", ".join(f"{n}: {b.state}" for n, b in self.breakers.items()),
            )
        return lost


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


def _store(tier: Any, state_dir: Path | None) -> BreakerFile | None:
    spec = getattr(tier, "spec", None)
    if state_dir is None or not isinstance(spec, RemoteSpec):
        return None
    return BreakerFile(state_dir, spec.base_url)


def _timed_out(tier: Any, exc: BaseException) -> bool:
    """True when ``exc`` says the remote did not answer in time."""
    check = getattr(tier, "timed_out", None)
    return bool(check(exc)) if check is not None else isinstance(exc, TimeoutError)


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


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
