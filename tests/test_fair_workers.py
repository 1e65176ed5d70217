"""A member cannot hold every worker from the others (docs/daemon.md#fair-workers).

The queue's turns order the callers' waiting jobs, but once one member's four slow compiles
held both workers, another member's 0.03 s compile waited for one of them to end (84.9 s).
Now, while every worker compiles, a reserve worker starts the job of a caller none of whose
jobs compiles. Real daemon (a dedicated user, two workers), real members, real gcc; the slow
compiles are gcc behind a wrapper that sleeps first (a CPU-bound slow compile would make the
other caller's time a measure of the two shared cores, not of the queue).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

from cachemgr.client import Client
from cachemgr.compile.queue import CompileQueue
from cachemgr.compile.request import CompileRequest, parse_request
from tests.compile_util import make_settings
from tests.daemon_util import wait_for
from tests.shared_util import kernel_request
from tests.test_deputy import _setup
from tests.users_util import Runtime, Users, run_as

#: Seconds each of the member's slow compiles takes (the issue: ≥ 3 s).
SLOW_S = 4.0
#: The other caller's trivial compile must be answered within this (seconds).
OTHER_WITHIN_S = 1.5

SUBMIT = textwrap.dedent(
    """
    import json, sys
    from cachemgr.client import Client
    client = Client(sys.argv[1], local_hits=False)  # trusts $CACHEMGR_DAEMON_USER
    ids = [client.compile(json.loads(line), "/", wait=False)["job_id"] for line in sys.stdin]
    print(json.dumps(ids), flush=True)
    """
)


def _sleepy_cc(folder: Path) -> Path:
    """gcc that first sleeps :data:`SLOW_S` for a compile with ``-DSLOW=1`` (not for
    ``--version`` or a dependency listing)."""
    folder.mkdir(parents=True, exist_ok=True)
    gcc = shutil.which("gcc") or "gcc"
    script = folder / "cc"
    script.write_text(
        "#!/bin/sh\n"
        f'for a in "$@"; do case "$a" in --version|-MM|-M) exec {gcc} "$@";; esac; done\n'
        f'case " $* " in *" -DSLOW=1 "*) sleep {SLOW_S};; esac\n'
        f'exec {gcc} "$@"\n'
    )
    script.chmod(0o755)
    return script


def _request(rt: Runtime, n: int, slow: bool) -> dict[str, object]:
    data = kernel_request(n)
    data["kernel_source"] = str(rt.kernels / "c" / "add.c")
    if slow:
        data["defines"] = {**data["defines"], "SLOW": 1}  # type: ignore[dict-item]
    return data


def test_another_callers_compile_starts_while_one_member_holds_every_worker(
    users: Users, other_runtime: Runtime
) -> None:
    rt = other_runtime
    cc = _sleepy_cc(users.base / "tools")
    daemon, _, _, bob = _setup(users, rt, f'[compilers]\ncc = "{cc}"\n[daemon]\nworkers = 2\n')
    script = users.base / "submit.py"
    script.write_text(SUBMIT)
    try:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "PYTHONPATH": rt.pythonpath,
            "HOME": str(bob),
            "CACHEMGR_DAEMON_USER": users.alice,
        }
        lines = "".join(json.dumps(_request(rt, n, slow=True)) + "\n" for n in range(4))
        member = subprocess.run(
            [rt.python, str(script), str(daemon.socket_path)],
            input=lines,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
            **run_as(users.bob, users),  # type: ignore[arg-type]
        )
        assert member.returncode == 0, member.stderr + daemon.log()
        slow_jobs = json.loads(member.stdout)
        other = Client(daemon.socket_path, timeout_s=120, daemon_user=users.alice, local_hits=False)

        def running() -> int:
            return int(other.stats().daemon["queue"]["running"])

        wait_for(lambda: running() == 2, 30, "bob's slow compiles on both workers")
        start = time.monotonic()
        answer = other.compile(_request(rt, 99, slow=False), "/")  # root: another caller
        took = time.monotonic() - start
        assert answer.status == "compiled", answer.error
        states = [other.job(j)["state"] for j in slow_jobs]
        assert took <= OTHER_WITHIN_S, f"the other caller's compile took {took:.2f} s: {states}"
        assert states.count("done") == 0, states  # it did not wait for one of bob's
        assert "starts on a reserve worker" in daemon.log()
    finally:
        daemon.proc.kill()  # bob's slow compiles need not finish
        daemon.proc.wait(10)


def _interval_cc(folder: Path, seconds: float) -> Path:
    """gcc that sleeps ``seconds`` and logs ``start end caller`` (epoch seconds; the caller
    from ``-DWHO=<name>``) of every real compile to ``<folder>/cc.log``; while the file
    ``<folder>/hold-<caller>`` exists, that caller's compiles wait (after their start time)."""
    folder.mkdir(parents=True, exist_ok=True)
    gcc = shutil.which("gcc") or "gcc"
    script = folder / "cc"
    script.write_text(
        "#!/bin/sh\n"
        f'for a in "$@"; do case "$a" in --version|-MM|-M) exec {gcc} "$@";; esac; done\n'
        'who=; for a in "$@"; do case "$a" in -DWHO=*) who=${a#-DWHO=};; esac; done\n'
        "start=$(date +%s.%N)\n"
        f'while [ -n "$who" ] && [ -e {folder}/hold-"$who" ]; do sleep 0.01; done\n'
        f'sleep {seconds}; {gcc} "$@"; rc=$?\n'
        f'echo "$start $(date +%s.%N) $who" >> {folder / "cc.log"}\n'
        "exit $rc\n"
    )
    script.chmod(0o755)
    return script


