"""The Redis tier, with redis-py.

One key per entry, ``cachemgr:<blob format>:<soc_version>:<kernel>``; its value is the entry
blob of :mod:`cachemgr.remote.blob`. Each chip has an index, the sorted set
``cachemgr:<blob format>:index:<soc_version>`` (member: kernel name, score: when it was last
uploaded or fetched, seconds since the epoch: "used anywhere"), for listing the entries most
recently used (``warm`` and ``[remote] prefetch``). Concurrent writers never lose an
update: ``ZADD`` is atomic on the server. The index is read within caps on the server
(:meth:`RedisTier.recent`): anyone who can write to it can add members of any size.

Size is the server's business: run it with ``maxmemory <bytes>`` and
``maxmemory-policy allkeys-lru`` so old entries go first (``gc`` never touches a remote).
Timeouts are the spec's ``connect-timeout``, ``operation-timeout`` (every request but an
upload) and ``upload-timeout`` (``SET``: a second connection pool, used by the background
uploader only); redis-py's own retries are off (the breaker of :mod:`cachemgr.remote.tierset`
decides when to try again).
"""

from __future__ import annotations

import logging
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cachemgr.remote import blob, signing
from cachemgr.remote.config import RemoteSpec
from cachemgr.remote.uploadcap import check_blob
from cachemgr.storage.store import MAX_KERNEL_NAME_BYTES
from cachemgr.storage.tiers import EntryFiles, TierStat
from cachemgr.words import plural

#: The errors of an unreachable, slow or failing server (the breaker counts them).
ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
log = logging.getLogger(__name__)


