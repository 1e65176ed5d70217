"""Header manifests: which files a kernel's compile read, as ccache's direct mode keeps them
(layer 4, beside the store; docs/design.md#keys-and-manifests).

A key covers the content of every file the compiler reads, but which headers a source reads
is known only after running the preprocessor. A manifest remembers it, so a hit never runs
it: after a compile the headers it read (the compiler's ``-M`` output, minus system
headers) are recorded with their SHA-256, and with them the places the compiler searched in
vain before it found each one (``absent``: :mod:`cachemgr.compile.searched`); a lookup hashes
the files named there (digests remembered per file identity), checks by one ``stat`` each
that no absent place exists now and, when all hold, knows the full key.

**File**: ``<chip folder>/<op_type lower-cased>_<base key>.manifest``, where the base key is
the SHA-256 of the key material without the headers (docs/design.md#keys-and-manifests: everything
else, including the source's path and digest). GE never reads it. **Format** (JSON, UTF-8, at most
:data:`MAX_BYTES`)::

    {"cachemgr_manifest": 2,
     "variants": [{"kernel": "te_add_<key>", "files": [["/abs/k.h", "<sha256>"], ...],
                   "absent": ["/abs/src/k.h", ...]}, ...]}

Version 1 (no ``absent``) is read as no manifest at all: a miss, never a hit that skipped
the checks. Newest variant first, at most :data:`MAX_VARIANTS`. Every part is untrusted input: a bad
manifest is a miss (and is reported by ``verify``, removed by ``verify --repair``); the
entry a matching variant names is still verified like every entry
(docs/design.md#writing-and-reading-an-entry). A manifest is part of the cache: counted in the chip
folder's size, and it **goes with the last entry it names**, wherever an entry is removed — eviction
and gc's reclaim pass, a purge, ``verify --repair``, a bad entry removed on lookup
(:func:`remove_unnamed`) — so no removal leaves a manifest that ``verify`` then reports; it stays
while another entry it names is present.
``force`` clears them all. See docs/commands.md (``verify``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachemgr.config import layout
from cachemgr.errors import InvalidEntryError
from cachemgr.memo import Memo
from cachemgr.storage import fsutil, madeahead
from cachemgr.storage.safedir import SafeDir

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
#: The largest manifest read (bytes) and the most variants kept.
MAX_BYTES = 1 << 20
MAX_VARIANTS = 16
_SHA = frozenset("0123456789abcdef")

#: Parsed manifests by file identity (device, inode, size, mtime, ctime).
_parsed: Memo[tuple[int, ...], tuple[Variant, ...]] = Memo("parsed manifests", 4096)


@dataclass(frozen=True)
class Variant:
    """One compile's headers: ``kernel`` (its entry), ``files`` (path → SHA-256) and
    ``absent`` (absolute paths that did not exist: places searched in vain)."""

    kernel: str
    files: Mapping[str, str]
    absent: tuple[str, ...] = ()


def path_of(chip_dir: Path, op_type: str, base_key: str) -> Path:
    """``<chip_dir>/<op_type lower-cased>_<base_key>.manifest``."""
    return Path(chip_dir) / f"{op_type.lower()}_{base_key}{layout.MANIFEST_SUFFIX}"


def parse(data: bytes, name: str) -> tuple[Variant, ...]:
    """The variants of a manifest's bytes.

    :raises InvalidEntryError: not the format above (``bad_manifest``), naming ``name``.
    """

    def bad(why: str) -> InvalidEntryError:
        return InvalidEntryError(f"manifest {name}: {why}", "bad_manifest")

    if len(data) > MAX_BYTES:
        raise bad(f"{len(data)} bytes, over {MAX_BYTES}")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise bad("not JSON") from None
    if not isinstance(doc, dict) or doc.get("cachemgr_manifest") != FORMAT_VERSION:
        raise bad(f"not a version {FORMAT_VERSION} manifest")
    return tuple(_variant(item, bad) for item in _variants(doc, bad))


def _variants(doc: dict[str, Any], bad: Callable[[str], InvalidEntryError]) -> list[Any]:
    raw = doc.get("variants")
    if not isinstance(raw, list) or len(raw) > MAX_VARIANTS:
        raise bad("variants must be a list")
    return raw


def _variant(item: Any, bad: Callable[[str], InvalidEntryError]) -> Variant:
    """One variant of a parsed manifest document.

    :raises InvalidEntryError: from ``bad``, for a malformed variant.
    """
    if not isinstance(item, dict) or not isinstance(item.get("kernel"), str):
        raise bad("a variant without kernel")
    layout_ok = layout._NAME_RE.match(item["kernel"]) is not None
    files, absent = item.get("files"), item.get("absent")
    if not layout_ok or not isinstance(files, list) or not isinstance(absent, list):
        raise bad(f"variant {str(item.get('kernel'))[:80]!r} is malformed")
    table: dict[str, str] = {}
    for pair in files:
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(x, str) for x in pair)
            or not pair[0].startswith("/")
            or len(pair[1]) != 64
            or not set(pair[1]) <= _SHA
        ):
            raise bad(f"variant {item['kernel']}: a file is not [absolute path, sha256]")
        table[pair[0]] = pair[1]
    if not all(isinstance(p, str) and p.startswith("/") for p in absent):
        raise bad(f"variant {item['kernel']}: an absent place is not an absolute path")
    return Variant(item["kernel"], table, tuple(absent))


def read(path: Path, dir_fd: int | None = None) -> tuple[Variant, ...]:
    """The variants of the manifest ``path`` (remembered per file identity); () when absent.

    :param dir_fd: its chip folder, open; without it the folder is opened for this read
        (never through a link: docs/security.md item 1).
    :raises InvalidEntryError: a bad manifest (not a regular file, too big, malformed).
    :raises UnsafePathError: ``kernel_cache`` or the chip folder is a symbolic link.
    :raises fsutil.AtimeWouldChange: inside ``fsutil.reads_keep_atime`` (``verify``), for
        another user's manifest whose access time the read would change: not read.
    """
    if dir_fd is None:
        try:
            folder = SafeDir.open_chip(Path(path).parent)
        except FileNotFoundError:
            return ()
        with folder:
            return read(path, folder.fd)
    path = path if isinstance(path, Path) else Path(path)
    ident = status(path, dir_fd)
    if ident is None:
        return ()
    known = _parsed.get(ident)
    if known is not None:
        return known
    try:
        data = fsutil.read_bytes_noatime(path, dir_fd, max_bytes=MAX_BYTES)
    except fsutil.AtimeWouldChange:
        raise  # verify by another member: not read, not bad (see Store._verify_manifest)
    except OSError as exc:
        if exc.errno in fsutil.GONE_ERRNOS:
            return ()
        raise InvalidEntryError(f"manifest {path}: {exc.strerror}", "bad_manifest") from None
    variants = parse(data, str(path))
    _parsed.put(ident, variants)
    return variants


def status(path: Path, dir_fd: int | None = None) -> tuple[int, ...] | None:
    """What the parsed variants of the manifest ``path`` are remembered by: its device,
    inode, size, modification and change times (one ``lstat``, relative to the open chip
    folder ``dir_fd``); None when it cannot be had (absent)."""
    try:
        st = os.stat(fsutil.at(path, dir_fd), dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def remembered(ident: tuple[int, ...] | None) -> tuple[Variant, ...] | None:
    """The variants :func:`read` parsed from a manifest of status ``ident``
    (:func:`status`), or None when none are remembered."""
    return None if ident is None else _parsed.get(ident)


def match(
    path: Path,
    digest: Callable[[str], str | None],
    absent: Callable[[Iterable[str]], bool] = lambda places: True,
    dir_fd: int | None = None,
) -> Variant | None:
    """The newest variant of ``path`` whose every file has today's digest (``digest`` of a
    path, None when unreadable) and whose absent places are all still absent (``absent``
    of them), or None (a miss; a bad manifest is a miss, logged). ``dir_fd``: its chip
    folder, open (see :func:`read`)."""
    try:
        variants = read(path, dir_fd)
    except InvalidEntryError as exc:
        log.warning("%s; treated as a miss", exc)
        return None
    for variant in variants:
        if all(digest(p) == d for p, d in variant.files.items()) and absent(variant.absent):
            return variant
    return None


def record(
    path: Path,
    kernel: str,
    files: Mapping[str, str],
    absent: Iterable[str] = (),
    dir_fd: int | None = None,
    made: int | None = None,
) -> None:
    """Add (or move to the front) the variant ``kernel`` → ``files`` in the manifest
    ``path``, keeping at most :data:`MAX_VARIANTS`; written atomically (temp + rename).
    Two publishers racing may drop one variant: the next miss adds it again.

    :param dir_fd: its chip folder, open (a publisher's, held with the entry lock);
        without it the folder is opened (made when missing) for this write, never through
        a link (docs/security.md item 1).
    :param made: a file made ahead in ``dir_fd`` (:func:`cachemgr.storage.madeahead.make`),
        taken over: the manifest is written to it instead of a file made now.
    :raises OSError: when it cannot be written (the caller logs it: the entry stays valid).
    :raises UnsafePathError: ``kernel_cache`` or the chip folder is a symbolic link.
    """
    new = Variant(kernel, dict(files), tuple(sorted(set(absent))))
    if dir_fd is not None:
        _record(Path(path), new, dir_fd, made)
        return
    madeahead.discard(made)  # made in a folder not given: not used
    with SafeDir.open_chip(Path(path).parent, create=True) as folder:
        _record(Path(path), new, folder.fd)


def _record(path: Path, new: Variant, dir_fd: int, made: int | None = None) -> None:
    try:
        old = read(path, dir_fd)
    except InvalidEntryError:
        old = ()
    except BaseException:
        madeahead.discard(made)
        raise
    same = (dict(new.files), new.absent)
    keep = [v for v in old if v.kernel != new.kernel and (dict(v.files), v.absent) != same]
    variants = [new, *keep][:MAX_VARIANTS]
    data = _encode(variants)
    while len(data) > MAX_BYTES and len(variants) > 1:  # the oldest go first
        variants = variants[:-1]
        data = _encode(variants)
    _write_unsynced(path, data, dir_fd, made)


def _encode(variants: list[Variant]) -> bytes:
    """The manifest document of ``variants`` (the format in the module docstring)."""
    doc: dict[str, Any] = {
        "cachemgr_manifest": FORMAT_VERSION,
        "variants": [
            {
                "kernel": v.kernel,
                "files": [[p, d] for p, d in sorted(v.files.items())],
                "absent": list(v.absent),
            }
            for v in variants
        ],
    }
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _write_unsynced(dest: Path, data: bytes, dir_fd: int, made: int | None = None) -> None:
    """temp + rename like :func:`fsutil.atomic_write_bytes`, without its fsync: a manifest
    lost in a crash costs one header listing, never a wrong hit (the miss path pays no
    extra disk flush for it). Relative to the chip folder's descriptor ``dir_fd``
    (docs/security.md item 1). The temp is ``made`` (a file made ahead, taken over) when
    it can be named, else a file made now.

    :raises OSError: on failure; nothing is left behind.
    """
    tmp = fsutil.temp_path(dest)
    try:
        mode = fsutil.file_mode_in(os.fstat(dir_fd).st_mode)
    except BaseException:
        madeahead.discard(made)
        raise
    try:
        if made is None or not madeahead.fill(
            made, dir_fd, tmp.name, lambda fd: fsutil.write_all(fd, data), mode, False
        ):
            _write_new(tmp.name, data, mode, dir_fd)
        os.rename(tmp.name, dest.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        fsutil.safe_unlink(tmp, dir_fd)
        raise


def _write_new(name: str, data: bytes, mode: int, dir_fd: int) -> None:
    """``data`` to a new file ``name`` of the folder ``dir_fd``, given ``mode``.

    :raises OSError: on failure (a file made is left for the caller to remove).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    try:
        fsutil.write_all(fd, data)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def kernels(path: Path, dir_fd: int | None = None) -> set[str] | None:
    """The kernels a manifest names, or None when it is bad (reclaim and verify use it).
    ``dir_fd``: its chip folder, open."""
    try:
        return {v.kernel for v in read(path, dir_fd)}
    except InvalidEntryError:
        return None


def entry_present(dir_fd: int, kernel: str) -> bool:
    """True when ``<kernel>.json`` is in the chip folder open as ``dir_fd`` (a visible main
    json means a complete entry: :mod:`cachemgr.storage.store`)."""
    try:
        os.stat(f"{kernel}.json", dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def stale(path: Path, dir_fd: int, present: Callable[[str], bool] | None = None) -> bool:
    """True when the manifest ``path`` is bad or names no entry present: it goes (gc's
    reclaim pass, purge). ``present`` tells whether a kernel's entry is there (default:
    :func:`entry_present` in the folder ``dir_fd``)."""
    named = kernels(path, dir_fd)
    if named is None:
        return True
    is_present = present or (lambda kernel: entry_present(dir_fd, kernel))
    return not any(is_present(k) for k in named)


def unnamed(path: Path, dir_fd: int, gone: Collection[str] | None = None) -> bool:
    """True when the manifest ``path`` parses and names no entry present (each kernel's
    json looked up in the folder ``dir_fd``) — and, with ``gone``, names one of those
    kernels (a manifest of other entries is not this removal's business). A bad manifest,
    one that is gone, or one another member's read would change the access time of
    (inside :func:`fsutil.reads_keep_atime`) is not: ``verify`` reports those."""
    try:
        if fsutil.lstat_or_none(path, dir_fd) is None:
            return False
        kernels = {v.kernel for v in read(path, dir_fd)}
    except (InvalidEntryError, OSError):
        return False
    if gone is not None and not kernels & set(gone):
        return False
    return not any(entry_present(dir_fd, k) for k in kernels)


def remove_unnamed(chip_dir: Path, dir_fd: int, gone: Collection[str]) -> list[str]:
    """Remove the manifests of the chip folder (open as ``dir_fd``) that name one of the
    kernels ``gone`` (entries just removed) and no entry present: a manifest goes with the
    last entry it names. The folder is listed as a stream (one ``scandir``); only
    ``*.manifest`` names are read. Returns the names removed; a manifest this user may not
    remove is logged and left (``verify`` reports it; gc's reclaim pass retries it).

    :raises OSError: the folder cannot be listed.
    """
    if not gone:
        return []
    removed = []
    with os.scandir(dir_fd) as it:
        names = [de.name for de in it if de.name.endswith(layout.MANIFEST_SUFFIX)]
    for name in names:
        if not unnamed(Path(chip_dir) / name, dir_fd, gone):
            continue
        try:
            if fsutil.safe_unlink(Path(chip_dir) / name, dir_fd):
                removed.append(name)
        except OSError as exc:
            log.warning("not removing %s/%s: %s", Path(chip_dir).name, name, exc.strerror)
    if removed:
        shown = ", ".join(f"{Path(chip_dir).name}/{n}" for n in removed)
        log.info("removed header manifest %s with the last entry it names", shown)
    return removed
