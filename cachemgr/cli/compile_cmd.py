"""``cachemgr compile`` (an in-process compile queue) and ``cachemgr pack`` (issue 4)."""

from __future__ import annotations

import json
import sys
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click

from cachemgr import entry, precompiled
from cachemgr.cli.common import (
    chip_dirs,
    emit_json,
    find_daemon,
    load_settings,
    settings_options,
    socket_option,
)
from cachemgr.cli.lockcheck import checked_for_writing
from cachemgr.client import Client
from cachemgr.counters import CounterBook
from cachemgr.errors import CacheMgrError, InvalidInputError
from cachemgr.queue import DEFAULT_TIMEOUT_S, CompileOutcome, CompileQueue
from cachemgr.request import load_request


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
                help="op_compiler_cache_mode (SPEC §4).",
            ),
            click.option("--jit-compile", metavar="auto|true|false", help="SPEC §6."),
            click.option("--op-debug-level", metavar="0..4", help="SPEC §7."),
            click.option("--op-debug-config", metavar="CFG", help="SPEC §7 .cfg file."),
            click.option("--debug-dir", metavar="DIR", help="kernel_meta base (SPEC §7)."),
        ]
    ):
        func = deco(func)
    return func


@click.command("compile")
@click.argument("requests", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per request (a line).")
@_setting_flags
@click.option("--workers", type=click.IntRange(1, 1024), help="Compile threads (default: CPUs).")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
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
    help="A precompiled package root (SPEC §6); repeatable.",
)
@click.option("--replace", is_flag=True, help="Recompile and replace these entries.")
@socket_option
def compile_cmd(
    requests: tuple[Path, ...],
    as_json: bool,
    socket_path: Path | None,
    workers: int | None,
    timeout_s: float,
    out_dir: Path,
    binaries: tuple[Path, ...],
    replace: bool,
    op_compiler_cache_dir: str | None,
    host_id: str | None,
    config_file: Path | None,
    **overrides: Any,
) -> None:
    """Compile REQUEST.json files (hit, binary, compiled, debug), through the daemon when one
    serves this cache, else in-process.

    \b
    Key: everything that changes the binary - op, shapes, dtypes, formats, attrs, soc,
    defines, include_dirs, extra_flags, options, the compiler and its flags, the source and
    every header it reads (system headers: the compiler's identity). The bytes hashed are the
    bytes compiled: the files are read once, by this process, and compiled from that copy.
    Header manifests (<chip folder>/*.manifest) list each kernel's headers with their
    SHA-256, so a hit never runs the preprocessor; a miss lists them first (-MM).
    \b
    --mode force: clears the chip folder once per run of this command (also through the
    daemon), waiting for compiles in flight, whose fresh results are kept; then compiles.
    Switch back to enable afterwards. --replace recompiles only these entries.
    \b
    Outputs: debug artefacts go to <base>/kernel_meta/<host>_<pid>/, base = --debug-dir >
    $ASCEND_WORK_PATH > the current directory; --mode disable kernels to --out-dir. Both are
    written by this process, as you, also when the daemon compiles; a folder you cannot write
    is refused before compiling.

    Exits 1 when a compile failed, 2 when a request is invalid (and none failed), else 0.
    """
    extra = {k: v for k, v in overrides.items() if v is not None}
    settings = load_settings(op_compiler_cache_dir, host_id, None, config_file, **extra)
    in_process_only = workers or binaries or timeout_s != DEFAULT_TIMEOUT_S or out_dir != Path(".")
    client = None if in_process_only else find_daemon(socket_path, settings)
    if client is not None:
        sys.exit(_compile_via_daemon(client, requests, extra, replace, as_json))
    cli_values = {
        "op_compiler_cache_dir": op_compiler_cache_dir,
        "host_id": host_id,
        "soc_version": None,
        **extra,
    }
    settings = checked_for_writing(settings, cli_values, config_file)  # as the daemon
    bad_input, failed = 0, 0
    counters = CounterBook(lambda: settings.layout.kernel_cache_dir)  # SPEC §10: in the cache
    queue = CompileQueue(
        settings,
        workers,
        timeout_s=timeout_s,
        output_dir=out_dir,
        binary_dirs=binaries,
        tally=counters.tally,
    )
    try:
        futures: list[tuple[Path, Future[CompileOutcome] | CacheMgrError]] = []
        for path in requests:
            try:
                futures.append((path, queue.submit(load_request(path), replace=replace)))
            except CacheMgrError as exc:
                futures.append((path, exc))
        for path, fut in futures:
            if isinstance(fut, CacheMgrError):
                bad_input += isinstance(fut, InvalidInputError)
                failed += not isinstance(fut, InvalidInputError)
                _report_error(path, str(fut), as_json)
                continue
            outcome = fut.result()
            failed += not outcome.ok
            _report(outcome, as_json)
    finally:
        queue.close()
        counters.save()
    if failed:
        sys.exit(1)
    if bad_input:
        sys.exit(2)


