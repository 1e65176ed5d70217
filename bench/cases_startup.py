"""CLI start-up: whole ``cachemgr`` processes beside ``python -c pass`` of the same
interpreter and beside the compile a hit saves, measured in one interleaved run — for the
non-editable ``pip install .`` users get and the checkout's editable ``.venv`` (byte code
warm, ``PYTHONDONTWRITEBYTECODE`` unset: :mod:`bench.install`).

* **compile hit**: ``cachemgr compile REQUEST.json`` (the console script pip writes, which
  imports :mod:`re` first; and ``python -m cachemgr compile``, which does not) answering a
  verified hit of ``examples/requests/add_c.json``, with no daemon (the default route finds
  no socket and runs in process: the direct memo answers, :mod:`cachemgr.direct`) and
  through a running daemon (the default socket, found through ``$XDG_RUNTIME_DIR``).
  Targets: ≤ 1.5× the interpreter's own start-up, and ≤ 0.8× the plain ``gcc -c`` of the
  same kernel (the compile the hit replaces); ``ccache gcc``'s hit of that command beside it.
* **stats**, **config** and **--help**: target ≤ 2× the interpreter's start-up.

Every command runs ``ROUNDS`` times, interleaved, order rotated each round
(:func:`bench.harness.timed_runs`); each ratio is the median of the paired rounds' ratios,
with their min–max, and the load average while measured.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from bench import cases_daemon
from bench.cases_compile import REQUESTS, _argv, ensure_ccache
from bench.harness import (
    Command,
    Install,
    Row,
    editable_cachemgr,
    installed_cachemgr,
    load_average,
    load_note,
    measured_env,
    ratio_row,
    timed_runs,
)
from cachemgr.compile.request import load_request

NAME = "startup"
ROUNDS = 21
#: The request of every hit row: the small C kernel CANN build hosts compile by the thousand.
HIT_EXAMPLE = "add_c"

#: An empty module: ``python -m`` of it is what ``python -m cachemgr`` costs before
#: cachemgr's code runs (runpy and what it imports).
EMPTY_MODULE = "cachemgr_bench_empty"

#: Why a row misses its target, for its note.
GAP_CAUSES = {
    "hit": "gap: pip's console script imports re (and enum, functools) before cachemgr.main "
    "(the `import re` row); the direct path's own imports are _sha256, _ctypes, struct, fcntl",
    "hit-daemon": "gap: beyond the local hit, one round trip (POST /compile/if-config): the "
    "daemon's thread for the connection, its prepare (compiler, key) and verified lookup",
    "hit-m": "gap: `python -m` imports runpy (importlib.util, contextlib, functools) first",
    "stats": "gap: the daemon-less `stats [--cache-dir DIR]` is answered on os alone "
    "(cachemgr.quickstats); a miss here means it declined (an option, a settings variable, an "
    "op_cache.ini not in GE's plain form, a warning) and localstats answered through the "
    "settings' modules (~4.3x of stdlib alone)",
    "config": "gap: the daemon-less `config [--cache-dir DIR]` is answered on os alone "
    "(cachemgr.quickconfig); a miss here means it declined (a config file, remote tiers, a "
    "value the full resolution words, an op_cache.ini not in GE's plain form) and "
    "options.resolve answered (its stdlib alone is ~4.4x)",
    "help": "gap: pip's console script imports re first (the `import re` row), or the stored "
    "help is stale",
}


def _env(work: Path, runtime: Path) -> dict[str, str]:
    """The commands' environment: their own HOME (so their own direct memos) and runtime
    folder; no ``ASCEND_``/``CACHEMGR_`` variable of the host."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_", "CACHEMGR_"))}
    env.update(HOME=str(work), XDG_RUNTIME_DIR=str(runtime), XDG_STATE_HOME=str(work / "st"))
    env.pop("XDG_CACHE_HOME", None)
    return env


def _modules(argv: list[str], env: dict[str, str], python: Path) -> int:
    """How many modules ``argv`` (a console-script command, or ``python …`` of that
    interpreter) imports (``-X importtime``)."""
    args = argv[1:] if argv[:1] == [str(python)] else argv  # not the interpreter as a script
    proc = subprocess.run(
        [str(python), "-X", "importtime", *args], env=measured_env(env), capture_output=True
    )
    lines = proc.stderr.decode(errors="replace").splitlines()
    return sum(1 for line in lines if line.startswith("import time:")) - 1


