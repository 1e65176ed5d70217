"""Where the installed toolkit's versions are found, GE's rule, on the standard library's
``os`` alone: :func:`cachemgr.config.versions.installed_versions` (the full path: gc, the
publish, ``limits``, ``config``) takes them from here, and so does the lean ``config``
(:mod:`cachemgr.quickconfig`) — one rule, no ``pathlib``/``glob``/``re`` at start-up
(docs/performance.md).

GE's rule (``common/te_config_info.cc``, ``TeConfigInfo::InitAdkAndOppVersion`` and
``GetVersionFromVersionFile``), described in full in :mod:`cachemgr.config.versions`:
``adk_version`` from ``version.info`` next to GE's library (found under ``$ASCEND_HOME_PATH``,
then ``$ASCEND_TOOLKIT_HOME``, in the layouts :data:`GE_LIBRARY_DIRS`; ``*`` stands for any
name, not starting with ``.``, of a folder), else from ``compiler/version.info`` then
``version.info`` under the home; ``ops_version`` from ``$ASCEND_OPP_PATH/version.info``.

Paths are spelt as ``pathlib`` spells them (:func:`path_text`), so the sources read the same
as they did when this was built on ``pathlib``. Each version is ``(value, source)``: the value
None when not found, the source then saying why.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: typing costs start-up
    from collections.abc import Mapping
    from typing import TypeAlias

    #: One version and where it came from (or why it was not found).
    Found: TypeAlias = tuple[str | None, str]

VERSION_INFO = "version.info"
#: Largest ``version.info`` read (bytes; CANN's has a few lines).
MAX_VERSION_INFO_BYTES = 1 << 20
#: GE's libraries holding ``TeConfigInfo`` (``op_compile_adapter/source/CMakeLists.txt``;
#: ``libte_fusion.so`` in older CANN) [GE].
GE_LIBRARIES = ("libop_compile_adapter.so", "libte_fusion.so")
#: Where a toolkit home keeps them: older ``ascend-toolkit/latest`` and newer
#: ``cann/<arch>-linux`` layouts (``*``: any folder's name ending as given).
GE_LIBRARY_DIRS = ("lib64", "compiler/lib64", "*-linux/lib64")
#: ``te_config_info.cc``: ``kParentDirRelativePath``, then ``kCompilerPkgRelativePath`` [GE].
ADK_FROM_LIBRARY = ("..", "../../compiler")
#: Without GE's library: ``version.info`` under the home, as GE's rule gives on the older
#: layout.
ADK_RELATIVE = ("compiler/version.info", "version.info")
ADK_ENV_VARS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
OPS_ENV_VAR = "ASCEND_OPP_PATH"


def path_text(path: str) -> str:
    """``str(pathlib.PurePosixPath(path))``: empty and ``.`` components dropped, a trailing
    ``/`` too, two leading slashes kept (POSIX leaves their meaning open), ``.`` for nothing."""
    root = ""
    if path.startswith("/"):
        root = "//" if path.startswith("//") and not path.startswith("///") else "/"
    parts = [p for p in path.split("/") if p and p != "."]
    return (root + "/".join(parts)) or "."


def read_version_info(path: str) -> str | None:
    """The ``Version=`` value of a CANN ``version.info``, GE's way (lines ``key=value``, key
    and value trimmed of spaces and tabs, ``#`` lines skipped, the first key exactly
    ``Version``); None if absent, unreadable, not a regular file (a FIFO never blocks) or
    over :data:`MAX_VERSION_INFO_BYTES`. The last component may be a link (the operator's
    toolkit)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_VERSION_INFO_BYTES:
            return None
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > MAX_VERSION_INFO_BYTES:
                return None
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    for line in b"".join(chunks).decode("utf-8", errors="replace").split("\n"):
        if not line or line.startswith("#") or "=" not in line:  # std::getline; Trim()
            continue
        key, _, value = line.partition("=")
        if key.strip(" \t") == "Version":
            return value.strip(" \t") or None
    return None


def _library_dirs(home: str, pattern: str) -> list[str]:
    """The folders of one :data:`GE_LIBRARY_DIRS` pattern under ``home``, sorted, as
    ``glob.glob`` of ``home/pattern`` finds them: a plain path when it exists (a link
    included); ``*-linux`` any folder (links followed) of that ending, not starting with
    ``.``."""
    first, _, rest = pattern.partition("/")
    if not first.startswith("*"):
        path = path_text(f"{home}/{pattern}")
        return [path] if os.path.lexists(path) else []
    ending = first[1:]
    base = path_text(home)
    try:
        with os.scandir(base) as it:
            names = [e.name for e in it if _is_dir(e)]
    except OSError:
        return []
    prefix = "" if base == "." else base  # glob spells the current folder's names bare
    found = [
        os.path.join(prefix, name, rest)
        for name in names
        if not name.startswith(".") and name.endswith(ending)
    ]
    return sorted(p for p in found if os.path.lexists(p))


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def ge_library(home: str) -> str | None:
    """The real path of GE's cache library under a toolkit home, or None (module doc)."""
    for pattern in GE_LIBRARY_DIRS:
        for folder in _library_dirs(home, pattern):
            for name in GE_LIBRARIES:
                lib = os.path.join(folder, name)
                if os.path.exists(lib):
                    return os.path.realpath(lib)
    return None


def _adk_from_library(home: str, var: str) -> Found | None:
    """``TeConfigInfo::InitAdkAndOppVersion``: ``version.info`` relative to GE's library."""
    lib = ge_library(home)
    if lib is None:
        return None
    for rel in ADK_FROM_LIBRARY:
        path = os.path.normpath(os.path.join(os.path.dirname(lib), rel, VERSION_INFO))
        value = read_version_info(path)
        if value:
            return value, f"{path} (next to GE's {lib}, from ${var})"
    return None


def _first_version(home: str, relatives: tuple[str, ...], var: str) -> Found:
    paths = [path_text(f"{home}/{rel}") for rel in relatives]
    for path in paths:
        value = read_version_info(path)
        if value:
            return value, path
    return None, f"not found: no Version= in {', '.join(paths)} (from ${var})"


def adk_version(env: Mapping[str, str]) -> Found:
    """The installed ``adk_version`` (module doc): ``$ASCEND_HOME_PATH`` first, then
    ``$ASCEND_TOOLKIT_HOME`` (each trimmed of spaces and tabs, as GE's ``InitEnvItem``)."""
    found: Found = (None, "not found: " + " / ".join(f"${v}" for v in ADK_ENV_VARS) + " unset")
    for var in ADK_ENV_VARS:
        home = env.get(var, "").strip(" \t")
        if home:
            found = _adk_from_library(home, var) or _first_version(home, ADK_RELATIVE, var)
            if found[0]:
                break
    return found


def ops_version(env: Mapping[str, str]) -> Found:
    """The installed ``ops_version``: ``$ASCEND_OPP_PATH/version.info`` (trimmed as GE)."""
    opp = env.get(OPS_ENV_VAR, "").strip(" \t")
    if not opp:
        return None, f"not found: ${OPS_ENV_VAR} unset"
    return _first_version(opp, (VERSION_INFO,), OPS_ENV_VAR)
