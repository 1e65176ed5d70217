"""Which folders of a kernel cache are watched with inotify and which are polled
(docs/daemon.md, *Governance*).

One non-recursive inotify watch on the kernel cache (chip folders appear and go) and one per
chip folder (its files), all through watchdog's one observer (watchdog 7 shares a single
inotify instance between them). A folder gets ``inotify`` mode when a watch could be added
within the budget (``[daemon] inotify_watches``; 0 = as many as the kernel allows) and
``polling`` mode otherwise — the kernel refused (``fs.inotify.max_user_watches`` /
``max_user_instances`` exhausted: ``ENOSPC``/``EMFILE``) or the budget is spent. Polled folders
are rescanned by governance every ``poll_interval_s``; the daemon starts either way.

:meth:`Watcher.check` (run every few seconds by governance) keeps the watches true to the
folders: a watched folder that was removed, or removed and made again (``rm -rf`` and a new
``mkdir``: another inode), is re-armed, and its chip folder is reported for a rescan; new
chip folders are armed. A lost-events condition of the observer (the kernel's inotify queue
overflowed: watchdog logs it and delivers nothing) marks every watched folder for a rescan.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers.api import ObservedWatch
from watchdog.observers.inotify import InotifyObserver

from cachemgr.config.layout import is_chip_folder
from cachemgr.storage import fsutil

log = logging.getLogger(__name__)

INOTIFY = "inotify"
POLLING = "polling"
#: errno of an exhausted inotify limit: watches (``ENOSPC``) or instances (``EMFILE``).
LIMIT_ERRNOS = {
    errno.ENOSPC: "fs.inotify.max_user_watches",
    errno.EMFILE: "fs.inotify.max_user_instances",
}
#: Seconds between attempts to watch a folder the kernel refused (the limit may be raised).
RETRY_S = 60.0


@dataclass
class _Folder:
    path: Path
    mode: str
    ident: tuple[int, int] | None = None  # (st_dev, st_ino) when armed
    watch: ObservedWatch | None = None
    reason: str = ""
    retry_at: float = 0.0


class _Overflow(logging.Handler):
    """watchdog reports a lost-events condition (``IN_Q_OVERFLOW``) only in a log line; this
    handler on its logger turns that line into a callback."""

    def __init__(self, callback: Callable[[], None]) -> None:
        super().__init__(logging.WARNING)
        self.callback = callback

    def emit(self, record: logging.LogRecord) -> None:
        if "overflow" in record.getMessage().lower():
            self.callback()


class Watcher:
    """The inotify watches of one kernel cache, with a polling fallback per folder.

    :param kernel_cache_dir: the folder holding the chip folders.
    :param handler: receives the file events of every watched folder.
    :param event_filter: the watchdog event classes to subscribe.
    :param budget: most folders watched with inotify (0 = no cap of our own).
    """

    def __init__(
        self,
        kernel_cache_dir: Path,
        handler: FileSystemEventHandler,
        event_filter: list[type[FileSystemEvent]],
        budget: int = 0,
    ) -> None:
        self.kernel_cache_dir = kernel_cache_dir
        self._handler = handler
        self._filter = event_filter
        self._budget = budget
        self._lock = threading.Lock()
        self._folders: dict[str, _Folder] = {}  # "" = the kernel cache itself, else the soc
        # full events: a file moved in from outside is a move with no source, not a creation
        self._observer = InotifyObserver(generate_full_events=True)
        self._observer.daemon = True
        self._overflowed = False
        self._warned: set[str] = set()
        self._overflow = _Overflow(self._on_overflow)
        logging.getLogger("watchdog.observers.inotify_c").addHandler(self._overflow)

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the observer and arm the kernel cache and every chip folder present."""
        self._observer.start()
        self.check()

    def stop(self) -> None:
        """Stop the observer (its emitters and their watches)."""
        logging.getLogger("watchdog.observers.inotify_c").removeHandler(self._overflow)
        self._observer.stop()
        self._observer.join(timeout=10)

    # --- state --------------------------------------------------------------------------------

    def modes(self) -> dict[str, str]:
        """``{soc: "inotify" | "polling"}`` for every chip folder known."""
        with self._lock:
            return {k: f.mode for k, f in sorted(self._folders.items()) if k}

    def cache_mode(self) -> str:
        """The kernel cache folder's own mode (new chip folders seen by events or polling)."""
        with self._lock:
            folder = self._folders.get("")
            return folder.mode if folder else POLLING

    def polled(self) -> list[str]:
        """Chip folders in polling mode."""
        return [soc for soc, mode in self.modes().items() if mode == POLLING]

    # --- keeping watches true -----------------------------------------------------------------

    def check(self, now: float | None = None) -> set[str]:
        """Re-arm what changed; return the chip folders to rescan now (new, re-armed, or
        all watched ones after lost events). The kernel cache itself gone → every folder is
        dropped (and armed again once it is back)."""
        now = time.monotonic() if now is None else now
        rescan: set[str] = set()
        with self._lock:
            if self._overflowed:
                self._overflowed = False
                rescan |= {k for k, f in self._folders.items() if k and f.mode == INOTIFY}
                log.warning(
                    "inotify lost events under %s (queue overflow); rescanning %d chip folders",
                    self.kernel_cache_dir,
                    len(rescan),
                )
            present = self._chips_present()
            if present is None:  # the kernel cache is gone (rm -rf): drop every watch
                for key in list(self._folders):
                    self._drop(key)
                return rescan
            if self._rearm_if_changed("", self.kernel_cache_dir, now):
                rescan |= present
            for soc in set(self._folders) - present - {""}:
                self._drop(soc)
            for soc in sorted(present):
                if self._rearm_if_changed(soc, self.kernel_cache_dir / soc, now):
                    rescan.add(soc)
        return rescan

    def _chips_present(self) -> set[str] | None:
        try:
            with os.scandir(self.kernel_cache_dir) as it:
                return {e.name for e in it if is_chip_folder(e)}
        except OSError as exc:
            if isinstance(exc, NotADirectoryError) or exc.errno in fsutil.GONE_ERRNOS:
                return None
            raise

    def _rearm_if_changed(self, key: str, path: Path, now: float) -> bool:
        """Arm ``path`` when new, moved to another inode, or due for a retry; True if armed
        anew (its usage must be rescanned)."""
        ident = _ident(path)
        folder = self._folders.get(key)
        if ident is None:
            return False
        if (
            folder is not None
            and folder.ident == ident
            and ((folder.mode == INOTIFY and self._alive(folder)) or now < folder.retry_at)
        ):
            return False
        if folder is not None and folder.ident is not None and folder.ident != ident:
            log.info("%s was removed and made again; re-arming its watch", path)
        self._drop(key)
        self._folders[key] = self._arm(key, path, ident, now)
        return True

    def _alive(self, folder: _Folder) -> bool:
        """Is the inotify watch of ``folder`` still delivering? Its folder removed, the kernel
        drops the watch and watchdog stops its emitter: a folder made again at once may get
        the same inode back (ext4 reuses freed inodes), so (device, inode) alone would keep a
        dead watch (``tests/test_governance_faults.py``: the rm -rf test)."""
        return any(
            e.watch == folder.watch and e.is_alive() and not e.stopped_event.is_set()
            for e in list(self._observer.emitters)
        )

    def _arm(self, key: str, path: Path, ident: tuple[int, int], now: float) -> _Folder:
        watched = sum(f.mode == INOTIFY for f in self._folders.values())
        if self._budget and watched >= self._budget:
            reason = f"the watch budget ([daemon] inotify_watches = {self._budget}) is spent"
            self._warn_once("budget", f"{path}: {reason}; polling it instead")
            return _Folder(path, POLLING, ident, reason=reason, retry_at=float("inf"))
        try:
            watch = self._observer.schedule(
                self._handler, str(path), recursive=False, event_filter=self._filter
            )
        except OSError as exc:
            sysctl = LIMIT_ERRNOS.get(exc.errno or 0)
            if sysctl is None and exc.errno not in fsutil.GONE_ERRNOS:
                raise
            reason = f"{exc.strerror or exc}" + (f" (raise {sysctl})" if sysctl else "")
            self._warn_once(
                sysctl or "gone",
                f"cannot watch {path}: {reason}; polling it instead"
                + (f" — raise it with: sysctl -w {sysctl}=<more>" if sysctl else ""),
            )
            return _Folder(path, POLLING, ident, reason=reason, retry_at=now + RETRY_S)
        return _Folder(path, INOTIFY, ident, watch)

    def _drop(self, key: str) -> None:
        folder = self._folders.pop(key, None)
        if folder is not None and folder.watch is not None:
            with contextlib.suppress(KeyError, OSError):  # its watch went with the folder
                self._observer.unschedule(folder.watch)

    def _warn_once(self, kind: str, message: str) -> None:
        if kind in self._warned:
            log.info("%s", message)
            return
        self._warned.add(kind)
        log.warning("%s", message)

    def _on_overflow(self) -> None:
        self._overflowed = True

    def reasons(self) -> dict[str, str]:
        """Why each polled chip folder is polled."""
        with self._lock:
            return {k: f.reason for k, f in self._folders.items() if k and f.mode == POLLING}


def _ident(path: Path) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:  # gone, ESTALE, or a file where a folder was
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    return (st.st_dev, st.st_ino)
