"""Compiling through the cache: locks, a second lookup, compile, publish (layer 7½;
docs/design.md#writing-and-reading-an-entry, #cache-modes).

:func:`compile_through_cache` is what a queue worker runs for an ``enable``/``force`` job:

1. hold the chip lock shared (:mod:`cachemgr.storage.chiplock`: ``force`` awaits this publish and no
   new publisher starts while ``force`` waits);
2. take the entry's fcntl lock (``<kernel>.lock``, the lock CANN takes too) and look up again —
   another process may have published the entry while we waited: cross-process single-flight.
   A lock still held after ``lock_timeout_s`` (a stuck compile on another host) does not fail
   the request: it is compiled here, outside the cache;
3. compile in the worker's private build folder (never in the chip folder);
4. hand back a :class:`Pending` publish. Its :meth:`Pending.finish` (run on another thread, so
   the compiler slot is free for the next job at once) publishes through
   :meth:`cachemgr.storage.store.Store.publish` — each file to a temp name, renamed, json last — and
   releases both locks. ``replace`` removes the old entry just before the new one goes in.

:func:`clear_chip` is ``force``'s clear, run under the chip lock held exclusive.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachemgr.compile import inplace, inputs, kernel_meta, precompiled, volatile
from cachemgr.compile.build import (
    COMPILED,
    HIT,
    SOURCES_DIR,
    Prepared,
    RunContext,
    compile_job,
)
from cachemgr.compile.results import CompileOutcome
from cachemgr.compilers import CompileJob, CompileResult
from cachemgr.config import versions
from cachemgr.errors import (
    CachePermissionError,
    CompileError,
    ConfigError,
    InvalidInputError,
    LockBusyError,
    NoSpaceError,
    OutputFolderError,
)
from cachemgr.remote.tierset import RemoteTiers
from cachemgr.storage import entry, fsutil, madeahead, manifest
from cachemgr.storage.chiplock import Hold
from cachemgr.storage.events import Events
from cachemgr.storage.safedir import SafeDir
from cachemgr.storage.store import PUBLISHED, EntryHold, Part, free_words
from cachemgr.storage.tiers import LocalTier, chip_store

log = logging.getLogger(__name__)


@dataclass
class Pending:
    """A compiled kernel not yet published; owns the entry lock and the chip hold."""

    prepared: Prepared
    #: the entry's parts: bytes, or a compiled binary waiting in the private pending folder
    #: (copied in chunks, removed when the publish is finished or released)
    files: dict[str, Part]
    main_json: dict[str, Any]
    entry_lock: EntryHold
    chip_hold: Hold
    lock_timeout_s: float
    config_sections: dict[str, Any] = field(default_factory=dict)
    #: told of a publish that hit a full filesystem (the daemon's governance evicts)
    events: Events | None = None
    #: the remote tiers: a published entry is queued for upload (never waited for)
    remotes: RemoteTiers | None = None
    #: the entry's and its header manifest's files, made while the compiler ran
    #: (:func:`_reserved_names`); those the publish does not take are closed by
    #: :meth:`release`
    reserved: madeahead.Reserved | None = None

    def finish(self, uncached_dir: Callable[[], Path] | None = None) -> CompileOutcome:
        """Publish (json last), then release the locks — from any thread.

        A publish that fails because the cache root is read-only or full does not fail the
        compile (as ccache and sccache do): the kernel goes to
        ``uncached_dir()`` and the outcome says ``cached: False`` with the reason.

        :raises InvalidInputError, OSError: the publish failed; nothing partial is left.
        """
        p = self.prepared
        try:
            store = chip_store(p.chip_dir, self.lock_timeout_s, self.events)
            if p.decision.cache.replace:
                store.remove(p.kernel, held=self.entry_lock)
            published = store.publish(
                p.kernel, self.files, self.main_json, held=self.entry_lock, reserved=self.reserved
            )
            held_fd = self.entry_lock.dir_fd
            if uncached_dir is not None and held_fd is not None and _moved(p.chip_dir, held_fd):
                names = [f.name for f in published.files]
                return self._deliver_from(held_fd, names, uncached_dir(), _MOVED_WHY)
            made = self.reserved.take(p.manifest_path.name, held_fd) if self.reserved else None
            _record_manifest(p, held_fd, made)
            _ensure_ini(p.chip_dir.parent, self.config_sections)  # logs its own failure
            if self.remotes is not None:  # after the compile, in the background
                digests = published.digests if published.status == PUBLISHED else None
                self.remotes.upload_later(
                    p.chip_dir.parent, p.chip_dir.name, p.kernel, digests=digests
                )
        except (NoSpaceError, OSError) as exc:
            if uncached_dir is None or not _cannot_store(exc):
                raise
            return self._deliver_uncached(uncached_dir(), _why(p.chip_dir, exc))
        finally:
            self.release()
        files = sorted(published.files, key=lambda f: f.name != f"{p.kernel}.json")
        return CompileOutcome(
            p.kernel, COMPILED, tuple(files), request=p.request.origin, cached=True
        )

    def _deliver_uncached(self, out: Path, reason: str) -> CompileOutcome:
        """Write the compiled kernel to ``out`` (binaries first, json last) instead of the
        cache; one warning line names the reason."""
        p = self.prepared
        paths = []
        warning = f"{p.kernel} compiled but not cached: {reason}"
        with _output_folder(out, warning):
            fsutil.ensure_dir(out)
            for name, data in self.files.items():
                if isinstance(data, bytes):
                    fsutil.atomic_write_bytes(out / name, data)
                else:
                    _move(data, out / name)  # a file: moved or copied, never read whole
                paths.append(out / name)
            doc = out / f"{p.kernel}.json"
            fsutil.atomic_write_bytes(doc, json.dumps(self.main_json).encode())
        log.info("%s", warning)  # the outcome carries it: the caller prints it once
        return CompileOutcome(
            p.kernel,
            COMPILED,
            (doc, *paths),
            request=p.request.origin,
            cached=False,
            warning=warning,
        )

    def _deliver_from(
        self, dir_fd: int, names: list[str], out: Path, reason: str
    ) -> CompileOutcome:
        """Copy the entry just published into the held chip folder ``dir_fd`` (file names
        ``names``) to ``out`` — binaries first, json last — as :meth:`_deliver_uncached` does
        for a publish that failed; one warning line names the reason."""
        p = self.prepared
        warning = f"{p.kernel} compiled but not cached: {reason}"
        main = f"{p.kernel}.json"
        order = sorted(names, key=lambda name: name == main)
        with _output_folder(out, warning):
            fsutil.ensure_dir(out)
            for name in order:
                _copy_at(dir_fd, name, out / name)
        log.info("%s", warning)  # the outcome carries it: the caller prints it once
        paths = sorted((out / name for name in order), key=lambda f: f.name != main)
        return CompileOutcome(
            p.kernel, COMPILED, tuple(paths), request=p.request.origin, cached=False,
            warning=warning,
        )  # fmt: skip

    def release(self) -> None:
        """Drop the entry lock and the chip hold (without publishing, when not finished);
        the pending binaries are removed, the files made ahead and not used closed."""
        if self.reserved is not None:
            self.reserved.close()  # before the lock: they were made in its folder
        self.entry_lock.release()
        self.chip_hold.release()
        for part in self.files.values():
            if isinstance(part, Path):
                with contextlib.suppress(OSError):
                    fsutil.safe_unlink(part)


#: Why a kernel published into a chip folder that was moved away meanwhile is delivered
#: outside the cache.
_MOVED_WHY = "its chip folder was moved away while the entry was written"


def _moved(chip_dir: Path, dir_fd: int) -> bool:
    """True when ``chip_dir`` no longer leads to the folder ``dir_fd`` holds (renamed away,
    another made at its path, or gone): an entry written there is not at the paths a result
    would name. Compares ``lstat(chip_dir)`` with ``fstat(dir_fd)`` (device and inode)."""
    held = os.fstat(dir_fd)
    now = fsutil.lstat_or_none(chip_dir)
    return now is None or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino)


def _copy_at(dir_fd: int, name: str, dest: Path) -> None:
    """Copy the file ``name`` of the folder ``dir_fd`` (never followed) to ``dest`` through a
    temp name beside it (``dest`` is whole or absent).

    :raises OSError: the file cannot be read or ``dest``'s folder written.
    """
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    tmp = fsutil.temp_path(dest)
    try:
        with os.fdopen(src, "rb") as reader, open(tmp, "wb") as writer:
            shutil.copyfileobj(reader, writer)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _record_manifest(p: Prepared, dir_fd: int | None = None, made: int | None = None) -> None:
    """Remember which headers ``p``'s compile read, under the entry lock (``dir_fd``: the
    chip folder it is held in; ``made``: a file made ahead there for it, taken over); a
    manifest that cannot be written costs a dependency scan on the next lookup, nothing
    else."""
    headers, absent = p.inputs.headers or {}, p.inputs.absent
    try:
        manifest.record(p.manifest_path, p.kernel, headers, absent, dir_fd, made)
    except OSError as exc:
        log.warning("%s: cannot write its header manifest %s: %s", p.kernel, p.manifest_path, exc)


def compile_through_cache(p: Prepared, ctx: RunContext) -> CompileOutcome | Pending:
    """Steps 1–4 of the module docstring: a ``hit`` (published meanwhile) or a :class:`Pending`
    publish that the caller must :meth:`~Pending.finish` (or :meth:`~Pending.release`).

    :raises CompileError: the compile failed; the locks are released, nothing is cached.
    :raises LockBusyError: the chip lock was not obtained within ``ctx.lock_timeout_s`` (a
        ``force`` that never ends; the entry lock's timeout compiles outside the cache).
    """
    timed = volatile.why_uncached(p.inputs, p.env, p.backend, p.identity)
    if timed is not None:  # its binary holds the time of its compile (docs/compiling.md)
        return _compile_outside(p, ctx, timed)
    try:
        hold = p.chip_lock.hold_shared(timeout_s=ctx.lock_timeout_s)
    except (IsADirectoryError, fsutil.NotRegularFileError) as exc:
        return _compile_alone(p, ctx, _unusable_lock(exc))
    except PermissionError as exc:
        # a kernel cache folder CANN GE created 0750: compile outside the cache
        where = Path(exc.filename) if exc.filename else p.chip_dir.parent
        return _compile_alone(p, ctx, fsutil.lock_access_hint(where))
    except OSError as exc:  # a read-only or full root
        if not _cannot_store(exc):
            raise
        return _compile_outside(p, ctx, _why(p.chip_dir, exc))
    try:
        lock = _hold_entry(p, ctx)
    except LockBusyError:
        hold.release()
        return _compile_alone(p, ctx)
    except (IsADirectoryError, fsutil.NotRegularFileError) as exc:
        hold.release()
        return _compile_alone(p, ctx, _unusable_lock(exc))
    except PermissionError:
        # e.g. a chip folder CANN GE created 0750, or its 0640 lock file in a folder we may
        # not write: compile anyway, outside the cache, and say why in one line
        hold.release()
        why = fsutil.lock_access_hint(chip_store(p.chip_dir).lock_path(p.kernel))
        return _compile_alone(p, ctx, why)
    except OSError as exc:  # a read-only or full root
        hold.release()
        if not _cannot_store(exc):
            raise
        return _compile_outside(p, ctx, _why(p.chip_dir, exc))
    except BaseException:
        hold.release()
        raise
    reserved = madeahead.Reserved(lock.dir_fd)  # filled while the compiler runs
    try:
        if p.decision.cache.read:
            found = chip_store(p.chip_dir, ctx.lock_timeout_s).lookup(p.kernel, held=lock)
            if found.hit:  # another process published it while we waited for the lock
                lock.release()
                hold.release()
                return CompileOutcome(
                    p.kernel, HIT, found.files, request=p.request.origin, coalesced=True
                )
            remote = _remote_hit(p, ctx, lock)
            if remote is not None:
                lock.release()
                hold.release()
                return remote
        build_dir = ctx.build_dir()
        job = dataclasses.replace(compile_job(p, build_dir, ctx.spares()), json_in_memory=True)
        if inputs.may_read_in_place(p.inputs, p.env):
            job = dataclasses.replace(job, depfile=build_dir / ".deps.d")
        names = _reserved_names(p, job)
        result = p.backend.compile(dataclasses.replace(job, meanwhile=lambda: reserved.make(names)))
        if not p.backend.still_runs(p.identity):  # the key names another compiler
            _release(lock, hold, reserved)
            return _compiler_changed(p, ctx, result)
        stale = inputs.reads_not_hashed(
            p.inputs, p.backend, p.identity, job, build_dir / SOURCES_DIR
        )
        if stale:  # the bytes compiled are not all the bytes hashed: never cache them
            _release(lock, hold, reserved)
            if p.inputs.sent:
                raise CompileError(inplace.refusal(p.request.origin, stale[0]))
            return _uncached(p, ctx, result, stale)
        files, main = _payload(p, result, ctx.pending_dir())
    except BaseException:
        _release(lock, hold, reserved)
        raise
    return Pending(
        p,
        files,
        main,
        lock,
        hold,
        ctx.lock_timeout_s,
        ctx.config_sections,
        ctx.events,
        ctx.remotes,
        reserved,
    )


def _reserved_names(p: Prepared, job: CompileJob) -> list[str]:
    """The files a publish of ``p`` makes in its chip folder, in the order they are made
    while its compiler runs (:class:`cachemgr.storage.madeahead.Reserved`): the binary, the
    main json, then the header manifest."""
    names = [p.backend.binary_path(job).name, f"{p.kernel}.json"]
    if p.manifest_path.parent == p.chip_dir:
        names.append(p.manifest_path.name)
    return names


def _release(lock: EntryHold, hold: Hold, reserved: madeahead.Reserved) -> None:
    """Give up a compile's publish: its files made ahead closed (never named: gone), then
    its entry lock and chip hold released."""
    reserved.close()
    lock.release()
    hold.release()


def _hold_entry(p: Prepared, ctx: RunContext) -> EntryHold:
    """``p``'s entry lock, in its chip folder opened once — made when missing, no link
    followed (docs/security.md item 1). The lock keeps that descriptor while it is held: the
    locked lookup, the publish and the header manifest work relative to it (the folder the
    lock is in), not through another walk from the cache root.

    :raises LockBusyError, OSError: see :meth:`cachemgr.storage.store.Store.hold`.
    """
    folder = SafeDir.open_chip(p.chip_dir, create=True)
    try:
        return chip_store(p.chip_dir, ctx.lock_timeout_s, ctx.events).hold(p.kernel, None, folder)
    except BaseException:
        folder.close()  # idempotent: the lock closed it already when it could not be taken
        raise


def _remote_hit(p: Prepared, ctx: RunContext, lock: EntryHold) -> CompileOutcome | None:
    """On a local miss, ask the remote tiers (under the entry lock we hold,
    so one fetch per kernel per host). A hit arrives verified (blob digest, every part's
    sha256, caps, names: :mod:`cachemgr.remote.blob`), is published into the chip folder
    the way every entry is (json last; each binary checked against its json,
    docs/design.md#writing-and-reading-an-entry), then served from there. Any failure is a miss: the
    kernel compiles. A ``force`` request is not answered from a remote (it asks for a fresh compile;
    the remote's entry is replaced by its upload — ``force`` clears the local chip folder only)."""
    if ctx.remotes is None or p.decision.cache.clear_first:
        return None
    got = ctx.remotes.fetch(p.chip_dir.name, p.kernel)
    if got is None:
        return None
    item, name = got
    local = LocalTier(p.chip_dir.parent, ctx.lock_timeout_s, ctx.events)
    try:
        local.put(item, held=lock)
    except InvalidInputError as exc:
        ctx.remotes.reject(name, p.chip_dir.name, p.kernel, str(exc))
        return None
    except (OSError, CachePermissionError, NoSpaceError) as exc:
        log.warning("%s: remote hit from %s not stored locally: %s", p.kernel, name, exc)
        return None
    found = local.check(p.chip_dir.name, p.kernel, held=lock)
    if not found.hit:
        return None
    ctx.remotes.note_local(p.chip_dir.parent, p.chip_dir.name, p.kernel)  # not sent back
    log.info("%s: remote hit from %s", p.kernel, name)
    return CompileOutcome(
        p.kernel, HIT, found.files, request=p.request.origin, tier=f"remote:{name}"
    )


def _uncached(
    p: Prepared, ctx: RunContext, result: CompileResult, stale: list[str]
) -> CompileOutcome:
    """A kernel compiled from files that changed or were not hashed: returned to the caller
    from the private output folder, not cached, with one warning line."""
    warning = (
        f"{p.kernel} compiled but not cached: {stale[0]} changed while it compiled (or was "
        "read without being hashed)"
    )
    return _kept_out(p, ctx, result, warning)


def _compiler_changed(p: Prepared, ctx: RunContext, result: CompileResult) -> CompileOutcome:
    """A kernel compiled after its compiler changed (a file it runs, or a link on the way):
    the binary is not the one its key names, so it is returned uncached with one warning;
    the next request is keyed by the new compiler (docs/compiling.md#the-compiler)."""
    warning = (
        f"{p.kernel} compiled but not cached: the compiler {p.identity.path} changed while "
        "it compiled"
    )
    return _kept_out(p, ctx, result, warning)


def _kept_out(p: Prepared, ctx: RunContext, result: CompileResult, warning: str) -> CompileOutcome:
    """A compiled kernel that must not be cached (``warning`` says why): its json written
    (it was kept in memory for a publish) and the kernel returned from the private output
    folder, the warning logged once (the outcome carries it: the caller prints it)."""
    log.info("%s", warning)
    result.write_json()
    return _outside_the_cache(p, ctx, result, warning)


def _ensure_ini(kernel_cache_dir: Path, sections: dict[str, Any]) -> None:
    """After a publish: create a missing ``op_cache.ini`` with the installed toolkit's stamps.
    GE purges a chip folder whose kernel cache has no ini
    (``te_cache_space_manager.cc`` ``DelCachedFiles``), so without it the next CANN process
    would wipe this entry. A failure is logged, never fails the publish."""
    if fsutil.lstat_or_none(kernel_cache_dir / "op_cache.ini") is not None:
        return
    try:
        versions.ensure_ini(kernel_cache_dir, versions.installed_versions(os.environ, sections))
    except (OSError, ConfigError, CachePermissionError) as exc:
        log.warning("could not create %s/op_cache.ini: %s", kernel_cache_dir, exc)


def _compile_alone(p: Prepared, ctx: RunContext, why: str = "") -> CompileOutcome:
    """The entry lock stayed held for ``ctx.lock_timeout_s``: the process (or host) compiling
    this kernel is stuck or very slow. Rather than fail, look once more, then compile here
    into the private output folder (``compiled``; the cache is not written: its lock is
    not ours). A second host waits for the first one's compile, up to a limit."""
    reason = why or (
        f"{chip_store(p.chip_dir).lock_path(p.kernel)} stayed locked for "
        f"{ctx.lock_timeout_s:g} s (another process compiling it?)"
    )
    return _compile_outside(p, ctx, reason)  # its one warning line says why


def _compile_outside(
    p: Prepared, ctx: RunContext, reason: str, warn: bool = True
) -> CompileOutcome:
    """Compile ``p`` into the private output folder, not the cache: ``compiled`` with
    ``cached: False`` and one warning line naming ``reason`` (a read-only
    or full root, or a lock never released, must not fail a compile that succeeds).

    :raises CompileError: the compile failed.
    """
    try:
        found = chip_store(p.chip_dir).lookup(p.kernel) if p.decision.cache.read else None
    except (OSError, CachePermissionError):
        found = None  # a folder we may not use: compile
    if found is not None and found.hit:
        return CompileOutcome(p.kernel, HIT, found.files, request=p.request.origin)
    if ctx.output_dir is not None:  # where the kernel will go: refused before compiling
        kernel_meta.check_output_dir(ctx.output_dir)
    result = p.backend.compile(compile_job(p, ctx.build_dir()))
    warning = f"{p.kernel} compiled but not cached: {reason}"
    if warn:
        log.info("%s", warning)  # the outcome carries it: the caller prints it once
    return _outside_the_cache(p, ctx, result, warning)


def _outside_the_cache(
    p: Prepared, ctx: RunContext, result: CompileResult, warning: str
) -> CompileOutcome:
    """Move a compiled kernel from its build folder into the private output folder (binary
    first, json last: a visible json means a whole kernel): ``compiled``, not cached.

    :raises OutputFolderError: the output folder cannot be made or written.
    """
    out = ctx.uncached_dir()
    binary, doc = out / result.binary.name, out / result.json_path.name
    with _output_folder(out, warning):
        fsutil.ensure_dir(out)
        _move(result.binary, binary)  # across filesystems too (the cwd is rarely on $TMPDIR's)
        _move(result.json_path, doc)
    return CompileOutcome(
        p.kernel,
        COMPILED,
        (doc, binary),
        request=p.request.origin,
        cached=False,
        warning=warning,
    )


@contextlib.contextmanager
def _output_folder(out: Path, warning: str) -> Iterator[None]:
    """Writing a kernel compiled outside the cache (``warning`` says why) into the output
    folder ``out``: an ``OSError`` there (a current directory the user cannot write, a full
    or read-only one) becomes one line naming both folders and what to do, not a raw
    ``[Errno 13]``.

    :raises OutputFolderError: ``out`` could not be made or written.
    """
    try:
        yield
    except OSError as exc:
        raise OutputFolderError(
            f"{warning}; the output folder {out} ({kernel_meta.OUTPUT_DIR_ORIGIN}) cannot "
            f"be written by user {fsutil.user_name()} either ({exc.strerror or exc}): give "
            "--out-dir a folder you can write, or run from one"
        ) from exc


def _move(src: Path, dest: Path) -> None:
    """Move a compiled file from the private build folder to ``dest`` — also across
    filesystems: the build folder is under ``$TMPDIR`` and ``dest`` in the caller's output
    folder (the current directory by default), usually another filesystem (``/tmp`` a tmpfs,
    the work in ``/home``). ``os.replace`` alone failed there with ``EXDEV``, and every
    compile outside the cache (a read-only or full root, a lock never released) with it.
    Across filesystems: a copy to a temp name beside ``dest``, then a rename (``dest`` is
    whole or absent).

    :raises OSError: ``dest``'s folder cannot be written.
    """
    try:
        os.replace(src, dest)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    tmp = fsutil.temp_path(dest)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        os.unlink(src)


#: errno of a cache that cannot take an entry now: read-only, full, over quota, or a root
#: that vanished (an NFS export gone: ESTALE).
CANNOT_STORE_ERRNOS = frozenset({errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ESTALE})


def _unusable_lock(exc: OSError) -> str:
    """Why a lock file could not be used: a member planted a folder (with something in it)
    under its name, or keeps replacing it (docs/security.md item 2). The kernel still
    compiles, outside the cache."""
    what = "is a folder" if isinstance(exc, IsADirectoryError) else "keeps being replaced"
    return f"{exc.filename} {what} where a lock file belongs; remove it"


def _cannot_store(exc: BaseException) -> bool:
    if isinstance(exc, NoSpaceError):
        return True
    return isinstance(exc, OSError) and exc.errno in CANNOT_STORE_ERRNOS


def _why(chip_dir: Path, exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno == errno.EROFS:
        return f"the cache folder {chip_dir} is on a read-only filesystem"
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return f"the cache folder {chip_dir}: {exc.strerror} ({free_words(chip_dir)})"
    if isinstance(exc, OSError):
        return f"the cache folder {chip_dir}: {exc.strerror or exc}"
    return str(exc)


def _payload(
    p: Prepared, result: CompileResult, pending: Path
) -> tuple[dict[str, Part], dict[str, Any]]:
    """The entry's files and main json (with ``supportInfo`` for a future package). The json
    is in memory (never written: ``json_in_memory``); the binary moves to a unique name in
    the private ``pending`` folder and is copied from there in chunks when published — never
    read whole (docs/daemon.md, "Bounded memory"). The build folder is emptied for the
    worker's next compile.

    :raises OSError: the binary cannot be moved.
    """
    binary = pending / f"{uuid.uuid4().hex}-{result.binary.name}"
    try:
        main = dict(result.doc)
        _move(result.binary, binary)
    finally:
        for path in (result.binary, result.json_path, *result.artefacts):
            fsutil.safe_unlink(path)
    impl = str(p.opts.extra.get("op_select_implmode", ""))
    main[precompiled.SUPPORT_INFO] = precompiled.signature(
        p.request, p.opts.deterministic, p.key, impl
    )
    return {result.binary.name: binary}, main


#: What ``force`` noted before waiting: entry → (device, inode) of its main json; loose
#: files and manifests by name.
Noted = tuple[dict[str, tuple[int, int]], set[str]]


def note_entries(chip_dir: Path) -> Noted:
    """The entries of ``chip_dir`` now (json identity) and its loose files and manifests,
    for :func:`clear_chip` (what in-flight compiles publish later stays)."""
    try:
        folder = SafeDir.open_chip(chip_dir)
    except FileNotFoundError:
        return {}, set()
    with folder:
        scan = entry.scan_chip(chip_dir, folder.fd)
        found: dict[str, tuple[int, int]] = {}
        for kernel in scan.entries:
            st = fsutil.lstat_or_none(chip_dir / f"{kernel}.json", folder.fd)
            if st is not None:
                found[kernel] = (st.st_dev, st.st_ino)
    return found, set(scan.orphans) | set(scan.manifests)


def clear_chip(chip_dir: Path, lock_timeout_s: float, noted: Noted | None = None) -> int:
    """Remove the entries of a chip folder (``force``, docs/design.md#cache-modes), json first, each
    under its entry lock; loose binaries and header manifests too. Lock files and ``*.temp`` of
    writers in progress stay. With ``noted`` (:func:`note_entries`) only what was noted goes: an
    entry whose json changed since (published by an in-flight compile) stays.

    The caller holds the chip lock exclusive. :returns: the number of entries removed.
    """
    try:
        folder = SafeDir.open_chip(chip_dir)  # one descriptor for the whole clear
    except FileNotFoundError:
        return 0
    with folder:
        store = chip_store(chip_dir, lock_timeout_s, dir_fd=folder.fd)
        scan = entry.scan_chip(chip_dir, folder.fd)
        removed = 0
        for kernel in sorted(scan.entries):
            if noted is not None:
                st = fsutil.lstat_or_none(chip_dir / f"{kernel}.json", folder.fd)
                if st is None or noted[0].get(kernel) != (st.st_dev, st.st_ino):
                    continue
            store.remove(kernel, manifests=False)  # every manifest goes below
            removed += 1
        for name in sorted(scan.orphans):
            if noted is None or name in noted[1]:
                store.remove_orphan(name)
        for name in sorted(scan.manifests):
            if noted is None or name in noted[1]:
                fsutil.safe_unlink(chip_dir / name, folder.fd)
    log.info("force: cleared %d entries of %s", removed, chip_dir)
    return removed
