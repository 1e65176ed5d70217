"""``cachemgr compile`` (an in-process compile queue) and ``cachemgr pack``."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from cachemgr import parsedfiles
from cachemgr.cli import directrecord, human
from cachemgr.cli.common import (
    Route,
    Seconds,
    chip_dirs,
    emit_json,
    int_option,
    load_settings,
    remote_option,
    report_line,
    route,
    settings_options,
    socket_option,
    warning,
)
from cachemgr.cli.lockcheck import checked_for_writing
from cachemgr.compile.queue import DEFAULT_TIMEOUT_S, CompileOutcome, CompileQueue
from cachemgr.compile.request import CompileRequest, load_request
from cachemgr.compile.results import Status
from cachemgr.config.configfile import MAX_WORKERS
from cachemgr.errors import CacheMgrError, InvalidInputError
from cachemgr.storage import safeio
from cachemgr.storage.counters import RUN_END_WAIT_S, CounterBook

if TYPE_CHECKING:  # the hit path imports only what a hit needs
    from concurrent.futures import Future

    from cachemgr.client import Client
    from cachemgr.config.options import Settings


def _setting_flags(func: Any) -> Any:
    """Options that override the configuration for every request (a request's own
    ``options`` still win)."""
    for deco in reversed(
        [
            click.option("--cache-dir", "op_compiler_cache_dir", metavar="DIR", help="Cache root."),
            click.option("--host-id", metavar="ID", help="Host id (ASCEND_CACHE_PATH layout)."),
            click.option(
                "--config",
                "config_file",
                type=click.Path(dir_okay=False, path_type=Path),
                help="TOML config file (env CACHEMGR_CONFIG).",
            ),
            click.option(
                "--mode",
                "op_compiler_cache_mode",
                type=click.Choice(["enable", "disable", "force"]),
                help=(
                    "op_compiler_cache_mode. enable (default): use a verified entry, else "
                    "compile and store. disable: neither read nor write the cache (kernels "
                    "go to --out-dir). force: clear the chip folder once, safely, then "
                    "compile and store."
                ),
            ),
            click.option(
                "--jit-compile",
                metavar="auto|true|false",
                help=(
                    "jit_compile. auto (default): a static shape is compiled, a dynamic one "
                    "(a dim -1, or shape [-2]) takes a precompiled binary first. true: always "
                    "compile (through the cache). false: a precompiled binary first, compile "
                    "only when none matches. GE's 2/1/0 and ACL's enable/disable also work."
                ),
            ),
            click.option(
                "--op-debug-level",
                metavar="0..4",
                help=(
                    "op_debug_level. 0 (default): no debug. 1: debug instrumentation; keeps "
                    ".o .json .cce *_loc.json in kernel_meta. 2: as 1, plus -O0 -g. 3: keeps "
                    ".o .json. 4: keeps .o .json .cce *_compute.json. Any level but 0 "
                    "bypasses the cache."
                ),
            ),
            click.option(
                "--op-debug-config",
                metavar="CFG",
                help=(
                    "op_debug_config: a .cfg file with one line 'op_debug_config = a,b' "
                    "(oom, dump_bin, dump_cce, dump_loc, ccec_O0, ccec_g, check_flag); it "
                    "bypasses the cache, for the ops of an op_debug_list= line when it has one."
                ),
            ),
            click.option(
                "--debug-dir",
                metavar="DIR",
                help=(
                    "Where kernel_meta/ with the debug artefacts goes (default "
                    "$ASCEND_WORK_PATH, else the current folder)."
                ),
            ),
        ]
    ):
        func = deco(func)
    return func


#: The request format, for ``compile --help`` (the schema's installed path included).
COMPILE_HELP = f"""Compile the kernels of REQUEST.json files, each once: a verified hit,
a precompiled binary, a compile, or a debug compile.

Runs through the daemon that serves this cache, else in this process
(see --socket, --local).

