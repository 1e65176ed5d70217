"""Pure path arithmetic for CANN's cache layout (layer 2; docs/design.md#where-the-cache-lives,
#files-of-an-entry, #debug-compiles-and-kernel_meta).

Nothing here touches the disk except :func:`check_root`, which only looks. Names follow CANN:
``<root>/kernel_cache/<soc_version>/`` holds the entries of one chip (the *chip folder*).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from cachemgr.config import core
from cachemgr.errors import ConfigError, InvalidEntryError
from cachemgr.storage import fsutil
from cachemgr.storage.pseudofs import pseudo_filesystem
from cachemgr.storage.safedir import SafeDir

#: The eviction lock's file name in every chip folder (CANN GE's own name,
#: docs/design.md#size-limits-and-eviction).
EVICT_LOCK_NAME = "op_cache_file_del.lock"
#: Suffix of cachemgr's header manifests beside the entries (GE never reads
#: them): ``<op>_<base key>.manifest`` (see :mod:`cachemgr.storage.manifest`).
MANIFEST_SUFFIX = ".manifest"
#: CANN's limits file, in the kernel cache folder (docs/design.md#size-limits-and-eviction).
INI_NAME = core.INI_NAME
KERNEL_CACHE = core.KERNEL_CACHE
KERNEL_META = "kernel_meta"

# docs/design.md#options-and-their-origins: a-z A-Z 0-9 _ - . , Chinese characters, and / as
# separator (config.core.path_value_ok, the rule on os alone).
_NAME_RE = re.compile(r"^[A-Za-z0-9_\-.]+\Z")
#: A chip folder's name is a ``soc_version``. GE makes the chip folder as
#: ``<cache dir>/kernel_cache/ + soc_version`` (``cache/te_cache_manager.cc``,
#: ``TeCacheManager::SetCacheDirPath``, created by ``CheckAndMakeCacheDir``) and never lists the
#: kernel cache: nothing else there is a chip folder to it. Every ``soc_version`` of CANN's
#: platform table (:mod:`cachemgr.config.socs`) is letters, digits, ``_`` and ``-`` and starts
#: with a letter or digit — never a ``.``: so ``op_cache.ini``, ``<soc>.chip.lock``,
#: ``*.temp``, ``.nfs*``, a planted ``X.chip.lock/`` folder are never chip folders.
CHIP_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]*\Z")


def is_chip_folder(entry: os.DirEntry[str]) -> bool:
    """True when ``entry`` (of a kernel cache folder's listing) is a chip folder as CANN
    makes them: a real folder (not a link: never followed, docs/security.md item 1) named
    like a ``soc_version`` (:data:`CHIP_NAME_RE`). Files, links, FIFOs, lock files and
    planted folders with other names are left alone by purge, gc, ls, stats and the daemon."""
    return core.chip_name_ok(entry.name) and entry.is_dir(follow_symlinks=False)


def validate_path_value(value: str, name: str, origin: str) -> Path:
    """Check a path option against the character set of docs/design.md#options-and-their-origins and
    return it as a ``Path``.

    :param name: the option's name, for the message (e.g. ``op_compiler_cache_dir``).
    :param origin: where the value came from (``option``, ``env ASCEND_CACHE_PATH``, ...).
    :raises ConfigError: naming the value, its origin and the allowed characters.
    """
    if not core.path_value_ok(value):
        bad = sorted({c for c in value if not core.path_char_ok(c)}) if value else []
        shown = "".join(bad) if bad else "(empty)"
        raise ConfigError(
            f"{name}={value!r} (from {origin}) has characters outside "
            f"a-z A-Z 0-9 _ - . / and Chinese characters: {shown!r}"
        )
    return Path(os.path.abspath(value))


def validate_name(value: str, what: str, origin: str) -> str:
    """Check a single path component (soc_version, host id): ``[A-Za-z0-9_.-]+``, not ``.``/``..``.

    :raises ConfigError: naming the value and its origin.
    """
    if not _NAME_RE.match(value) or value in {".", ".."}:
        raise ConfigError(
            f"{what}={value!r} (from {origin}) must be letters, digits, '_', '-' or '.'"
        )
    return value


def check_root(path: Path, name: str, origin: str) -> None:
    """Check that ``path`` is, or can be created as, a writable folder; create nothing.

    Walks up to the first existing ancestor: it must be a folder (not a file) and writable
    by this user (docs/design.md#where-the-cache-lives: "if it does not exist but is a valid path it
    is created").

    :raises ConfigError: naming the value, its origin and what is wrong — for a folder this
        user may not write, its owner, group and mode and how to get access
        (docs/design.md#sharing-and-locking).
    """
    cur = check_folder(path, name, origin)
    if not os.access(cur, os.W_OK | os.X_OK):
        if cur == path and _read_only_fs(cur) and os.access(cur, os.R_OK | os.X_OK):
            return  # an existing root on a read-only filesystem: hits are served, compiles
            # return their kernel outside the cache, gc says so
        raise ConfigError(f"{name}={path} (from {origin}): {fsutil.access_hint(cur)}")


def check_folder(path: Path, name: str, origin: str) -> Path:
    """Check that ``path`` is, or could be, a folder: its first existing ancestor (itself
    included) is not a file. Read-only commands (``ls``, ``stats``, ``verify``) check this
    much of a cache root, so ``--cache-dir FILE`` is named as such, not as a bad
    ``FILE/kernel_cache/op_cache.ini``. Creates nothing.

    :returns: the first existing ancestor of ``path`` (``path`` itself when it exists).
    :raises ConfigError: naming the value, its origin and that it is a file, or that it lies
        on a pseudo filesystem such as ``/proc`` (:mod:`cachemgr.storage.pseudofs`), where
        nothing can be stored.
    """
    cur = path
    while not os.path.lexists(cur):
        if cur.parent == cur:
            break
        cur = cur.parent
    if not cur.is_dir():
        what = "a file" if cur == path else f"under {cur}, which is a file"
        raise ConfigError(f"{name}={path} (from {origin}) is {what}, not a folder")
    pseudo = pseudo_filesystem(cur)
    if pseudo is not None:
        raise ConfigError(
            f"{name}={path} (from {origin}) is on {pseudo[0]}, a {pseudo[1]} pseudo filesystem "
            "(the kernel's view, no storage): a cache cannot live there; name a folder on a disk"
        )
    return cur


def check_reachable(path: Path, name: str, origin: str) -> None:
    """The read-only commands' check of a cache root (``ls``, ``stats``, ``verify``):
    :func:`check_folder`, and this user may pass through its first existing ancestor —
    else nothing below it can be read, and an outsider of a shared root
    (docs/shared-cache.md, ``2770``) is told so in one line, as ``gc`` tells it, instead of
    a warning about ``op_cache.ini`` and a bare ``Permission denied``. Creates nothing.

    :raises ConfigError: as :func:`check_folder`; or naming the value, its origin, the
        folder's owner, group and mode and how to get access (``fsutil.access_hint``).
    """
    cur = check_folder(path, name, origin)
    if not os.access(cur, os.X_OK):
        hint = fsutil.access_hint(cur, "readable")
        raise ConfigError(f"{name}={path} (from {origin}): {hint}")


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def safe_file_name(value: object, field: str) -> str:
    """Validate a file name taken from an entry json (``binFileName``, ``jsonFileName``, ...).

    Names are flat in the chip folder (docs/design.md#writing-and-reading-an-entry): no ``/``, no
    ``..``, no NUL, not empty.

    :raises InvalidEntryError: with reason ``bad_name``.
    """
    if not isinstance(value, str) or not value:
        raise InvalidEntryError(f"{field}={value!r} is not a file name", "bad_name")
    if "/" in value or "\\" in value or "\x00" in value or ".." in value or value == ".":
        raise InvalidEntryError(f"{field}={value!r} leaves the chip folder", "bad_name")
    return value


@dataclass(frozen=True)
class CacheLayout:
    """Where one kernel cache lives: ``kernel_cache_dir`` and the chip folders below it."""

    kernel_cache_dir: Path

    @property
    def ini_path(self) -> Path:
        """``<kernel cache>/op_cache.ini`` (docs/design.md#size-limits-and-eviction, [GE])."""
        return self.kernel_cache_dir / INI_NAME

    def chip_dir(self, soc_version: str) -> Path:
        """The chip folder of ``soc_version`` (e.g. ``Ascend910B1``).

        :raises ConfigError: for a soc_version that is not a plain folder name.
        """
        chip = self.kernel_cache_dir / validate_name(soc_version, "soc_version", "argument")
        if not CHIP_NAME_RE.match(soc_version):
            raise ConfigError(
                f"soc_version={soc_version!r} cannot name a chip folder: a soc_version is "
                "letters, digits, '_' and '-' (no '.'), as CANN's chip names are"
            )
        if os.path.islink(chip):
            raise ConfigError(
                f"chip folder {chip} is a symlink; cachemgr never follows symlinks inside the "
                "cache (docs/design.md#writing-and-reading-an-entry): replace it with a folder"
            )
        return chip

    def chip_dirs(self) -> list[Path]:
        """Existing chip folders, sorted (real folders only; symlinks are not followed).

        The kernel cache folder is listed through a descriptor reached without following a
        link (docs/security.md item 1).

        :raises UnsafePathError: ``kernel_cache`` is a symbolic link or not a folder.
        """
        try:
            with SafeDir.open_kernel_cache(self.kernel_cache_dir) as folder:
                found = [
                    self.kernel_cache_dir / e.name for e in folder.scandir() if is_chip_folder(e)
                ]
        except FileNotFoundError:
            return []
        return sorted(found)


def kernel_cache_for_option(cache_dir: Path) -> Path:
    """docs/design.md#where-the-cache-lives rule 1: the ``op_compiler_cache_dir`` option →
    ``<dir>/kernel_cache``."""
    return cache_dir / KERNEL_CACHE


def kernel_cache_for_env(ascend_cache_path: Path, host_id: str) -> Path:
    """docs/design.md#where-the-cache-lives rule 2: ``${ASCEND_CACHE_PATH}/kernel_cache_<host id>``.

    An empty host id gives plain ``kernel_cache``, GE's own layout shared by all hosts."""
    return ascend_cache_path / (f"{KERNEL_CACHE}_{host_id}" if host_id else KERNEL_CACHE)


def kernel_caches_under(ascend_cache_path: Path) -> list[Path]:
    """docs/design.md#where-the-cache-lives: every kernel cache folder under
    ``${ASCEND_CACHE_PATH}`` — GE's plain
    ``kernel_cache`` and the seed's ``kernel_cache_<host id>`` — real folders only (symlinks
    are not followed), sorted. Each has its own ``op_cache.ini``."""
    try:
        with os.scandir(ascend_cache_path) as it:
            found = [
                Path(e.path)
                for e in it
                if (e.name == KERNEL_CACHE or e.name.startswith(KERNEL_CACHE + "_"))
                and _NAME_RE.match(e.name)
                and e.is_dir(follow_symlinks=False)
            ]
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []
    return sorted(found)


def kernel_cache_for_home(home: Path) -> Path:
    """docs/design.md#where-the-cache-lives rule 3: ``$HOME/atc_data/kernel_cache``."""
    return home / "atc_data" / KERNEL_CACHE


def kernel_meta_dir(base: Path) -> Path:
    """docs/design.md#debug-compiles-and-kernel_meta: debug artefacts go to
    ``<base>/kernel_meta``."""
    return base / KERNEL_META
