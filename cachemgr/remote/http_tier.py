"""The HTTP tier, with requests (connection pooling, auth, TLS).

``GET``/``PUT``/``HEAD``/``DELETE`` of one entry blob (:mod:`cachemgr.remote.blob`) at a URL
derived from the entry's key ``cachemgr:<blob format>:<soc_version>:<kernel>`` by its
sha256 (64 hex digits, ``h``), in one of ccache's layouts:

* ``subdirs`` (default, as ccache's): ``<url>/<h[:2]>/<h[2:]>``;
* ``flat``: ``<url>/<h>``;
* ``bazel``: ``<url>/ac/<h>`` — an action-cache slot of bazel-remote started with
  ``--disable_http_ac_validation`` (the value is not an ActionResult).

So an existing bazel-remote, nginx with WebDAV, or any server that accepts ``PUT`` works. A
WebDAV server that answers ``409 Conflict`` to a ``PUT`` into a missing folder (nginx with
``create_full_put_path off`` answers ``500``: its rename fails) gets every folder of the URL's
path made, from the top (``MKCOL``; ``405``: it exists already — so
``http://host/very/long/prefix`` works on an empty server), and the ``PUT`` once more. An
upload waits ``upload-timeout``, every other request ``operation-timeout``. A blob over
``max_blob_bytes`` is not sent, and ``413 Payload Too Large`` is that entry's problem
(:class:`~cachemgr.remote.uploadcap.EntryTooBig`), not an outage of the server. Basic auth
comes from the URL or a ``password-file``; a bearer token from ``bearer-token-file``. A
redirect is never followed (an error naming it), a ``Content-Encoding`` never decoded, and an
answer must arrive whole within :func:`answer_deadline_s`.
``https://`` verifies against the system's CA bundle. The server owns its size (``gc`` never
touches a remote).

**The index per chip** (``warm`` and ``[remote] prefetch`` list the entries most
recently used anywhere). An HTTP cache cannot list its keys and most cannot update an object
atomically (bazel-remote and nginx ignore ``If-Match`` on ``PUT``: the last writer wins), so
one shared index object would lose concurrent writers' updates. Instead each writer (a host
and user: :func:`default_writer`) owns one *shard* per chip, a JSON object at the key
``cachemgr:<format>:index:<soc>:writer:<id>`` mapping kernel names to the time they were last
uploaded or fetched there; nobody else writes it, so no update is lost. Readers merge every
shard (the newest time wins). The shards are found through a small *registry* per chip
(``cachemgr:<format>:index:<soc>:writers``): at every flush of its shard a writer reads the
registry (one ``GET``) and, only when it is not listed, adds itself — ``PUT`` with
``If-Match: <ETag>`` (or ``If-None-Match: *`` for a new registry) where the server gives an
ETag (WebDAV servers honour it: a lost race answers ``412`` and is retried), then reads it
back. Servers that ignore conditions (bazel-remote), or check them apart from the write
(wsgidav), can still let a racing ``PUT`` drop a name; the writer adds itself again at its
next flush, so a registry name is never lost for longer than one flush interval and a
shard's content is never lost at all. All
index objects live at the layout's URL of the sha256 of their key, like entries (so
``bazel`` keeps its ``/ac/<64 hex>`` shape), and are untrusted input when read (size-capped,
every name checked).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import ssl
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import requests
import urllib3.exceptions

from cachemgr.config.configfile import redact_url
from cachemgr.constants import short_host
from cachemgr.remote import blob, signing
from cachemgr.remote.config import RemoteSpec
from cachemgr.remote.uploadcap import EntryTooBig, check_blob
from cachemgr.storage.tiers import EntryFiles, TierStat

#: The errors of an unreachable, slow or failing server (the breaker counts them).
ERRORS: tuple[type[BaseException], ...] = (requests.RequestException, OSError)
CHUNK_BYTES = 1 << 20
#: The slowest pace an answer may come at: this many bytes per ``operation-timeout``
#: (:func:`answer_deadline_s`).
MIN_RATE_BYTES = 1 << 20
#: Answers to a ``PUT`` into a missing folder: RFC 4918's ``409`` (wsgidav, Apache), nginx's
#: ``500`` (``create_full_put_path off``). Folders are made and the ``PUT`` tried once more.
NO_FOLDER = (409, 500)
log = logging.getLogger(__name__)
#: Format of the index objects (registry and shards).
INDEX_FORMAT = 1
#: The biggest index object read (bytes); a writer keeps at most INDEX_KEEP names per chip.
MAX_INDEX_BYTES = 8 << 20
INDEX_KEEP = 20_000
#: The most writers' shards :meth:`HttpTier.recent` reads per chip (bounds a read to
#: 64 × ``MAX_INDEX_BYTES`` on the wire, one shard in memory at a time).
MAX_INDEX_WRITERS = 64
#: A shard of n names has n + 2 commas (between its four members, between its names;
#: names have none): more is more than n names, known before parsing.
_DOC_COMMAS = 2
#: What :meth:`HttpTier._read_shard` returns for a shard over a cap (compared by identity).
_REFUSED: Mapping[str, float] = MappingProxyType({})
#: Attempts to get a writer into a chip's registry (read, add, PUT, read back).
REGISTER_ATTEMPTS = 8
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")
_WRITER = re.compile(r"[0-9a-f]{16}")


def answer_deadline_s(operation_timeout_s: float, size: int) -> float:
    """Seconds the whole body of an answer of ``size`` bytes may take: one
    ``operation-timeout`` for it to start, one more per :data:`MIN_RATE_BYTES` (a LAN server
    streams a 64 MiB blob in well under a second; this allows 33 s at the default 500 ms)."""
    return operation_timeout_s * (1 + -(-max(0, size) // MIN_RATE_BYTES))


def default_writer() -> str:
    """This writer's id: 16 hex digits of sha256(short host name, uid) — stable across
    restarts, so a restarted daemon goes on with its own shard."""
    raw = f"{short_host()}:{os.getuid()}".encode()
    return hashlib.sha256(raw).hexdigest()[:16]


class HttpError(OSError):
    """An HTTP status that is neither success nor "not found" (one line: method, status)."""


def _system_cas() -> str | bool:
    """The system's CA bundle (``ssl``'s default), else requests' own."""
    cafile = ssl.get_default_verify_paths().cafile
    return cafile if cafile and Path(cafile).is_file() else True