Exit codes: 0 every request answered; 1 a compile failed; 2 a request is invalid
(and none failed) or a bad option.

\b
A request is one JSON object (relative paths are relative to its file):
  {{
    "op_type": "Add",                 CANN operator type
    "soc_version": "Ascend910B1",     the chip (its chip folder)
    "language": "c",                  c, cpp (gcc/clang), cuda (nvcc), cce
    "kernel_source": "add.c",
    "kernel_entry": "add_kernel",
    "inputs":  [{{"shape": [4096], "dtype": "float32", "format": "ND"}}],
    "outputs": [{{"shape": [4096], "dtype": "float32", "format": "ND"}}],
    "attrs": {{}},                      operator attributes
    "defines": {{"N": 4096}},           -DN=4096
    "include_dirs": ["include"],      -I folders, in order
    "extra_flags": ["-O3"],           allowed compiler flags (-D -U -I -O -f -m -std= -W -g)
    "options": {{"jit_compile": "auto"}}  any option below; these win
  }}
A shape dim of -1 is dynamic; the shape [-2] is an unknown rank.
Schema: {Path(__file__).parents[1] / "schemas" / "compile_request.schema.json"}
Examples: examples/requests/ in the source tree.

\b
Key: everything that changes the binary - op, shapes, dtypes, formats, attrs, soc,
defines, include_dirs, extra_flags, options, the compiler and its flags, the source and
every header it reads (system headers: the compiler's identity). The bytes hashed are the
bytes compiled: the files are read once, by this process, and compiled from that copy.
Header manifests (<chip folder>/*.manifest) list each kernel's headers with their
SHA-256 and the places searched in vain before each (a header created there is a
miss), so a hit never runs the preprocessor; a miss lists them first (-M). .incbin
data is keyed; a name cachemgr cannot resolve compiles the kernel uncached.

\b
--mode force: clears the chip folder once per run of this command (also through the
daemon), waiting for compiles in flight, whose fresh results are kept; then compiles.
Switch back to enable afterwards. --replace recompiles only these entries.

\b
Direct mode: a repeated hit is answered from a memo in $XDG_CACHE_HOME/cachemgr/direct/
(yours, at most 512), every input re-checked first; CACHEMGR_DIRECT=0 turns it off,
rm -rf ~/.cache/cachemgr/direct clears it.

\b
Outputs: debug artefacts go to <base>/kernel_meta/<host>_<pid>/, base = --debug-dir >
$ASCEND_WORK_PATH > the current directory; --mode disable kernels to --out-dir. Both are
written by this process, as you, also when the daemon compiles; a folder you cannot write
is refused before compiling.
"""


@click.command(
    "compile",
    help=COMPILE_HELP,
    short_help="Compile the kernels of REQUEST.json files, each only once.",
)
@click.argument("requests", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per request (a line).")
@_setting_flags
@click.option("--workers", metavar="N", help=f"Compile threads, 1..{MAX_WORKERS} (default: CPUs).")
@click.option(
    "--timeout",
    "timeout_s",
    type=Seconds(0, lo_open=True),
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    help="Seconds per compiler process; on timeout its process group is killed.",
)
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    help="Where kernels compiled without the cache (mode disable) go.",
)
@click.option(
    "--binaries",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help=(
        "A package of precompiled kernels in CANN's layout (config/<soc>/<op>.json, "
        "<soc>/<op>/<Op>_<hash>.json/.o); repeatable."
    ),
)
@click.option("--replace", is_flag=True, help="Recompile and replace these entries.")
@remote_option
@socket_option
def compile_cmd(
    requests: tuple[Path, ...],
    as_json: bool,
    socket_path: Path | None,
    run_local: bool,
    workers: str | None,
    timeout_s: float,
    out_dir: Path,
    binaries: tuple[Path, ...],
    replace: bool,
    remotes: tuple[str, ...],
    op_compiler_cache_dir: str | None,
    host_id: str | None,
    config_file: Path | None,
    **overrides: Any,
) -> None:
    """Compile REQUEST.json files (help: :data:`COMPILE_HELP`)."""
    n_workers = int_option(workers, "--workers", 1, MAX_WORKERS)
    extra = {k: v for k, v in overrides.items() if v is not None}
    settings = load_settings(op_compiler_cache_dir, host_id, None, config_file, **extra)
    where = route(socket_path, run_local, settings, _local_only_option(click.get_current_context()))
    where.announce()
    if where.client is not None:
        sys.exit(
            _compile_via_daemon(
                where.client, where, requests, extra, replace, as_json, out_dir, settings
            )
        )
    cli_values = {
        "op_compiler_cache_dir": op_compiler_cache_dir,
        "host_id": host_id,
        "soc_version": None,
        **extra,
    }
    checked = checked_for_writing(settings, cli_values, config_file)  # as the daemon
    # a run on a fallback cache (its note printed) gets no direct memo
    memo_ok = checked.layout.kernel_cache_dir == settings.layout.kernel_cache_dir
    settings = checked
    # the counters live in the cache (docs/commands.md#what-stats-counts); a run answered by
    # precompiled binaries alone made no kernel cache folder: the flush makes it
    counters = CounterBook(lambda: settings.layout.kernel_cache_dir, create=True)
    from cachemgr.remote import config as remote_config

    remote_cfg = remote_config.from_settings(settings, list(remotes))
    tiers = None
    if remote_cfg.remotes:  # the tiers' clients only when configured (a lean hit)
        from cachemgr.daemon.state import remotes_state_dir
        from cachemgr.remote.tierset import RemoteTiers

        tiers = RemoteTiers.from_config(remote_cfg, remotes_state_dir())
    queue = CompileQueue(
        settings,
        n_workers,
        timeout_s=timeout_s,
        output_dir=out_dir,
        binary_dirs=binaries,
        tally=counters.tally,
        remotes=tiers,
    )
    try:
        sys.exit(_compile_here(queue, requests, replace, as_json, where, memo_ok))
    finally:
        queue.close()
        if tiers is not None:  # the uploads queued by this run go, if they can go soon
            from cachemgr.remote.tierset import EXIT_WAIT_S

            counters.add("remote_uploads_dropped_at_exit", tiers.close(wait_s=EXIT_WAIT_S))
        counters.save(wait_s=RUN_END_WAIT_S)  # a held stats lock costs a run seconds


def _compile_here(
    queue: CompileQueue,
    requests: tuple[Path, ...],
    replace: bool,
    as_json: bool,
    where: Route,
    memo_ok: bool = True,
) -> int:
    """Submit every request to the in-process queue, then report each in order (a progress
    bar on a terminal). Returns the exit code: 1 if any failed, 2 if any was invalid. A
    plain hit of a single request leaves its direct memo (:mod:`cachemgr.cli.directrecord`)
    unless ``memo_ok`` is False or the run warned."""
    bad_input, failed = 0, 0
    futures: list[tuple[Path, Future[CompileOutcome] | CacheMgrError]] = []
    loaded: list[CompileRequest] = []
    warned = directrecord.WarningCount()
    logging.getLogger().addHandler(warned)
    for path in requests:
        try:
            loaded.append(load_request(path))
            futures.append((path, queue.submit(loaded[-1], replace=replace)))
        except CacheMgrError as exc:
            futures.append((path, exc))
    with human.progress(human.bars_enabled(as_json), "compile", len(futures), "kernel") as bar:
        for path, fut in futures:
            if isinstance(fut, CacheMgrError):
                bad_input += isinstance(fut, InvalidInputError)
                failed += not isinstance(fut, InvalidInputError)
                _report_error(path, str(fut), as_json, where)
            else:
                outcome = fut.result()
                failed += not outcome.ok
                doc = _report(outcome, as_json, where)
                plain = memo_ok and not replace and not where.notice and not warned.count
                if plain and len(requests) == 1:
                    directrecord.record(loaded[0], path, outcome, doc, queue, _absent_socket(where))
            bar.update(1)
    logging.getLogger().removeHandler(warned)
    return 1 if failed else 2 if bad_input else 0


def _absent_socket(where: Route) -> str | None:
    """The default socket whose absence routed the run here; None when it was routed here
    whatever is there (``--local``, an in-process-only option)."""
    if where.reason.startswith("no daemon answers at the default socket"):
        from cachemgr.client import default_socket_path

        return str(default_socket_path())
    return None


#: Options that only an in-process queue honours: given on the command line, they route
#: the compile here (with an explicit ``--socket`` they are an error). ``--out-dir`` is not
#: one: the daemon hands ``disable`` kernels back and this process writes them there.
LOCAL_ONLY = ("workers", "timeout_s", "binaries", "remotes")


def _local_only_option(ctx: click.Context) -> str | None:
    """The first in-process-only option given on the command line (``--workers``…), or None.

    Decided by whether the option was given, never by comparing its value with the default.
    """
    for param in ctx.command.params:
        if param.name in LOCAL_ONLY:
            source = ctx.get_parameter_source(param.name)
            if source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
                return param.opts[0] if isinstance(param, click.Option) else param.name
    return None


def _compile_via_daemon(
    client: Client,
    where: Route,
    requests: tuple[Path, ...],
    overrides: dict[str, Any],
    replace: bool,
    as_json: bool,
    out_dir: Path,
    local: Settings | None = None,
) -> int:
    """Send the requests to the daemon at once (its pool compiles them in parallel) and
    report each in order; command-line options fill what a request's own ``options`` leave
    unset, with relative paths made absolute here (the daemon has another cwd). Kernels
    compiled without the cache (``disable``) come back and are written to ``out_dir`` by
    this process, as the caller. Returns the exit code: 1 if any failed, 2 if any was
    invalid. A plain hit of a single request leaves its direct memo when ``local`` (this
    command's settings) is given (:func:`cachemgr.cli.directrecord.record_daemon`)."""
    given = dict(overrides)
    out_dir = out_dir.absolute()
    for name in ("op_debug_config", "debug_dir"):
        if overrides.get(name):
            overrides[name] = str(Path(overrides[name]).absolute())
    import uuid
    from concurrent.futures import ThreadPoolExecutor, as_completed

    session = uuid.uuid4().hex  # force clears once per run, as in-process

    def one(path: Path) -> CompileOutcome | CacheMgrError:
        try:
            resolved = path.resolve()  # once: the bytes and the base folder from one file
            # non-blocking, regular files only, capped: like every request file
            raw = safeio.read_regular(resolved)
            parsedfiles.note(str(path), raw, str(resolved))  # what a direct memo binds to
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict):
                raise InvalidInputError(f"request {path}: a request must be a JSON object")
            data["options"] = {**overrides, **(data.get("options") or {})}
            sent[path] = (path, data, str(resolved.parent), out_dir)
            return client.compile(
                data,
                base_dir=resolved.parent,
                replace=replace,
                session=session,
                out_dir=out_dir,
            )
        except OSError as exc:
            return InvalidInputError(f"request {path}: cannot read ({exc.strerror})")
        except ValueError as exc:
            return InvalidInputError(f"request {path}: malformed JSON: {exc}")
        except RecursionError:
            return InvalidInputError(f"request {path}: JSON nested too deeply")
        except CacheMgrError as exc:
            return exc

    sent: dict[Path, tuple[Path, dict[str, Any], str, Path]] = {}
    bad_input, failed = 0, 0
    bars = human.bars_enabled(as_json)
    with (
        ThreadPoolExecutor(max_workers=min(32, len(requests))) as pool,
        human.progress(bars, "compile", len(requests), "kernel") as bar,
    ):
        pending = [pool.submit(one, path) for path in requests]
        for _done in as_completed(pending):
            bar.update(1)
        answers = [f.result() for f in pending]
    for path, answer in zip(requests, answers, strict=True):
        if isinstance(answer, CacheMgrError):
            bad_input += answer.exit_code == 2
            failed += answer.exit_code != 2
            message = str(answer).replace("/compile request", f"request {path}")
            if str(path) not in message:
                message = f"request {path}: {message}"
            _report_error(path, message, as_json, where)
            continue
        failed += not answer.ok
        doc = _report(dataclasses.replace(answer, request=str(path)), as_json, where)
        if local is not None and len(requests) == 1 and not replace and path in sent:
            directrecord.record_daemon(client, where, local, sent[path], answer, doc, given)
    return 1 if failed else 2 if bad_input else 0


def report_daemon_answer(
    memo: dict[str, Any], code: int | None, raw: bytes, error: BaseException | None
) -> int:
    """Report, as :func:`_compile_via_daemon` does, the daemon's answer (``code``, ``raw``
    body; ``error`` when the connection failed after sending) to the request a direct memo
    sent (:mod:`cachemgr.directwire`) when it is not the recorded hit; returns the exit
    code."""
    from cachemgr.client import DaemonUnavailable, _decode, _typed

    socket = str(memo["socket"])

    class Answered:
        """A client whose one answer is the one already received."""

        def compile(self, data: Any, **kw: Any) -> CompileOutcome:
            if error is not None or code is None:
                raise DaemonUnavailable(f"daemon at {socket} hung up")
            answer = _decode(code, raw, "application/json")
            if isinstance(answer, dict) and "status" in answer:
                answer["via"] = "daemon"
            return _typed(CompileOutcome, answer, "/compile")

    where = Route("daemon", None, socket, str(memo["reason"]))
    return _compile_via_daemon(
        Answered(),  # type: ignore[arg-type]
        where,
        (Path(memo["requests"][0][0]),),
        dict(memo["overrides"] or {}),
        False,
        memo["doc"] is not None,
        Path(memo["out_dir"]),
    )


def _report(outcome: CompileOutcome, as_json: bool, where: Route) -> dict[str, Any] | None:
    """Print one outcome; returns the ``--json`` object printed (None for text)."""
    went = "" if as_json else _outside_the_cache(outcome)
    if outcome.warning:  # e.g. compiled but not cached: a read-only root
        shown = went and f"folder {outcome.files[0].parent}" not in outcome.warning
        warning(outcome.warning + (f"; its files are in {went}" if shown else ""))
    elif went:  # a debug build, op_compiler_cache_mode=disable: where the files went
        why = outcome.policy.why_not_cached if outcome.policy else None
        report_line(
            f"cachemgr: note: {outcome.kernel_name} not cached ({why or 'not cacheable'}): "
            f"its files are in {went}",
            err=True,
        )
    if outcome.note and not as_json:  # e.g. force: local only, remote tiers untouched
        report_line(f"cachemgr: note: {outcome.note}", err=True)
    if as_json:
        doc = {**outcome.to_json(), "via": outcome.via or where.via, "route": where.to_json()}
        click.echo(json.dumps(doc, ensure_ascii=False))
        return doc
    if not outcome.ok:
        _failed_line(outcome.kernel_name or outcome.request, outcome.seconds)
        click.echo(f"cachemgr: error: {outcome.request}: {outcome.error}", err=True)
        return None
    folder = outcome.files[0].parent if outcome.files else ""
    parts = " ".join(f.name.removeprefix(outcome.kernel_name) for f in outcome.files)
    report_line(
        f"{outcome.status:8} {outcome.kernel_name}  {outcome.seconds:.3f}s  {folder}/ {parts}"
    )
    return None


def _outside_the_cache(outcome: CompileOutcome) -> str:
    """Where the files of a kernel compiled outside the cache went (its folder, and whether
    that is the current folder or below it: CANN writes debug builds to ``kernel_meta`` there,
    docs/compiling.md#what-makes-a-kernel-uncached); "" for an entry of the cache, a
    precompiled binary or a failure."""
    if not outcome.ok or not outcome.files or outcome.status in (Status.HIT, Status.BINARY):
        return ""
    cached = outcome.cached if outcome.cached is not None else None
    if cached is None:
        cached = outcome.policy.cached if outcome.policy is not None else True
    if cached:
        return ""
    folder = outcome.files[0].parent
    cwd = Path.cwd()
    if folder == cwd:
        return f"{folder} (the current folder)"
    return f"{folder} (under the current folder)" if folder.is_relative_to(cwd) else str(folder)


def _report_error(path: Path, message: str, as_json: bool, where: Route) -> None:
    """A request that failed before its policy was decided: ``failed``, policy unresolved."""
    if as_json:
        _report(CompileOutcome.failed_early(message, str(path)), as_json, where)
    else:
        _failed_line(str(path), 0.0)
        click.echo(f"cachemgr: error: {message}", err=True)


def _failed_line(name: str, seconds: float) -> None:
    """The stdout line of a failed request, in the columns of the others (``status kernel
    seconds files``, no files): ``name`` is its kernel, or its request file when the kernel
    is not known; why it failed is the error line on stderr, which ``-q`` (errors only)
    keeps while it drops this result line, as every other (docs/commands.md)."""
    report_line(f"{Status.FAILED:8} {name}  {seconds:.3f}s")


@click.command("pack", short_help="Build a package of precompiled kernels from cache entries.")
@click.argument("kernels", nargs=-1)
@click.option(
    "--out",
    "out_root",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Package root to create or extend (config/<soc>/..., <soc>/<op>/...).",
)
@click.option("--all", "pack_all", is_flag=True, help="Every entry compiled by cachemgr.")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of the files written.")
@settings_options
def pack_cmd(
    kernels: tuple[str, ...], out_root: Path, pack_all: bool, as_json: bool, **kw: Any
) -> None:
    """Build a read-only package of precompiled kernels in CANN's layout from cache entries.

    KERNELS are entry names as cachemgr ls shows them; --all takes every entry that carries
    its operator description (compiled by cachemgr's queue).
    """
    from cachemgr.compile import precompiled

    settings = load_settings(writable=False, **kw)
    chips = chip_dirs(settings)
    chosen: dict[Path, list[str]] = {}
    for kernel in kernels:
        chip = next((c for c in chips if (c / f"{kernel}.json").is_file()), None)
        if chip is None:
            raise InvalidInputError(f"pack: no entry {kernel!r} in {', '.join(map(str, chips))}")
        chosen.setdefault(chip, []).append(kernel)
    named = {chip: list(names) for chip, names in chosen.items()}
    if pack_all:
        for chip in chips:
            chosen.setdefault(chip, []).extend(_packable(chip))
    if not any(chosen.values()):
        raise InvalidInputError("pack: no entries chosen (name KERNELS or use --all)")
    written = []
    for chip, names in chosen.items():
        for kernel in dict.fromkeys(names):
            try:
                written += precompiled.pack(chip, [kernel], out_root)
            except InvalidInputError as exc:
                if kernel in named.get(chip, []):
                    raise  # named on the command line: an error
                # --all: e.g. GE's dynamic-shape entries (supportInfo without opType and
                # staticKey) cannot be packed; say so and go on
                warning(f"pack: skipped {kernel}: {exc}")
    written = list(dict.fromkeys(written))  # a config file shared by several kernels
    if as_json:
        emit_json([str(p) for p in written])
    else:
        for path in written:
            click.echo(str(path))


def _packable(chip: Path) -> list[str]:
    from cachemgr.compile import precompiled
    from cachemgr.storage import entry

    names = []
    for kernel in sorted(entry.scan_chip(chip).entries):
        try:
            desc = entry.parse_entry(chip, kernel)
        except (OSError, CacheMgrError):
            continue
        if isinstance(desc.data.get(precompiled.SUPPORT_INFO), dict):
            names.append(kernel)
    return names