def _most_at_once(log: Path, who: str | None = None) -> int:
    """The most compiles (of caller ``who``, or all) that ran at one time, from the log."""
    rows = [line.split() for line in log.read_text().splitlines()]
    spans = [(float(r[0]), float(r[1])) for r in rows if who is None or r[2:] == [who]]
    return max(sum(s <= t < e for s, e in spans) for t, _ in spans)


def test_one_caller_never_takes_a_reserve_slot_and_compilers_stay_bounded(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """A real queue with 1 worker and 1 reserve slot: one caller's jobs run one at a time
    (its throughput is the workers', the reserve never serves it); with a second caller, its
    job runs beside the first caller's — never more than 2 compilers at once (either caller
    may then hold both, one of them the reserve, for as long as the other has nothing
    compiling)."""
    cc = _interval_cc(tmp_path / "cc", 0.6)
    settings = make_settings(tmp_path, clean_env, compilers={"cc": str(cc)})

    def req(n: int, who: str) -> CompileRequest:
        data = kernel_request(n)
        data["defines"] = {**data["defines"], "WHO": who}
        return parse_request(data, Path("/"))

    with CompileQueue(settings, workers=1, reserve_workers=1) as queue:
        alone = [queue.submit(req(n, "a"), caller="a") for n in range(3)]
        assert all(f.result(timeout=120).status == "compiled" for f in alone)
        assert _most_at_once(tmp_path / "cc" / "cc.log") == 1
        assert queue.counters["reserve_starts"] == 0
        hold = tmp_path / "cc" / "hold-a"
        hold.touch()  # a's jobs stay running until b's job has started beside them
        mixed = [queue.submit(req(10 + n, "a"), caller="a") for n in range(3)]
        mixed += [queue.submit(req(20 + n, "b"), caller="b") for n in range(3)]
        try:
            wait_for(lambda: queue.counters["reserve_starts"] >= 1, 60, "b's job on the reserve")
        finally:
            hold.unlink()  # else closing the queue would wait for a's held job for ever
        assert all(f.result(timeout=120).status == "compiled" for f in mixed)
    log = tmp_path / "cc" / "cc.log"
    assert _most_at_once(log) == 2  # the reserve ran the other caller's job beside, no more
    assert queue.counters["reserve_starts"] >= 1