def _request(work: Path) -> Path:
    """``add_c.json`` with its source made absolute, in the work folder."""
    data = json.loads((REQUESTS / f"{HIT_EXAMPLE}.json").read_text())
    data["kernel_source"] = str((REQUESTS / data["kernel_source"]).resolve())
    path = work / f"{HIT_EXAMPLE}.json"
    path.write_text(json.dumps(data))
    return path


def _prime(hit: list[str], env: dict[str, str], via: str) -> None:
    """Run ``hit`` until it is a hit by the route ``via`` (a compile, then a hit through the
    full path, which leaves the direct memo).

    :raises RuntimeError: it does not become one.
    """
    for _ in range(3):
        proc = subprocess.run(
            [*hit, "--json"], env=measured_env(env), capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{hit}: exit {proc.returncode}: {proc.stderr[-300:]}")
        answer = json.loads(proc.stdout)
        if answer["status"] == "hit" and answer["route"]["via"] == via:
            subprocess.run(hit, env=measured_env(env), capture_output=True, check=True)
            return
    raise RuntimeError(f"expected a hit via {via}, got {proc.stdout}")


def _commands(
    kinds: list[Install], work: Path, request: Path, cache: Path, via_env: dict[str, str]
) -> dict[str, Command]:
    """Every command of a round, by name (``<kind>:<what>`` for cachemgr's)."""
    no_daemon = _env(work, work / "no-run")
    empty = work / "m-floor"
    empty.mkdir(exist_ok=True)
    (empty / f"{EMPTY_MODULE}.py").write_text("")
    floor_env = {**no_daemon, "PYTHONPATH": str(empty)}
    commands: dict[str, Command] = {}
    gcc_argv = _argv(load_request(REQUESTS / f"{HIT_EXAMPLE}.json"), work / "gcc-out")
    commands["gcc"] = (gcc_argv, no_daemon)
    ccache = ensure_ccache()
    if ccache is not None:
        ccache_env = {**no_daemon, "CCACHE_DIR": str(work / "ccache"), "CCACHE_NOSTATS": "1"}
        commands["ccache"] = ([ccache, *_argv(load_request(REQUESTS / f"{HIT_EXAMPLE}.json"),
                                              work / "cc-out")], ccache_env)  # fmt: skip
    for kind in kinds:
        cm = str(kind.script)
        hit = [cm, "compile", "--cache-dir", str(cache), str(request)]
        commands[f"{kind.kind}:pass"] = ([str(kind.python), "-c", "pass"], no_daemon)
        commands[f"{kind.kind}:hit"] = (hit, no_daemon)
        commands[f"{kind.kind}:hit-m"] = ([str(kind.python), "-m", "cachemgr", *hit[1:]], no_daemon)
        commands[f"{kind.kind}:m-floor"] = ([str(kind.python), "-m", EMPTY_MODULE], floor_env)
        commands[f"{kind.kind}:hit-daemon"] = (hit, via_env)
        commands[f"{kind.kind}:stats"] = ([cm, "stats", "--cache-dir", str(cache)], no_daemon)
        commands[f"{kind.kind}:config"] = ([cm, "config", "--cache-dir", str(cache)], no_daemon)
        commands[f"{kind.kind}:help"] = ([cm, "--help"], no_daemon)
    py = str(kinds[0].python)
    commands["click"] = ([py, "-c", "import click, json, logging, pathlib, dataclasses"], no_daemon)
    commands["re"] = ([py, "-c", "import re"], no_daemon)
    return commands


def run(workdir: Path, quick: bool) -> list[Row]:
    """Every row of this module (see the module docstring)."""
    kinds = [installed_cachemgr(), editable_cachemgr()]
    cache = workdir / "cache"
    request = _request(workdir)
    no_daemon = _env(workdir, workdir / "no-run")
    for kind in kinds:
        _prime([str(kind.script), "compile", "--cache-dir", str(cache), str(request)],
               no_daemon, "local")  # fmt: skip
    daemon_work = workdir / "d"
    daemon_work.mkdir()
    proc, _ = cases_daemon._start(daemon_work, cache)
    try:
        via = _env(workdir, daemon_work / "run")
        for kind in kinds:
            _prime([str(kind.script), "compile", "--cache-dir", str(cache), str(request)],
                   via, "daemon")  # fmt: skip
        commands = _commands(kinds, workdir, request, cache, via)
        rounds = 5 if quick else ROUNDS
        since = load_average()
        hits = {n: "hit" for n in commands if n.endswith((":hit", ":hit-m", ":hit-daemon"))}
        times = timed_runs(commands, rounds, expect=hits)
        load = load_note(since)
        mods = {
            n: _modules(list(argv), dict(env), kinds[0].python if "installed" in n else
                        kinds[1].python)
            for n, (argv, env) in commands.items() if ":" in n and not n.endswith(":pass")
        }  # fmt: skip
    finally:
        cases_daemon._stop(proc)
    return _rows(kinds, times, mods, load)


def _rows(
    kinds: list[Install], times: dict[str, list[float]], mods: dict[str, int], load: str
) -> list[Row]:
    """The table: per install, each command against its ``python -c pass`` (and the hit
    against ``gcc -c``), then ccache's hit and the click floor."""
    label = {"installed": "installed (pip install .)", "editable": "editable .venv"}
    rows = []
    for kind in kinds:
        k = kind.kind
        floor = times[f"{k}:pass"]
        for what, metric, target in (
            ("hit", "`cachemgr compile` hit, no daemon", 1.5),
            ("hit-m", "`python -m cachemgr compile` hit, no daemon", 1.5),
            ("hit-daemon", "`cachemgr compile` hit through the daemon", 1.5),
            ("stats", "`cachemgr stats`", 2.0),
            ("config", "`cachemgr config`", 2.0),
            ("help", "`cachemgr --help`", 2.0),
        ):
            row = ratio_row(
                "CLI start-up",
                f"{metric}, {label[k]}",
                times[f"{k}:{what}"],
                "python -c pass",
                floor,
                target=target,
                note=f"{mods[f'{k}:{what}']} modules imported",
                load=load,
            )
            if row.met is False and what in GAP_CAUSES:
                row.note += f"; {GAP_CAUSES[what]}"
            rows.append(row)
        rows.append(
            ratio_row(
                "CLI start-up",
                f"`python -m cachemgr compile` hit, no daemon, {label[k]}",
                times[f"{k}:hit-m"],
                "python -m of an empty module",
                times[f"{k}:m-floor"],
                note="the same hit against `python -m`'s own floor (runpy, importlib.util, "
                f"contextlib, functools: {mods[f'{k}:m-floor']} modules), beside the rows above",
                load=load,
            )
        )
        rows.append(
            ratio_row(
                "CLI start-up",
                f"`cachemgr compile` hit, no daemon, {label[k]}: {HIT_EXAMPLE}",
                times[f"{k}:hit"],
                "gcc -c, same command",
                times["gcc"],
                target=0.8,
                note="the compile the hit replaces, run in the same rounds",
                load=load,
            )
        )
    if "ccache" in times:
        rows.append(
            ratio_row(
                "CLI start-up",
                f"`ccache gcc` hit: {HIT_EXAMPLE}",
                times["ccache"],
                "gcc -c, same command",
                times["gcc"],
                note="ccache 4 (Debian), its own cache folder; beside the rows above",
                load=load,
            )
        )
    for name, metric, note in (
        ("re", "`python -c 'import re'`: what an older pip's console script imports first",
         "the `cachemgr` script of pip 23.2 (Python 3.11's bundled pip) imports re first"),
        ("click", "floor of any click CLI: `import click, json, logging, pathlib, dataclasses`",
         "the modules every click command needs before cachemgr's own"),
    ):  # fmt: skip
        rows.append(
            ratio_row("CLI start-up", metric, times[name], "python -c pass",
                      times[f"{kinds[0].kind}:pass"], note=f"{note} ({kinds[0].kind})",
                      load=load)
        )  # fmt: skip
    return rows
