"""Writing the direct memo of a ``cachemgr compile`` hit (:mod:`cachemgr.direct`, which
reads it and says what it holds and why that is enough).

The full path calls :func:`record` after it printed a hit. The request is prepared again
(its source and headers hashed, the header manifest matched, the compiler identified: as
for the hit itself) and the memo lists what that preparation read; a memo is written only
for the plain case the lean path reproduces exactly — the local route with no daemon
passed by, default verbosity, one request, a hit from the chip folder, no warning, no note,
no remote tier, no precompiled binary looked for first, no debug, no ``force``, headers
from the manifest (no dependency listing) — and never when anything differs between the
hit and this second preparation. The request file, the config file and ``op_cache.ini``
are bound by the bytes the run parsed (:mod:`cachemgr.parsedfiles`), never read again
here: one rewritten meanwhile must not tie its new bytes to the old hit. Best effort: a
memo that cannot be written costs only the next hit its speed (one debug line).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import marshal
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cachemgr import direct, parsedfiles
from cachemgr.compile import build, keys, pipeline
from cachemgr.compile.queue import CompileOutcome, CompileQueue
from cachemgr.compile.request import CompileRequest
from cachemgr.compile.results import Status
from cachemgr.compilers import stamp
from cachemgr.compilers.base import identity_cache_file
from cachemgr.config.options import Settings
from cachemgr.console import VERBOSITY
from cachemgr.constants import VERSION
from cachemgr.storage import entry, fsutil, manifest, secretfile

if TYPE_CHECKING:
    from cachemgr.cli.common import Route
    from cachemgr.client import Client

log = logging.getLogger(__name__)

#: The ``argv`` ``cachemgr.main`` started the click CLI with (None: click was called
#: another way, e.g. by a test's runner, and no memo is written).
ARGV: list[str] | None = None
#: Languages whose compiler is found on ``PATH`` alone (covered by the ``PATH`` folders'
#: status); nvcc's own search order also looks in fixed folders.
LANGUAGES = ("c", "cpp", "cce")


class WarningCount(logging.Handler):
    """Counts the warnings logged during a run: a run that logged one gets no memo (the lean
    path would not print it)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def record(
    request: CompileRequest,
    request_path: Path,
    outcome: CompileOutcome,
    doc: dict[str, Any] | None,
    queue: CompileQueue,
    socket: str | None,
) -> None:
    """Write the memo of the hit ``outcome`` (of ``request`` from ``request_path``) when it
    is the plain case (module docstring); ``doc`` is the ``--json`` object printed (None for
    text), ``socket`` the default socket whose absence routed the run here (None: routed
    here whatever is there). Never raises."""
    if ARGV is not None and VERBOSITY.level == 0 and outcome.status == Status.HIT:
        _written(request_path, lambda: _memo(request, request_path, outcome, doc, queue, socket))


def _memo(
    request: CompileRequest,
    request_path: Path,
    outcome: CompileOutcome,
    doc: dict[str, Any] | None,
    queue: CompileQueue,
    socket: str | None,
) -> dict[str, Any] | None:
    """The memo's content, or None when the hit is not the plain case."""
    settings = queue.settings
    if not _plain_outcome(outcome) or settings.problems or request.language not in LANGUAGES:
        return None
    compilers = keys.Compilers.of(settings)
    p = pipeline.prepare(request, settings, compilers, pipeline.JobOptions(queue.timeout_s))
    if not _plain(p, outcome):
        return None
    jsons, binaries, header = _entry(p.chip_dir, p.kernel)
    kcache = str(p.chip_dir.parent)
    return {
        **_checks(request, request_path, p, settings, compilers),
        "route": "local",
        "modes": [[f, direct.folder_mode(f)] for f in (str(p.chip_dir.parent.parent), kcache)]
        + [[str(p.chip_dir), direct.folder_mode(str(p.chip_dir))]],
        "socket": socket,
        "kernel_cache": kcache,
        "jsons": jsons,
        "binaries": binaries,
        "header": header,
        "manifest": [p.manifest_path.name, _chip_digest(p.chip_dir, p.manifest_path.name)],
        "doc": _plain_types(doc),
    }