def _compile_via_daemon(
    client: Client,
    requests: tuple[Path, ...],
    overrides: dict[str, Any],
    replace: bool,
    as_json: bool,
) -> int:
    """Send the requests to the daemon at once (its pool compiles them in parallel) and
    report each in order; command-line options fill what a request's own ``options`` leave
    unset, with relative paths made absolute here (the daemon has another cwd). Returns
    the exit code: 1 if any failed, 2 if any was invalid."""
    for name in ("op_debug_config", "debug_dir"):
        if overrides.get(name):
            overrides[name] = str(Path(overrides[name]).absolute())
    session = uuid.uuid4().hex  # force clears once per run, as in-process (issue 11 item 5)

    def one(path: Path) -> dict[str, Any] | CacheMgrError:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise InvalidInputError(f"request {path}: a request must be a JSON object")
            data["options"] = {**overrides, **(data.get("options") or {})}
            return client.compile(
                data, base_dir=path.resolve().parent, replace=replace, session=session
            )
        except OSError as exc:
            return InvalidInputError(f"request {path}: cannot read ({exc.strerror})")
        except ValueError as exc:
            return InvalidInputError(f"request {path}: malformed JSON: {exc}")
        except CacheMgrError as exc:
            return exc

    bad_input, failed = 0, 0
    with ThreadPoolExecutor(max_workers=min(32, len(requests))) as pool:
        answers = list(pool.map(one, requests))
    for path, answer in zip(requests, answers, strict=True):
        if isinstance(answer, CacheMgrError):
            bad_input += answer.exit_code == 2
            failed += answer.exit_code != 2
            message = str(answer).replace("/compile request", f"request {path}")
            if str(path) not in message:
                message = f"request {path}: {message}"
            _report_error(path, message, as_json, "daemon")
            continue
        answer["request"] = str(path)
        failed += answer.get("status") == "failed"
        _report(_outcome_of(answer), as_json, via=answer.get("via", "daemon"))
    return 1 if failed else 2 if bad_input else 0


def _outcome_of(answer: dict[str, Any]) -> CompileOutcome:
    return CompileOutcome(
        answer.get("kernel_name", ""),
        answer.get("status", "failed"),
        tuple(Path(f) for f in answer.get("files", [])),
        float(answer.get("seconds", 0.0)),
        answer.get("error"),
        answer.get("request", ""),
        answer.get("cached"),
        answer.get("warning"),
    )


def _report(outcome: CompileOutcome, as_json: bool, via: str = "local") -> None:
    if outcome.warning:  # e.g. compiled but not cached: a read-only root (issue 10 item 12)
        click.echo(f"cachemgr: warning: {outcome.warning}", err=True)
    if as_json:
        click.echo(json.dumps({**outcome.to_json(), "via": via}, ensure_ascii=False))
        return
    if not outcome.ok:
        click.echo(f"cachemgr: error: {outcome.request}: {outcome.error}", err=True)
        return
    folder = outcome.files[0].parent if outcome.files else ""
    parts = " ".join(f.name.removeprefix(outcome.kernel_name) for f in outcome.files)
    click.echo(
        f"{outcome.status:8} {outcome.kernel_name}  {outcome.seconds:.3f}s  {folder}/ {parts}"
    )


def _report_error(path: Path, message: str, as_json: bool, via: str = "local") -> None:
    if as_json:
        doc = {"request": str(path), "kernel_name": "", "status": "failed", "files": [], "via": via}
        click.echo(json.dumps({**doc, "seconds": 0.0, "error": message}, ensure_ascii=False))
    else:
        click.echo(f"cachemgr: error: {message}", err=True)


@click.command("pack")
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
    """Build a read-only precompiled package (CANN's layout, SPEC §6) from cache entries.

    KERNELS are entry names as `cachemgr ls` shows them; --all takes every entry that carries
    its operator description (compiled by cachemgr's queue).
    """
    settings = load_settings(writable=False, **kw)
    chips = chip_dirs(settings)
    chosen: dict[Path, list[str]] = {}
    for kernel in kernels:
        chip = next((c for c in chips if (c / f"{kernel}.json").is_file()), None)
        if chip is None:
            raise InvalidInputError(f"pack: no entry {kernel!r} in {', '.join(map(str, chips))}")
        chosen.setdefault(chip, []).append(kernel)
    if pack_all:
        for chip in chips:
            chosen.setdefault(chip, []).extend(_packable(chip))
    if not any(chosen.values()):
        raise InvalidInputError("pack: no entries chosen (name KERNELS or use --all)")
    written = []
    for chip, names in chosen.items():
        written += precompiled.pack(chip, list(dict.fromkeys(names)), out_root)
    if as_json:
        emit_json([str(p) for p in written])
    else:
        for path in written:
            click.echo(str(path))


def _packable(chip: Path) -> list[str]:
    names = []
    for kernel in sorted(entry.scan_chip(chip).entries):
        try:
            desc = entry.parse_entry(chip, kernel)
        except (OSError, CacheMgrError):
            continue
        if isinstance(desc.data.get(precompiled.SUPPORT_INFO), dict):
            names.append(kernel)
    return names
