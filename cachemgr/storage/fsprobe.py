"""Start-up checks of a cache root shared by users and hosts (docs/design.md#sharing-and-locking).

* :func:`probe_locks` — do fcntl locks work on the root? A lock is taken on a probe file and
  a child process, through its own open file description, must see it as held (POSIX record
  locks, and the open-file-description locks :mod:`cachemgr.storage.chiplock` uses). A filesystem
  that refuses locks (``ENOLCK``), ignores them, or is an NFS mount whose locks stay local to
  the host (``local_lock=all|posix``, ``nolock``: other hosts would not see them) fails.
* :func:`access_problems` — can this user write the kernel cache? (:func:`chip_access_problems`:
  its chip folders, which are warned about and skipped, never refused.) Each problem is one
  line naming the folder, the user, its owner, group and mode and the fix
  (:func:`cachemgr.storage.fsutil.access_hint`), instead of CANN's silent skip.

The daemon runs both before it serves (``cachemgr serve``; ``[daemon] lock_fallback``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

from cachemgr.config.layout import is_chip_folder
from cachemgr.constants import short_host
from cachemgr.errors import ConfigError
from cachemgr.storage import fsutil, mountrule

log = logging.getLogger(__name__)

#: Probe files are ``<folder>/.cachemgr-lockprobe.<host>.<pid>``, removed after the probe.
PROBE_PREFIX = ".cachemgr-lockprobe"
#: How long the child may take to test the lock (seconds); a hung lock manager fails.
PROBE_TIMEOUT_S = 20.0
#: NFS mount options under which fcntl locks are local to one host.
LOCAL_LOCK_OPTIONS = ("local_lock=all", "local_lock=posix", "nolock")

# The child: open the probe file itself (a second open file description) and try the locks
# the parent holds. Exit 0 = both seen as held; 10 = the POSIX lock was not seen; 11 = the
# OFD lock was not seen; 12 = an error (printed).
_CHILD = """
import errno, fcntl, os, struct, sys
busy = (errno.EAGAIN, errno.EACCES)
try:
    fd = os.open(sys.argv[1], os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        sys.exit(10)
    except OSError as exc:
        if exc.errno not in busy:
            raise
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 1, 1, 0))
        sys.exit(11)
    except OSError as exc:
        if exc.errno not in busy:
            raise
except OSError as exc:
    print(f"[Errno {exc.errno}] {exc.strerror}")
    sys.exit(12)
"""


@dataclass(frozen=True)
class LockProbe:
    """The answer of :func:`probe_locks`: ``ok``, and one line saying what was found."""

    folder: Path
    ok: bool
    detail: str


@dataclass(frozen=True)
class Mount:
    """One line of ``/proc/self/mountinfo``: where, the filesystem type, the options."""

    mount_point: str
    fstype: str
    options: tuple[str, ...]


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a ``/proc/<pid>/mountinfo`` text (:func:`cachemgr.storage.mountrule.parse`:
    ``proc(5)``, malformed lines skipped, mount and superblock options together, octal escapes
    in mount points decoded)."""
    return [Mount(point, fstype, opts) for point, fstype, opts in mountrule.parse(text)]


def mount_of(path: Path, mounts: list[Mount]) -> Mount | None:
    """The mount holding ``path`` (resolved): the longest mount point that contains it (the
    last one mounted there when several are; :func:`cachemgr.storage.mountrule.best_mount`)."""
    best = mountrule.best_mount(str(path), [m.mount_point for m in mounts])
    return None if best is None else mounts[best]


def local_lock_reason(mount: Mount | None) -> str | None:
    """Why locks on ``mount`` would not be seen by other hosts, or None: an NFS mount with
    ``local_lock=all``/``local_lock=posix`` or ``nolock`` keeps fcntl locks on this host."""
    if mount is None or not mount.fstype.startswith("nfs"):
        return None
    found = [o for o in mount.options if o in LOCAL_LOCK_OPTIONS]
    if not found:
        return None
    return (
        f"{mount.mount_point} is an {mount.fstype} mount with {found[0]}: its fcntl locks are "
        "not seen by other hosts (docs/design.md#sharing-and-locking needs NFSv4 locks)"
    )


def probe_locks(
    folder: Path,
    timeout_s: float = PROBE_TIMEOUT_S,
    mountinfo: Path = Path("/proc/self/mountinfo"),
) -> LockProbe:
    """Check that fcntl locks work in ``folder`` (created if missing), across processes.

    Takes a POSIX record lock and an open-file-description lock on a probe file; a child
    process opens the file itself and must find both held. Also fails for an NFS mount with
    host-local locks (see :func:`local_lock_reason`). The probe file is removed.

    :param timeout_s: how long the child may take (a hung lock manager fails the probe).
    :returns: ``ok`` False with a one-line ``detail`` when locks do not work.
    :raises OSError: the folder or the probe file cannot be created (e.g. ``EACCES``).
    :raises ConfigError: this interpreter (``sys.executable``) cannot be started as the
        second process (e.g. a venv whose Python lies under a home this user cannot enter).
    """
    folder = Path(folder)
    fsutil.ensure_dir(folder)
    _remove_dead_probes(folder)
    try:
        reason = local_lock_reason(mount_of(folder, parse_mountinfo(mountinfo.read_text())))
    except OSError:
        reason = None  # no mountinfo (not Linux /proc): the lock test below still runs
    if reason is not None:
        return LockProbe(folder, False, reason)
    path = folder / f"{PROBE_PREFIX}.{short_host()}.{os.getpid()}"
    fd = fsutil.open_lock_file(path)
    try:
        return _probe_fd(folder, path, fd, timeout_s)
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            fsutil.safe_unlink(path)