def _plain_outcome(outcome: CompileOutcome) -> bool:
    """A hit with files and nothing more to say (no warning, note, remote tier)."""
    return bool(
        outcome.status == Status.HIT
        and outcome.files
        and not (outcome.warning or outcome.note or outcome.coalesced)
        and outcome.tier in (None, "local")
    )


def _plain(p: build.Prepared, outcome: CompileOutcome) -> bool:
    """``p`` (prepared again) is the plain case and names ``outcome``'s entry."""
    d = p.decision
    plain = d.cache.read and d.cache.write and not d.binary_first and not d.debug.on
    if not plain or d.cache.clear_first or d.cache.replace or p.scanned or p.note:
        return False
    if p.kernel != outcome.kernel_name or outcome.files[0].parent != p.chip_dir:
        return False
    if p.opts.op_debug_config or p.inputs.uncached or p.inputs.headers is None:
        return False
    return p.manifest_path.parent == p.chip_dir


def _checks(
    request: CompileRequest,
    request_path: Path,
    p: build.Prepared,
    settings: Settings,
    compilers: keys.Compilers,
    local: Settings | None = None,
) -> dict[str, Any]:
    """The memo's checks of the world (:mod:`cachemgr.direct`): the request, the inputs, the
    files the settings were read from (``local``'s, the command's own, when given: a
    daemon's settings are checked by its answer), the places searched in vain, the
    compiler."""
    files: list[list[Any]] = [[str(request.kernel_source), p.inputs.source_sha256]]
    files += [[path, digest] for path, digest in sorted((p.inputs.headers or {}).items())]
    # through a daemon its settings are the digest of its answer, its files not ours to read
    own = settings if local is None else local
    # the config and the ini as this run parsed them, not as they are now
    for path in sorted({str(f) for f in (own.config.path, own.value("ini_path")) if f}):
        files.append([path, _parsed_digest(path)])
    identity = str(identity_cache_file())
    files.append([identity, _digest_or_absent(identity)])
    ident = compilers.identity(request.language)
    mode = stamp.check_mode(settings.sections.get("compilers", {}))
    # every file the compiler runs, and each name it is reached by resolved as now: a link
    # flipped on the way (a toolchain's ``current``, the compiler behind ccache) is a decline
    tools = stamp.named_files(ident.path)
    stats = [[real, direct.file_state(real)] for _, real in tools]
    name = os.path.basename(ident.path)
    searched = os.environ.get("PATH", os.defpath).split(os.pathsep)
    searched += [f for f in os.environ.get("CCACHE_PATH", "").split(os.pathsep) if f]
    for folder in searched:
        stats.append([folder, direct.file_state(folder)])
        stats.append([os.path.join(folder, name), direct.file_state(os.path.join(folder, name))])
    return {
        "format": direct.FORMAT,
        "earlier": _earlier_variants(p),
        "requests": [_request_check(request_path)],
        "files": files,
        "absent": sorted(p.inputs.absent),
        "stats": stats,
        "links": [[named, real] for named, real in tools],
        "compiler_check": mode,
        "chip_dir": str(p.chip_dir),
        "kernel": p.kernel,
    }


def _earlier_variants(p: build.Prepared) -> list[list[Any]]:
    """The header manifest's variants before the one ``p`` matched, each as ``[files,
    absent]``: :func:`cachemgr.storage.manifest.match` takes the first that matches, so a
    direct hit needs each of them still not matching.

    :raises ValueError: ``p``'s headers are no variant of the manifest (no memo then).
    """
    variants = manifest.read(p.manifest_path)
    mine = (dict(p.inputs.headers or {}), tuple(sorted(set(p.inputs.absent))))
    for i, variant in enumerate(variants):
        if (dict(variant.files), tuple(sorted(set(variant.absent)))) == mine:
            return [[sorted(v.files.items()), sorted(v.absent)] for v in variants[:i]]
    raise ValueError("the headers are no variant of the manifest")


