"""The daemon's gc of chip folders, run in a child process.

Why a child: :func:`cachemgr.eviction.gc_chip` scans a chip folder into one Python object per
entry and file (``entry.scan_chip``: about 1.1 KiB per entry, measured at 1,000,000 entries).
Run in the daemon, the start-up reclaim pass (``Governance.reap``) and each eviction grew its
heap to ~1.2 GB at 1,000,000 entries, and ``malloc_trim`` gave back only part of it: the
freed objects are scattered over arenas that stay half used, so the daemon stayed at 266 MB
for its whole life. In a child the same scan lives and dies with the child; the daemon keeps
only the usage index (an SQLite table, :mod:`cachemgr.daemon.usage`) and the small reports.

What stays exactly as it was:

* the run itself: the child calls the same :func:`~cachemgr.eviction.gc_chip` with the same
  arguments, so ``op_cache_file_del.lock`` and each entry's ``.lock`` are taken with the same
  fcntl record locks, without waiting, as CANN takes them
  (docs/design.md#writing-and-reading-an-entry, #size-limits-and-eviction; GE
  ``te_cache_space_manager.cc``). The lock belongs to the child while it runs; the kernel
  drops it when the child exits or is killed, as for a killed CANN process;
* the daemon's lock on an entry (a compile of the daemon publishing it) now also excludes
  the child's eviction of it at the fcntl level (another process), not only through the
  per-path thread lock of :class:`~cachemgr.storage.fsutil.FcntlLock`;
* its log lines: each record the child logs is sent back and logged by the daemon's logger
  of the same name, at the same level (timestamps and handlers are the daemon's);
* the state the daemon keeps between runs: ``first_seen`` (future access times)
  goes to the child and comes back; "warned once per folder" about clock skew is
  decided by the daemon.

Failures are one log line each and the daemon goes on serving: an error of one chip folder
(``OSError``, ``CacheMgrError``: the folder cannot be listed or locked) is reported by the
child and logged by the caller as before; a child that dies (killed, crashed, cannot start)
is logged once here with its exit status and last line of stderr, and the next run (the
reaper's interval, the next limit crossing) tries again.

Protocol: the daemon writes one JSON request on the child's stdin and closes it; the child
writes one JSON object per line on stdout — ``{"log": [level, logger, message]}`` as it
goes, ``{"job": i, "report": {...}, "first_seen": {...}}`` or ``{"job": i, "error": "..."}``
after each chip folder. Start-up cost: one interpreter and the eviction modules (~0.1–0.3 s),
once per reclaim pass (all chip folders in one child) or eviction.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import cachemgr
from cachemgr.constants import NEVER_EVICT
from cachemgr.errors import CacheMgrError
from cachemgr.words import plural

log = logging.getLogger(__name__)

#: The name lists of a gc report: only sent back when the evicted names are logged
#: (``cachemgr.evicted`` at debug level): 200,000 evictions are ~15 MB of strings.
NAME_LISTS = ("evicted", "kept", "saved_by_hit", "gone")


@dataclass
class GcJob:
    """One chip folder's gc, with :func:`~cachemgr.eviction.gc_chip`'s arguments.

    ``first_seen`` (kernel → ns) is updated in place from the child's copy.
    """

    chip_dir: Path
    max_mb: int = NEVER_EVICT
    ratio_pct: int = 100
    min_age_s: float = 1800.0
    force_ratio: bool = False
    target_bytes: int | None = None
    clock_skew_s: float | None = 300.0
    first_seen: dict[str, int] = field(default_factory=dict)
    #: the clock-skew warning was already given for this folder (once per folder)
    skew_warned: bool = False
    #: only report what would be done (``DryRun.YES``)
    dry_run: bool = False
    #: ``time.monotonic()`` (one clock for all processes on Linux) by which the whole child
    #: run stops: no job starts and no bad entry is waited for after it; None = no deadline
    deadline: float | None = None
    #: check the entries whose jsons changed since then (ns since the epoch) for shapes that
    #: make GE abort; 0 = every entry, None = none (``gc_chip``'s ``ge_fatal_since_ns``)
    ge_fatal_since_ns: int | None = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "chip_dir": str(self.chip_dir),
            "max_mb": self.max_mb,
            "ratio_pct": self.ratio_pct,
            "min_age_s": self.min_age_s,
            "force_ratio": self.force_ratio,
            "target_bytes": self.target_bytes,
            "clock_skew_s": self.clock_skew_s,
            "first_seen": self.first_seen,
            "skew_warned": self.skew_warned,
            "dry_run": self.dry_run,
            "deadline": self.deadline,
            "ge_fatal_since_ns": self.ge_fatal_since_ns,
        }


class GcChildError(CacheMgrError):
    """A chip folder's gc failed in the child (its one line), or the child died."""

    exit_code = 1


