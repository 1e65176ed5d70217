"""A hung remote never holds a caller (docs/remote.md#failure-isolation): against a real
``redis-server`` paused with ``SIGSTOP``, ``cachemgr compile --local --remote`` pays one
short lookup timeout, exits within 1 s of printing its result (an upload still under way is
dropped and counted), and the next run skips the remote without connecting to it (the
breaker's window is shared through the user's state folder)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cachemgr.remote.config import DEFAULT_OPERATION_TIMEOUT_MS
from tests.compile_util import calls, counting_cc, request_data
from tests.daemon_util import wait_for
from tests.remote_util import RedisServer, keys_toml

LOOKUP_S = DEFAULT_OPERATION_TIMEOUT_MS / 1000
#: Slack over the same run without a remote (seconds): scheduling on a loaded 2-core host;
#: the code before took 11 s to print and 10 s more to exit.
MARGIN_S = 1.5


@dataclass
class Run:
    """One CLI run: its output and when it printed its result and exited."""

    stdout: str
    stderr: str
    returncode: int
    to_print_s: float  # from start to the result line on stdout
    print_to_exit_s: float  # from that line to the process's exit


def _compile(args: list[str], env: dict[str, str], cwd: Path) -> Run:
    """Run ``cachemgr compile`` and time its result line and its exit."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cachemgr", "compile", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()  # the one result line (--json: one per request)
    printed = time.monotonic()
    try:
        rest, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    exited = time.monotonic()
    return Run(line + rest, err, proc.returncode, printed - started, exited - printed)


@pytest.fixture
def paused(redis_server: RedisServer) -> Iterator[RedisServer]:
    """The server, to be paused by the test; always resumed (then stopped by its fixture)."""
    try:
        yield redis_server
    finally:
        if redis_server.proc is not None:
            os.kill(redis_server.proc.pid, signal.SIGCONT)


def _connections(server: RedisServer, probe: object) -> int:
    return int(probe.info("stats")["total_connections_received"])  # type: ignore[attr-defined]


def _setup(tmp_path: Path, cc: Path, ns: tuple[int, ...]) -> tuple[Path, list[Path]]:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[compilers]\ncc = "{cc}"\n[remote]\n' + keys_toml(tmp_path))
    reqs = []
    for n in ns:
        req = tmp_path / f"r{n}.json"
        req.write_text(json.dumps(request_data(defines={"N": n, "B_N": 1})))
        reqs.append(req)
    return cfg, reqs