class RedisTier:
    """A Redis server as a storage tier (see the module docstring).

    :param spec: the configured remote (``redis://`` or ``rediss://`` with system CAs).
    :param keys: what uploads are signed with and whose signatures a fetch accepts
        (default: none — nothing is accepted, nothing can be uploaded).
    """

    def __init__(
        self,
        spec: RemoteSpec,
        max_part_bytes: int = blob.DEFAULT_MAX_PART_BYTES,
        keys: signing.Keys | None = None,
    ):
        self.spec = spec
        self.keys = keys or signing.Keys()
        self.name = spec.name
        self.read_only = spec.read_only
        self.max_part_bytes = max_part_bytes
        self.max_blob_bytes = blob.DEFAULT_MAX_BLOB_BYTES
        self._client = _client(spec, spec.operation_timeout_s)
        self._uploader = _client(spec, spec.upload_timeout_s)  # connects on its first SET

    @staticmethod
    def key(soc_version: str, kernel: str) -> str:
        """``cachemgr:<blob format>:<soc_version>:<kernel>``."""
        return f"cachemgr:{blob.FORMAT_VERSION}:{soc_version}:{kernel}"

    @staticmethod
    def index_key(soc_version: str) -> str:
        """The chip's sorted set of kernel names by last upload (seconds since the epoch)."""
        return f"cachemgr:{blob.FORMAT_VERSION}:index:{soc_version}"

    def lookup(self, soc_version: str, kernel: str) -> bool:
        """True when the key exists (the blob is not read: see :meth:`fetch`).

        :raises redis.RedisError, OSError: the server failed.
        """
        return bool(self._client.exists(self.key(soc_version, kernel)))

    def fetch_blob(self, soc_version: str, kernel: str, use: bool = True) -> bytes | None:
        """The raw blob, or None when absent; with ``use`` its index score becomes now.

        The value's size is asked first (``STRLEN``): one over ``max_blob_bytes`` is refused
        before a byte of it is read, and the read itself (``GETRANGE``) never returns more
        than the cap and one byte, should the value grow in between (a member may plant
        a 500 MB value: read whole, it cost the daemon 1.6 GB; docs/remote.md, "Caps").

        :raises blob.BadBlob: the value is over the cap (naming it).
        :raises redis.RedisError, OSError: the server failed.
        """
        key, cap = self.key(soc_version, kernel), self.max_blob_bytes
        size = int(self._client.strlen(key))
        if size == 0:
            return None  # absent (an empty value is no blob either)
        if size > cap:
            raise blob.BadBlob(f"value of {size} bytes is over the {cap}-byte cap; not read")
        pipe = self._client.pipeline(transaction=False)  # one round trip for both
        pipe.getrange(key, 0, cap)  # at most cap + 1 bytes
        if use and not self.read_only:  # a use: the index's score becomes now (only if listed: XX)
            pipe.zadd(self.index_key(soc_version), {kernel: time.time()}, xx=True)
        raw = pipe.execute()[0]
        if not raw:
            return None  # removed in between
        if len(raw) > cap:
            raise blob.BadBlob(f"value grew over the {cap}-byte cap while it was read")
        return bytes(raw)

    def fetch(self, soc_version: str, kernel: str, use: bool = True) -> EntryFiles | None:
        """The verified entry, or None when absent (``use``: see :meth:`fetch_blob`).

        :raises blob.BadBlob: the value fails a check (not signed by a trusted key, tampered,
            truncated, another entry's, not exactly an entry's parts).
        :raises redis.RedisError, OSError: the server failed.
        """
        raw = self.fetch_blob(soc_version, kernel, use)
        if raw is None:
            return None
        return blob.decode(
            raw, soc_version, kernel, self.keys, self.max_part_bytes, self.max_blob_bytes
        )

    def put(self, entry_files: EntryFiles) -> bool:
        """Store the entry's blob (signed with this site's key) and note it in the chip's index.

        :raises ConfigError: no signing key.
        :raises EntryTooBig: the blob is over ``max_blob_bytes`` (not sent).
        :raises redis.RedisError, OSError: the server failed.
        """
        data = blob.encode(entry_files, self.keys)
        check_blob(data, self.max_blob_bytes, self.name)
        pipe = self._uploader.pipeline(transaction=False)
        pipe.set(self.key(entry_files.soc_version, entry_files.kernel), data)
        pipe.zadd(self.index_key(entry_files.soc_version), {entry_files.kernel: time.time()})
        pipe.execute()
        return True

    def remove(self, soc_version: str, kernel: str) -> bool:
        """Delete the entry and its index row.

        :raises redis.RedisError, OSError: the server failed.
        """
        pipe = self._client.pipeline(transaction=False)
        pipe.delete(self.key(soc_version, kernel))
        pipe.zrem(self.index_key(soc_version), kernel)
        return bool(pipe.execute()[0])

    def recent(self, soc_version: str, limit: int) -> list[str]:
        """The chip's kernel names, most recently uploaded first (at most ``limit``).

        The index is untrusted (anyone who can write to the server can add members of up to
        512 MB each), so it is read with a bounded script on the server (:data:`_RECENT`):
        the answer holds at most ``limit`` names of at most ``MAX_KERNEL_NAME_BYTES``
        (250) bytes each in a kernel name's characters, so this process never holds more
        than ``limit`` × 250 bytes of it (docs/remote.md#sizes). The scan stops after
        :data:`MAX_SKIPPED` other members, or after half of ``operation-timeout`` on the
        server (the answer comes in time, the server is not held longer). Members passed
        over, or a scan stopped, are one warning line naming the caps.

        :raises redis.RedisError, OSError: the server failed.
        """
        want = max(0, limit)
        if want == 0:
            return []
        index = self.index_key(soc_version)
        budget_ms = int(self.spec.operation_timeout_s * 1000 / 2)
        args = (want, MAX_KERNEL_NAME_BYTES, MAX_SKIPPED, budget_ms)
        reply = self._client.eval(_RECENT, 1, index, *args)
        skipped, stopped = int(reply[0]), bool(reply[1])
        if skipped or stopped:
            log.warning(
                "remote %s: index %s: %s passed over (caps: %d bytes a name, a "
                "kernel name's characters, %d names a read, %d passed over, %d ms a read%s)",
                self.name,
                index,
                plural(skipped, "member"),
                MAX_KERNEL_NAME_BYTES,
                want,
                MAX_SKIPPED,
                budget_ms,
                "; the read stopped at a cap" if stopped else "",
            )
        return [n.decode() if isinstance(n, bytes) else str(n) for n in reply[2:]]

    def forget(self, soc_version: str, kernel: str) -> bool:
        """Drop the chip's index row of ``kernel`` when its entry is gone (evicted by the
        server's ``allkeys-lru``), atomically: a writer that uploads it meanwhile keeps its row.

        :returns: True when a row was dropped.
        :raises redis.RedisError, OSError: the server failed.
        """
        keys = (self.key(soc_version, kernel), self.index_key(soc_version))
        return bool(self._client.eval(_FORGET, 2, *keys, kernel))

    def ping(self) -> bool:
        """True when the server answers ``PING`` (within ``operation-timeout``).

        :raises redis.RedisError, OSError: it does not.
        """
        return bool(self._client.ping())

    @staticmethod
    def timed_out(exc: BaseException) -> bool:
        """True when ``exc`` is a timeout (the server did not answer in time)."""
        return isinstance(exc, redis.TimeoutError | TimeoutError)

    @staticmethod
    def fatal(exc: BaseException) -> bool:
        """True when the server refused our credentials (``WRONGPASS``, ``NOAUTH``,
        ``NOPERM``): retrying cannot help."""
        return isinstance(exc, redis.AuthenticationError | redis.exceptions.NoPermissionError)

    def stat(self) -> TierStat:
        """The server's key count (``DBSIZE``; no value is read).

        :raises redis.RedisError, OSError: the server failed.
        """
        return TierStat(self.name, entries=int(self._client.dbsize()))

    def close(self) -> None:
        """Close the connection pools."""
        self._client.close()
        self._uploader.close()