@dataclass
class Outcome:
    """One job's result: ``report`` (``GcReport.to_json()``) or ``error`` (one line).

    ``died`` is True when the child ended before this job was done; that was logged once
    by :func:`run_jobs` already.
    """

    report: dict[str, Any] | None = None
    error: str = ""
    died: bool = False


def run_jobs(
    jobs: Sequence[GcJob], names: bool = False, run_as: tuple[int, int] | None = None
) -> list[Outcome]:
    """Run ``jobs`` one after another in one child process; one :class:`Outcome` each.

    :param names: send the evicted (kept, saved, gone) names back; otherwise those lists
        are empty in the reports (their counts stay).
    :param run_as: ``(uid, gid)``: the child runs as that user, with their groups, no
        capability and a minimal environment (:func:`child_env`; the governor's eviction of
        another user's cache root: docs/daemon.md#the-privileges-it-needs); needs
        ``CAP_SETUID`` and ``CAP_SETGID``.
    """
    if not jobs:
        return []
    outcomes = [Outcome() for _ in jobs]
    request = {
        "jobs": [j.to_json() for j in jobs],
        "names": names,
        "log_level": _log_level(),
        "parent": os.getpid(),
    }
    as_user = _as_user(run_as)
    env = child_env(os.environ, another_user=bool(as_user))
    with tempfile.TemporaryFile() as errors:
        try:
            # -P and cwd "/": ``-m`` would put the working folder first on the import path,
            # and a daemon started by hand from a folder others can write would run their
            # ``cachemgr/__init__.py`` as its own user (attack review); PYTHONPATH (set above
            # to this cachemgr) still counts.
            proc = subprocess.Popen(
                [sys.executable, "-P", "-m", __name__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                env=env,
                cwd="/",
                close_fds=True,
                **as_user,
            )
        except OSError as exc:
            return _died(jobs, outcomes, f"could not start: {exc}")
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(request).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass  # it died at once: its status says why
        with proc.stdout:
            for line in proc.stdout:
                _take(line, jobs, outcomes)
        code = proc.wait()
        errors.seek(0)
        tail = _last_line(errors)
    if code != 0 or any(o.report is None and not o.error for o in outcomes):
        stopped = -code in _STOPS  # asked to stop (systemd stops the unit's every process)
        return _died(jobs, outcomes, _status(code) + (f": {tail}" if tail else ""), stopped)
    return outcomes


#: What a gc child run as another user keeps of the daemon's environment: the program
#: search path, the locale and the time zone (the child reads no other variable: its limits
#: and settings come in its request).
KEPT_FOR_ANOTHER_USER = ("PATH", "LANG", "LANGUAGE", "TZ")


def child_env(parent: Mapping[str, str], another_user: bool) -> dict[str, str]:
    """The gc child's environment: the daemon's own, or — when it runs as another user, who
    can read it in ``/proc/<pid>/environ`` — only :data:`KEPT_FOR_ANOTHER_USER` and
    ``LC_*`` (the governor's environment may hold credentials;
    docs/daemon.md#the-privileges-it-needs). Either way ``PYTHONPATH`` starts with this
    cachemgr's folder (then the daemon's ``PYTHONPATH``), so the child runs the same code.
    """
    if another_user:
        env = {k: v for k, v in parent.items() if k in KEPT_FOR_ANOTHER_USER or k[:3] == "LC_"}
    else:
        env = dict(parent)
    root = str(Path(cachemgr.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, parent.get("PYTHONPATH")]))
    return env


def _as_user(run_as: tuple[int, int] | None) -> dict[str, Any]:
    """``Popen`` arguments that start the child as ``run_as`` (uid, gid) with that user's
    groups; none when it is this process's own user already."""
    if run_as is None or run_as[0] == os.geteuid():
        return {}
    import pwd

    uid, gid = run_as
    try:
        groups = os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except (KeyError, OSError):
        groups = [gid]
    return {"user": uid, "group": gid, "extra_groups": groups}


def _log_level() -> int:
    """The lowest level any cachemgr logger of the daemon logs at (``debug_loggers``)."""
    level = logging.getLogger("cachemgr").getEffectiveLevel()
    for name, logger in logging.root.manager.loggerDict.items():
        if name.startswith("cachemgr") and isinstance(logger, logging.Logger) and logger.level:
            level = min(level, logger.level)
    return level


