"""Giving CANN GE's ``0750`` folders and ``0640`` files back to the group the moment cachemgr
meets them (layer 0½; docs/shared-cache.md#ges-modes-given-back-on-sight).

GE forces ``0640`` on the files and ``0750`` on the folders it creates, whatever the umask
(``te_file_utils.cc`` ``CopyFileToCacheDir``, ``CreateMultiLevelDir``; ``te_cache_utils.cc``
``LockAndOpenCacheFile``): the other members of the group may then neither publish into such
a chip folder nor lock its files. A process that may change those modes — the files' owner,
or one holding ``CAP_FOWNER`` (the systemd unit's ``AmbientCapabilities=CAP_FOWNER``) — puts
``g+rw`` on the files and ``g+rwxs`` on the folder back:

* the daemon's watcher when a chip folder or a file appears (:func:`give_back_folder`,
  :func:`give_back_names`);
* a lock, publish or eviction that was refused (``EACCES``/``EPERM``) asks
  :func:`give_back_names` for the folder and the file named in the error, and is retried
  once when something was given back (:func:`retry_denied`).

Only folders of the cache are changed, each reached without following a link at any step
(:class:`~cachemgr.storage.safedir.SafeDir`, docs/security.md item 1), and only regular files
with one name (``fsutil.share_modes``). Others never get a bit they lacked, nor ``o+w``.

Only the cache's own files (:func:`ours`): a name of the cache's namespace, and not renamed in
from elsewhere — a member may move another user's file from a group folder on the same
filesystem into a chip folder, wait for its modes to be given back, and move it back
(docs/security.md#3b-outsiders-read-nothing-ges-modes-are-given-back-on-sight).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from cachemgr.errors import CacheMgrError
from cachemgr.storage import fsutil
from cachemgr.storage.safedir import SafeDir

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A folder's group bits that sharing needs (``g+rwx`` and setgid: new files keep the group).
FOLDER_BITS = 0o2070
#: Endings of the files of a chip folder (docs/design.md#files-of-an-entry): an entry's jsons
#: (``<kernel>.json``, ``_mix_aic.json``, ``_pre.json``...), binaries, header, locks (the
#: entry's and ``op_cache_file_del.lock``) and cachemgr's header manifests.
CHIP_ENDINGS = (".json", ".o", ".so", ".cubin", ".h", ".lock", ".manifest")
#: The files of the kernel cache folder itself: CANN's ``op_cache.ini`` and chip locks
#: (``<soc>.chip.lock``).
KERNEL_CACHE_NAMES = ("op_cache.ini",)
KERNEL_CACHE_ENDINGS = (".lock",)
#: Nanoseconds a file's ``ctime`` may pass its ``mtime`` and still be one written here: GE and
#: cachemgr write a temp file and ``rename()`` it into place just after (``te_file_utils.cc``
#: ``CopyFileToCacheDir``); a file renamed in from elsewhere keeps its old ``mtime``.
RENAMED_IN_SLACK_NS = 2_000_000_000


def ours(kernel_cache: bool = False) -> Callable[[str, os.stat_result], bool]:
    """The rule that says which files of a chip folder (or, ``kernel_cache``, of the kernel
    cache folder) may have their modes given back
    (docs/security.md#3b-outsiders-read-nothing-ges-modes-are-given-back-on-sight):

    * a name of the cache's namespace (:data:`CHIP_ENDINGS`, :data:`KERNEL_CACHE_NAMES`);
    * a lock file (``.lock``) only when empty: GE runs ``chmod`` on a lock at every open
      (``te_cache_utils.cc`` ``LockAndOpenCacheFile``), so its ``ctime`` says nothing, and
      it never writes one;
    * any other file only when its ``ctime`` is at most :data:`RENAMED_IN_SLACK_NS` past its
      ``mtime``: a ``rename()`` changes only the ``ctime``, and GE writes each file fresh.
    """

    def wanted(name: str, st: os.stat_result) -> bool:
        if kernel_cache:
            named = name in KERNEL_CACHE_NAMES or name.endswith(KERNEL_CACHE_ENDINGS)
        else:
            named = name.endswith(CHIP_ENDINGS)
        if not named:
            return False
        if name.endswith(".lock"):
            return st.st_size == 0
        return st.st_ctime_ns - st.st_mtime_ns <= RENAMED_IN_SLACK_NS

    return wanted


def _open(folder: Path, kernel_cache: bool) -> SafeDir:
    opener = SafeDir.open_kernel_cache if kernel_cache else SafeDir.open_chip
    return opener(folder)


def give_back_folder(folder: Path, kernel_cache: bool = False) -> int:
    """``fsutil.share_modes`` of a chip folder (or, ``kernel_cache``, of the kernel cache
    folder ``<root>/kernel_cache``) and of every regular file of the cache's own in it
    (:func:`ours`), the folder reached
    without following a link. Returns how many were repaired (0: nothing to do, or not
    allowed: neither the owner nor ``CAP_FOWNER``).

    :raises OSError: the folder cannot be opened (e.g. ``EACCES``: a member's ``0700`` one).
    :raises CacheMgrError: the folder, or one above it, is a link.
    """
    with _open(folder, kernel_cache) as opened:
        return fsutil.share_modes(folder, dir_fd=opened.fd, wanted=ours(kernel_cache))


def give_back_names(folder: Path, names: Iterable[str] = (), kernel_cache: bool = False) -> bool:
    """Give the group back ``folder`` itself and the files ``names`` in it (only those: a
    refused operation must not scan a chip folder of a million entries; only the cache's own,
    :func:`ours`), where this process may. Returns True when a mode was changed — the
    refused operation may then be tried again. Never raises: a folder that cannot be opened
    (or is a link) is left as it is.

    :param folder: a chip folder, or with ``kernel_cache`` the kernel cache folder.
    """
    fowner = fsutil.has_cap_fowner()
    me = os.geteuid()
    try:
        opened = _open(folder, kernel_cache)
    except (OSError, CacheMgrError) as exc:
        log.debug("%s: modes not given back: %s", folder, exc)
        return False
    changed = False
    with opened:
        try:
            st = os.fstat(opened.fd)
            mode = stat.S_IMODE(st.st_mode)
            if mode & FOLDER_BITS != FOLDER_BITS and (st.st_uid == me or fowner):
                os.fchmod(opened.fd, (mode | FOLDER_BITS) & ~0o002)
                changed = True
        except OSError as exc:
            log.debug("%s: folder mode not given back: %s", folder, exc)
            return False
        wanted = ours(kernel_cache)
        for name in names:
            changed |= fsutil.share_file(opened.fd, name, fowner, st.st_gid, wanted)
    if changed:  # the kernels' names at debug only (the eviction log's rule)
        log.info("%s: group-sharing modes given back", folder)
        log.debug("%s: modes given back: %s", folder, ", ".join(names) or ".")
    return changed


def _names_in(folder: Path, exc: OSError) -> list[str]:
    """The file of ``folder`` that ``exc`` names (its last component), if any."""
    if not exc.filename:
        return []
    path = Path(os.fsdecode(exc.filename))
    return [path.name] if path.parent == folder and path.name else []


def retry_denied(
    op: Callable[[], T], folder: Path, names: Iterable[str] = (), kernel_cache: bool = False
) -> T:
    """Run ``op``; when it is refused for lack of permission, give ``folder`` and ``names``
    (plus the file the error names) back to the group and run it once more — only when a
    mode was changed: otherwise the first refusal is raised as it was.

    :raises PermissionError: ``op``'s, when nothing could be given back or the retry is
        refused too.
    """
    names = list(names)
    try:
        return op()
    except PermissionError as exc:
        wanted = [*names, *(n for n in _names_in(folder, exc) if n not in names)]
        if not give_back_names(folder, wanted, kernel_cache):
            raise
    return op()
