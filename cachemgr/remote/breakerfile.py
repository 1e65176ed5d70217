"""A remote's open circuit breaker, shared by every run of one user on a host
(docs/remote.md#failure-isolation).

When a remote's breaker opens, :meth:`BreakerFile.save` writes ``breaker-<id>.json`` into the
user's state folder (``$XDG_STATE_HOME/cachemgr/remotes``; the daemon's under systemd is
``$STATE_DIRECTORY/remotes``): the remote's URL (no credentials), until when it is skipped
(seconds since the epoch) and why, written atomically (a temp file, then ``rename``). A new
``cachemgr compile --remote`` (or a restarted daemon) reads it with :meth:`BreakerFile.load`
and skips the remote until then, instead of paying its timeout once more. A success removes
the file (:meth:`BreakerFile.clear`).

The file is the user's own (docs/design.md#the-users-own-files): its folder is made ``0700``, and
it is read only when it and its folder are this user's and nobody else may write them. Even
so it is untrusted input when read: at most :data:`MAX_BYTES` bytes, a JSON object whose
``url`` is this remote's, a finite ``open_until`` that is honoured for at most the breaker's
own ``open_s`` from now (a planted far-future time cannot switch a remote off), a one-line
``why`` of at most :data:`MAX_WHY` characters. Anything else is ignored (logged at debug).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

from cachemgr.storage import fsutil, secretfile

log = logging.getLogger(__name__)

#: Format of the file.
FORMAT = 1
#: The biggest state file read (bytes).
MAX_BYTES = 4096
#: The longest reason kept (characters).
MAX_WHY = 300


class BreakerFile:
    """The state file of one remote (see the module docstring).

    :param folder: the user's state folder for remotes (made 0700 when first written).
    :param url: the remote's URL without credentials (:attr:`RemoteSpec.base_url`); the
        file's name is derived from it, so two runs naming one server share it.
    :param wall: the wall clock (seconds since the epoch).
    """

    def __init__(self, folder: Path, url: str, wall: Callable[[], float] = time.time) -> None:
        self.url = url
        self.path = folder / f"breaker-{hashlib.sha256(url.encode()).hexdigest()[:16]}.json"
        self._wall = wall

    def load(self, open_s: float) -> tuple[float, str] | None:
        """Seconds the remote is still to be skipped (at most ``open_s``) and why, or None
        when no run left it open (no file, expired, or not a valid file of this remote)."""
        try:
            raw = secretfile.read_own(self.path, MAX_BYTES)
            doc = json.loads(raw.decode("utf-8"))
        except FileNotFoundError:
            return None
        except secretfile.NotPrivate as exc:  # planted by another user: never trusted
            log.warning("ignoring breaker state %s: %s", self.path, exc.strerror)
            return None
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            log.debug("ignoring breaker state %s: %s", self.path, exc)
            return None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("url") != self.url:
            log.debug("ignoring breaker state %s: not this remote's", self.path)
            return None
        until, why = doc.get("open_until"), doc.get("why", "")
        if isinstance(until, bool) or not isinstance(until, int | float):
            return None
        if not math.isfinite(until):
            return None
        left = min(float(until) - self._wall(), open_s)
        if left <= 0:
            return None
        text = why.splitlines()[0][:MAX_WHY] if isinstance(why, str) and why.strip() else "failing"
        return left, text

    def save(self, open_for_s: float, why: str) -> None:
        """Record that the remote is skipped for ``open_for_s`` seconds from now. A failure
        to write is logged at debug: the breaker works in this process regardless."""
        doc = {
            "format": FORMAT,
            "url": self.url,
            "open_until": self._wall() + open_for_s,
            "why": why[:MAX_WHY],
        }
        try:
            data = json.dumps(doc, sort_keys=True).encode()
            secretfile.write_own(self.path, data)
        except OSError as exc:
            log.debug("could not write breaker state %s: %s", self.path, exc)

    def clear(self) -> None:
        """The remote answered again: remove the file (other runs use the remote again)."""
        try:
            fsutil.safe_unlink(self.path)
        except OSError as exc:
            log.debug("could not remove breaker state %s: %s", self.path, exc)
