"""Which compiler, exactly: the files a compile runs and their stamp in the key.

A compiler is named in the key by the file really run — the path found on ``PATH`` with
every symbolic link followed — and a stamp of it, the way ccache's ``compiler_check``
works (https://ccache.dev/manual/latest.html#config_compiler_check):

* ``mtime`` (the default): the file's size and modification time (nanoseconds);
* ``content``: the SHA-256 of its bytes, remembered per device, inode, size, mtime and
  ctime (a copy made with its mtime restored still gets a new ctime, so it is hashed again).

A ``#!`` script (a wrapper such as ``/usr/local/bin/nvcc`` → ``exec
/usr/local/cuda/bin/nvcc "$@"``) is stamped with every executable file it names by an
absolute path, so a compiler upgraded under an unchanged wrapper changes the key, and two
wrappers of the same compiler that add different flags never share one (their scripts
differ). What a wrapper finds by ``PATH`` alone is not followed (docs/compiling.md#the-compiler).

The ``[compilers] compiler_check`` setting picks the mode (config/cachemgr.toml,
docs/compiling.md#the-compiler).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping

from cachemgr.errors import CompileError, ConfigError
from cachemgr.memo import Memo

#: The ``compiler_check`` modes.
CHECKS = ("mtime", "content")
#: Bytes of a ``#!`` script read for the programs it runs.
SCRIPT_HEAD_BYTES = 4096
#: The most programs a wrapper script is stamped with.
MAX_WRAPPED = 8
_ABS_WORD = re.compile(rb"(?<![\w$./-])(/[A-Za-z0-9_.+/-]+)")

#: The programs a script names, by the script's (path, inode, size, mtime).
_wrapped: Memo[tuple[str, int, int, int], tuple[str, ...]] = Memo("wrapped compilers", 256)
#: SHA-256 of compiler files by (path, device, inode, size, mtime, ctime).
_contents: Memo[tuple[str, int, int, int, int, int], str] = Memo("compiler digests", 256)


def check_mode(config: Mapping[str, object]) -> str:
    """``[compilers] compiler_check``: ``mtime`` (default) or ``content``.

    :raises ConfigError: any other value (named).
    """
    value = config.get("compiler_check", "mtime")
    if value not in CHECKS:
        raise ConfigError(
            f"[compilers] compiler_check={value!r} must be one of {', '.join(CHECKS)}"
        )
    return str(value)


def compiler_files(path: str) -> tuple[str, ...]:
    """The file ``path`` runs (links followed), then the programs it names when it is a
    ``#!`` script (links followed, at most :data:`MAX_WRAPPED`).

    :raises CompileError: ``path`` cannot be read (named).
    """
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as exc:
        raise CompileError(f"compiler {path} cannot be read: {exc.strerror}") from None
    memo = (real, st.st_ino, st.st_size, st.st_mtime_ns)
    known = _wrapped.get(memo)
    if known is None:
        known = _programs_of(real)
        _wrapped.put(memo, known)
    return (real, *known)


def _programs_of(script: str) -> tuple[str, ...]:
    """The executable files a ``#!`` script names by an absolute path, its interpreter line
    left out; () for anything else."""
    try:
        with open(script, "rb") as fh:
            head = fh.read(SCRIPT_HEAD_BYTES)
    except OSError:
        return ()
    if not head.startswith(b"#!"):
        return ()
    body = head.split(b"\n", 1)[1] if b"\n" in head else b""
    found: list[str] = []
    for match in _ABS_WORD.finditer(body):
        word = os.fsdecode(match.group(1))
        real = os.path.realpath(word)
        if real != script and os.path.isfile(real) and os.access(real, os.X_OK):
            found.append(real)
    return tuple(dict.fromkeys(found))[:MAX_WRAPPED]


def stat_key(files: tuple[str, ...], mode: str) -> tuple[object, ...]:
    """What identifies ``files`` now for ``mode``: per file its path, device, inode, size,
    mtime (and ctime for ``content``) — one ``stat`` each.

    :raises CompileError: a file cannot be read (named).
    """
    out: list[object] = [mode]
    for name in files:
        try:
            st = os.stat(name)
        except OSError as exc:
            raise CompileError(f"compiler {name} cannot be read: {exc.strerror}") from None
        ctime = st.st_ctime_ns if mode == "content" else 0
        out.append((name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, ctime))
    return tuple(out)


def stamp(files: tuple[str, ...], mode: str) -> str:
    """The key's stamp of ``files``: ``<path>=<size>:<mtime_ns>`` each (``mtime``) or
    ``<path>=sha256:<hex>`` each (``content``), joined by ``;``.

    :raises CompileError: a file cannot be read (named).
    """
    parts = []
    for name in files:
        try:
            st = os.stat(name)
        except OSError as exc:
            raise CompileError(f"compiler {name} cannot be read: {exc.strerror}") from None
        if mode == "content":
            parts.append(f"{name}=sha256:{_digest(name, st)}")
        else:
            parts.append(f"{name}={st.st_size}:{st.st_mtime_ns}")
    return ";".join(parts)


def _digest(name: str, st: os.stat_result) -> str:
    memo = (name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    known = _contents.get(memo)
    if known is None:
        sha = hashlib.sha256()
        try:
            with open(name, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    sha.update(chunk)
        except OSError as exc:
            raise CompileError(f"compiler {name} cannot be read: {exc.strerror}") from None
        known = sha.hexdigest()
        _contents.put(memo, known)
    return known
