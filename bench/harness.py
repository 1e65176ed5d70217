"""The benchmark harness: discovers ``bench/cases_*.py``, runs them, prints a table and
rewrites one section per case module in ``BENCHMARKS.md``.

The protocol every case module follows (later issues add their own modules):

* ``NAME: str`` — the section name (``--only NAME`` runs just this module);
* ``run(workdir: Path, quick: bool) -> list[Row]`` — measure in ``workdir`` (an empty folder
  on the real disk, removed afterwards); ``quick`` asks for a small smoke-sized run.

Targets are reported, never asserted: a missed target prints its ratio and gap.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

from bench.install import (
    Install,
    editable_cachemgr,
    installed_cachemgr,
    measured_env,
    warm_bytecode,
)

__all__ = [
    "Install",
    "Row",
    "editable_cachemgr",
    "installed_cachemgr",
    "load_average",
    "load_note",
    "measured_env",
    "ratio_of",
    "ratio_row",
    "ratio_text",
    "timed_runs",
    "warm_bytecode",
]

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = ROOT / "BENCHMARKS.md"
#: ``--large``: cases that have a large size (``cases_scaling``: 1,000,000 entries) run it too.
LARGE = False
_HEADER = "# Benchmarks"
_LEGEND = (
    "ratio: value ÷ baseline, measured side by side; (min–max) over the paired repetitions "
    "where the case repeats them. load: the 1-minute load average while measured "
    '(start→end; "(case)" when only the whole case\'s is known).'
)


@dataclass
class Row:
    """One measured number and what it is compared with.

    :ivar value: the measurement, in ``unit``; ``baseline_value`` the same for the baseline.
    :ivar ratio: ``value / baseline_value`` (None without a baseline).
    :ivar target: the goal in words (``"≤ 2.0× floor"``), empty when informational.
    :ivar met: whether the target was met; None when there is no target.
    :ivar ratio_min: the smallest ratio over the repetitions (None when not repeated);
        ``ratio_max`` the largest.
    :ivar load: the 1-minute load average while measured (:func:`load_note`); the harness
        fills in the case's own start and end when a case leaves it empty.
    """

    case: str
    metric: str
    value: float
    unit: str
    baseline_name: str = ""
    baseline_value: float | None = None
    ratio: float | None = None
    target: str = ""
    met: bool | None = None
    note: str = ""
    ratio_min: float | None = None
    ratio_max: float | None = None
    load: str = ""


def ratio_of(value: float, baseline: float | None) -> float | None:
    """``value / baseline``, None when there is no usable baseline."""
    return value / baseline if baseline else None


def load_average() -> float:
    """The 1-minute load average now (0.0 where the system has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def load_note(since: float | None = None) -> str:
    """The load for a row's ``load`` column: ``"1.8"`` now, or ``"1.2→1.8"`` from ``since``
    (a :func:`load_average` taken when the measurement started) to now; 1-minute averages
    on ``os.cpu_count()`` cores."""
    now = load_average()
    return f"{now:.1f}" if since is None else f"{since:.1f}→{now:.1f}"


def ratio_row(
    case: str,
    metric: str,
    samples: Sequence[float],
    baseline_name: str,
    baseline_samples: Sequence[float],
    *,
    unit: str = "ms",
    scale: float = 1e3,
    target: float | None = None,
    at_least: bool = False,
    note: str = "",
    load: str = "",
) -> Row:
    """A row comparing paired repetitions: ``samples[i]`` and ``baseline_samples[i]`` were
    measured side by side (interleaved, in the same round).

    The value and baseline are the medians (times ``scale``: seconds → ms by default); the
    ratio is the median of the pairs' ratios (drift between rounds hits both sides of a
    pair alike), with the smallest and largest pair's ratio. ``target`` is the ratio to stay
    at or under (``at_least``: at or over, for throughputs).

    :raises ValueError: the sample lists are empty or of different lengths (not paired).
    """
    if not samples or len(samples) != len(baseline_samples):
        raise ValueError(
            f"ratio_row {case!r}: {len(samples)} samples vs {len(baseline_samples)} baseline "
            "samples: need the same number, measured in pairs"
        )
    ratios = [a / b for a, b in zip(samples, baseline_samples, strict=True) if b]
    ratio = statistics.median(ratios) if ratios else None
    met = None
    goal = ""
    if target is not None and ratio is not None:
        met = ratio >= target if at_least else ratio <= target
        goal = f"{'≥' if at_least else '≤'} {target:g}× {baseline_name}"
    reps = f"median of {len(samples)} paired runs' ratios"
    return Row(
        case,
        metric,
        statistics.median(samples) * scale,
        unit,
        baseline_name,
        statistics.median(baseline_samples) * scale,
        ratio,
        goal,
        met,
        f"{reps}; {note}" if note else reps,
        min(ratios) if ratios else None,
        max(ratios) if ratios else None,
        load or load_note(),
    )


#: A command to time: its argv and the environment it runs with.
Command = tuple[Sequence[str], Mapping[str, str]]


def timed_runs(
    commands: Mapping[str, Command] | Callable[[int], Mapping[str, Command]],
    rounds: int,
    *,
    expect: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    cpu: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:
    """Wall time (seconds) of each command per round: the commands interleaved, their order
    rotated each round (a noisy neighbour hits all alike); round 0 warms up and is not kept.
    ``commands`` may be a function of the round (0 … ``rounds``), e.g. a fresh kernel per
    round for misses; the names must stay the same. Each child runs with
    :func:`measured_env` of its environment; ``expect`` maps a name to how its stdout must
    begin (``"hit"``), checked on every run kept (round 0 may
    fill a cache). Index ``i`` of every list is the same round:
    pass two of them to :func:`ratio_row`. With ``cpu``, each kept run's CPU time (user +
    system seconds of the child and the children it waited for, from ``getrusage``) is
    appended there too, by name: on a loaded host it swings far less than wall time.

    :raises RuntimeError: a command exited non-zero or printed something else than expected
        (its output's tail in the message).
    """
    times: dict[str, list[float]] = {}
    for r in range(rounds + 1):
        this = commands(r) if callable(commands) else commands
        names = list(this)
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            argv, env = this[name]
            child_env = measured_env(env)
            before = _children_cpu()
            start = time.perf_counter()
            proc = subprocess.run(list(argv), env=child_env, cwd=cwd, capture_output=True)
            took = time.perf_counter() - start
            used = _children_cpu() - before
            if proc.returncode != 0:
                raise RuntimeError(f"{name}: exit {proc.returncode}: {proc.stderr[-300:]!r}")
            want = (expect or {}).get(name) if r else None
            if want is not None and not proc.stdout.decode(errors="replace").startswith(want):
                raise RuntimeError(f"{name}: expected {want!r}, got {proc.stdout[-300:]!r}")
            if r:
                times.setdefault(name, []).append(took)
                if cpu is not None:
                    cpu.setdefault(name, []).append(used)
    return times


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def discover(only: str | None = None) -> list[ModuleType]:
    """Import every ``bench/cases_*.py`` (sorted); with ``only``, just the one named so.

    :raises SystemExit: when ``only`` names no module (lists the known names).
    """
    modules = []
    for path in sorted(Path(__file__).parent.glob("cases_*.py")):
        module = importlib.import_module(f"bench.{path.stem}")
        modules.append(module)
    if only is None:
        return modules
    chosen = [m for m in modules if only == m.NAME]
    if not chosen:
        known = ", ".join(m.NAME for m in modules) or "(none)"
        raise SystemExit(f"bench: no case module named {only!r} (known: {known})")
    return chosen


def machine() -> dict[str, str]:
    """CPU model, cores, RAM, the work folder's filesystem, Python."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / 2**20:.1f} GiB"
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "ram": ram,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
    }


def filesystem_of(path: Path) -> str:
    """The filesystem type and mount point holding ``path`` (from /proc/mounts)."""
    best, fstype = "", "unknown"
    real = str(Path(path).resolve())
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            fields = line.split()
            mnt = fields[1]
            inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
            if len(fields) > 2 and inside and len(mnt) >= len(best):
                best, fstype = mnt, fields[2]
    except OSError:
        pass
    return f"{fstype} (mounted at {best or '?'})"


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def _ratio_target(row: Row) -> bool:
    """Whether ``row``'s target is a ratio (``"≤ 1.5× …"``), not an absolute (``"≤ 1 ms"``)."""
    return row.ratio is not None and "×" in row.target


def _status(row: Row) -> str:
    if row.met is None:
        return ""
    if row.met:
        return "met"
    return "MISSED" + (f" (at {row.ratio:.2f}×)" if _ratio_target(row) else "")


def ratio_text(row: Row) -> str:
    """``row``'s ratio as the tables print it: ``"2.00× (1.83–2.40)"`` (min–max over the
    repetitions), ``"2.00×"`` when not repeated, ``"-"`` without one."""
    if row.ratio is None:
        return "-"
    if row.ratio_min is None or row.ratio_max is None:
        return f"{row.ratio:.2f}×"
    return f"{row.ratio:.2f}× ({row.ratio_min:.2f}–{row.ratio_max:.2f})"


def table(rows: list[Row]) -> str:
    """A Markdown table of rows: value, baseline, ratio (with its min–max over the
    repetitions), target, whether it was met, and the load average while measured."""
    head = "| case | metric | value | baseline | ratio (min–max) | target | status | load | note |"
    sep = "|---|---|---|---|---|---|---|---|---|"
    lines = [head, sep]
    for r in rows:
        base = f"{r.baseline_name}: {_fmt(r.baseline_value)} {r.unit}" if r.baseline_name else "-"
        lines.append(
            f"| {r.case} | {r.metric} | {_fmt(r.value)} {r.unit} | {base} | {ratio_text(r)} | "
            f"{r.target or '-'} | {_status(r)} | {r.load or '-'} | {r.note} |"
        )
    return "\n".join(lines)


def section(name: str, rows: list[Row], info: dict[str, str], workdir_fs: str, quick: bool) -> str:
    """One case module's Markdown section, delimited so ``--only`` can replace just it."""
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    mach = ", ".join(f"{k} {v}" for k, v in info.items())
    load = (
        f"; load average {os.getloadavg()[0]:.1f} when it ended"
        if hasattr(os, "getloadavg")
        else ""
    )
    mode = " (--quick: smoke-sized, not comparable)" if quick else ""
    missed = [r for r in rows if r.met is False]
    summary = (
        "all targets met"
        if not missed
        else "; ".join(f"{r.metric}: {_fmt(r.value)} {r.unit} vs {r.target}" for r in missed)
    )
    return (
        f"<!-- bench:{name} -->\n"
        f"## {name}{mode}\n\n"
        f"Measured {when} on: {mach}; work folder on {workdir_fs}{load}.\n\n"
        f"{table(rows)}\n\n"
        f"{_LEGEND}\n\n"
        f"Targets: {summary}.\n"
        f"<!-- /bench:{name} -->"
    )


def merge(existing: str, name: str, text: str) -> str:
    """Replace the section ``name`` in ``existing`` (or append it), keeping all the rest."""
    pattern = re.compile(
        rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.DOTALL
    )
    if pattern.search(existing):
        return pattern.sub(lambda _: text, existing)
    base = existing.rstrip() or (
        f"{_HEADER}\n\nWritten by `scripts/bench` (one section per `bench/cases_*.py`; "
        "`scripts/bench --only NAME` refreshes one). Targets are goals, not test assertions."
    )
    return f"{base}\n\n{text}\n"


def run_case(module: ModuleType, quick: bool, work_root: Path) -> list[Row]:
    """Run one case module in a fresh work folder (removed afterwards); a row without its own
    load gets the case's (load average at its start → at its end)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{module.NAME}-", dir=work_root))
    since = load_average()
    try:
        rows: list[Row] = module.run(workdir, quick)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    span = f"{load_note(since)} (case)"
    for row in rows:
        row.load = row.load or span
    return rows


def default_work_root() -> Path:
    """A folder on the real disk: ``/var/tmp`` (``/tmp`` may be tmpfs), else the project."""
    var_tmp = Path("/var/tmp")
    return var_tmp if var_tmp.is_dir() and os.access(var_tmp, os.W_OK) else ROOT


def main(argv: list[str] | None = None, echo: Callable[[str], None] = print) -> int:
    """Run the benchmarks; returns the exit code (1 if a case crashed, 0 otherwise)."""
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", metavar="NAME", help="run only the case module NAME")
    parser.add_argument("--quick", action="store_true", help="small smoke-sized runs")
    parser.add_argument(
        "--large", action="store_true", help="also the large sizes (scaling: 1,000,000 entries)"
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="Markdown to rewrite")
    parser.add_argument("--workdir", type=Path, default=None, help="where cases build data")
    args = parser.parse_args(argv)
    global LARGE
    LARGE = args.large
    work_root = args.workdir or default_work_root()
    work_root.mkdir(parents=True, exist_ok=True)
    info = machine()
    fs = filesystem_of(work_root)
    status = 0
    for module in discover(args.only):
        echo(f"== {module.NAME} (work folder on {fs})")
        started = time.monotonic()
        try:
            rows = run_case(module, args.quick, work_root)
        except Exception:
            traceback.print_exc(file=sys.stderr)
            echo(f"== {module.NAME}: crashed; BENCHMARKS.md section left as it was")
            status = 1
            continue
        echo(table(rows))
        for r in rows:
            if r.met is False:
                gap = f" gap {r.ratio:.2f}×" if _ratio_target(r) else ""
                echo(
                    f"MISSED {r.case} {r.metric}: {_fmt(r.value)} {r.unit}, target {r.target};{gap}"
                )
        echo(f"== {module.NAME}: {time.monotonic() - started:.0f} s")
        old = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        new = merge(old, module.NAME, section(module.NAME, rows, info, fs, args.quick))
        args.output.write_text(new, encoding="utf-8")
    echo(f"wrote {args.output}")
    return status
