"""Private files: the TCP listener's token, a remote site's signing key (secrets), and the
user's own files outside the cache (:func:`read_own`, :func:`write_own`).

A secret is a file only the daemon's user may read. Read without care, a planted link would
make the daemon take another file's content as its secret, and a group-readable file would be
a secret every member knows (docs/security.md#6-the-tcp-listener-needs-a-token,
docs/security.md#13-a-remote-is-only-as-trusted-as-its-writers).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

from cachemgr.errors import ConfigError
from cachemgr.memo import Memo
from cachemgr.peer import user_name
from cachemgr.storage.atomic import atomic_write_bytes
from cachemgr.storage.modes import make_missing_folders


def read_private(path: str | Path, where: str, max_bytes: int, what: str) -> bytes:
    """At most ``max_bytes + 1`` bytes of ``path`` (the caller judges a longer file): a
    regular file, not a symbolic link (``O_NOFOLLOW``), owned by this process's user, with no
    permission for group or others.

    :param where: the setting that named the file (``[daemon] tcp_token_file``), for messages.
    :param what: what the file holds (``the token``), for messages; the content is never shown.
    :raises ConfigError: one line naming the setting, the file, what is wrong and the fix.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        why = "is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise ConfigError(f"{where}={str(path)!r}: cannot read it ({why})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{where}={str(path)!r} is not a regular file")
        if st.st_uid != os.geteuid():
            raise ConfigError(
                f"{where}={str(path)!r} belongs to {user_name(st.st_uid)}, not to this user "
                f"{user_name(os.geteuid())}; chown it"
            )
        if st.st_mode & 0o077:
            raise ConfigError(
                f"{where}={str(path)!r} has mode {stat.S_IMODE(st.st_mode):04o}; others could "
                f"read {what}: chmod 600 it"
            )
        return os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)


# --- a user's own files outside the cache ------------------------------------------------
#
# cachemgr keeps a few files of one user's own beside the shared cache: the compiler
# identities (``compilers.json``), the ``-march=native`` resolutions (``native.json``), the
# lock probe's answers (``lockprobe.json``) in ``$XDG_CACHE_HOME/cachemgr``, a remote's open
# breaker in the state folder (docs/design.md#the-users-own-files). Their folders are made
# ``0700`` whatever the umask, as the XDG Base Directory specification asks of a folder it
# creates; one is read only when it and its folder are this user's and nobody else may write
# them — where users share a primary group, a folder made by the shared cache's rule (group
# ``rwx``) would let any of them plant the identity every key holds.

#: Bits of a private folder or file that let another user change it.
OTHERS_WRITE = 0o022
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class NotPrivate(OSError):
    """A private folder or file that another user could have written (or of another
    kind): it is not trusted. :attr:`planted` is True when it belongs to another user."""

    def __init__(self, why: str, planted: bool = False) -> None:
        super().__init__(errno.EPERM, why)
        self.planted = planted


