"""Small filesystem helpers (layer 0): atomic writes, fcntl locks, tolerant removal.

Rules that hold everywhere in cachemgr:

* writes go to a unique ``*.temp`` name in the destination folder and are ``rename()``-d into
  place (docs/design.md#writing-and-reading-an-entry), so a reader sees either nothing or a whole
  file;
* locks are POSIX record locks (``fcntl(F_SETLK)``), the kind CANN's processes take and the
  kind NFSv4 carries across hosts (docs/design.md#sharing-and-locking); "busy" is a ``False``
  return, not an error;
* removing a file that is already gone (``ENOENT``) or that another NFS host holds
  (``ESTALE``) is normal, never fatal (docs/design.md#size-limits-and-eviction,
  #sharing-and-locking).

This module only re-exports: each idea has its own module, and every name is defined there —
:mod:`~cachemgr.storage.kinds` (what a name is: ``lstat_or_none``, ``plain_file``, ``at``),
:mod:`~cachemgr.storage.modes` (modes and capabilities, ``access_hint``),
:mod:`~cachemgr.storage.remove` (``safe_unlink``, trees),
:mod:`~cachemgr.storage.atomic` (temp files and atomic writes),
:mod:`~cachemgr.storage.noatime` (reads that keep the access time, ``touch_atime``),
:mod:`~cachemgr.storage.locks` (lock files, :class:`FcntlLock`). The names stay importable
from here, so no caller has to change.
"""

from __future__ import annotations

from cachemgr.constants import short_host
from cachemgr.peer import group_name, user_name
from cachemgr.storage.atomic import (
    TEMP_SUFFIX,
    atomic_write_bytes,
    pid_alive,
    publish_temp,
    temp_path,
    temp_writer,
    temp_writer_dead,
    write_all,
    write_temp,
)
from cachemgr.storage.kinds import (
    GONE_ERRNOS,
    NFS_SILLY_PREFIX,
    HardLinkError,
    NotRegularFileError,
    at,
    kind_of,
    lstat_or_none,
    plain_file,
    real_path,
    regular_files,
)
from cachemgr.storage.locks import FcntlLock, lock_access_hint, open_lock_file, try_lock
from cachemgr.storage.modes import (
    CAP_FOWNER_BIT,
    DIR_MODE,
    FILE_MODE,
    OTHERS_AT_MOST,
    access_hint,
    dir_mode_in,
    ensure_dir,
    file_mode_for,
    file_mode_in,
    has_cap_fowner,
    share_file,
    share_modes,
)
from cachemgr.storage.noatime import (
    READ_CHUNK_BYTES,
    RELATIME_MAX_AGE_S,
    AtimeWouldChange,
    FileTooLargeError,
    read_bytes_noatime,
    read_changes_atime,
    reads_keep_atime,
    sha256_noatime,
    touch_atime,
)
from cachemgr.storage.remove import (
    open_up_folder,
    open_up_tree,
    remove_tree,
    remove_tree_at,
    safe_unlink,
    unlink_in,
)

# every name fsutil defined, now defined in the module named above; and the three it always
# had from elsewhere (peer's user_name/group_name, constants' short_host)
__all__ = [
    "CAP_FOWNER_BIT",
    "DIR_MODE",
    "FILE_MODE",
    "GONE_ERRNOS",
    "NFS_SILLY_PREFIX",
    "OTHERS_AT_MOST",
    "READ_CHUNK_BYTES",
    "RELATIME_MAX_AGE_S",
    "TEMP_SUFFIX",
    "AtimeWouldChange",
    "FcntlLock",
    "FileTooLargeError",
    "HardLinkError",
    "NotRegularFileError",
    "access_hint",
    "at",
    "atomic_write_bytes",
    "dir_mode_in",
    "ensure_dir",
    "file_mode_for",
    "file_mode_in",
    "group_name",
    "has_cap_fowner",
    "kind_of",
    "lock_access_hint",
    "lstat_or_none",
    "open_lock_file",
    "open_up_folder",
    "open_up_tree",
    "pid_alive",
    "plain_file",
    "publish_temp",
    "read_bytes_noatime",
    "read_changes_atime",
    "reads_keep_atime",
    "real_path",
    "regular_files",
    "remove_tree",
    "remove_tree_at",
    "safe_unlink",
    "sha256_noatime",
    "share_file",
    "share_modes",
    "short_host",
    "temp_path",
    "temp_writer",
    "temp_writer_dead",
    "touch_atime",
    "try_lock",
    "unlink_in",
    "user_name",
    "write_all",
    "write_temp",
]