def _probe_fd(folder: Path, path: Path, fd: int, timeout_s: float) -> LockProbe:
    import subprocess  # here: only a lock probe runs a child, a CLI hit does not

    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        ofd = _ofd_struct(fcntl.F_WRLCK)
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, ofd)
    except OSError as exc:
        return LockProbe(folder, False, f"fcntl lock on {path} failed: {exc.strerror}")
    try:
        child = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _CHILD, str(path)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return LockProbe(
            folder, False, f"testing the lock on {path} hung for {timeout_s:g} s (lock manager?)"
        )
    except OSError as exc:  # not the folder's fault: the second process cannot start
        raise ConfigError(
            f"cannot run {sys.executable} (the Python cachemgr runs on) as uid {os.geteuid()} "
            f"to test the locks in {folder} from a second process: {exc.strerror}; make "
            "cachemgr's venv from a Python this user may run (not one under a private home "
            "such as /root)"
        ) from None
    finally:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0)
    if child.returncode == 0:
        return LockProbe(folder, True, f"fcntl locks work on {folder}")
    why = {
        10: "a lock held by one process was not seen by another (locks are ignored)",
        11: "an open-file-description lock was not seen by another process",
    }.get(child.returncode, f"the lock test failed: {child.stdout.strip() or child.stderr}")
    return LockProbe(folder, False, f"fcntl locks do not work on {folder}: {why}")


def _ofd_struct(kind: int) -> bytes:
    # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks); byte 1
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, 1, 1, 0)


def _remove_dead_probes(folder: Path) -> None:
    """Probe files of this host's dead processes (a daemon killed mid-probe)."""
    prefix = f"{PROBE_PREFIX}.{short_host()}."
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        pid = name[len(prefix) :]
        if name.startswith(prefix) and pid.isdigit() and not fsutil.pid_alive(int(pid)):
            with contextlib.suppress(OSError):
                fsutil.safe_unlink(folder / name)


def access_problems(kernel_cache_dir: Path) -> list[str]:
    """Why this user cannot write the kernel cache folder, one line, or none
    (docs/design.md#sharing-and-locking).

    Checks the kernel cache folder (or its first existing parent). Each line names the path,
    the user, the owner, group and mode and what to do
    (:func:`cachemgr.storage.fsutil.access_hint`). A missing folder is fine: it will be
    created group-shareable. A chip folder this user cannot read or write is not one of
    them (:func:`chip_access_problems`): like an unreadable ``op_cache.ini``
    (docs/security.md item 3), one member's private chip folder cannot stop the daemon.
    """
    cur = Path(kernel_cache_dir)
    while not os.path.lexists(cur) and cur.parent != cur:
        cur = cur.parent
    if os.access(cur, os.W_OK | os.X_OK):
        return []
    return [fsutil.access_hint(cur)]


def chip_access_problems(kernel_cache_dir: Path) -> dict[Path, str]:
    """The chip folders of the kernel cache this user cannot read and write, each with its
    one line (path, user, owner, group, mode, fix): they are skipped with a warning, the
    others served (docs/security.md item 3)."""
    found = {}
    with contextlib.suppress(OSError):
        for e in os.scandir(kernel_cache_dir):
            if is_chip_folder(e) and not os.access(e.path, os.R_OK | os.W_OK | os.X_OK):
                found[Path(e.path)] = fsutil.access_hint(Path(e.path))
    return found


def world_writable(kernel_cache_dir: Path) -> list[Path]:
    """Folders of the kernel cache that anyone may write (docs/design.md#sharing-and-locking: never
    world-writable)."""
    found = []
    paths = [Path(kernel_cache_dir)]
    with contextlib.suppress(OSError):
        paths += [Path(e.path) for e in os.scandir(kernel_cache_dir) if is_chip_folder(e)]
    for path in paths:
        try:
            mode = os.lstat(path).st_mode
        except OSError as exc:
            if exc.errno in fsutil.GONE_ERRNOS or exc.errno == errno.EACCES:
                continue
            raise
        if stat.S_ISDIR(mode) and mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            found.append(path)
    return found


#: errno of a write refused because the filesystem is read-only.
READ_ONLY_ERRNOS = frozenset({errno.EROFS})
#: errno of a cache root that vanished under us (an NFS export gone: ``ESTALE``) or whose
#: server fails (``EIO``).
VANISHED_ERRNOS = frozenset({errno.ESTALE, errno.EIO})


def root_problem(kernel_cache_dir: Path) -> str:
    """Why the kernel cache cannot be written now, in one line, or ``""``.

    Checks the mount of the kernel cache (or, when it does not exist yet, of its nearest
    existing parent): a read-only filesystem (``ST_RDONLY``: remounted read-only, e.g. after
    an I/O error) or a root that vanished (``ESTALE``/``EIO`` on an NFS root). A kernel cache
    that is simply missing is no problem: it is made again on the next publish.
    """
    path = Path(kernel_cache_dir)
    while True:
        try:
            vfs = os.statvfs(path)
            break
        except OSError as exc:
            if exc.errno in VANISHED_ERRNOS:
                return f"the cache root {path} has vanished ({exc.strerror})"
            if exc.errno in (errno.ENOENT, errno.ENOTDIR) and path.parent != path:
                path = path.parent
                continue
            return f"the cache root {path} cannot be checked ({exc.strerror})"
    if vfs.f_flag & os.ST_RDONLY:
        return f"the cache root {path} is on a read-only filesystem"
    return ""