def _own(st: os.stat_result, path: str | Path, forbid: int) -> None:
    """:raises NotPrivate: ``st`` (of ``path``) is not this user's, or has a bit of ``forbid``."""
    if st.st_uid != os.geteuid():
        raise NotPrivate(
            f"{path} belongs to {user_name(st.st_uid)}, not to {user_name(os.geteuid())}",
            planted=True,
        )
    if st.st_mode & forbid:
        raise NotPrivate(f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: others may write it")


def open_private_dir(folder: str | Path) -> int:
    """``folder`` opened (not through a link) when it is this user's and not group- or
    other-writable; the caller closes the descriptor.

    :raises FileNotFoundError: it does not exist.
    :raises NotPrivate: a link, not a folder, another user's or writable by others.
    """
    try:
        dfd = os.open(folder, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotPrivate(f"{folder} is a symbolic link or no folder") from None
        raise
    try:
        _own(os.fstat(dfd), folder, OTHERS_WRITE)
    except BaseException:
        os.close(dfd)
        raise
    return dfd


def read_own(path: Path, max_bytes: int) -> bytes:
    """The bytes of the private file ``path`` (see the comment above :data:`OTHERS_WRITE`):
    a regular file of one link, opened without following a link, this user's, neither it
    nor its folder writable by group or others, at most ``max_bytes`` bytes.

    :raises FileNotFoundError: it (or its folder) does not exist.
    :raises NotPrivate: any of those does not hold (the caller ignores the file).
    :raises OSError: it cannot be read.
    """
    dfd = open_private_dir(path.parent)
    try:
        try:
            fd = os.open(path.name, _FILE_FLAGS, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise NotPrivate(f"{path} is a symbolic link") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise NotPrivate(f"{path} is not a regular file of one link")
            _own(st, path, OTHERS_WRITE)
            if st.st_size > max_bytes:
                raise NotPrivate(f"{path} is over {max_bytes} bytes")
            data = os.read(fd, max_bytes + 1)
            if len(data) > max_bytes:
                raise NotPrivate(f"{path} is over {max_bytes} bytes")
            return data
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


#: What :func:`read_own_or_none` has warned of in this process (a file read twice in one
#: run, as the identity file is before and after a ``--version``, is warned of once).
_warned: Memo[str, bool] = Memo("private files warned of", 64)


def read_own_or_none(path: Path, max_bytes: int, log: logging.Logger) -> bytes | None:
    """:func:`read_own`, or None (with one log line: a warning when another user's file or
    folder is found there, once per process and finding, else debug) when the file is
    missing, not private or unreadable."""
    try:
        return read_own(path, max_bytes)
    except FileNotFoundError:
        return None
    except NotPrivate as exc:
        first = exc.planted and _warned.put_new(str(exc.strerror), True)
        level = logging.WARNING if first else logging.DEBUG
        log.log(level, "ignoring %s: %s", path.name, exc.strerror)
    except OSError as exc:
        log.debug("cannot read %s: %s", path, exc)
    return None


def read_own_json(path: Path, max_bytes: int, log: logging.Logger) -> dict[str, Any]:
    """The JSON object in the private file ``path`` (:func:`read_own_or_none`); {} when it is
    missing, not private, unreadable or not a JSON object (a cache of the user's own: its
    content is computed again)."""
    raw = read_own_or_none(path, max_bytes, log)
    try:
        data = json.loads(raw) if raw is not None else {}
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        log.debug("ignoring %s: not JSON", path)
        return {}
    return data if isinstance(data, dict) else {}


def ensure_private_dir(folder: Path) -> Path:
    """Make ``folder`` and its missing parents ``0700`` whatever the umask; return it. An
    existing ``folder`` of this user's that others may write — as cachemgr made it before
    it kept these folders private — is made ``0700``, unless it is setgid (shared on
    purpose: it is then left as it is, and :func:`write_own` refuses it).

    :raises NotPrivate: ``folder`` is a link or no folder (another user's, or a shared one,
        is returned as it is: :func:`open_private_dir` refuses it).
    :raises OSError: it cannot be made (``EACCES``, ``ENOTDIR``).
    """
    make_missing_folders(folder, lambda _: 0o700)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise NotPrivate(f"{folder} is a symbolic link or no folder")
    if st.st_uid == os.geteuid() and st.st_mode & OTHERS_WRITE and not st.st_mode & stat.S_ISGID:
        os.chmod(folder, 0o700, follow_symlinks=False)
    return folder


def write_own(path: Path, data: bytes) -> None:
    """Write the private file ``path`` atomically, mode ``0600``, in its private folder
    (:func:`ensure_private_dir`).

    :raises NotPrivate: the folder is not this user's private one (nothing written).
    :raises OSError: the write failed (``path`` unchanged).
    """
    ensure_private_dir(path.parent)
    dfd = open_private_dir(path.parent)
    try:
        atomic_write_bytes(path, data, mode=0o600, dir_fd=dfd, sync=False)
    finally:
        os.close(dfd)
