"""CANN's cache entry format (layer 3; docs/design.md#files-of-an-entry,
#writing-and-reading-an-entry [GE]).

Grammar of one chip folder (flat; names are CANN's):

* ``<kernel>.json``            main kernel description; required ``binFileName``,
  ``binFileSuffix``, ``kernelName``, ``sha256`` — or, for a mix kernel, a ``jsonList`` of
  ``{binType, jsonFileName}`` whose sub-jsons carry those fields;
* ``<binFileName><binFileSuffix>``   the binary (``.o``, ``.so``, ``.cubin``...);
* ``<kernel>.h``               optional, also when ``headerFileSuffix`` is set [GE];
* ``<name>_pre.json``          GE's pre-build cache: an entry of its own (rule R7 below);
* ``<kernel>_mix_aic.json`` / ``_mix_aiv.json`` and their binaries, for mix kernels;
* ``<kernel>.lock``            the entry's fcntl lock; ``op_cache_file_del.lock`` the evictor's;
* ``*.temp``                   writes in progress;
* ``.nfs*``                    NFS "silly renames" of removed files still open somewhere
  (docs/design.md#sharing-and-locking): counted in the used bytes (they hold space until closed) and
  otherwise left alone.

GE's validity rules — the one place they are listed (GE = ``hicann/ge``,
``compiler/opcompiler/op_compile_adapter/source/``). An entry GE would serve is never called bad
here, so cachemgr never deletes what GE considers valid:

* **R1** the json parses to a JSON object (``common/te_file_utils.cc``
  ``TeFileUtils::GetJsonValueFromJsonFile``);
* **R2** it names its binary with ``binFileName`` and ``binFileSuffix``
  (``common/compile_result_utils.cc`` ``CompileResultUtils::SetBinFilePath``); a mix kernel's
  sub-jsons in ``jsonList`` do the same for theirs (``te_file_utils.cc``
  ``TeFileUtils::IsObjFileExsit``);
* **R3** the binary exists (``SetBinFilePath``: ``RealPath`` of it);
* **R4** a ``.o``/``.so`` binary needs ``kernelName`` and is not empty
  (``CompileResultUtils::SetKernelBin``, ``TeFileUtils::GetBufferFromBinFile``: size <= 0 fails);
* **R5** ``sha256`` is present, not empty, and equal *as a string* to the binary's lower-case
  hex SHA-256 (``cache/te_cache_manager.cc`` ``TeCacheManager::VerifyBinFileSha256``): an
  upper-case value does not match;
* **R6** the header is optional even when ``headerFileSuffix`` is set
  (``CompileResultUtils::SetHeaderFilePath`` keeps an empty path when the file is missing;
  ``TeCacheManager::CopyCompileRetIntoCacheDir`` copies it only when the compile made one);
* **R7** ``<name>_pre.json`` is a pre-build entry of its own: a JSON object with a string
  ``pattern`` (``TeCacheManager::MatchPreCompileCache``). GE counts its bytes toward the limit
  (``common/te_file_utils.cc`` ``TeFileUtils::GetDirectorySize``) but never ages or deletes
  it: ``cache/te_cache_space_manager.cc`` ``GetFilesAccessTime`` skips a name ending in
  ``kPreCompileFileSuffix`` before it enters the map ``AgingCacheFileByAccessTime`` deletes
  from. Left to GE they only grow, so cachemgr evicts them by their own access time like any
  entry — cachemgr's rule, not GE's (docs/eviction.md#pre-build-entries).

cachemgr adds two rules of its own, for safety: names are flat (no ``/`` or ``..``), and a mix
kernel's sub-binaries are checked against their ``sha256`` too (a hit is served whole).

Two readings are offered. :func:`scan_chip` groups files by *name only* — one ``scandir`` and
one ``lstat`` per file, no json opened — which is what eviction needs on 100,000 entries
(``ls`` adds one small read per entry cachemgr named, for its op type's case).
:func:`parse_entry` and :func:`verify_entry` open an entry's json and check every part,
which is what lookups and ``verify`` need. Unknown json fields are kept as they are.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Container, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from cachemgr.config import layout
from cachemgr.errors import InvalidEntryError
from cachemgr.memo import Memo
from cachemgr.storage import fsutil, kinds
from cachemgr.storage.safedir import SafeDir
from cachemgr.words import noun

REQUIRED_FIELDS = ("binFileName", "binFileSuffix", "kernelName", "sha256")
#: Suffixes (before ``.json``) of files that belong to the kernel named before them
#: (:data:`cachemgr.storage.kinds.PART_STEM_SUFFIXES`, where the rule is stated).
PART_STEM_SUFFIXES = kinds.PART_STEM_SUFFIXES
#: Stem suffix of GE's pre-build entries (``te_cache_space_manager.cc`` ``kPreCompileFileSuffix``).
PRE_SUFFIX = "_pre"
#: Binary suffixes GE reads into a kernel bin, which then needs ``kernelName`` (rule R4).
KERNEL_BIN_SUFFIXES = (".o", ".so")

# Problem kinds reported by verify (stable strings: they appear in --json output).
SHA256_MISMATCH = "sha256_mismatch"
#: Not read: the read would have changed the entry's access time. Not a
#: problem of the entry: never repaired.
NOT_CHECKED = "not_checked"
EMPTY_BINARY = "empty_binary"
MISSING_BINARY = "missing_binary"
MISSING_SUBPART = "missing_subpart"
UNREADABLE_JSON = "unreadable_json"
INVALID_JSON = "invalid_json"
BAD_NAME = "bad_name"
ORPHAN_BINARY = "orphan_binary"
ORPHAN_FILE = "orphan_file"
NOT_A_FILE = "not_a_file"
UNREADABLE = "unreadable"
#: A binary over :data:`MAX_BINARY_BYTES`: never hashed (docs/security.md item 4).
TOO_LARGE = "too_large"

#: An entry json larger than this is bad, never read whole (bytes; real CANN jsons are a few
#: KiB, the largest mix-kernel ones well under 1 MiB; docs/security.md item 4).
MAX_JSON_BYTES = 4 << 20
#: A binary larger than this is bad, never hashed (bytes): any member may plant a sparse
#: terabyte under a kernel's name, and every lookup of that kernel (and ``verify``) would
#: read it for hours. GE reads a kernel binary whole into memory
#: (``cache/te_cache_manager.cc`` ``TeCacheManager::VerifyBinFileSha256`` hashes
#: ``kernelBin``'s data); cachemgr's own compiles write at most ``[sandbox] output_mb``
#: (1024 MiB by default).
MAX_BINARY_BYTES = 1 << 30
#: Deeper nesting than this makes a json bad (CANN's ``compileInfo`` nests a few levels).
MAX_JSON_DEPTH = 64


class FileStat(NamedTuple):
    """What one ``lstat`` tells about a file: apparent size (bytes) and times (ns).

    A named tuple: a scan of 100,000 entries makes 200,000 of these, and a tuple is the
    cheapest immutable record Python builds (docs/design.md#size-limits-and-eviction eviction
    budget).
    """

    size: int
    atime_ns: int
    mtime_ns: int


_new_stat = tuple.__new__  # FileStat without the generated __new__'s call overhead


@dataclass(slots=True)
class EntryGroup:
    """The files of one entry as grouped by name (no json opened).

    ``files`` maps file name → :class:`FileStat` and includes the main json. ``resolved`` is
    False when no file named like a binary was found next to the json, so the json must be
    opened to learn its ``binFileName`` (see :func:`resolve_group`). ``atime_ns`` is the main
    json's access time (ns) as the scan saw it: the eviction order
    (docs/design.md#size-limits-and-eviction, [GE]); a field, not a lookup, because planning reads
    it for every entry.
    """

    kernel: str
    files: dict[str, FileStat] = field(default_factory=dict)
    resolved: bool = False
    atime_ns: int = 0

    @property
    def json_name(self) -> str:
        return self.kernel + ".json"

    @property
    def size(self) -> int:
        """Apparent bytes of every file of the entry."""
        total = 0
        for fst in self.files.values():
            total += fst[0]
        return total


@dataclass
class ChipScan:
    """One pass over a chip folder: entries, and everything that is not part of one.

    ``used_bytes`` is the sum of the apparent sizes of all regular files
    (docs/design.md#size-limits-and-eviction, [GE]).
    """

    chip_dir: Path
    #: a dict from ``scan_chip``; gc's bounded-memory scan keeps most entries in columns
    #: (:class:`cachemgr.eviction.compact.CompactEntries`)
    entries: MutableMapping[str, EntryGroup] = field(default_factory=dict)
    orphans: dict[str, FileStat] = field(default_factory=dict)
    temps: dict[str, FileStat] = field(default_factory=dict)
    locks: dict[str, FileStat] = field(default_factory=dict)
    silly: dict[str, FileStat] = field(default_factory=dict)  # .nfs* names: never touched
    odd: dict[str, str] = field(default_factory=dict)  # name → why (symlink, folder...)
    manifests: dict[str, FileStat] = field(default_factory=dict)  # cachemgr's header lists
    used_bytes: int = 0
    #: the open chip folder the scan was made through (see :mod:`cachemgr.storage.safedir`): later
    #: reads of the scan's files go through it; None = open one per read
    dir_fd: int | None = None


def kernel_of_part(stem: str, mains: Container[str]) -> str | None:
    """The kernel that a file stem belongs to, by name: ``stem`` itself or ``stem`` minus one
    of :data:`PART_STEM_SUFFIXES`; None when no main json has that name."""
    if stem in mains:
        return stem
    for suffix in PART_STEM_SUFFIXES:
        if stem.endswith(suffix) and stem[: -len(suffix)] in mains:
            return stem[: -len(suffix)]
    return None


def owned_by(name: str, kernel: str) -> bool:
    """True when file ``name`` belongs to ``kernel`` by name: ``<kernel>.<ext>`` or
    ``<kernel><part suffix>.<ext>`` (docs/design.md#files-of-an-entry). Removal of an entry is
    limited to these."""
    stem = name.split(".", 1)[0] if "." in name else name
    if name.startswith(kernel + "."):
        return True
    return kernel_of_part(stem, {kernel}) == kernel


def is_pre_entry(kernel: str) -> bool:
    """True for GE's pre-build entries, ``<name>_pre`` (rule R7)."""
    return kernel.endswith(PRE_SUFFIX)


def _is_main_json(stem: str, json_stems: set[str]) -> bool:
    if not stem.endswith(PART_STEM_SUFFIXES):  # the common case, one C call
        return True
    return not any(
        stem.endswith(sfx) and stem[: -len(sfx)] in json_stems for sfx in PART_STEM_SUFFIXES
    )


class _Listing(NamedTuple):
    """A chip folder's regular files bucketed by name while it is listed (no json opened).

    ``by_stem``: ``<stem>`` → ``{"<stem>.<ext>": FileStat}`` for every file whose last
    extension is not one of :data:`_NOT_PARTS` (a main json's bucket becomes its entry's
    ``files`` as it is, and its key the entry's name: one string per entry is kept);
    ``loose``: every other file (locks, temps, names without a dot).
    """

    by_stem: dict[str, dict[str, FileStat]]
    loose: dict[str, FileStat]


def _lstat_all(chip_dir: Path, scan: ChipScan, dir_fd: int | None) -> _Listing:
    """One ``scandir`` + one ``lstat`` per regular file (the floor of any size accounting)."""
    # scandir over a descriptor: each stat is an fstatat() relative to the folder instead of
    # a walk of the whole path (~20 % of the pass on 200,000 files); the folder is reached
    # without following links (docs/security.md item 1)
    if dir_fd is not None:
        return _lstat_fd(dir_fd, scan)
    with SafeDir.open_chip(chip_dir) as folder:
        return _lstat_fd(folder.fd, scan)


def _lstat_fd(dir_fd: int, scan: ChipScan) -> _Listing:
    """List and ``lstat`` the folder, bucketing each file by its name's stem on the way: one
    pass over the names, no second dictionary of every file (the grouping
    cost as much as the listing)."""
    out = _Listing({}, {})
    by_stem, loose = out
    get = by_stem.get
    not_parts = _NOT_PARTS
    used = 0
    with os.scandir(dir_fd) as it:
        for de in it:
            st = listed_file(scan, de)
            if st is None:
                continue
            name = de.name
            size = st.st_size
            used += size
            fst = _new_stat(FileStat, (size, st.st_atime_ns, st.st_mtime_ns))
            stem, _, ext = name.rpartition(".")
            if ext in not_parts:
                loose[name] = fst
                continue
            bucket = get(stem)
            if bucket is None:
                by_stem[stem] = {name: fst}
            else:
                bucket[name] = fst
    scan.used_bytes += used
    return out


def listed_file(scan: ChipScan, de: os.DirEntry[str]) -> os.stat_result | None:
    """The ``lstat`` of a listed name when it is a regular file with one name (an ``.nfs*``
    one may have more); anything else goes into ``scan.odd`` with why, or is skipped when
    it vanished meanwhile. The one check of every file a chip-folder scan counts."""
    try:
        # d_type answers without a syscall; an unknown d_type costs the lstat that
        # de.stat() below then reuses from the DirEntry's cache
        if not de.is_file(follow_symlinks=False):
            scan.odd[de.name] = "symlink (not followed)" if de.is_symlink() else NOT_A_FILE
            return None
        st = de.stat(follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in fsutil.GONE_ERRNOS:
            scan.odd[de.name] = f"{UNREADABLE}: {exc.strerror}"
        return None
    if st.st_nlink > 1 and not de.name.startswith(fsutil.NFS_SILLY_PREFIX):
        # another file's content under a cache name: never used (security.md item 2)
        scan.odd[de.name] = f"hard link ({st.st_nlink} names; not used)"
        return None
    return st


def scan_chip(chip_dir: Path, dir_fd: int | None = None) -> ChipScan:
    """Group a chip folder's files into entries by name, opening no file
    (docs/design.md#files-of-an-entry, #size-limits-and-eviction).

    A missing chip folder gives an empty scan, also when another NFS host removed it
    (``ESTALE``, docs/design.md#sharing-and-locking).

    A file ``<kernel>.<ext>`` (ext not ``lock``/``temp``) belongs to the entry whose main json
    is ``<kernel>.json``; every other file is placed by :func:`_place` (parts such as
    ``_mix_aic``, locks, temps, orphans).

    :param dir_fd: the chip folder, open (:class:`~cachemgr.storage.safedir.SafeDir`); it
        must stay open while the scan is used. Without it the folder is opened for the scan
        only.
    :raises UnsafePathError: the chip folder (or ``kernel_cache``) is a symbolic link.
    :raises OSError: when the folder cannot be listed (e.g. ``EACCES``).
    """
    scan = ChipScan(chip_dir, dir_fd=dir_fd)
    try:
        listing = _lstat_all(chip_dir, scan, dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return scan
    except OSError as exc:
        if exc.errno in fsutil.GONE_ERRNOS:
            return scan
        raise
    by_stem, loose = listing
    json_stems = {stem for stem, files in by_stem.items() if stem + ".json" in files}
    entries = scan.entries
    for stem in json_stems:
        if _is_main_json(stem, json_stems):
            files = by_stem[stem]
            # a bucket holds "<stem>.json", maybe "<stem>.h", and otherwise binaries; a
            # pre-build entry is its json alone: nothing to resolve (rule R7)
            resolved = len(files) > (2 if stem + ".h" in files else 1) or is_pre_entry(stem)
            entries[stem] = EntryGroup(stem, files, resolved, files[stem + ".json"][1])
    for stem, files in by_stem.items():  # stems without a main json: parts, orphans
        if stem not in entries:
            for name, fst in files.items():
                _place(scan, name, fst)
    for name, fst in loose.items():
        _place(scan, name, fst)
    return scan


#: Extensions that are never part of an entry, even after a kernel's name.
_NOT_PARTS = frozenset({"lock", "temp", ""})


def _place(scan: ChipScan, name: str, fst: FileStat) -> None:
    owner = place_file(scan, name, fst)
    if owner is not None:
        group = scan.entries[owner]
        group.files[name] = fst
        if name.rpartition(".")[2] != "json" and name != owner + ".h":
            group.resolved = True


def place_file(scan: ChipScan, name: str, fst: FileStat) -> str | None:
    """Place a file that no entry owns by its stem: into the scan's tables of locks, temps,
    manifests, ``.nfs*`` names or orphans — or return the kernel that owns it by name (a
    part such as ``_mix_aic``, ``<kernel>.tar.gz``), which the caller adds it to."""
    if name.startswith(fsutil.NFS_SILLY_PREFIX):
        scan.silly[name] = fst
        return None
    if name.endswith(fsutil.TEMP_SUFFIX):
        scan.temps[name] = fst
        return None
    if name == layout.EVICT_LOCK_NAME:
        return None
    if name.endswith(layout.MANIFEST_SUFFIX):
        scan.manifests[name] = fst
        return None
    if name.endswith(".lock"):
        scan.locks[name] = fst
        return None
    stem, dot, _ = name.rpartition(".")
    if not dot:
        stem = name
    owner = kernel_of_part(stem, scan.entries)
    if owner is None and "." in stem:  # e.g. foo.tar.gz style suffixes
        owner = kernel_of_part(stem.split(".", 1)[0], scan.entries)
    if owner is None:
        scan.orphans[name] = fst
    return owner


# --- full parse (opens the json) -------------------------------------------------------


@dataclass(frozen=True)
class BinaryRef:
    """One binary an entry needs: named by ``json_name``'s ``binFileName`` + ``binFileSuffix``."""

    json_name: str
    bin_name: str
    sha256: str
    is_sub: bool = False


@dataclass(frozen=True)
class EntryDesc:
    """A parsed entry: the main json's content (unknown fields kept) and every part it names.

    ``data`` is shared by every :func:`parse_entry` of the same bytes (remembered): read it,
    never change it.
    """

    kernel: str
    data: dict[str, Any]
    binaries: tuple[BinaryRef, ...]
    sub_jsons: tuple[str, ...]
    header: str | None

    @property
    def json_name(self) -> str:
        return self.kernel + ".json"

    def file_names(self) -> list[str]:
        """Every file of the entry in deletion order: main json first, then binaries, header
        and sub-jsons (docs/design.md#size-limits-and-eviction). A ``_pre.json`` is an entry of its
        own (rule R7)."""
        names = [self.json_name]
        names += [b.bin_name for b in self.binaries]
        if self.header:
            names.append(self.header)
        names += list(self.sub_jsons)
        return list(dict.fromkeys(names))


#: A main json of at most this many bytes is parsed once per distinct content: a hit reads
#: its bytes every time and compares them with those remembered (bytes; CANN's are ~2 KB).
MAX_REMEMBERED_JSON_BYTES = 64 << 10
#: Parsed entries by (kernel, the main json's bytes).
_parsed: Memo[tuple[str, bytes], EntryDesc] = Memo("parsed entries", 1024)


def load_json_object(raw: bytes, name: str) -> dict[str, Any]:
    """Parse a kernel json; it must be a JSON object of bounded size and depth.

    Values are bounded (docs/security.md item 4): more than :data:`MAX_JSON_BYTES`, a number
    Python refuses to convert (over 4300 digits: ``ValueError``), or nesting deeper than
    :data:`MAX_JSON_DEPTH` make the json bad like any other unreadable json.

    :raises InvalidEntryError: ``unreadable_json`` (truncated, not UTF-8, not JSON, too
        large, too deep, an over-long number) or ``invalid_json`` (not an object).
    """
    if len(raw) > MAX_JSON_BYTES:
        msg = f"{name}: json is {len(raw)} bytes, more than {MAX_JSON_BYTES}"
        raise InvalidEntryError(msg, UNREADABLE_JSON)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError, int digit limit
        detail = str(exc)[:200]
        raise InvalidEntryError(f"{name}: unreadable json ({detail})", UNREADABLE_JSON) from exc
    except RecursionError as exc:
        raise InvalidEntryError(f"{name}: json nested too deeply", UNREADABLE_JSON) from exc
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise InvalidEntryError(f"{name}: json is a {kind}, not an object", INVALID_JSON)
    if _depth_over(data, MAX_JSON_DEPTH):
        msg = f"{name}: json nested deeper than {MAX_JSON_DEPTH} levels"
        raise InvalidEntryError(msg, UNREADABLE_JSON)
    return data


def _depth_over(data: Any, limit: int) -> bool:
    """True when ``data`` nests lists/objects more than ``limit`` deep (no recursion)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def _binary_ref(data: dict[str, Any], json_name: str, is_sub: bool) -> BinaryRef:
    """Rules R2, R4 (``kernelName`` for ``.o``/``.so``) and R5 (``sha256`` present, kept as
    written: GE compares it as a string, so an upper-case value never matches)."""
    suffix = data.get("binFileSuffix")
    needed = [f for f in REQUIRED_FIELDS if f != "kernelName" or suffix in KERNEL_BIN_SUFFIXES]
    missing = [f for f in needed if f not in data]
    if missing:
        raise InvalidEntryError(
            f"{json_name}: missing required {noun(len(missing), 'field')} {', '.join(missing)}",
            INVALID_JSON,
        )
    suffix = data["binFileSuffix"]
    if not isinstance(suffix, str) or ("/" in suffix or ".." in suffix or "\x00" in suffix):
        raise InvalidEntryError(f"{json_name}: binFileSuffix={suffix!r} is invalid", BAD_NAME)
    base = layout.safe_file_name(data["binFileName"], f"{json_name}: binFileName")
    sha = data["sha256"]
    if not isinstance(sha, str) or not sha:
        raise InvalidEntryError(f"{json_name}: sha256={sha!r} is not a string", INVALID_JSON)
    return BinaryRef(json_name, base + suffix, sha, is_sub)


def _read(chip_dir: Path, name: str, dir_fd: int | None, max_bytes: int | None = None) -> bytes:
    """Read one file of an entry (at most ``max_bytes``)."""
    data: bytes = _reading(fsutil.read_bytes_noatime, chip_dir, name, dir_fd, max_bytes)
    return data


def _digest(chip_dir: Path, name: str, dir_fd: int | None) -> tuple[str, int]:
    """SHA-256 and size of a binary, streamed (a hit never holds a binary in memory)."""
    digest: tuple[str, int] = _reading(
        fsutil.sha256_noatime, chip_dir, name, dir_fd, MAX_BINARY_BYTES
    )
    return digest


def _reading(
    how: Callable[..., Any],
    chip_dir: Path,
    name: str,
    dir_fd: int | None,
    max_bytes: int | None,
) -> Any:
    """``how(chip_dir / name, dir_fd, single_link=True, max_bytes=max_bytes)`` relative to
    the open chip folder (no link followed, no hard link used, never blocking;
    docs/security.md items 1, 2), with the errors of reading an entry's file as entry
    errors.

    :raises InvalidEntryError: a folder, not a regular file, a hard link, too large,
        unreadable.
    :raises FileNotFoundError: gone (also ``ESTALE``, docs/design.md#sharing-and-locking).
    """
    try:
        if dir_fd is None:
            with SafeDir.open_chip(chip_dir) as folder:
                return _reading(how, chip_dir, name, folder.fd, max_bytes)
        return how(_joined(chip_dir, name), dir_fd, single_link=True, max_bytes=max_bytes)
    except IsADirectoryError as exc:
        raise InvalidEntryError(f"{name}: is a folder, not a file", NOT_A_FILE) from exc
    except fsutil.HardLinkError as exc:
        raise InvalidEntryError(f"{name}: {exc.strerror}", NOT_A_FILE) from exc
    except fsutil.NotRegularFileError as exc:
        raise InvalidEntryError(f"{name}: is not a regular file", NOT_A_FILE) from exc
    except fsutil.FileTooLargeError as exc:
        kind = UNREADABLE_JSON if name.endswith(".json") else TOO_LARGE
        raise InvalidEntryError(f"{name}: {exc.strerror}", kind) from exc
    except FileNotFoundError:
        raise
    except fsutil.AtimeWouldChange as exc:  # ls/verify by a non-owner: not read, not bad
        raise InvalidEntryError(f"{name}: {exc.strerror}", NOT_CHECKED) from exc
    except OSError as exc:
        # ESTALE: removed by another NFS host (docs/design.md#sharing-and-locking)
        if exc.errno in fsutil.GONE_ERRNOS:
            raise FileNotFoundError(exc.errno, exc.strerror, str(chip_dir / name)) from exc
        raise InvalidEntryError(f"{name}: cannot read ({exc.strerror})", UNREADABLE) from exc


@functools.lru_cache(maxsize=1024)
def _joined(chip_dir: Path, name: str) -> Path:
    """``chip_dir / name``, joined once per file name (each pathlib join parses again)."""
    return chip_dir / name


def parse_entry(
    chip_dir: Path,
    kernel: str,
    read: Callable[[str], bytes] | None = None,
    dir_fd: int | None = None,
) -> EntryDesc:
    """Open and parse ``<kernel>.json`` and the sub-jsons it lists
    (docs/design.md#files-of-an-entry).

    Reads without changing access times. ``read(name) -> bytes`` replaces the disk read (the
    store uses it to check an entry before publishing it). ``dir_fd``: the open chip folder.

    :raises FileNotFoundError: when the main json is gone.
    :raises InvalidEntryError: unreadable or invalid json, a bad name (``/``, ``..``), a
        missing sub-json (reason ``missing_subpart``).
    """
    if read is None:

        def read(name: str) -> bytes:
            return _read(chip_dir, name, dir_fd, MAX_JSON_BYTES)

    raw = read(kernel + ".json")
    known = _parsed.get((kernel, raw)) if len(raw) <= MAX_REMEMBERED_JSON_BYTES else None
    return known if known is not None else _remember(kernel, raw, read)


def remembered(kernel: str, raw: bytes) -> EntryDesc | None:
    """The entry ``kernel`` parsed before from the main json ``raw`` (those very bytes), or
    None when it is not remembered (then :func:`parse_entry` parses it)."""
    return _parsed.get((kernel, raw)) if len(raw) <= MAX_REMEMBERED_JSON_BYTES else None


def _remember(kernel: str, raw: bytes, read: Callable[[str], bytes]) -> EntryDesc:
    """Parse the main json ``raw`` of ``kernel`` (its sub-jsons read with ``read``) and
    remember the entry by those bytes, unless it has sub-jsons (their own bytes are read and
    parsed every time) or is too big.

    :raises InvalidEntryError, FileNotFoundError: as :func:`parse_entry`.
    """
    json_name = kernel + ".json"
    desc = _parse_entry(kernel, json_name, load_json_object(raw, json_name), read)
    if not desc.sub_jsons and len(raw) <= MAX_REMEMBERED_JSON_BYTES:
        _parsed.put((kernel, raw), desc)
    return desc


def _parse_entry(
    kernel: str, json_name: str, data: dict[str, Any], read: Callable[[str], bytes]
) -> EntryDesc:
    """:func:`parse_entry` once the main json is parsed: its sub-jsons read and parsed, the
    parts it names checked (rules R2, R4–R7)."""
    if is_pre_entry(kernel):
        if not isinstance(data.get("pattern"), str):
            raise InvalidEntryError(f"{json_name}: pre-build json has no pattern", INVALID_JSON)
        return EntryDesc(kernel, data, (), (), None)
    binaries: list[BinaryRef] = []
    subs: list[str] = []
    json_list = data.get("jsonList")
    if json_list is not None:
        if not isinstance(json_list, list):
            raise InvalidEntryError(f"{json_name}: jsonList is not a list", INVALID_JSON)
        for item in json_list:
            sub_name = _sub_json_name(item, json_name)
            subs.append(sub_name)
            try:
                sub_data = load_json_object(read(sub_name), sub_name)
            except FileNotFoundError as exc:
                msg = f"{sub_name}: sub-json is missing"
                raise InvalidEntryError(msg, MISSING_SUBPART) from exc
            binaries.append(_binary_ref(sub_data, sub_name, is_sub=True))
        if "binFileName" in data:
            binaries.insert(0, _binary_ref(data, json_name, is_sub=False))
    else:
        binaries.append(_binary_ref(data, json_name, is_sub=False))
    header = None  # optional even when named (rule R6): deleted with the entry if present
    if data.get("headerFileSuffix"):
        header = layout.safe_file_name(kernel + str(data["headerFileSuffix"]), "header")
    return EntryDesc(kernel, data, tuple(binaries), tuple(subs), header)


def _sub_json_name(item: Any, json_name: str) -> str:
    if not isinstance(item, dict) or "jsonFileName" not in item:
        msg = f"{json_name}: jsonList item {item!r} has no jsonFileName"
        raise InvalidEntryError(msg, INVALID_JSON)
    return layout.safe_file_name(item["jsonFileName"], f"{json_name}: jsonFileName")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an entry: ``kind`` (a stable code) and a one-line ``detail``."""

    kind: str
    detail: str


def sha256_hex(data: bytes) -> str:
    """Hex SHA-256 of ``data`` (the json's ``sha256`` field, docs/design.md#files-of-an-entry)."""
    return hashlib.sha256(data).hexdigest()


def verify_entry(chip_dir: Path, desc: EntryDesc, dir_fd: int | None = None) -> list[Problem]:
    """Check every part of a parsed entry by GE's rules (module docstring): binaries present,
    not empty where GE reads them, matching ``sha256``; sub-parts present; the header is
    optional. Reads without changing access times. Empty list = the entry is good.
    ``dir_fd``: the open chip folder.
    """
    problems: list[Problem] = []
    for ref in desc.binaries:
        try:
            actual, size = _digest(chip_dir, ref.bin_name, dir_fd)
        except FileNotFoundError:
            kind = MISSING_SUBPART if ref.is_sub else MISSING_BINARY
            problems.append(Problem(kind, f"{ref.bin_name} (named by {ref.json_name}) is missing"))
            continue
        except InvalidEntryError as exc:
            problems.append(Problem(exc.reason, str(exc)))
            continue
        if not size and ref.bin_name.endswith(KERNEL_BIN_SUFFIXES):
            problems.append(Problem(EMPTY_BINARY, f"{ref.bin_name} is empty"))
            continue
        if actual != ref.sha256:  # a string compare, as GE's (rule R5)
            problems.append(
                Problem(SHA256_MISMATCH, f"{ref.bin_name}: sha256 {actual} != {ref.sha256}")
            )
    return problems


def plainly_good(chip_dir: Path, kernel: str, dir_fd: int) -> EntryDesc | None:
    """The entry ``kernel`` when it is plainly good — its main json read (the same reader and
    caps as :func:`parse_entry`) is one parsed before, without sub-jsons, and every binary
    it names reads (:func:`verify_entry`'s reader) to its ``sha256``, non-empty where GE
    reads it — else None, and :func:`check_entry` judges it (a hit's common case in few
    steps; anything else the full way).
    """
    try:
        raw = fsutil.read_bytes_noatime(
            _joined(chip_dir, kernel + ".json"), dir_fd, single_link=True, max_bytes=MAX_JSON_BYTES
        )
        desc = remembered(kernel, raw)
        if desc is None:
            desc = _remember(kernel, raw, lambda n: _read(chip_dir, n, dir_fd, MAX_JSON_BYTES))
        if desc.sub_jsons:
            return None
        for ref in desc.binaries:
            actual, size = fsutil.sha256_noatime(
                _joined(chip_dir, ref.bin_name),
                dir_fd,
                single_link=True,
                max_bytes=MAX_BINARY_BYTES,
            )
            if actual != ref.sha256 or not (size or not ref.bin_name.endswith(KERNEL_BIN_SUFFIXES)):
                return None
    except (OSError, InvalidEntryError):
        return None
    return desc


def check_entry(
    chip_dir: Path, kernel: str, dir_fd: int | None = None
) -> tuple[EntryDesc | None, list[Problem]]:
    """Parse and verify one entry; never raises for a bad entry (it becomes a Problem).

    :param dir_fd: the open chip folder; without it the folder is opened for this check.
    :raises FileNotFoundError: when the main json is gone (someone removed the entry).
    :raises UnsafePathError: the chip folder (or ``kernel_cache``) is a symbolic link.
    """
    if dir_fd is None:
        try:
            folder = SafeDir.open_chip(chip_dir)
        except NotADirectoryError as exc:
            raise FileNotFoundError(str(chip_dir)) from exc
        with folder:
            return check_entry(chip_dir, kernel, folder.fd)
    try:
        desc = parse_entry(chip_dir, kernel, dir_fd=dir_fd)
    except InvalidEntryError as exc:
        return None, [Problem(exc.reason, str(exc))]
    return desc, verify_entry(chip_dir, desc, dir_fd)


def resolve_group(scan: ChipScan, group: EntryGroup) -> None:
    """Attach to ``group`` the files its json names that name-grouping could not place.

    Opens the main json (only for unresolved groups); a bad json leaves the group as it is.
    Files claimed move from ``scan.orphans`` into the group.
    """
    try:
        desc = parse_entry(scan.chip_dir, group.kernel, dir_fd=scan.dir_fd)
    except (OSError, InvalidEntryError):
        return
    for name in desc.file_names():
        fst = scan.orphans.pop(name, None)
        if fst is not None:
            group.files[name] = fst
    group.resolved = True