@pytest.mark.serial  # bounds of a second or two on a whole CLI run
def test_paused_redis_costs_one_lookup_timeout_and_the_next_run_skips_it(
    paused: RedisServer, tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """Redis paused before the first run (default timeouts): that run's lookup times out
    once (the breaker opens at once and says so), it compiles, prints and exits at once; a
    second run within the breaker's window never connects (the server's connection count,
    read after ``SIGCONT``) and says why it skipped the remote."""
    cc = counting_cc(tmp_path / "cc")
    cfg, reqs = _setup(tmp_path, cc, (2501, 2502, 2500))
    remote = paused.url + "|name=r"
    base = ["--json", "--local", "--config", str(cfg), "--cache-dir", str(tmp_path / "cache")]
    # the floor: the same kind of run with no remote, on this host at this moment (a loaded
    # 2-core host takes seconds to start Python and compile)
    floor = _compile([*base, str(reqs[2])], clean_env, tmp_path)
    assert floor.returncode == 0, floor.stderr
    probe = paused.client()
    before = _connections(paused, probe)
    assert paused.proc is not None
    os.kill(paused.proc.pid, signal.SIGSTOP)

    first = _compile([*base, "--remote", remote, str(reqs[0])], clean_env, tmp_path)
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert out["status"] == "compiled" and out["via"] == "local", out
    # the request's own time (lookup + compile) and the whole run's (with Python's start)
    assert out["seconds"] <= LOOKUP_S + 1.0, out
    assert first.to_print_s <= floor.to_print_s + LOOKUP_S + MARGIN_S, (first, floor)
    assert first.print_to_exit_s <= 1.0, first
    assert "remote r failing (TimeoutError" in first.stderr, first.stderr

    second = _compile([*base, "--remote", remote, str(reqs[1])], clean_env, tmp_path)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["status"] == "compiled"
    assert "remote r failing (TimeoutError" in second.stderr, second.stderr
    assert "seen by an earlier run): skipped for" in second.stderr, second.stderr
    assert second.to_print_s <= floor.to_print_s + MARGIN_S, (second, floor)
    assert second.print_to_exit_s <= 1.0, second
    assert len(calls(tmp_path / "cc")) == 3

    os.kill(paused.proc.pid, signal.SIGCONT)
    # the connections made while it was paused wait in the listen backlog; Redis accepts
    # them all in one go when it runs again
    wait_for(lambda: _connections(paused, probe) > before, 30, "the paused-time connections")
    assert _connections(paused, probe) - before == 1, "only the first run tried the remote"


@pytest.mark.serial  # bounds of a second or two on a whole CLI run
def test_exit_drops_an_upload_the_remote_hangs_on_and_counts_it(
    paused: RedisServer, tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """The remote answers the lookup (a miss), then hangs during the compile (the compiler
    pauses it): the upload is under way when the result is printed; the run exits within
    1 s of printing, dropping it with one warning line, and the cache's counters keep
    ``remote_uploads_dropped_at_exit``."""
    assert paused.proc is not None
    cc = counting_cc(tmp_path / "cc", body=f"kill -STOP {paused.proc.pid}")
    cfg, reqs = _setup(tmp_path, cc, (2511,))
    cache = tmp_path / "cache"
    args = ["--json", "--local", "--config", str(cfg), "--cache-dir", str(cache)]
    run = _compile([*args, "--remote", paused.url + "|name=r", str(reqs[0])], clean_env, tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["status"] == "compiled"
    assert run.print_to_exit_s <= 1.0, run
    assert "1 upload to the remotes not done within 0.4 s: dropped" in run.stderr, run.stderr
    assert len(calls(tmp_path / "cc")) == 1
    os.kill(paused.proc.pid, signal.SIGCONT)
    stats = subprocess.run(
        [sys.executable, "-m", "cachemgr", "stats", "--json", "--local", "--cache-dir", str(cache)],
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert stats.returncode == 0, stats.stderr
    assert '"remote_uploads_dropped_at_exit": 1' in stats.stdout, stats.stdout


def test_the_shared_breaker_file_is_untrusted_input(tmp_path: Path) -> None:
    """The state file is read bounded and validated: a planted far-future time keeps the
    remote off for at most ``open_s``; another remote's file, a non-number, an oversized
    file or a symlink are ignored; a success removes the file, so the next run uses the
    remote again."""
    from cachemgr.remote.breakerfile import MAX_BYTES, BreakerFile
    from cachemgr.remote.tierset import FAILING, OK, Breaker

    url = "redis://127.0.0.1:6379/0"
    store = BreakerFile(tmp_path / "remotes", url)
    assert Breaker("r", 3, 30.0, store=store).state == OK  # no file yet

    store.save(30.0, "TimeoutError: Timeout reading from socket")
    assert oct(store.path.stat().st_mode & 0o777) == "0o600"
    fresh = Breaker("r", 3, 30.0, store=store)
    assert fresh.state == FAILING and not fresh.allow() and "Timeout" in fresh.why

    def planted(doc: object) -> str:
        store.path.write_text(json.dumps(doc))
        return Breaker("r", 3, 5.0, store=store).state

    far = {"format": 1, "url": url, "open_until": time.time() + 1e9, "why": "x"}
    store.path.write_text(json.dumps(far))
    breaker = Breaker("r", 3, 5.0, store=store)
    assert breaker.state == FAILING and breaker.open_until - time.monotonic() <= 5.0
    assert planted(dict(far, url="redis://elsewhere:1/0")) == OK
    assert planted(dict(far, open_until="forever")) == OK
    assert planted(dict(far, open_until=float("inf"))) == OK
    assert planted([far]) == OK
    store.path.write_text(json.dumps(far) + " " * MAX_BYTES)
    assert Breaker("r", 3, 5.0, store=store).state == OK
    store.path.unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps(far))
    store.path.symlink_to(tmp_path / "elsewhere.json")
    assert Breaker("r", 3, 5.0, store=store).state == OK
    store.path.unlink()

    store.save(30.0, "ConnectionError")
    now = [time.monotonic()]
    reopened = Breaker("r", 3, 30.0, store=store, clock=lambda: now[0])
    assert not reopened.allow()
    now[0] += 31
    assert reopened.allow(), "after its window: one probe"
    reopened.success()
    assert not store.path.exists() and Breaker("r", 3, 30.0, store=store).state == OK