def _read1(resp: requests.Response, url: str) -> bytes:
    """The next bytes of ``resp``'s body as they arrive (b"" at its end), urllib3's read
    errors raised as the ``requests`` ones every caller of a tier handles — as
    ``Response.iter_content`` maps them, which this raw read (no decoding) does not use.

    :raises requests.ReadTimeout: silent for the read timeout (``operation-timeout``).
    :raises requests.ConnectionError: the connection broke or the body was cut short.
    """
    try:
        return resp.raw.read1(CHUNK_BYTES, decode_content=False)
    except urllib3.exceptions.ReadTimeoutError as exc:
        raise requests.ReadTimeout(f"GET {redact_url(url)}: read timed out mid-answer") from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:  # ProtocolError among them
        raise requests.ConnectionError(f"GET {redact_url(url)}: {exc}") from exc


class HttpTier:
    """An HTTP cache server as a storage tier (see the module docstring)."""

    def __init__(
        self,
        spec: RemoteSpec,
        max_part_bytes: int = blob.DEFAULT_MAX_PART_BYTES,
        writer: str | None = None,
        keys: signing.Keys | None = None,
    ):
        self.spec = spec
        self.keys = keys or signing.Keys()  # see RedisTier
        self.writer = writer or default_writer()
        self._index_lock = threading.Lock()
        self._shards: dict[str, dict[str, float]] = {}  # soc → kernel → time (this writer's)
        self._loaded: set[str] = set()  # chips whose shard was read back from the server
        self._dirty: set[str] = set()
        self.name = spec.name
        self.read_only = spec.read_only
        self.max_part_bytes = max_part_bytes
        self.max_blob_bytes = blob.DEFAULT_MAX_BLOB_BYTES
        base = spec.base_url
        self.base = ("https" if spec.scheme == "https" else "http") + base[len(spec.scheme) :]
        self._session = requests.Session()
        self._session.verify = _system_cas()
        self._session.trust_env = False  # no proxy from the environment for a cache server
        # blobs are read as sent: a server's Content-Encoding is never decoded (a blob so
        # encoded fails its checks), so a read is bounded by the bytes on the wire
        self._session.headers["Accept-Encoding"] = "identity"
        if spec.bearer_token:
            self._session.headers["Authorization"] = f"Bearer {spec.bearer_token}"
        elif spec.password is not None:
            self._session.auth = (spec.username or "", spec.password)
        self._timeout = (spec.connect_timeout_s, spec.operation_timeout_s)
        self._upload_timeout = (spec.connect_timeout_s, spec.upload_timeout_s)

    @staticmethod
    def digest(soc_version: str, kernel: str) -> str:
        """sha256 hex of the entry's key ``cachemgr:<format>:<soc_version>:<kernel>``."""
        key = f"cachemgr:{blob.FORMAT_VERSION}:{soc_version}:{kernel}"
        return hashlib.sha256(key.encode()).hexdigest()

    def url(self, soc_version: str, kernel: str) -> str:
        """The entry's URL in this remote's layout."""
        return self._url_of(self.digest(soc_version, kernel))

    def key_url(self, key: str) -> str:
        """The URL of any object named ``key`` (the index's), in this remote's layout."""
        return self._url_of(hashlib.sha256(key.encode()).hexdigest())

    def _url_of(self, h: str) -> str:
        if self.spec.layout == "flat":
            return f"{self.base}/{h}"
        if self.spec.layout == "bazel":
            return f"{self.base}/ac/{h}"
        return f"{self.base}/{h[:2]}/{h[2:]}"

    def _check(self, resp: requests.Response, method: str) -> None:
        """Raise for an answer that is no success (a redirect included: never followed — the
        remote's URL names the cache server, and an answer from wherever a redirect points
        would cost a request and its own timeout per hop).

        :raises HttpError: one line: method, URL, status.
        """
        url = redact_url(resp.url) if resp.url else self.spec.url  # the URL, not the spec
        if 300 <= resp.status_code < 400:
            raise HttpError(
                f"{method} {url}: HTTP {resp.status_code}, a redirect (not followed: give the "
                "server's own URL)"
            )
        if resp.status_code >= 400:
            raise HttpError(f"{method} {url}: HTTP {resp.status_code}")

    def lookup(self, soc_version: str, kernel: str) -> bool:
        """``HEAD``: True when the server has the entry.

        :raises HttpError, requests.RequestException: the server failed.
        """
        resp = self._session.head(self.url(soc_version, kernel), timeout=self._timeout)
        if resp.status_code == 404:
            return False
        self._check(resp, "HEAD")
        return True

    def fetch_blob(self, soc_version: str, kernel: str) -> bytes | None:
        """``GET`` the blob, read at most ``max_blob_bytes``: an answer whose
        ``Content-Length`` is over it is refused before its body is read, and a streamed
        read stops at the cap.

        :raises blob.BadBlob: the answer is over the cap.
        :raises HttpError, requests.RequestException: the server failed.
        """
        url = self.url(soc_version, kernel)
        with self._session.get(
            url, timeout=self._timeout, stream=True, allow_redirects=False
        ) as resp:
            if resp.status_code == 404:
                return None
            self._check(resp, "GET")
            length = resp.headers.get("Content-Length", "")
            if length.isdigit() and int(length) > self.max_blob_bytes:
                raise blob.BadBlob(
                    f"answer of {length} bytes (Content-Length) is over the "
                    f"{self.max_blob_bytes}-byte cap; not read"
                )
            data = self._read_body(resp, self.max_blob_bytes, url)
        if data is None:
            raise blob.BadBlob(f"answer is over the {self.max_blob_bytes}-byte cap")
        return data

    def _read_body(self, resp: requests.Response, cap: int, url: str) -> bytes | None:
        """The body of ``resp``, None when it is over ``cap`` bytes (no more than the cap and
        one read are held). The bytes as sent (no ``Content-Encoding`` is decoded: asked for
        ``identity``), read as they arrive; the whole body must come within its deadline
        (:func:`answer_deadline_s`), whatever the pace — a read timeout bounds only each
        silence, and a server sending one byte per silence never met it.

        :raises requests.Timeout: the deadline passed (a lookup that timed out: the breaker
            opens at once), or the server fell silent for the read timeout mid-body.
        :raises requests.ConnectionError: the connection broke mid-body.
        """
        length = resp.headers.get("Content-Length", "")
        size = int(length) if length.isdigit() else cap
        deadline = time.monotonic() + answer_deadline_s(self.spec.operation_timeout_s, size)
        chunks, total = [], 0
        while chunk := _read1(resp, url):
            total += len(chunk)
            if total > cap:
                return None
            chunks.append(chunk)
            if time.monotonic() > deadline:
                raise requests.Timeout(
                    f"GET {redact_url(url)}: {total} bytes in "
                    f"{answer_deadline_s(self.spec.operation_timeout_s, size):g} s, under "
                    f"{MIN_RATE_BYTES} bytes per operation-timeout; given up"
                )
        return b"".join(chunks)

    def fetch(self, soc_version: str, kernel: str, use: bool = True) -> EntryFiles | None:
        """The verified entry, or None when absent (a use is noted by the tier set:
        :meth:`note_use`).

        :raises blob.BadBlob: the answer fails a check.
        :raises HttpError, requests.RequestException: the server failed.
        """
        raw = self.fetch_blob(soc_version, kernel)
        if raw is None:
            return None
        return blob.decode(
            raw, soc_version, kernel, self.keys, self.max_part_bytes, self.max_blob_bytes
        )

    def put(self, entry_files: EntryFiles) -> bool:
        """``PUT`` the blob (``MKCOL`` of missing folders on a WebDAV ``409``, nginx's ``500``).

        :raises EntryTooBig: the blob is over ``max_blob_bytes`` (not sent), or the server
            answered ``413``.
        :raises HttpError, requests.RequestException: the server failed.
        """
        url = self.url(entry_files.soc_version, entry_files.kernel)
        data = blob.encode(entry_files, self.keys)
        check_blob(data, self.max_blob_bytes, self.name)
        resp = self._session.put(
            url, data=data, timeout=self._upload_timeout, allow_redirects=False
        )
        if resp.status_code in NO_FOLDER:
            refused = self._make_folders(url)
            resp = self._session.put(
                url, data=data, timeout=self._upload_timeout, allow_redirects=False
            )
            if resp.status_code in NO_FOLDER and refused:
                raise HttpError(f"PUT {url}: HTTP {resp.status_code} after {refused}")
        if resp.status_code == 413:
            raise EntryTooBig(f"PUT {url}: HTTP 413, over the server's size limit")
        self._check(resp, "PUT")
        self.note_use(entry_files.soc_version, entry_files.kernel)
        return True

    def _make_folders(self, url: str) -> str:
        """``MKCOL`` every folder of ``url``'s path, from the top: a WebDAV server makes one
        folder at a time (RFC 4918 section 9.3.1: ``409`` when the parent is missing).
        ``201`` made it, ``405`` it exists; any other answer (a folder above the remote's
        own that we may not make: ``403``…) is left to the ``PUT`` that follows.

        :returns: the last ``MKCOL`` that was refused (``"MKCOL <url>: HTTP <status>"``), or "".
        """
        origin_len = len(self.base) - len(self.spec.path)
        origin, path = url[:origin_len], url[origin_len:]
        parts = [p for p in path.split("/")[:-1] if p]
        refused = ""
        for i in range(1, len(parts) + 1):
            folder = f"{origin}/{'/'.join(parts[:i])}/"
            resp = self._session.request(
                "MKCOL", folder, timeout=self._timeout, allow_redirects=False
            )
            if resp.status_code >= 300 and resp.status_code != 405:
                refused = f"MKCOL {folder}: HTTP {resp.status_code}"
        return refused

    def remove(self, soc_version: str, kernel: str) -> bool:
        """``DELETE`` the entry.

        :raises HttpError, requests.RequestException: the server failed.
        """
        resp = self._session.delete(
            self.url(soc_version, kernel), timeout=self._timeout, allow_redirects=False
        )
        if resp.status_code == 404:
            return False
        self._check(resp, "DELETE")
        return True

    def forget(self, soc_version: str, kernel: str) -> bool:
        """Drop ``kernel`` from this writer's index shard of the chip (written at the next
        :meth:`flush_index`); other writers' shards are theirs to change.

        :returns: True when this writer's shard listed it.
        """
        with self._index_lock:
            found = self._shards.get(soc_version, {}).pop(kernel, None) is not None
            if found:
                self._dirty.add(soc_version)
        return found

    def ping(self) -> bool:
        """True when the server answers anything to a ``HEAD`` of the base URL.

        :raises requests.RequestException: it does not answer.
        """
        self._session.head(self.base + "/", timeout=self._timeout)
        return True

    @staticmethod
    def timed_out(exc: BaseException) -> bool:
        """True when ``exc`` is a timeout (connecting or waiting for an answer)."""
        return isinstance(exc, requests.Timeout | TimeoutError)

    @staticmethod
    def fatal(exc: BaseException) -> bool:
        """True when the server refused our credentials (HTTP 401 or 403)."""
        return isinstance(exc, HttpError) and (": HTTP 401" in str(exc) or ": HTTP 403" in str(exc))

    # --- the index per chip (see the module docstring) -------------------------------------

    @staticmethod
    def registry_key(soc_version: str) -> str:
        """The key of the chip's registry of writers."""
        return f"cachemgr:{blob.FORMAT_VERSION}:index:{soc_version}:writers"

    @staticmethod
    def shard_key(soc_version: str, writer: str) -> str:
        """The key of one writer's index shard of the chip."""
        return f"cachemgr:{blob.FORMAT_VERSION}:index:{soc_version}:writer:{writer}"

    def note_use(self, soc_version: str, kernel: str) -> None:
        """Record in this writer's shard (in memory; :meth:`flush_index` writes it) that
        ``kernel`` was uploaded or fetched now."""
        with self._index_lock:
            self._shards.setdefault(soc_version, {})[kernel] = time.time()
            self._dirty.add(soc_version)

    def flush_index(self) -> None:
        """Write this writer's changed shards (merged with what the server had, newest
        ``INDEX_KEEP`` names) and make sure each chip's registry lists this writer.

        :raises HttpError, requests.RequestException: the server failed (retried later).
        """
        with self._index_lock:
            dirty = sorted(self._dirty)
        for soc in dirty:
            if soc not in self._loaded:  # a restart goes on with the shard it had
                old = self._read_shard(soc, self.writer) or {}
                with self._index_lock:
                    mine = self._shards.setdefault(soc, {})
                    for name, when in old.items():
                        mine[name] = max(when, mine.get(name, 0.0))
                self._loaded.add(soc)
            with self._index_lock:
                mine = self._shards.get(soc, {})
                kept = dict(sorted(mine.items(), key=lambda kv: -kv[1])[:INDEX_KEEP])
                self._shards[soc] = kept
                self._dirty.discard(soc)
            doc = {"format": INDEX_FORMAT, "soc_version": soc, "writer": self.writer}
            doc["kernels"] = kept
            try:
                self._put_object(self.key_url(self.shard_key(soc, self.writer)), doc)
                self._register(soc)
            except BaseException:
                with self._index_lock:
                    self._dirty.add(soc)
                raise

    def recent(self, soc_version: str, limit: int) -> list[str]:
        """The chip's kernel names, most recently uploaded or fetched by any writer first
        (at most ``limit``): the writers' shards merged, the newest time winning.

        The index is untrusted (anyone who can write to the server can list writers and
        fill shards), so the read is bounded (docs/remote.md#sizes): at most
        :data:`MAX_INDEX_WRITERS` shards are read (this writer's own first, then the
        registry's order), one at a time; a shard over ``MAX_INDEX_BYTES`` or with more than
        ``INDEX_KEEP`` names (counted before it is parsed) is passed over; and between
        shards only the newest ``limit`` names are kept. Whatever was passed over is one
        warning line naming the caps.

        :raises HttpError, requests.RequestException: the server failed.
        """
        want = max(0, limit)
        writers, _ = self._read_registry(soc_version)
        mine = [self.writer] if self.writer in writers else []
        chosen = (mine + [w for w in writers if w != self.writer])[:MAX_INDEX_WRITERS]
        merged: dict[str, float] = {}
        refused = 0
        for writer in chosen:
            shard = self._read_shard(soc_version, writer, quiet=True)
            if shard is _REFUSED:
                refused += 1
                continue
            for name, when in (shard or {}).items():
                merged[name] = max(when, merged.get(name, 0.0))
            if len(merged) > want:  # the newest ``want`` now are a superset of the final ones
                merged = dict(_newest(merged, want))
        if refused or len(writers) > len(chosen):
            log.warning(
                "remote %s: the %s index: %d of %d writers' shards read, %d passed over "
                "(caps: %d writers, %d bytes and %d names a shard, %d names kept)",
                self.name,
                soc_version,
                len(chosen) - refused,
                len(writers),
                refused,
                MAX_INDEX_WRITERS,
                MAX_INDEX_BYTES,
                INDEX_KEEP,
                want,
            )
        return [name for name, _ in _newest(merged, want)]

    def _register(self, soc: str) -> None:
        """Get this writer into the chip's registry without losing another writer's entry
        (read, add, conditional ``PUT``, read back; see the module docstring)."""
        url = self.key_url(self.registry_key(soc))
        for attempt in range(REGISTER_ATTEMPTS):
            writers, etag = self._read_registry(soc)
            if self.writer in writers:
                return
            doc = {"format": INDEX_FORMAT, "soc_version": soc}
            doc["writers"] = sorted({*writers, self.writer})
            headers = {"If-Match": etag} if etag else {"If-None-Match": "*"} if not writers else {}
            # a server refusing a condition may answer before reading the body: a fresh
            # connection keeps the unread body from being parsed as the next request
            headers["Connection"] = "close"
            if not self._put_object(url, doc, headers, conflict_ok=True):
                time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))  # lost a race: again
        log.warning("remote %s: could not list this host in the %s index", self.name, soc)

    def _read_registry(self, soc: str) -> tuple[list[str], str | None]:
        raw, etag, _ = self._get_object(self.key_url(self.registry_key(soc)))
        doc = _json_object(raw, self.name, "index registry")
        if doc is None or doc.get("soc_version") != soc:
            return [], etag
        writers = doc.get("writers")
        if not isinstance(writers, list):
            return [], etag
        return [w for w in writers if isinstance(w, str) and _WRITER.fullmatch(w)], etag

    def _read_shard(self, soc: str, writer: str, quiet: bool = False) -> Mapping[str, float] | None:
        """One writer's shard (kernel → time); None when absent or malformed;
        :data:`_REFUSED` when over ``MAX_INDEX_BYTES`` or ``INDEX_KEEP`` names (logged here
        unless ``quiet``: :meth:`recent` says it once for all shards)."""
        raw, _, over = self._get_object(self.key_url(self.shard_key(soc, writer)), quiet)
        if over or (raw is not None and raw.count(b",") > INDEX_KEEP + _DOC_COMMAS):
            if not quiet:
                log.warning(
                    "remote %s: the %s index shard of %s is over %d bytes or %d names; not read",
                    self.name,
                    soc,
                    writer,
                    MAX_INDEX_BYTES,
                    INDEX_KEEP,
                )
            return _REFUSED
        doc = _json_object(raw, self.name, "index shard")
        if doc is None or doc.get("soc_version") != soc or doc.get("writer") != writer:
            return None
        kernels = doc.get("kernels")
        if not isinstance(kernels, dict):
            return None
        return {
            k: float(v)
            for k, v in kernels.items()
            if _NAME.fullmatch(k) and ".." not in k and isinstance(v, int | float)
        }

    def _get_object(self, url: str, quiet: bool = False) -> tuple[bytes | None, str | None, bool]:
        """``GET`` a small object (at most ``MAX_INDEX_BYTES``): its bytes (None when absent
        or over the cap), its ETag, and whether it was over the cap (one warning line unless
        ``quiet``)."""
        with self._session.get(
            url, timeout=self._timeout, stream=True, allow_redirects=False
        ) as resp:
            if resp.status_code == 404:
                return None, None, False
            self._check(resp, "GET")
            data = self._read_body(resp, MAX_INDEX_BYTES, url)
            if data is None:
                if not quiet:
                    log.warning(
                        "remote %s: an index object is over the %d-byte cap; not read",
                        self.name,
                        MAX_INDEX_BYTES,
                    )
                return None, None, True
            return data, resp.headers.get("ETag"), False

    def _put_object(
        self,
        url: str,
        doc: dict[str, object],
        headers: dict[str, str] | None = None,
        conflict_ok: bool = False,
    ) -> bool:
        """``PUT`` a JSON object; False on ``412`` (a condition failed) when ``conflict_ok``."""
        data = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        resp = self._session.put(
            url, data=data, headers=headers, timeout=self._timeout, allow_redirects=False
        )
        if resp.status_code in NO_FOLDER:
            self._make_folders(url)
            resp = self._session.put(
                url, data=data, headers=headers, timeout=self._timeout, allow_redirects=False
            )
        if resp.status_code == 412 and conflict_ok:
            return False
        self._check(resp, "PUT")
        return True

    def stat(self) -> TierStat:
        """Reachability only (an HTTP cache does not list its size cheaply).

        :raises requests.RequestException: the server cannot be reached.
        """
        self._session.head(self.base + "/", timeout=self._timeout)
        return TierStat(self.name)

    def close(self) -> None:
        """Close the connection pool."""
        self._session.close()


def _json_object(raw: bytes | None, name: str, what: str) -> dict[str, object] | None:
    """``raw`` as a format-1 JSON object, None when absent or malformed (logged once per
    read: remote data is untrusted)."""
    if raw is None:
        return None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        log.warning("remote %s: %s is not JSON; ignored", name, what)
        return None
    if not isinstance(doc, dict) or doc.get("format") != INDEX_FORMAT:
        log.warning("remote %s: %s is not a format-%d object; ignored", name, what, INDEX_FORMAT)
        return None
    return doc


def _newest(names: dict[str, float], n: int) -> list[tuple[str, float]]:
    """The ``n`` newest (name, time) of ``names``, newest first (ties by name)."""
    return sorted(names.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
