"""Reading a private file: the TCP listener's token, a remote site's signing key.

A secret is a file only the daemon's user may read. Read without care, a planted link would
make the daemon take another file's content as its secret, and a group-readable file would be
a secret every member knows (docs/security.md#6-the-tcp-listener-needs-a-token,
docs/security.md#13-a-remote-is-only-as-trusted-as-its-writers).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from cachemgr.errors import ConfigError
from cachemgr.peer import user_name


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
