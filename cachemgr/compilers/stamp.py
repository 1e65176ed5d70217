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

Every link is resolved again on every check: the wrapper's own file is what its programs'
*names* are remembered by, never what they resolve to, so a toolchain link flipped behind an
unchanged wrapper (``/opt/tc/current`` → another compiler, as CANN's ``ascend-toolkit/latest``
or ``update-alternatives`` do) names other files and changes the key.

ccache's masquerade link (``/usr/lib/ccache/gcc`` → ``/usr/bin/ccache``) runs the compiler
ccache finds itself: the one its ``compiler`` setting (``CCACHE_COMPILER``) names, else the
first program of the same name in ``CCACHE_PATH`` (else ``PATH``) that is not ccache
(https://ccache.dev/manual/latest.html#config_compiler,
https://ccache.dev/manual/latest.html#config_path); that compiler is stamped too.

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

#: ccache's own program name: a file of this name reached through a link of another name is
#: ccache masquerading as that compiler.
CCACHE_NAME = "ccache"
#: The most ccache masquerade links followed in a row (a link, its compiler's wrapper's link).
MAX_CCACHE_DEPTH = 2

#: The absolute words a script names, by the script's (path, device, inode, size, mtime,
#: ctime): what they resolve to is looked up again on every use.
_wrapped: Memo[tuple[str, int, int, int, int, int], tuple[str, ...]] = Memo(
    "wrapped compilers", 256
)
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
    ``#!`` script and the compiler a ccache masquerade link runs (links followed, at most
    :data:`MAX_WRAPPED`): the real files of :func:`named_files`.

    :raises CompileError: ``path`` cannot be read (named).
    """
    return tuple(real for _, real in named_files(path))


def named_files(path: str) -> tuple[tuple[str, str], ...]:
    """``(name, real file)`` of each file a run of ``path`` executes: ``path`` itself, each
    program its ``#!`` script names by an absolute path, and, for a ccache masquerade link,
    the compiler ccache runs (:func:`ccache_compiler`). Each name is resolved now (``lstat``
    calls only; the script is read once per change of its own file), so a link flipped
    anywhere on the way names another file. Costs no ``--version`` and no compile.

    :raises CompileError: ``path`` cannot be read (named).
    """
    return _named(path, 0)


def _named(path: str, depth: int) -> tuple[tuple[str, str], ...]:
    """:func:`named_files`, ``depth`` ccache links deep (at most :data:`MAX_CCACHE_DEPTH`:
    a script that ccache finds for a link that script names ends there)."""
    real = os.path.realpath(path)
    out = [(path, real)]
    for word in _words(real, path):
        found = os.path.realpath(word)
        if found != real and os.path.isfile(found) and os.access(found, os.X_OK):
            out.append((word, found))
    for name, found in list(out):
        if depth < MAX_CCACHE_DEPTH and _is_masquerade(name, found):
            behind = ccache_compiler(name, found)
            if behind is not None:
                out.extend(_named(behind, depth + 1)[:MAX_WRAPPED])
    seen: dict[str, tuple[str, str]] = {}
    for name, found in out:
        seen.setdefault(found, (name, found))
    return tuple(seen.values())[: MAX_WRAPPED + 1]


def _words(real: str, path: str) -> tuple[str, ...]:
    """The absolute words of the script ``real`` (remembered by its file's status).

    :raises CompileError: it cannot be read (named by ``path``).
    """
    try:
        st = os.stat(real)
    except OSError as exc:
        raise CompileError(f"compiler {path} cannot be read: {exc.strerror}") from None
    memo = (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    known = _wrapped.get(memo)
    if known is None:
        known = _programs_of(real)
        _wrapped.put(memo, known)
    return known


def _is_masquerade(path: str, real: str) -> bool:
    """ccache reached by another name: it runs the compiler of that name (ccache's run modes,
    https://ccache.dev/manual/latest.html#_run_modes)."""
    return os.path.basename(real) == CCACHE_NAME and os.path.basename(path) != CCACHE_NAME


def ccache_compiler(path: str, ccache: str) -> str | None:
    """The compiler ccache (the file ``ccache``) runs when invoked as ``path``: the one its
    ``compiler`` setting names (``CCACHE_COMPILER``), else the first executable of the same
    name in the folders of ``CCACHE_PATH`` (else ``PATH``) whose file is not ccache
    (https://ccache.dev/manual/latest.html#config_compiler, #config_path). None when there is
    none (ccache then fails to run; ``--version`` says so). ccache's config files are not
    read: a ``compiler`` or ``path`` set there is not seen (set it in the environment)."""
    name = os.environ.get("CCACHE_COMPILER") or os.path.basename(path)
    if os.sep in name:
        return name if _runnable_not_ccache(name, ccache) else None
    folders = os.environ.get("CCACHE_PATH") or os.environ.get("PATH", os.defpath)
    for folder in folders.split(os.pathsep):
        cand = os.path.join(folder or ".", name)
        if _runnable_not_ccache(cand, ccache):
            return cand
    return None


def _runnable_not_ccache(cand: str, ccache: str) -> bool:
    real = os.path.realpath(cand)
    if real == ccache or os.path.basename(real) == CCACHE_NAME:
        return False
    return os.path.isfile(real) and os.access(real, os.X_OK)


def _programs_of(script: str) -> tuple[str, ...]:
    """The absolute words of a ``#!`` script that may name a program, its interpreter line
    left out (at most 4 × :data:`MAX_WRAPPED`); () for anything else."""
    try:
        with open(script, "rb") as fh:
            head = fh.read(SCRIPT_HEAD_BYTES)
    except OSError:
        return ()
    if not head.startswith(b"#!"):
        return ()
    body = head.split(b"\n", 1)[1] if b"\n" in head else b""
    found = [os.fsdecode(m.group(1)) for m in _ABS_WORD.finditer(body)]
    return tuple(dict.fromkeys(found))[: 4 * MAX_WRAPPED]


#: What a remembered identity is checked against: each name a run of the compiler goes
#: through and the status of the file it names now (:func:`watch`).
Watched = tuple[tuple[str, tuple[int, ...]], ...]


def watch(path: str, mode: str) -> tuple[Watched, str]:
    """Each name of :func:`named_files` with the status of the file it names (device,
    inode, size, mtime, ctime: ``stat``, links followed), and the :func:`stamp` of those
    files now. A remembered identity whose stamp is this one stays valid while
    :func:`unchanged` holds: a link flipped anywhere on the way to a name (a toolchain's
    ``current``, the compiler behind a ccache link) names another file, whose status
    differs; the wrapper's own edits change its status.

    :raises CompileError: ``path`` cannot be read (named).
    """
    named = named_files(path)
    watched = tuple((name, _status(name)) for name, _ in named)
    return watched, stamp(tuple(real for _, real in named), mode)


def unchanged(watched: Watched) -> bool:
    """Every name of ``watched`` still names a file of the recorded status: one ``stat``
    per name, no ``--version``, no script read. False for nothing watched. (A loop, not
    ``all()`` over a generator: every remembered hit runs it.)"""
    for name, status in watched:
        if _status(name) != status:
            return False
    return bool(watched)


def _status(name: str) -> tuple[int, ...]:
    try:
        st = os.stat(name)
    except OSError:
        return ()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


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
