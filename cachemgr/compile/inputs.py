"""The bytes a compile reads: the kernel source, its headers and the ``.cfg`` (layer 6;
docs/design.md#keys-and-manifests).

A :class:`Snapshot` names every input file of one compile with its SHA-256; once
:meth:`Snapshot.frozen` it also holds their bytes. The cache key is computed from those
digests and the compile runs from those bytes, written into a private mirror tree
(:func:`materialise`), so **the bytes hashed are the bytes compiled**: an edit made while a
job waits in the queue changes nothing that job builds.

The snapshot is taken on the caller's side — by the process that runs as the caller (the CLI,
:class:`cachemgr.Client`) — and travels with the request to the daemon (:func:`to_wire`,
:func:`from_wire`), so the daemon never opens a path a caller names on that caller's behalf.

Headers are "every file the compiler reads" (docs/design.md#keys-and-manifests) found through the
compiler's dependency output (``-M -MF``, :meth:`CompilerBackend.list_dependencies`), minus the
compiler's own and the system's headers (:func:`system_prefixes`): those are represented by
the compiler's identity in the key, as ccache's ``system_headers = false``. To them a scan
adds what the compile looked for (:mod:`cachemgr.compile.searched`: the places searched in
vain, kept in :attr:`Snapshot.absent`, and files a ``__has_include`` found) and the data it
embeds (:mod:`cachemgr.compile.embedded`); see docs/compiling.md#files-looked-for. A hit does
not run the preprocessor: the header list and the places to check come from the manifest
(:mod:`cachemgr.storage.manifest`).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import functools
import hashlib
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cachemgr.compile import bytescan, embedded, searched
from cachemgr.compilers import CompileJob, CompilerBackend, CompilerIdentity, envvars, process
from cachemgr.compilers.base import read_depfile
from cachemgr.errors import CompileError, InvalidInputError
from cachemgr.memo import Memo
from cachemgr.storage import fsutil, madeahead

#: The largest input file read (bytes): a source or header above it is refused.
MAX_INPUT_BYTES = 64 << 20
#: The most bytes of all inputs of one request together.
MAX_TOTAL_BYTES = 256 << 20
#: The most header files one compile may read (outside the system folders).
MAX_HEADERS = 4096
#: A file modified this recently is hashed again on every use (its mtime may not have ticked
#: since a change: git's "racy" rule), seconds.
RACY_S = 2.0
#: Folders whose headers belong to the system or the compiler (``system_headers = false``).
SYSTEM_DIRS = ("/usr/include/", "/usr/lib/gcc/", "/usr/local/include/", "/usr/lib/llvm")

#: SHA-256 of input files by (path, device, inode, size, mtime, ctime).
_digests: Memo[tuple[str, int, int, int, int, int], str] = Memo("file digests", 16384)


@dataclass(frozen=True)
class Snapshot:
    """The inputs of one compile.

    :ivar source: absolute path of the kernel source (as the caller resolved it).
    :ivar source_sha256: hex SHA-256 of its bytes.
    :ivar headers: absolute path → hex SHA-256 of every other file the compiler reads,
        system headers excepted; None while unknown (no manifest matched, no scan yet).
    :ivar debug_config: the ``op_debug_config`` file's bytes, read by the caller, or None.
    :ivar data: path → bytes of the source and every header once :meth:`frozen`, else None.
    :ivar sent: it came with a request (:func:`from_wire`): the daemon never reads its paths.
    :ivar absent: the places the compiler searched in vain before it found a header, and
        the files ``__has_include`` asked about that do not exist (absolute paths,
        :mod:`cachemgr.compile.searched`): a hit needs every one still absent.
    :ivar uncached: why the kernel is compiled but never cached (embedded data cachemgr
        cannot follow: :mod:`cachemgr.compile.embedded`), or None.
    :ivar listed: a sent snapshot whose caller found its headers by a dependency listing (no
        variant of the caller's header manifest matched): its hit records them in that
        manifest, as a local hit does (docs/design.md#keys-and-manifests).
    """

    source: Path
    source_sha256: str
    headers: Mapping[str, str] | None = None
    debug_config: bytes | None = None
    data: Mapping[str, bytes] | None = None
    sent: bool = False
    absent: tuple[str, ...] = ()
    uncached: str | None = None
    listed: bool = False

    def key_fields(self) -> dict[str, Any]:
        """What of the snapshot goes into the key (docs/design.md#keys-and-manifests): the source's
        digest and each header's digest with its path relative to the source's folder — so the same
        project built in another folder (or from a package made elsewhere) has the same key."""
        headers = sorted([self.relative(p), d] for p, d in (self.headers or {}).items())
        return {"source_sha256": self.source_sha256, "headers": headers}

    def relative(self, path: str | Path) -> str:
        """``path`` relative to the source's folder (``../include/k.h`` style)."""
        return os.path.relpath(str(path), os.path.dirname(str(self.source)))


def read_input(path: Path | str, what: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the regular file ``path``, opened non-blocking (a FIFO never hangs).

    :raises InvalidInputError: missing, unreadable, not a regular file, or over ``limit``
        bytes — one line naming ``what`` and the path.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise InvalidInputError(f"{what} {path}: cannot read ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInputError(f"{what} {path}: not a regular file")
        if st.st_size > limit:
            raise InvalidInputError(f"{what} {path}: {st.st_size} bytes, over {limit}")
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > limit:
                raise InvalidInputError(f"{what} {path}: over {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise InvalidInputError(f"{what} {path}: cannot read ({exc.strerror})") from None
    finally:
        os.close(fd)


def file_digest(path: Path | str, what: str = "input") -> str:
    """Hex SHA-256 of ``path``, remembered per (path, device, inode, size, mtime, ctime)
    unless the file changed in the last :data:`RACY_S` seconds.

    :raises InvalidInputError: as :func:`read_input`.
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InvalidInputError(f"{what} {path}: {exc.strerror}") from None
    known = remembered_digest(path, st)
    if known is not None:
        return known
    blob = read_input(path, what)
    digest = hashlib.sha256(blob).hexdigest()
    bytescan.facts(blob, digest)  # the one pass over its bytes (names a path, macros, words)
    if time.time() - max(st.st_mtime, st.st_ctime) > RACY_S:
        _digests.put(_ident(path, st), digest)
    return digest


def remembered_digest(path: Path | str, st: os.stat_result) -> str | None:
    """The digest :func:`file_digest` remembers for ``path`` of status ``st`` (its
    ``stat``), or None: then it reads and hashes the file again."""
    return _digests.get(_ident(path, st))


def _ident(path: Path | str, st: os.stat_result) -> tuple[str, int, int, int, int, int]:
    return (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def current_digest(path: str) -> str | None:
    """:func:`file_digest`, or None when the file cannot be read (a manifest names it)."""
    try:
        return file_digest(path, "header")
    except InvalidInputError:
        return None


#: System header folders by (compiler identity, language): one probe per compiler.
_probed: Memo[tuple[CompilerIdentity, str], tuple[str, ...]] = Memo("system prefixes", 256)


def system_prefixes(
    backend: CompilerBackend, identity: CompilerIdentity, job: CompileJob
) -> tuple[str, ...]:
    """Folders whose files the compiler's identity stands for: :data:`SYSTEM_DIRS` and the
    folders of every file the compiler reads for an *empty* source (``-M``: its implicit
    headers, e.g. ``cuda_runtime.h`` for nvcc, so the whole CUDA include folder), probed
    once per compiler and language.

    :raises CompileError: the probe failed.
    """
    memo = (identity, job.language)
    known = _probed.get(memo)
    if known is not None:
        return known
    with tempfile.TemporaryDirectory(prefix="cachemgr-probe-") as tmp:
        empty = Path(tmp) / "empty"
        empty.write_bytes(b"")
        probe = replace(job, source=empty, out_dir=Path(tmp), include_dirs=(), defines={})
        argv = backend.depend_command(probe, Path(tmp) / "d")
        clean = envvars.process_env({})  # the compiler's own headers, none a variable adds
        out = process.run_in_group(argv, job.timeout_s, Path(tmp), "probing system headers", clean)
        names = []
        if out.returncode == 0 and (Path(tmp) / "d").is_file():
            with contextlib.suppress(OSError):  # over the cap: no system folder is known
                names = read_depfile(Path(tmp) / "d")
    found = {
        os.path.dirname(os.path.normpath(os.path.join(tmp, n))).rstrip("/") + "/"
        for n in names
        if os.path.normpath(os.path.join(tmp, n)) != str(empty)
    }
    found = {f for f in found if not f.startswith(tmp) and f.count("/") > 2}
    prefixes = (*SYSTEM_DIRS, *sorted(found))
    _probed.put(memo, prefixes)
    return prefixes


def is_system(path: str, prefixes: tuple[str, ...]) -> bool:
    """True for a file below one of ``prefixes`` (see :func:`system_prefixes`), by its name
    or, links followed by the kernel (:func:`cachemgr.storage.fsutil.real_path`: a caller's
    chain of links makes no recursion), by where it is; a file that cannot be reached is
    not a system one."""
    if path.startswith(prefixes):
        return True
    try:
        return fsutil.real_path(path).startswith(prefixes)
    except OSError:
        return False


@dataclass(frozen=True)
class Scanned:
    """A dependency scan's answer: ``headers`` (path → SHA-256 of every non-system file of
    the compile: headers read, files a search found, embedded data), ``absent`` (places
    searched in vain) and ``uncached`` (why the kernel is not to be cached, or None)."""

    headers: dict[str, str]
    absent: tuple[str, ...] = ()
    uncached: str | None = None


def scan_headers(backend: CompilerBackend, job: CompileJob, identity: CompilerIdentity) -> Scanned:
    """Run the compiler's dependency listing of ``job`` (the caller's real files: ``-M``,
    system headers included, so a project header reached from a system header — an
    ``include_dirs`` ``features.h`` with ``#include_next`` — is not missed) and complete it
    (:func:`complete`).

    :raises CompileError: the preprocessor failed (a missing header, a syntax error).
    :raises InvalidInputError: a header that cannot be read or more than :data:`MAX_HEADERS`.
    """
    prefixes = system_prefixes(backend, identity, job)
    with tempfile.TemporaryDirectory(prefix="cachemgr-deps-") as tmp:
        job = replace(job, out_dir=Path(tmp))
        names = backend.list_dependencies(job, Path(tmp) / "deps.d")
        out: dict[str, str] = {}
        system: list[str] = []
        for name in names:
            path = os.path.normpath(os.path.join(tmp, name))
            if path == str(job.source):
                continue
            if is_system(path, prefixes):
                system.append(path)
                continue
            if path.startswith(tmp + "/"):
                raise CompileError(f"{job.source}: the compiler read {name} from its work folder")
            out[path] = file_digest(path, "header")
    if len(out) > MAX_HEADERS:
        raise InvalidInputError(f"{job.source}: reads {len(out)} headers (at most {MAX_HEADERS})")
    return complete(job, out, system, prefixes)


def complete(
    job: CompileJob, headers: Mapping[str, str], system: list[str], prefixes: tuple[str, ...]
) -> Scanned:
    """The headers ``headers`` the compile of ``job`` read, completed with what it looked
    for: every file of it (and, when the request has include folders, the system headers
    ``system`` it read) is scanned for the names it searches (:mod:`.searched`) and the data
    it embeds (:mod:`.embedded`); an existing file found that way is added (hashed, so it is
    mirrored and keyed) and scanned in turn, until nothing new is found.

    :raises InvalidInputError: more than :data:`MAX_HEADERS` files, or embedded data that
        cannot be read.
    """
    src = str(job.source)
    known = {src: file_digest(src, "kernel_source"), **headers}
    dirs = [str(d) for d in job.include_dirs]
    scan_system = [p for p in system if dirs]
    while True:
        facts = {p: _facts(p, d) for p, d in known.items()}
        for p in scan_system:
            facts.setdefault(p, _facts(p, file_digest(p, "system header")))
        look = {p: f[0] for p, f in facts.items()}
        found = searched.search(
            look, dirs, searched.on_disk, lambda c: is_system(c, prefixes), lambda: prefixes
        )
        emb = embedded.resolve([facts[p][1] for p in known], src)
        new = (found.found | set(emb.files.values())) - known.keys()
        if emb.problem or not new:
            break
        for path in sorted(new):
            digest = _optional_digest(path)
            if digest is not None:
                known[path] = digest
        if not new & known.keys():
            break
        if len(known) > MAX_HEADERS + 1:
            raise InvalidInputError(f"{src}: reads over {MAX_HEADERS} files (headers, data)")
    del known[src]
    return Scanned(known, tuple(sorted(found.absent)), emb.problem)


def _facts(path: str, digest: str) -> tuple[tuple[searched.Directive, ...], embedded.Uses]:
    """The names ``path`` (content ``digest``) searches and the data it embeds; its bytes
    are read only when they were not scanned before."""
    looks = searched.remembered(digest)
    uses = embedded.remembered(digest, path)
    if looks is None or uses is None:
        blob = read_input(path, "header")
        actual = hashlib.sha256(blob).hexdigest()  # (changed since hashed: freeze notices)
        looks, uses = searched.directives(blob, actual), embedded.uses(blob, actual, path)
    return looks, uses


def _optional_digest(path: str) -> str | None:
    """The digest of a file a search or an ``.incbin`` found, or None when it is no regular
    readable file (then it stays out: the compiler cannot read it either)."""
    try:
        return file_digest(path, "header")
    except InvalidInputError:
        return None


def check_sent(
    snap: Snapshot, include_dirs: tuple[Path, ...], prefixes: Callable[[], tuple[str, ...]]
) -> Snapshot:
    """A snapshot a caller sent, with what the daemon derives from its bytes itself instead
    of trusting the caller: the places searched in vain among the files sent (added to the
    caller's own list, which alone covers the system headers' searches) and whether embedded
    data keeps it out of the cache. Nothing of the caller's is opened: a place is present
    when its file was sent (or it is a system file, checked here). ``prefixes`` gives the
    system folders (:func:`system_prefixes`), asked only when a place was not sent.

    :raises CompileError: the system-header probe failed.
    """
    data = snap.data or {}
    digests = {str(snap.source): snap.source_sha256, **(snap.headers or {})}

    def system(path: str) -> bool:
        return path not in data and is_system(path, prefixes())

    def present(path: str) -> bool:
        return path in data or (path.startswith(prefixes()) and searched.on_disk(path))

    look = {p: searched.directives(b, digests[p]) for p, b in data.items()}
    dirs = [str(d) for d in include_dirs]
    found = searched.search(look, dirs, present, system, prefixes)
    uses = [embedded.uses(b, digests[p], p) for p, b in data.items()]
    emb = embedded.resolve(uses, str(snap.source))
    absent = tuple(sorted(set(snap.absent) | found.absent))
    return replace(snap, absent=absent, uncached=emb.problem)


#: An ``#include <...>`` line in its plain form (nothing else on it but a ``//`` comment).
_SYSTEM_INCLUDE = re.compile(
    rb"^[ \t]*#[ \t]*(?:include|include_next|import)[ \t]*<[^>\n]*>[ \t]*(?://[^\n]*)?$",
    re.MULTILINE,
)
#: Environment variables that add folders to every compile's include path.
INCLUDE_ENV = (
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "OBJC_INCLUDE_PATH",
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
)


def reads_only_system_headers(
    source: bytes,
    language: str,
    include_dirs: tuple[Path, ...],
    env: Mapping[str, str],
    digest: str | None = None,
) -> bool:
    """True when a C, C++ or CUDA source can read no header outside the system folders: no
    include folder, no include-path variable in ``env``, and — once its plain
    ``#include <...>`` lines are taken out (without ``-I`` they resolve in the system
    folders only) — no ``include`` or ``import`` left anywhere in it, nor a digraph or
    trigraph that could spell a ``#``, nor an ``.incbin`` or ``#embed``. Conservative: a
    comment saying "include" means a listing. Then a miss needs no dependency listing (its
    header set is empty, and so is its list of places searched: without include folders a
    ``<...>`` name is searched in the compiler's folders only). ``digest``: the source's
    SHA-256, when known (its :mod:`.bytescan` facts are remembered by it)."""
    if language not in ("c", "cpp", "cuda") or include_dirs:
        return False
    if any(env.get(name) for name in INCLUDE_ENV):
        return False
    if not bytescan.facts(source, digest).words:  # none of the words below, no line splice
        return True
    rest = _SYSTEM_INCLUDE.sub(b"", source.replace(b"\\\n", b""))
    words = (b"include", b"import", b"incbin", b"embed", b"%:", b"??=")
    return not any(word in rest for word in words)


#: An include that may be read in place rather than from the mirror: an absolute name, or a
#: computed one (a macro), or a spelling of ``#`` this check does not follow.
_IN_PLACE_INCLUDE = re.compile(
    rb'#[ \t]*(?:include|include_next|import)[ \t]*(?:["<][ \t]*/|[^"< \t])|%:|\?\?=',
)


def may_read_in_place(snap: Snapshot, env: Mapping[str, str]) -> bool:
    """True when a compile from the mirror of ``snap`` may read a file in place instead (an
    absolute or computed ``#include`` in one of its files, or an include-path variable in
    ``env``): then the compile writes the files it read and :func:`reads_not_hashed` checks
    them. Otherwise every file it can read outside the system folders is in the mirror."""
    if any(env.get(name) for name in INCLUDE_ENV):
        return True
    digests = {str(snap.source): snap.source_sha256, **(snap.headers or {})}
    return any(
        bytescan.facts(blob, digests.get(path)).words  # no include word, no splice: no match
        and _IN_PLACE_INCLUDE.search(blob.replace(b"\\\n", b""))
        for path, blob in (snap.data or {}).items()
    )


def reads_not_hashed(
    snap: Snapshot,
    backend: CompilerBackend,
    identity: CompilerIdentity,
    job: CompileJob,
    mirror_root: Path,
) -> list[str]:
    """After a compile of ``job`` (from the mirror of ``snap`` under ``mirror_root``, with
    ``job.depfile`` written): the files it read that are not the bytes hashed — neither in
    the mirror nor system headers, or a header read in place (an absolute ``#include``, a
    ``CPATH`` folder) whose digest changed since. Empty when everything matches; [] too when
    the compiler wrote no dependency file (nothing to check).

    :raises CompileError: the system-header probe failed.
    """
    if job.depfile is None or not job.depfile.is_file():
        return []
    try:
        names = read_depfile(job.depfile)
    except OSError as exc:
        raise CompileError(f"the dependency list of {job.source}: {exc}") from exc
    root = str(mirror_root).rstrip("/") + "/"
    prefixes = system_prefixes(backend, identity, job)
    known = snap.headers or {}
    out = []
    for name in names:
        path = os.path.normpath(os.path.join(str(job.out_dir), name))
        if path.startswith(root) or is_system(path, prefixes):
            continue
        if path in known and not snap.sent and current_digest(path) == known[path]:
            continue  # (a sent snapshot's paths are the caller's: never read here)
        out.append(path)
    return out


def freeze(snap: Snapshot) -> Snapshot | None:
    """``snap`` with the bytes of its source and headers, or None when one of them no longer
    has the digest the key was computed from (the caller computes the key again).

    :raises InvalidInputError: a file that cannot be read, or over :data:`MAX_TOTAL_BYTES`.
    """
    if snap.data is not None:
        return snap
    data: dict[str, bytes] = {}
    total = 0
    for path, digest in [(str(snap.source), snap.source_sha256), *(snap.headers or {}).items()]:
        blob = read_input(path, "kernel_source" if path == str(snap.source) else "header")
        total += len(blob)
        if total > MAX_TOTAL_BYTES:
            raise InvalidInputError(f"{snap.source}: inputs over {MAX_TOTAL_BYTES} bytes")
        if hashlib.sha256(blob).hexdigest() != digest:
            return None
        data[path] = blob
    return replace(snap, data=data)


def materialise(
    snap: Snapshot, root: Path, include_dirs: tuple[Path, ...], spare: list[int] | None = None
) -> Path:
    """Write the frozen inputs of ``snap`` into the mirror tree ``root`` (``root`` + each
    absolute path) and make each include folder there; return the source's mirror path.

    Quote includes resolve next to the mirrored source as next to the real one, and
    ``-I<root><dir>`` finds what ``-I<dir>`` found. A worker reuses its build folder, and
    :func:`empty_mirror` keeps the folders of the last job: the folders this job needs are
    kept, any other is removed first (:func:`_prune`) — so a compile sees only its own
    job's folders (no other caller's paths), and a run of compiles from one source folder
    makes and removes no folder (``rmdir`` took 1-4 ms each on the reference host's ext4
    with ``discard``, six per miss).

    The paths are the caller's: however deep they go, nothing here recurses once per folder
    (``Path.mkdir(parents=True)`` and ``os.makedirs`` do, and a header 1,900 folders deep
    ended a compile in ``RecursionError``; docs/security.md, section 10).

    ``spare``: unnamed files the worker made in its build folder after its last job
    (:func:`cachemgr.storage.madeahead.make`; a file create is the dear part of a write on
    the reference host): each taken is written and then named at its file's mirror path,
    which must be free, as with ``O_EXCL``; a file without one is created as before.

    :raises ValueError: when ``snap`` is not frozen.
    :raises InvalidInputError: a path whose mirror is longer than :data:`MAX_PATH_BYTES`
        (named, with its length).
    """
    if snap.data is None:
        raise ValueError(f"{snap.source}: the snapshot holds no bytes")
    files = {mirror(root, Path(path)): blob for path, blob in snap.data.items()}
    for path in [*snap.data, *map(str, include_dirs)]:
        _check_length(path, mirror(root, Path(path)), path == str(snap.source))
    folders = {mirror(root, d) for d in include_dirs} | {dest.parent for dest in files}
    _prune(root, _with_parents(str(f) for f in folders))
    for folder in sorted(folders):
        make_folders(folder)
    for dest, blob in files.items():
        _write_new(dest, blob, spare.pop() if spare else None)
    return mirror(root, snap.source)


def _write_new(dest: Path, blob: bytes, made: int | None) -> None:
    """``blob`` to the new file ``dest`` (mode ``0600``; nothing may be there): through
    ``made``, a file made ahead (taken over), when it can be named there, else a file
    created now (``O_EXCL``).

    :raises OSError: e.g. ``FileExistsError``.
    """
    if made is not None and madeahead.fill(
        made, None, dest, functools.partial(fsutil.write_all, data=blob), 0o600, False
    ):
        return
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fsutil.write_all(fd, blob)
    finally:
        os.close(fd)


def _with_parents(folders: Iterable[str]) -> frozenset[str]:
    """Each of the absolute ``folders`` and every folder above it (strings: a pathlib
    ``parents`` walk made a path object per level, per job)."""
    found: set[str] = set()
    for folder in folders:
        while folder not in found:
            found.add(folder)
            up = os.path.dirname(folder)
            if up == folder:
                break
            folder = up
    return frozenset(found)


#: The longest path one system call takes on Linux, in bytes (``PATH_MAX`` less its NUL).
MAX_PATH_BYTES = 4095


def _check_length(path: str, mirrored: Path, is_source: bool) -> None:
    """:raises InvalidInputError: ``mirrored`` (``path`` in the build folder's mirror) is
    longer than :data:`MAX_PATH_BYTES`: no compiler could open it."""
    size = len(os.fsencode(mirrored))
    if size <= MAX_PATH_BYTES:
        return
    what = "kernel_source" if is_source else "header or include folder"
    shown = path if len(path) <= 100 else f"{path[:48]}…{path[-48:]}"
    raise InvalidInputError(
        f"{what} {shown} ({len(os.fsencode(path))} bytes, {path.count('/')} folders deep) "
        f"is too long to compile: its copy in the build folder would be {size} bytes, and a "
        f"path may have at most {MAX_PATH_BYTES} (Linux PATH_MAX)"
    )


def make_folders(folder: Path) -> None:
    """``folder`` and every missing folder above it, one ``mkdir`` each, without recursion
    (``os.makedirs`` recurses once per missing folder). A folder that exists is fine.

    :raises OSError: a folder cannot be made (e.g. a file has its name).
    """
    missing: list[Path] = []
    at = folder
    while True:
        try:
            os.mkdir(at)
        except FileExistsError:
            break
        except FileNotFoundError:
            if at.parent == at:
                raise
            missing.append(at)
            at = at.parent
            continue
        break
    for made in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(made)


def place_embedded(snap: Snapshot, work: Path) -> None:
    """Write each file ``snap``'s sources embed by a relative name (``.incbin "d.bin"``,
    :mod:`cachemgr.compile.embedded`) into ``work`` — the folder the compiler runs in, where
    the assembler looks — at that name, so it reads the bytes hashed, as a compile by hand
    in the source's folder reads ``<source folder>/d.bin``.

    :raises ValueError: when ``snap`` is not frozen.
    """
    if snap.data is None:
        raise ValueError(f"{snap.source}: the snapshot holds no bytes")
    digests = {str(snap.source): snap.source_sha256, **(snap.headers or {})}
    if not any(b"incbin" in b or b".include" in b for b in snap.data.values()):
        return
    uses = [embedded.uses(b, digests[p], p) for p, b in snap.data.items() if p in digests]
    for name, path in embedded.resolve(uses, str(snap.source)).files.items():
        blob = snap.data.get(path)
        if blob is None:
            continue  # not there when it was hashed: the assembler says so
        dest = work / name
        make_folders(dest.parent)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)


def empty_mirror(root: Path) -> None:
    """Remove every file (and link) of the mirror tree ``root``, keeping its folders for the
    next job of the same worker (:func:`materialise` removes those it does not need). A
    folder a compiler made unlistable or read-only (modes ``000``, ``500``) is given its
    owner's ``rwx`` back on the way (:func:`cachemgr.storage.fsutil.open_up_folder`): the
    build folder's own opening-up does not walk the mirror a second time."""
    with contextlib.suppress(FileNotFoundError):
        fsutil.open_up_folder(root, os.lstat(root))
    _prune(root, None, open_up=True)


def _prune(root: Path, keep: frozenset[str] | None, open_up: bool = False) -> None:
    """Below ``root``: remove every non-folder (links too, never followed) and every folder
    not in ``keep`` (all folders are kept when ``keep`` is None); with ``open_up``, each
    folder kept is opened up for its owner before it is listed. Walked with a stack, not
    recursion: the folders are the callers' (any depth).

    :raises OSError: a folder of the tree cannot be listed (the worker gives its build
        folder up: :meth:`cachemgr.compile.build.RunContext.after_job`).
    """
    stack = [root]
    uid = os.geteuid() if open_up else -1
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for item in entries:
            if not item.is_dir(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(item.path)
            elif keep is None or item.path in keep:
                if open_up:
                    try:
                        st = item.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    fsutil.open_up_folder(Path(item.path), st, uid)
                stack.append(Path(item.path))
            else:
                fsutil.remove_tree(Path(item.path))  # by descriptor, any depth


def mirror(root: Path, path: Path) -> Path:
    """Where the absolute ``path`` lives in the mirror tree ``root``."""
    return root / str(path).lstrip("/")


# --- on the wire (Client → daemon) ---------------------------------------------------------


def to_wire(snap: Snapshot, listed: bool = False) -> dict[str, Any]:
    """The frozen snapshot as JSON: ``{"source": {"path", "data"}, "headers": [{"path",
    "data"}], "op_debug_config": data | null, "absent": [path, ...]}`` with ``data`` in
    base64 (``absent``: :attr:`Snapshot.absent`), and ``"listed": true`` when ``listed``
    (the headers came from a dependency listing: :attr:`Snapshot.listed`).

    :raises ValueError: when ``snap`` is not frozen.
    """
    if snap.data is None:
        raise ValueError(f"{snap.source}: the snapshot holds no bytes")

    def enc(blob: bytes) -> str:
        return base64.b64encode(blob).decode("ascii")

    src = str(snap.source)
    doc: dict[str, Any] = {
        "source": {"path": src, "data": enc(snap.data[src])},
        "headers": [{"path": p, "data": enc(b)} for p, b in snap.data.items() if p != src],
        "op_debug_config": None if snap.debug_config is None else enc(snap.debug_config),
        "absent": list(snap.absent),
    }
    if listed:
        doc["listed"] = True
    return doc


def from_wire(doc: Any, origin: str) -> Snapshot:
    """The :class:`Snapshot` a request carried (:func:`to_wire`), digests computed here.

    :raises InvalidInputError: a malformed document, a relative path, bad base64, more than
        :data:`MAX_HEADERS` headers or :data:`MAX_TOTAL_BYTES` bytes.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("source"), dict):
        raise InvalidInputError(f"{origin}: inputs must be {{source, headers, op_debug_config}}")
    headers = doc.get("headers", [])
    if not isinstance(headers, list) or len(headers) > MAX_HEADERS:
        raise InvalidInputError(f"{origin}: inputs.headers must be a list of ≤ {MAX_HEADERS}")
    total = 0
    data: dict[str, bytes] = {}
    for i, item in enumerate([doc["source"], *headers]):
        path, blob = _wire_file(item, f"{origin}: inputs file {i}")
        total += len(blob)
        if total > MAX_TOTAL_BYTES:
            raise InvalidInputError(f"{origin}: inputs over {MAX_TOTAL_BYTES} bytes")
        data[path] = blob
    src = os.path.normpath(doc["source"]["path"])
    cfg = doc.get("op_debug_config")
    cfg_bytes = None if cfg is None else _b64(cfg, f"{origin}: inputs.op_debug_config")
    digests = {p: hashlib.sha256(b).hexdigest() for p, b in data.items()}
    return Snapshot(
        source=Path(src),
        source_sha256=digests[src],
        headers={p: d for p, d in digests.items() if p != src},
        debug_config=cfg_bytes,
        data=data,
        sent=True,
        absent=_wire_absent(doc.get("absent", []), f"{origin}: inputs.absent"),
        listed=doc.get("listed") is True,
    )


def _wire_absent(raw: Any, where: str) -> tuple[str, ...]:
    """The places a caller says its compile searched in vain (:attr:`Snapshot.absent`).

    :raises InvalidInputError: not a list of at most :data:`searched.MAX_ABSENT` absolute
        paths.
    """
    if not isinstance(raw, list) or len(raw) > searched.MAX_ABSENT:
        raise InvalidInputError(f"{where}: must be a list of ≤ {searched.MAX_ABSENT} paths")
    for item in raw:
        if not isinstance(item, str) or not item.startswith("/") or "\0" in item:
            raise InvalidInputError(f"{where}: {str(item)[:80]!r} is not an absolute path")
    return tuple(sorted({os.path.normpath(p) for p in raw}))


def _wire_file(item: Any, where: str) -> tuple[str, bytes]:
    if not isinstance(item, dict) or not isinstance(item.get("path"), str):
        raise InvalidInputError(f"{where}: must be {{path, data}}")
    path = item["path"]
    if not path.startswith("/") or "\0" in path or len(path) > 4096:
        raise InvalidInputError(f"{where}: path {path[:80]!r} must be absolute")
    blob = _b64(item.get("data"), where)
    if len(blob) > MAX_INPUT_BYTES:
        raise InvalidInputError(f"{where}: {path} over {MAX_INPUT_BYTES} bytes")
    return os.path.normpath(path), blob


def _b64(text: Any, where: str) -> bytes:
    if not isinstance(text, str):
        raise InvalidInputError(f"{where}: data must be base64 text")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise InvalidInputError(f"{where}: data is not base64") from None


def gone(exc: OSError) -> bool:
    """True for an error that means the file is not there (any more)."""
    return exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ESTALE)
