"""The HTTP tier (issue 15 item 4), with requests (connection pooling, auth, TLS).

``GET``/``PUT``/``HEAD``/``DELETE`` of one entry blob (:mod:`cachemgr.remote.blob`) at a URL
derived from the entry's key ``cachemgr:<blob format>:<soc_version>:<kernel>`` by its
sha256 (64 hex digits, ``h``), in one of ccache's layouts:

* ``subdirs`` (default, as ccache's): ``<url>/<h[:2]>/<h[2:]>``;
* ``flat``: ``<url>/<h>``;
* ``bazel``: ``<url>/ac/<h>`` — an action-cache slot of bazel-remote started with
  ``--disable_http_ac_validation`` (the value is not an ActionResult).

So an existing bazel-remote, nginx with WebDAV, or any server that accepts ``PUT`` works. A
WebDAV server that answers ``409 Conflict`` to a ``PUT`` into a missing folder gets the
folder made (``MKCOL``) and the ``PUT`` once more. Basic auth comes from the URL or a
``password-file``; a bearer token from ``bearer-token-file``. ``https://`` verifies against
the system's CA bundle. The server owns its size (``gc`` never touches a remote).
"""

from __future__ import annotations

import hashlib
import ssl
from pathlib import Path

import requests

from cachemgr.remote import blob
from cachemgr.remote.config import RemoteSpec
from cachemgr.storage.tiers import EntryFiles, TierStat

#: The errors of an unreachable, slow or failing server (the breaker counts them).
ERRORS: tuple[type[BaseException], ...] = (requests.RequestException, OSError)
CHUNK_BYTES = 1 << 20


class HttpError(OSError):
    """An HTTP status that is neither success nor "not found" (one line: method, status)."""


def _system_cas() -> str | bool:
    """The system's CA bundle (``ssl``'s default), else requests' own."""
    cafile = ssl.get_default_verify_paths().cafile
    return cafile if cafile and Path(cafile).is_file() else True


class HttpTier:
    """An HTTP cache server as a storage tier (see the module docstring)."""

    def __init__(self, spec: RemoteSpec, max_part_bytes: int = blob.DEFAULT_MAX_PART_BYTES):
        self.spec = spec
        self.name = spec.name
        self.read_only = spec.read_only
        self.max_part_bytes = max_part_bytes
        self.max_blob_bytes = blob.DEFAULT_MAX_BLOB_BYTES
        base = spec.base_url
        self.base = ("https" if spec.scheme == "https" else "http") + base[len(spec.scheme) :]
        self._session = requests.Session()
        self._session.verify = _system_cas()
        self._session.trust_env = False  # no proxy from the environment for a cache server
        if spec.bearer_token:
            self._session.headers["Authorization"] = f"Bearer {spec.bearer_token}"
        elif spec.password is not None:
            self._session.auth = (spec.username or "", spec.password)
        self._timeout = (spec.connect_timeout_s, spec.operation_timeout_s)

    @staticmethod
    def digest(soc_version: str, kernel: str) -> str:
        """sha256 hex of the entry's key ``cachemgr:<format>:<soc_version>:<kernel>``."""
        key = f"cachemgr:{blob.FORMAT_VERSION}:{soc_version}:{kernel}"
        return hashlib.sha256(key.encode()).hexdigest()

    def url(self, soc_version: str, kernel: str) -> str:
        """The entry's URL in this remote's layout."""
        h = self.digest(soc_version, kernel)
        if self.spec.layout == "flat":
            return f"{self.base}/{h}"
        if self.spec.layout == "bazel":
            return f"{self.base}/ac/{h}"
        return f"{self.base}/{h[:2]}/{h[2:]}"

    def _check(self, resp: requests.Response, method: str) -> None:
        if resp.status_code >= 400:
            raise HttpError(f"{method} {self.spec.display}: HTTP {resp.status_code}")

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
        """``GET`` the blob, read at most ``max_blob_bytes`` (a bigger answer is refused).

        :raises blob.BadBlob: the answer is over the cap.
        :raises HttpError, requests.RequestException: the server failed.
        """
        url = self.url(soc_version, kernel)
        with self._session.get(url, timeout=self._timeout, stream=True) as resp:
            if resp.status_code == 404:
                return None
            self._check(resp, "GET")
            chunks, total = [], 0
            for chunk in resp.iter_content(CHUNK_BYTES):
                total += len(chunk)
                if total > self.max_blob_bytes:
                    raise blob.BadBlob(f"answer is over the {self.max_blob_bytes}-byte cap")
                chunks.append(chunk)
        return b"".join(chunks)

    def fetch(self, soc_version: str, kernel: str) -> EntryFiles | None:
        """The verified entry, or None when absent.

        :raises blob.BadBlob: the answer fails a check.
        :raises HttpError, requests.RequestException: the server failed.
        """
        raw = self.fetch_blob(soc_version, kernel)
        if raw is None:
            return None
        return blob.decode(raw, soc_version, kernel, self.max_part_bytes, self.max_blob_bytes)

    def put(self, entry_files: EntryFiles) -> bool:
        """``PUT`` the blob (``MKCOL`` of missing folders on a WebDAV ``409``).

        :raises HttpError, requests.RequestException: the server failed.
        """
        url = self.url(entry_files.soc_version, entry_files.kernel)
        data = blob.encode(entry_files)
        resp = self._session.put(url, data=data, timeout=self._timeout)
        if resp.status_code == 409:
            self._make_folders(url)
            resp = self._session.put(url, data=data, timeout=self._timeout)
        self._check(resp, "PUT")
        return True

    def _make_folders(self, url: str) -> None:
        rel = url[len(self.base) + 1 :].split("/")[:-1]
        for i in range(1, len(rel) + 1):
            folder = f"{self.base}/{'/'.join(rel[:i])}/"
            resp = self._session.request("MKCOL", folder, timeout=self._timeout)
            if resp.status_code not in (201, 405):  # 405: it exists
                self._check(resp, "MKCOL")

    def remove(self, soc_version: str, kernel: str) -> bool:
        """``DELETE`` the entry.

        :raises HttpError, requests.RequestException: the server failed.
        """
        resp = self._session.delete(self.url(soc_version, kernel), timeout=self._timeout)
        if resp.status_code == 404:
            return False
        self._check(resp, "DELETE")
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