#: Index members passed over (too long, not a kernel name) before :meth:`RedisTier.recent`
#: stops reading: a writer of the index cannot make a read scan more than this many.
MAX_SKIPPED = 256

#: The chip's newest members, bounded on the server. KEYS[1]: the index; ARGV: the most
#: names returned, the longest name (bytes), the most members passed over, the longest the
#: scan may run (ms). One member is read at a time (``ZREVRANGE i i``: the script holds one
#: member; copying a 4 MiB one into the script costs the server ~5-10 ms, hence the time
#: budget). Returns {passed over, 1 if it stopped at a cap else 0, name, name, ...}.
_RECENT = """
local want, longest = tonumber(ARGV[1]), tonumber(ARGV[2])
local most, budget_us = tonumber(ARGV[3]), tonumber(ARGV[4]) * 1000
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local started = now_us()
local out, skipped, i = {0, 0}, 0, 0
while #out - 2 < want do
  local m = redis.call('ZREVRANGE', KEYS[1], i, i)[1]
  if not m then break end
  i = i + 1
  if #m > 0 and #m <= longest and not string.find(m, '[^A-Za-z0-9_.%-]') then
    out[#out + 1] = m
  else
    skipped = skipped + 1
    if skipped >= most then out[2] = 1 break end
  end
  if now_us() - started > budget_us then out[2] = 1 break end
end
out[1] = skipped
return out
"""

#: Drop an index row only while its entry's key is absent (one atomic step on the server).
_FORGET = (
    "if redis.call('EXISTS', KEYS[1]) == 0 then "
    "return redis.call('ZREM', KEYS[2], ARGV[1]) end return 0"
)


def _client(spec: RemoteSpec, timeout_s: float) -> redis.Redis:
    """A client of the spec's server whose requests time out after ``timeout_s`` seconds
    (connecting after ``connect-timeout``), with redis-py's retries off."""
    db = spec.path.lstrip("/")
    return redis.Redis(
        host=spec.host,
        port=spec.port or 6379,
        db=int(db) if db else 0,
        username=spec.username or None,
        password=spec.password,
        ssl=spec.scheme == "rediss",
        socket_connect_timeout=spec.connect_timeout_s,
        socket_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
    )
