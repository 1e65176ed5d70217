"""Debug artefacts in ``kernel_meta`` (layer 7; SPEC §7).

``<base>/kernel_meta/`` (base = ``debug_dir`` > ``ASCEND_WORK_PATH`` > current directory)
gets one sub-folder per compiling process, ``<host>_<pid>``, so parallel compiles never write
the same path. A folder holds an ``.owner`` file (host, pid, and the process's start time from
``/proc/<pid>/stat``, so a reused pid is told apart). A completed debug output belongs to the
user and is never reaped (SPEC §7, issue 11 item 7): :func:`reap_orphans` removes only what is
provably a leftover of a dead process of this host — its private build folders
(``.build-*``) and temp files (``*.temp``), and its folder when nothing else is left in it.
With an explicit retention (``[daemon] kernel_meta_retention_s``, off by default) a dead
process's folder whose newest file is older than that goes too. Folders of other hosts and
folders without ``.owner`` (not ours) are left alone.

Compiles run in a private temp folder inside the process folder; :func:`keep_artefacts` then
moves in the artefacts SPEC §7's table keeps for the request (``.o``/``.cubin``, ``.json``,
``.cce``, ``*_loc.json``) and writes ``*_compute.json`` (the operator's computation as the
request describes it) when asked.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import stat
import tempfile
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
_FOLDER = re.compile(r"^(?P<host>[A-Za-z0-9_.\-]+)_(?P<pid>[0-9]+)$")
#: This process's folder per ``kernel_meta`` base (the lock serialises their creation).
_dirs: Memo[tuple[str, int], Path] = Memo("kernel_meta process folders", 1024)
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


def process_dir(kernel_meta_dir: Path) -> Path:
    """This process's folder ``<kernel_meta_dir>/<host>_<pid>/``, created (with ``.owner``)
    on first use.

    :raises OSError: when it cannot be created (e.g. ``EACCES``).
    """
    pid = os.getpid()
    ident = (str(kernel_meta_dir), pid)
    with _dirs_lock:
        known = _dirs.get(ident)
        if known is not None and known.is_dir():
            _check_own_folder(known)
            return known
        path = fsutil.ensure_dir(Path(kernel_meta_dir) / folder_name(pid=pid))
        _check_own_folder(path)
        owner = {"host": short_host(), "pid": pid, "start": process_start_time(pid)}
        fsutil.atomic_write_bytes(path / OWNER_FILE, json.dumps(owner).encode())
        _dirs.put(ident, path)
        return path


def _check_own_folder(path: Path) -> None:
    """Refuse a process folder, or its ``kernel_meta``, that is another user's symbolic link,
    and a process folder that another user made: ``kernel_meta`` may be shared, and a member
    could make ``<host>_<pid>`` for a process id to come, a link to any folder of its user
    (who then wrote its debug outputs and ``.owner`` there), or a folder of their own (attack
    review). This user's own links are this user's choice.

    :raises UnsafePathError: naming the folder, whose it is and what to do.
    """
    me = os.geteuid()
    for folder in (path.parent, path):
        st = os.lstat(folder)
        if stat.S_ISLNK(st.st_mode) and st.st_uid != me:
            raise UnsafePathError(
                f"debug output folder {folder} is a symbolic link of "
                f"{fsutil.user_name(st.st_uid)} (to {os.readlink(folder)}); cachemgr never "
                "writes debug outputs through another user's link: remove it"
            )
    owner = os.stat(path).st_uid
    if owner != me:
        raise UnsafePathError(
            f"debug output folder {path} belongs to {fsutil.user_name(owner)}, not to "
            "this process's user: someone made it for this process id; remove it"
        )


def caller_base(options: Mapping[str, Any], env: Mapping[str, str], cwd: Path) -> tuple[Path, str]:
    """The caller's ``kernel_meta`` base and where it came from (SPEC §7): the request's (or
    command line's) ``debug_dir`` > ``ASCEND_WORK_PATH`` > the current directory — resolved
    with the *caller's* environment and folder, also when the daemon compiles."""
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


def build_dir(process_folder: Path, kernel: str) -> Path:
    """A fresh private folder inside ``process_folder`` for one compile (caller removes it)."""
    return Path(tempfile.mkdtemp(prefix=f".build-{kernel[:40]}-", dir=process_folder))


def compute_document(request: CompileRequest, kernel: str) -> dict[str, Any]:
    """``<kernel>_compute.json``: the operator's computation as the request describes it —
    one placeholder node per input, the operator node, one node per output (SPEC §7)."""

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
    dest: Path,
    request: CompileRequest,
) -> tuple[Path, ...]:
    """Move the kinds in ``keep`` (``o``, ``json``, ``cce``, ``loc``, ``compute``) from the
    compile's private folder into ``dest``; replaces older files of the same kernel.

    :raises OSError: when a move or write fails.
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
            target = dest / sources[kind].name
            os.replace(sources[kind], target)
            kept.append(target)
    if "compute" in keep:
        target = dest / f"{kernel}_compute.json"
        doc = compute_document(request, kernel)
        data = (json.dumps(doc, indent=4, ensure_ascii=False) + "\n").encode()
        fsutil.atomic_write_bytes(target, data)
        kept.append(target)
    return tuple(kept)


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
    """Remove the leftovers of dead processes of this host (SPEC §7): their build folders and
    temp files, and their folder once nothing else is in it (``.owner`` aside). Completed
    debug outputs stay — unless ``retention_s`` > 0 and the folder's newest file is older.

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


def remove_build_dir(path: Path) -> None:
    """Remove a private build folder; a folder already gone is fine."""
    fsutil.remove_tree(path)
