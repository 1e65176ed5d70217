"""Debug artefacts in ``kernel_meta`` (layer 7; docs/design.md#debug-compiles-and-kernel_meta).

``<base>/kernel_meta/`` (base = ``debug_dir`` > ``ASCEND_WORK_PATH`` > current directory)
gets one sub-folder per compiling process, ``<host>_<pid>``, so parallel compiles never write
the same path. A folder holds an ``.owner`` file (host, pid, and the process's start time from
``/proc/<pid>/stat``, so a reused pid is told apart). A completed debug output belongs to the
user and is never reaped (docs/design.md#debug-compiles-and-kernel_meta): :func:`reap_orphans`
removes only what is provably a leftover of a dead process of this host — its private build folders
(``.build-*``) and temp files (``*.temp``), and its folder when nothing else is left in it.
With an explicit retention (``[daemon] kernel_meta_retention_s``, off by default) a dead
process's folder whose newest file is older than that goes too. Folders of other hosts and
folders without ``.owner`` (not ours) are left alone.

A debug compile opens its process folder once, before compiling (:func:`open_process_dir`),
and builds in the worker's private build folder in the temp folder (never in ``kernel_meta``,
which other members may rename in); :func:`keep_artefacts` then moves in the artefacts the
request's debug level keeps (``.o``/``.cubin``, ``.json``, ``.cce``, ``*_loc.json``; see
docs/compiling.md, "Rules") and writes ``*_compute.json`` (the operator's computation as the
request describes it) when asked — every one relative to the opened folder's descriptor, so
renaming the folder and putting a link in its place redirects none of them (see
docs/security.md#1-no-symbolic-link-is-followed-at-any-step-for-the-whole-operation).
Build folders (``.build-*``) that older versions left in ``kernel_meta`` are still reaped.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from cachemgr.compile.request import CompileRequest
from cachemgr.compilers import CompileResult
from cachemgr.constants import short_host
from cachemgr.errors import InvalidInputError
from cachemgr.memo import Memo
from cachemgr.storage import fsutil
from cachemgr.storage.safedir import SafeDir, UnsafePathError

log = logging.getLogger(__name__)

OWNER_FILE = ".owner"
#: The largest ``.owner`` record read (bytes): a host, a pid and a start time.
MAX_OWNER_BYTES = 4096
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_FOLDER = re.compile(r"^(?P<host>[A-Za-z0-9_.\-]+)_(?P<pid>[0-9]+)$")
#: The process folder (device, inode) whose ``.owner`` this process wrote, per
#: ``kernel_meta`` folder and pid (the lock serialises the writes).
_dirs: Memo[tuple[str, int], tuple[int, int]] = Memo("kernel_meta process folders", 1024)
_dirs_lock = threading.Lock()


def process_start_time(pid: int) -> str | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22), or
    None when the process does not exist (or is a zombie)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def folder_name(host: str | None = None, pid: int | None = None) -> str:
    """``<host>_<pid>`` of this (or the given) process."""
    return f"{host or short_host()}_{os.getpid() if pid is None else pid}"


def open_process_dir(kernel_meta_dir: Path) -> SafeDir:
    """Open this process's folder ``<kernel_meta_dir>/<host>_<pid>/`` once for one compile's
    outputs, creating it (and ``kernel_meta``, mode 0775, setgid where the folder above has
    it) and its ``.owner`` on first use.

    Every output is then written relative to the returned descriptor (``openat`` with
    ``O_EXCL | O_NOFOLLOW`` to a temp name, then ``renameat``; :func:`keep_artefacts`), so a
    member who renames the folder and puts a link in its place meanwhile redirects nothing:
    the outputs land in the real folder under whatever name it now has (see
    docs/security.md#1-no-symbolic-link-is-followed-at-any-step-for-the-whole-operation).
    ``kernel_meta`` may be shared, so neither it nor the process folder is reached through
    another user's link — this user's own links are this user's choice — and the process
    folder must be this user's: a member could make ``<host>_<pid>`` for a process id to
    come (attack review).

    :returns: the open folder (a context manager; close it).
    :raises UnsafePathError: one line naming the folder, whose link or folder it is and
        what to do.
    :raises OSError: when a folder cannot be created or opened (e.g. ``EACCES``).
    """
    kernel_meta_dir = Path(kernel_meta_dir)
    pid = os.getpid()
    name = folder_name(pid=pid)
    fsutil.ensure_dir(kernel_meta_dir.parent)  # the caller's base: as the caller named it
    with SafeDir.open(kernel_meta_dir.parent) as base:
        meta = _open_folder(base, kernel_meta_dir.name, kernel_meta_dir)
    with meta:
        folder = _open_folder(meta, name, kernel_meta_dir / name)
    try:
        _check_own_folder(folder)
        _stamp_owner(folder, (str(kernel_meta_dir), pid))
    except BaseException:
        folder.close()
        raise
    return folder


def _open_folder(parent: SafeDir, name: str, path: Path) -> SafeDir:
    """``parent/name`` (made when missing) opened with ``O_DIRECTORY | O_NOFOLLOW``; a link
    only when it is this user's own (:func:`_open_own_link`).

    :raises UnsafePathError: ``name`` is another user's link, or keeps changing between a
        link and a folder while it is opened.
    :raises OSError: e.g. ``ENOTDIR`` (a file there) or ``EACCES``.
    """
    try:
        _make_folder(parent, name)
        for _ in range(_OPEN_TRIES):
            try:
                return SafeDir(os.open(name, _DIR_FLAGS, dir_fd=parent.fd), path)
            except OSError as exc:  # a link: ELOOP, or ENOTDIR with O_DIRECTORY
                st = os.stat(name, dir_fd=parent.fd, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    return SafeDir(_open_own_link(parent, name, path), path)
                if exc.errno != errno.ENOTDIR or not stat.S_ISDIR(st.st_mode):
                    raise
                # a folder again: a link was swapped out meanwhile; open it once more
    except OSError as exc:
        exc.filename = str(path)  # the full name for messages
        raise
    raise _swapped(path)


#: How often a name that turns from a link back into a folder while opened is tried.
_OPEN_TRIES = 3


def _swapped(path: Path) -> UnsafePathError:
    """The one line for a folder swapped with a link while it was being opened."""
    return UnsafePathError(
        f"debug output folder {path} changed while it was opened (a symbolic link was "
        "swapped in); cachemgr writes no debug output there: check who else writes "
        f"{path.parent}"
    )


def _make_folder(parent: SafeDir, name: str) -> None:
    """``mkdirat(name)`` with mode 0775 (setgid where ``parent`` has it) whatever the umask;
    a name already there is left as it is."""
    try:
        os.mkdir(name, 0o775, dir_fd=parent.fd)
    except FileExistsError:
        return
    mode = 0o775 | (os.fstat(parent.fd).st_mode & stat.S_ISGID)
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent.fd)
    except OSError:
        return  # swapped meanwhile: the open that follows says what is there
    try:
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, mode)  # through the descriptor: never a link's target
    finally:
        os.close(fd)


def _open_own_link(parent: SafeDir, name: str, path: Path) -> int:
    """Open the folder the link ``parent/name`` leads to when the link is this user's, and
    is still the same link to the same folder once opened (a member who can write
    ``parent`` could swap it for a link of theirs between the check and the open).

    :raises UnsafePathError: another user's link, or a link changed while it was opened.
    """
    link = os.stat(name, dir_fd=parent.fd, follow_symlinks=False)
    if link.st_uid != os.geteuid():
        try:
            target = f"to {os.readlink(name, dir_fd=parent.fd)}"
        except OSError:  # swapped back meanwhile: it was a link all the same
            target = "swapped in and out again"
        raise UnsafePathError(
            f"debug output folder {path} is a symbolic link of "
            f"{fsutil.user_name(link.st_uid)} ({target}); "
            "cachemgr never writes debug outputs through another user's link: remove it"
        )
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC, dir_fd=parent.fd)
    if not _still_the_link(parent, name, link, os.fstat(fd)):
        os.close(fd)
        raise _swapped(path)
    return fd


def _still_the_link(
    parent: SafeDir, name: str, link: os.stat_result, opened: os.stat_result
) -> bool:
    """True when ``parent/name`` is still the link ``link`` and leads to ``opened``."""
    try:
        again = os.stat(name, dir_fd=parent.fd, follow_symlinks=False)
        now = os.stat(name, dir_fd=parent.fd)
    except OSError:
        return False
    same_link = (again.st_dev, again.st_ino, again.st_uid) == (
        link.st_dev,
        link.st_ino,
        link.st_uid,
    )
    return same_link and (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino)


def _check_own_folder(folder: SafeDir) -> None:
    """Refuse a process folder another user made (``fstat`` of the open folder).

    :raises UnsafePathError: naming the folder, whose it is and what to do.
    """
    owner = os.fstat(folder.fd).st_uid
    if owner != os.geteuid():
        raise UnsafePathError(
            f"debug output folder {folder.path} belongs to {fsutil.user_name(owner)}, not to "
            "this process's user: someone made it for this process id; remove it"
        )


def _stamp_owner(folder: SafeDir, ident: tuple[str, int]) -> None:
    """Write ``.owner`` (relative to the open folder) unless this very folder (device and
    inode) already has ours: a folder made anew since (removed, or renamed away) gets one."""
    st = os.fstat(folder.fd)
    with _dirs_lock:
        if _dirs.get(ident) == (st.st_dev, st.st_ino):
            return
        pid = ident[1]
        owner = {"host": short_host(), "pid": pid, "start": process_start_time(pid)}
        data = json.dumps(owner).encode()
        fsutil.atomic_write_bytes(folder.path / OWNER_FILE, data, dir_fd=folder.fd)
        _dirs.put(ident, (st.st_dev, st.st_ino))


def caller_base(options: Mapping[str, Any], env: Mapping[str, str], cwd: Path) -> tuple[Path, str]:
    """The caller's ``kernel_meta`` base and where it came from
    (docs/design.md#debug-compiles-and-kernel_meta): the request's (or command line's) ``debug_dir``
    > ``ASCEND_WORK_PATH`` > the current directory — resolved with the *caller's* environment and
    folder, also when the daemon compiles."""
    if options.get("debug_dir"):
        return Path(str(options["debug_dir"])), "debug_dir"
    if env.get("ASCEND_WORK_PATH"):
        return Path(env["ASCEND_WORK_PATH"]), "ASCEND_WORK_PATH"
    return cwd, "current directory"


def check_base(kernel_meta_dir: Path, origin: str = "") -> None:
    """Refuse, before compiling, a ``kernel_meta`` folder this user cannot create or write.

    :raises InvalidInputError: one line naming the folder, where it came from and what to set.
    """
    _check_writable(
        kernel_meta_dir,
        "debug output folder",
        origin,
        "set debug_dir (--debug-dir) or ASCEND_WORK_PATH to a folder you can write",
    )


#: Where a kernel compiled outside the cache goes on the command line (``--mode disable``, or
#: a cache this user cannot write): ``cachemgr compile --out-dir``.
OUTPUT_DIR_ORIGIN = "--out-dir, default the current directory"


def check_output_dir(output_dir: Path, origin: str = OUTPUT_DIR_ORIGIN) -> None:
    """Refuse, before compiling, an output folder for kernels compiled outside the cache
    (``disable``, or a cache this user cannot write) that this user cannot create or write —
    as :func:`check_base` does for ``kernel_meta`` — instead of failing after the compile.

    :raises InvalidInputError: one line naming the folder, where it came from and what to set.
    """
    _check_writable(
        output_dir,
        "output folder",
        origin,
        "give --out-dir a folder you can write (kernels compiled outside the cache go there)",
    )


def _check_writable(folder: Path, what: str, origin: str, fix: str) -> None:
    """:raises InvalidInputError: ``folder`` (or the nearest existing folder above it, where
    it would be created) is not writable by this user."""
    probe = Path(folder)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.is_dir() and os.access(probe, os.W_OK | os.X_OK):
        return
    where = f" ({origin})" if origin else ""
    raise InvalidInputError(
        f"{what} {folder}{where} cannot be written by user {fsutil.user_name()} "
        f"({probe} is not writable); {fix}"
    )


def goes_outside_the_cache(chip_dir: Path) -> bool:
    """True when this user cannot write ``chip_dir`` (or, while it does not exist, the nearest
    folder above it), or its filesystem has no free block left for this user: a compile
    through the cache will then be delivered outside it (``publisher._compile_outside``, or
    a publish that fails with ``ENOSPC``), so its output folder must be checked first."""
    probe = Path(chip_dir)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not (probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)):
        return True
    return _no_space_left(probe)


def _no_space_left(folder: Path) -> bool:
    """True when ``folder``'s filesystem has no free block for this user (root may use the
    blocks reserved for it); False when that cannot be told (an unlimited tmpfs, some FUSE
    filesystems report no blocks at all)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    free = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return st.f_blocks > 0 and free == 0


def compute_document(request: CompileRequest, kernel: str) -> dict[str, Any]:
    """``<kernel>_compute.json``: the operator's computation as the request describes it —
    one placeholder node per input, the operator node, one node per output
    (docs/design.md#debug-compiles-and-kernel_meta)."""

    def tensors(kind: str, descs: Iterable[Any]) -> list[dict[str, Any]]:
        return [
            {"name": f"{kind}_{i}", "index": i, **t.to_json(), "dynamic": t.dynamic}
            for i, t in enumerate(descs)
        ]

    inputs, outputs = tensors("input", request.inputs), tensors("output", request.outputs)
    op_node = {
        "name": request.op_name or request.op_type.lower(),
        "type": request.op_type,
        "inputs": [t["name"] for t in inputs],
        "outputs": [t["name"] for t in outputs],
        "attrs": dict(request.attrs),
    }
    nodes = [{"name": t["name"], "type": "placeholder"} for t in inputs]
    nodes += [op_node] + [{"name": t["name"], "type": "output"} for t in outputs]
    return {
        "kernelName": kernel,
        "opType": request.op_type,
        "socVersion": request.soc_version,
        "inputs": inputs,
        "outputs": outputs,
        "attrs": dict(request.attrs),
        "kernel": {
            "language": request.language,
            "source": str(request.kernel_source),
            "entry": request.kernel_entry,
            "defines": dict(request.defines),
        },
        "graph": {"nodes": nodes},
    }


def keep_artefacts(
    result: CompileResult,
    kernel: str,
    keep: frozenset[str],
    dest: SafeDir,
    request: CompileRequest,
) -> tuple[Path, ...]:
    """Move the kinds in ``keep`` (``o``, ``json``, ``cce``, ``loc``, ``compute``) from the
    compile's private build folder into the open folder ``dest`` (:func:`open_process_dir`),
    each relative to its descriptor; replaces older files of the same kernel.

    :returns: the files kept, named by ``dest``'s path (where they are unless the folder was
        renamed meanwhile).
    :raises OSError: when a move or write fails (nothing half-written is left).
    """
    out = result.binary.parent
    sources = {
        "o": result.binary,
        "json": result.json_path,
        "cce": out / f"{kernel}.cce",
        "loc": out / f"{kernel}_loc.json",
    }
    kept = []
    for kind in ("json", "o", "cce", "loc"):
        if kind in keep and sources[kind].is_file():
            move_in(sources[kind], dest)
            kept.append(dest.path / sources[kind].name)
    if "compute" in keep:
        target = dest.path / f"{kernel}_compute.json"
        doc = compute_document(request, kernel)
        data = (json.dumps(doc, indent=4, ensure_ascii=False) + "\n").encode()
        fsutil.atomic_write_bytes(target, data, dir_fd=dest.fd)
        kept.append(target)
    return tuple(kept)


#: Bytes copied per read when an output is copied across filesystems.
COPY_CHUNK_BYTES = 1 << 20


def move_in(src: Path, dest: SafeDir) -> None:
    """Move the file ``src`` (in a private folder) into the open folder ``dest`` under its
    name: ``renameat`` into the descriptor, or — across filesystems — a copy in chunks of
    :data:`COPY_CHUNK_BYTES` into a fresh temp name (``O_CREAT | O_EXCL | O_NOFOLLOW``
    relative to ``dest``), renamed into place relative to ``dest`` and ``src`` removed.

    :raises OSError: when the move or copy fails; no temp file is left in ``dest``.
    """
    try:
        os.rename(src, src.name, dst_dir_fd=dest.fd)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    tmp = fsutil.temp_path(dest.path / src.name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
    with open(src, "rb") as reader:
        fd = os.open(tmp.name, flags, fsutil.FILE_MODE, dir_fd=dest.fd)
        try:
            with os.fdopen(fd, "wb") as writer:
                shutil.copyfileobj(reader, writer, COPY_CHUNK_BYTES)
                os.fchmod(writer.fileno(), fsutil.FILE_MODE)
            os.rename(tmp.name, src.name, src_dir_fd=dest.fd, dst_dir_fd=dest.fd)
        except BaseException:
            fsutil.safe_unlink(tmp, dir_fd=dest.fd)
            raise
    fsutil.safe_unlink(src)


def _owner(folder: Path, dir_fd: int | None = None) -> dict[str, Any] | None:
    """The ``.owner`` record of a per-process folder (``dir_fd``: that folder, open)."""
    try:
        path = folder / OWNER_FILE
        raw = fsutil.read_bytes_noatime(
            path if dir_fd is None else Path(OWNER_FILE), dir_fd, max_bytes=MAX_OWNER_BYTES
        )
        data = json.loads(raw)
    except (OSError, ValueError, RecursionError):  # planted: huge, sparse, [[[…]]]
        return None
    return data if isinstance(data, dict) else None


def is_orphan(folder: Path, host: str | None = None) -> bool:
    """True when ``folder`` is a per-process folder of this host whose process is gone (or
    whose pid now belongs to a later process)."""
    return _orphan(folder.name, lambda: _owner(folder), host)


def _orphan(
    name: str, owner_of: Callable[[], dict[str, Any] | None], host: str | None = None
) -> bool:
    match = _FOLDER.match(name)
    host = host or short_host()
    if match is None or match["host"] != host:
        return False
    owner = owner_of()
    if owner is None or owner.get("host") != host or str(owner.get("pid")) != match["pid"]:
        return False
    start = process_start_time(int(match["pid"]))
    return start is None or (owner.get("start") is not None and start != owner.get("start"))


def reap_orphans(kernel_meta_dir: Path, retention_s: float = 0.0) -> list[Path]:
    """Remove the leftovers of dead processes of this host
    (docs/design.md#debug-compiles-and-kernel_meta): their build folders and temp files, and their
    folder once nothing else is in it (``.owner`` aside). Completed debug outputs stay — unless
    ``retention_s`` > 0 and the folder's newest file is older.

    Files directly in ``kernel_meta_dir`` (CANN's own) and folders of other hosts are never
    touched; symlinks are not followed: ``kernel_meta`` is opened without following a link,
    and each folder is judged and cleaned relative to its descriptor, so a name swapped for a
    link meanwhile cannot redirect a removal (docs/security.md item 1). Already-gone files
    are normal.

    :returns: the folders and files removed.
    :raises OSError: when ``kernel_meta_dir`` exists but cannot be listed.
    """
    removed: list[Path] = []
    kernel_meta_dir = Path(kernel_meta_dir)
    try:
        meta = SafeDir.open(kernel_meta_dir.parent, [kernel_meta_dir.name])
    except FileNotFoundError:
        return removed
    except UnsafePathError as exc:
        log.warning("not reaping kernel_meta: %s", exc)
        return removed
    with meta:
        for de in list(meta.scandir()):
            if de.is_dir(follow_symlinks=False):
                removed += _reap_one(meta, de.name, retention_s)
    return removed


def _reap_one(meta: SafeDir, name: str, retention_s: float) -> list[Path]:
    """The leftovers of ``meta/name`` when it is a dead process's folder."""
    try:
        folder = meta.child(name)
    except (OSError, UnsafePathError):
        return []  # gone, or swapped for a link: not ours
    with folder:
        if not _orphan(name, lambda: _owner(folder.path, folder.fd)):
            return []
        removed, empty_or_expired = _reap_dead(folder, retention_s)
    if empty_or_expired:
        fsutil.remove_tree_at(meta.fd, name, meta.path)
        removed.append(meta.path / name)
        why = "its retention expired" if empty_or_expired == "expired" else "nothing left in it"
        log.info("reaped kernel_meta folder %s of a dead process (%s)", meta.path / name, why)
    return removed


def _reap_dead(folder: SafeDir, retention_s: float) -> tuple[list[Path], str]:
    """Remove one dead process's build folders and temps (relative to its descriptor); also
    say whether the folder itself goes: ``"empty"``, ``"expired"`` or ``""``."""
    removed: list[Path] = []
    try:
        items = list(folder.scandir())
    except OSError:
        return removed, ""
    newest = 0.0
    for item in items:
        path = folder.path / item.name
        if item.name.startswith(".build-") and item.is_dir(follow_symlinks=False):
            fsutil.remove_tree_at(folder.fd, item.name, folder.path)
            removed.append(path)
        elif item.name.endswith(fsutil.TEMP_SUFFIX) and item.is_file(follow_symlinks=False):
            folder.unlink(item.name)
            removed.append(path)
        elif item.name != OWNER_FILE:
            with contextlib.suppress(OSError):
                newest = max(newest, item.stat(follow_symlinks=False).st_mtime)
    expired = retention_s > 0 and newest and time.time() - newest > retention_s
    return removed, ("expired" if expired else "empty" if not newest else "")