def _take(line: bytes, jobs: Sequence[GcJob], outcomes: list[Outcome]) -> None:
    """Act on one line of the child: relay a log record, or take a job's result."""
    try:
        msg = json.loads(line)
        if "log" in msg:
            level, name, text = msg["log"]
            logging.getLogger(str(name)).log(int(level), "%s", text)
            return
        i = int(msg["job"])
        if "error" in msg:
            outcomes[i].error = str(msg["error"])
            return
        outcomes[i].report = msg["report"]
        jobs[i].first_seen.clear()
        jobs[i].first_seen.update(msg.get("first_seen") or {})
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        log.warning("the gc child wrote a line not understood (%s): %.200r", exc, line)


#: Signals that ask a process to stop: ``systemctl stop`` sends SIGTERM to every process of
#: the unit, the gc child too, before the daemon has ended it — a stop, not a death.
_STOPS = (signal.SIGTERM, signal.SIGINT)


def _died(
    jobs: Sequence[GcJob], outcomes: list[Outcome], why: str, stopped: bool = False
) -> list[Outcome]:
    """One line for a child that ended without every result: a warning when it died, an
    info line when it was asked to stop (:data:`_STOPS`)."""
    left = [j for j, o in zip(jobs, outcomes, strict=True) if o.report is None and not o.error]
    log.log(
        logging.INFO if stopped else logging.WARNING,
        "the gc child of %s %s; %d of %s not done, the next run tries again",
        ", ".join(str(j.chip_dir) for j in jobs[:3]) + (" ..." if len(jobs) > 3 else ""),
        why,
        len(left),
        plural(len(jobs), "chip folder"),
    )
    for outcome in outcomes:
        if outcome.report is None and not outcome.error:
            outcome.error, outcome.died = why, True
    return outcomes


def _status(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"was killed by signal {-code}"
    if code == 0:
        return "ended without a result"
    return f"exited with status {code}"


def _last_line(errors: IO[bytes]) -> str:
    """The last non-empty line the child wrote on stderr (a traceback's last line), short."""
    data = errors.read()[-4096:].decode("utf-8", "replace")
    lines = [ln.strip() for ln in data.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


# --- the child ---------------------------------------------------------------------------


class _Relay(logging.Handler):
    """Send each log record to the daemon as one JSON line."""

    def __init__(self, out: IO[str]) -> None:
        super().__init__()
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                text += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
            _send(self.out, {"log": [record.levelno, record.name, text]})
        except Exception:  # a log line must never stop the gc
            self.handleError(record)


def _send(out: IO[str], msg: dict[str, Any]) -> None:
    out.write(json.dumps(msg) + "\n")
    out.flush()


def _child_job(i: int, job: dict[str, Any], names: bool, out: IO[str]) -> None:
    from cachemgr.eviction import collect

    chip = Path(job["chip_dir"])
    if job["skew_warned"]:
        collect.skew_warned.first(chip)  # the daemon warned already: once per folder
    first_seen: dict[str, int] = {str(k): int(v) for k, v in job["first_seen"].items()}
    try:
        report = collect.gc_chip(
            chip,
            int(job["max_mb"]),
            int(job["ratio_pct"]),
            float(job["min_age_s"]),
            force_ratio=bool(job["force_ratio"]),
            target_bytes=job["target_bytes"],
            clock_skew_s=job["clock_skew_s"],
            first_seen=first_seen,
            dry_run=collect.DryRun.YES if job.get("dry_run") else collect.DryRun.NO,
            deadline=job.get("deadline"),
            ge_fatal_since_ns=job.get("ge_fatal_since_ns", 0),
        )
    except (OSError, CacheMgrError) as exc:
        _send(out, {"job": i, "error": str(exc)})
        return
    data = report.to_json()
    if not names:
        for key in NAME_LISTS:
            data[key] = []
    _send(out, {"job": i, "report": data, "first_seen": first_seen})


def _die_with_parent(parent: int) -> None:
    """SIGKILL this child when the daemon ends (``prctl(PR_SET_PDEATHSIG)``): a daemon that
    stops, or is killed, must not leave a gc running on with ``op_cache_file_del.lock``
    (attack review: the child outlived a stopped daemon). The daemon's thread waits for the
    child, so the thread that started it lives as long as it does. Exits at once when the
    daemon is already gone (``getppid`` changed before the signal was armed)."""
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if parent and os.getppid() != parent:
        os._exit(1)


def _child_main() -> int:
    """Read the request from stdin, run each job, write results on stdout (see above)."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything else printed goes to stderr, never into the protocol
    request = json.load(sys.stdin)
    _die_with_parent(int(request.get("parent", 0)))
    root = logging.getLogger()
    root.handlers[:] = [_Relay(out)]
    root.setLevel(int(request.get("log_level", logging.INFO)))
    names = bool(request.get("names"))
    for i, job in enumerate(request["jobs"]):
        _child_job(i, job, names, out)
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