def _plain_types(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """``doc`` in plain types for marshal (the status is a str subclass), as printed."""
    return None if doc is None else dict(json.loads(json.dumps(doc)))


def record_daemon(
    client: Client,
    where: Route,
    local: Settings,
    sent: tuple[Path, dict[str, Any], str, Path],
    outcome: CompileOutcome,
    doc: dict[str, Any] | None,
    overrides: dict[str, Any],
) -> None:
    """Write the memo of a hit through the daemon (:mod:`cachemgr.directwire`): ``sent`` is
    the request file, the request sent (options merged), its base folder and the output
    folder; ``outcome`` the daemon's answer as the client typed it (before the request file
    was put in), ``doc`` the ``--json`` object printed. Never raises."""
    if ARGV is not None and VERBOSITY.level == 0 and not where.notice and _plain_outcome(outcome):
        _written(sent[0], lambda: _daemon_memo(client, where, local, sent, outcome, doc, overrides))


def _written(request_path: Path, make: Callable[[], dict[str, Any] | None]) -> None:
    """Write the memo ``make()`` gives (None: none) under this run's fingerprint; any error
    is one debug line (best effort: the hit was answered already)."""
    if ARGV is None:
        return
    try:
        memo = make()
        if memo is not None:
            write(direct.fingerprint(ARGV, VERSION), memo)
    except Exception as exc:
        log.debug("no direct memo for %s: %s", request_path, exc)


def _daemon_memo(
    client: Client,
    where: Route,
    local: Settings,
    sent: tuple[Path, dict[str, Any], str, Path],
    outcome: CompileOutcome,
    doc: dict[str, Any] | None,
    overrides: dict[str, Any],
) -> dict[str, Any] | None:
    """The daemon-route memo's content, or None when it is not the plain case."""
    from cachemgr import directwire, sockcheck
    from cachemgr.compile import environment

    path, data, base, out_dir = sent
    if os.path.dirname(parsedfiles.seen(str(path))[0]) != base:
        return None  # the base folder sent is not the folder of the bytes parsed
    side = client._side  # the client's own preparation: what it sent is computed there
    settings, compilers = side._state()
    p = side.prepare(data, base)
    if p is None or not _plain(p, outcome) or p.request.language not in LANGUAGES:
        return None
    if settings.problems or client._output_target(p, out_dir) is not None:
        return None
    wire = side.wire_inputs(p, data, base)
    if wire.get("op_debug_config") is not None:
        return None
    items = [wire["source"], *wire["headers"]]
    wire_files = [[i["path"], direct.sha256_hex(base64.b64decode(i["data"]))] for i in items]
    texts = directwire.recorded_data([i["data"] for i in items])
    wire["source"] = {"path": items[0]["path"], "data": texts[0]}
    wire["headers"] = [
        {"path": i["path"], "data": t} for i, t in zip(items[1:], texts[1:], strict=True)
    ]
    body = {
        "request": dict(data),
        "base_dir": base,
        "wait": True,
        "priority": 0,
        "replace": False,
        "compile_env": environment.from_caller(os.environ, os.getcwd()),
        "session": directwire.SESSION,
        "deliver": False,
        "inputs": wire,
    }
    daemon_user = local.sections.get("daemon", {}).get("user") or None
    trusted = sorted(sockcheck.trusted_uids(daemon_user if isinstance(daemon_user, str) else None))
    socket = str(where.socket)
    config, _ = side.config_answer()  # the one the route and the preparation used
    answer = _plain_types(outcome.to_json()) or {}
    answer.pop("seconds", None)
    return {
        **_checks(p.request, path, p, settings, compilers, local),
        "route": "daemon",
        "modes": [],  # the daemon writes the cache, not this process
        "socket": socket,
        "reason": where.reason,
        "trusted": trusted,
        "config_answer": directwire.config_digest(config),
        "body": json.dumps(body),
        "wire_files": wire_files,
        "answer": answer,
        "doc": _plain_types(doc),
        "parts": " ".join(f.name.removeprefix(outcome.kernel_name) for f in outcome.files),
        "overrides": _plain_types(overrides),
        "out_dir": str(out_dir),
    }


def _request_check(request_path: Path) -> list[str]:
    """``[the request path as given, the real path it was read at, the SHA-256 of the bytes
    parsed]``: a direct hit needs the path to resolve to the same file (its folder is the
    base of every relative path of the request) holding those bytes.

    :raises LookupError: the run did not parse it once, from one place, in one content.
    """
    read, data = parsedfiles.seen(str(request_path))
    if data is None:
        raise LookupError(f"request {request_path}: no bytes parsed")
    return [str(request_path), read, hashlib.sha256(data).hexdigest()]


def _parsed_digest(path: str) -> str | None:
    """The SHA-256 of the bytes this run parsed from ``path`` (None: it parsed its absence).

    :raises LookupError: the run did not parse it, or parsed two contents.
    """
    read, data = parsedfiles.seen(path)
    if read != path:
        raise LookupError(f"{path} was read at {read}")
    return None if data is None else hashlib.sha256(data).hexdigest()


def _digest_or_absent(path: str) -> str | None:
    """The file's digest; None when it does not exist.

    :raises ValueError: it exists but cannot be read as an input (no memo then).
    """
    if not os.path.lexists(path):
        return None
    digest = direct.input_digest(path)
    if digest is None:
        raise ValueError(f"{path} cannot be read")
    return digest


def _chip_digest(chip_dir: Path, name: str) -> str:
    """SHA-256 of a file of the chip folder, read as the entry readers read."""
    return hashlib.sha256(fsutil.read_bytes_noatime(chip_dir / name, single_link=True)).hexdigest()


def _entry(chip_dir: Path, kernel: str) -> tuple[list[list[str]], list[list[str]], str | None]:
    """The entry's jsons with their bytes' digests, its binaries with the digests their
    jsons name, and its optional header — from one read of each json, parsed as a hit parses
    it.

    :raises OSError, CacheMgrError: the entry cannot be read or is bad now.
    """
    seen: dict[str, bytes] = {}

    def read(name: str) -> bytes:
        seen[name] = fsutil.read_bytes_noatime(
            chip_dir / name, single_link=True, max_bytes=entry.MAX_JSON_BYTES
        )
        return seen[name]

    desc = entry.parse_entry(chip_dir, kernel, read=read)
    problems = entry.verify_entry(chip_dir, desc)
    if problems:
        raise ValueError(problems[0].detail)
    names = [desc.json_name, *desc.sub_jsons]
    jsons = [[n, hashlib.sha256(seen[n]).hexdigest()] for n in names]
    binaries = [[b.bin_name, b.sha256] for b in desc.binaries]
    return jsons, binaries, desc.header


def write(name: str, memo: dict[str, Any]) -> None:
    """Write ``memo`` as ``<memo folder>/<name>.memo`` (:mod:`marshal`): a private folder
    (``0700``, made here) and file (``0600``), replaced atomically; beyond
    :data:`direct.MAX_MEMOS` the oldest memos go, and so do leftover temp files
    (:func:`_prune`).

    :raises OSError: the folder is not this user's own, or the write failed.
    """
    folder = direct.memo_dir()
    secretfile.ensure_private_dir(Path(folder))  # and its parents 0700
    st = os.lstat(folder)
    if st.st_uid != os.geteuid() or not os.path.isdir(folder) or os.path.islink(folder):
        raise OSError(f"{folder} is not this user's own folder")
    if st.st_mode & 0o077:
        os.chmod(folder, 0o700)
    data = marshal.dumps(memo)
    dest = Path(folder) / f"{name}{direct.MEMO_SUFFIX}"
    fsutil.atomic_write_bytes(dest, data, mode=0o600, sync=False)
    _prune(folder)


#: A memo's temp file older than this (seconds) is a leftover whatever wrote it.
STALE_TEMP_S = 3600.0


def _prune(folder: str) -> None:
    """Keep the newest :data:`direct.MAX_MEMOS` memos, and remove the temp files of writes
    that can never finish: made by a process of this host that is gone (a ``kill -9``
    between the write and the rename), or older than :data:`STALE_TEMP_S`."""
    with os.scandir(folder) as it:
        entries = [e for e in it if e.is_file(follow_symlinks=False)]
    now = time.time()
    for e in entries:
        if e.name.endswith(fsutil.TEMP_SUFFIX) and (
            fsutil.temp_writer_dead(e.name)
            or now - e.stat(follow_symlinks=False).st_mtime > STALE_TEMP_S
        ):
            fsutil.safe_unlink(Path(e.path))
    memos = [e for e in entries if e.name.endswith(direct.MEMO_SUFFIX)]
    if len(memos) <= direct.MAX_MEMOS:
        return
    memos.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime_ns)
    for old in memos[: len(memos) - direct.MAX_MEMOS]:
        fsutil.safe_unlink(Path(old.path))
