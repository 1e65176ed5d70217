"""Unauthenticated TCP connections cannot lock token holders out (docs/security.md, section 9).

An outsider without the token held all 128 places of the TCP share (idle connections live
30 s), and every token holder was refused 429. Now a TCP connection not authenticated
``auth_deadline_s`` (2 s) after its accept is closed, unauthenticated connections hold at
most ``max_unauth_per_address`` places per source address and ``max_unauth_connections`` in
all, and a newcomer evicts the oldest unauthenticated one. Everything runs for real: a
daemon with a TCP listener on 127.0.0.1, an outsider (a real user outside the group) opening
200 raw connections for a bounded time, and token holders through :class:`Client`.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cachemgr.client import Client
from tests.compile_util import request_data
from tests.daemon_util import AS_ROOT, Daemon, daemon_env, start_daemon
from tests.users_util import Runtime, Users, run_as

TOKEN = "5eed" * 16
#: The default [daemon] auth_deadline_s, and what scheduling may add to it on a busy host.
AUTH_DEADLINE_S = 2.0
SLACK_S = 1.5
#: How long the outsider keeps its connections up (seconds): the token holders' tries fit.
FLOOD_S = 20.0

# The outsider: keeps COUNT connections from SRC to HOST:PORT for SECONDS, reopening each
# one the server closes (after 0.25 s). Slot i % 4: silent; a head trickled a byte per
# 0.25 s that never ends; a whole request with a wrong token; half a head, then silence.
# Prints "ready" once every slot has been tried, then one JSON line of what it saw.
FLOODER = textwrap.dedent(
    """
    import json, select, socket, sys, time
    host, port, count, seconds, src = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \\
        float(sys.argv[4]), sys.argv[5]
    heads = [b"", b"GET /health HTTP/1.1\\r\\nHost: %s:%d\\r\\nX-Pad: " % (host.encode(), port),
             b"GET /health HTTP/1.1\\r\\nHost: %s:%d\\r\\nAuthorization: Bearer %s\\r\\n\\r\\n"
             % (host.encode(), port, b"0" * 64),
             b"GET /health HTTP/1.1\\r\\nHost: "]
    slots = [None] * count  # (sock, connected_at, last_byte_at) or None
    reopen = [0.0] * count
    lifetimes, answers = [], {}
    opened = failed = 0
    def close(i, now, by_server):
        sock, since, _ = slots[i]
        sock.close()
        slots[i] = None
        reopen[i] = now + 0.25
        if by_server:
            lifetimes.append(now - since)
    def open_slot(i, now):
        global opened, failed
        s = socket.socket()
        s.settimeout(1.0)
        try:
            s.bind((src, 0))
            s.connect((host, port))
            s.setblocking(False)
            if heads[i % 4]:
                s.send(heads[i % 4])
        except OSError:
            s.close()
            failed += 1
            reopen[i] = now + 0.25
            return
        opened += 1
        slots[i] = (s, now, now)
    start = time.monotonic()
    for i in range(count):
        open_slot(i, time.monotonic())
    print("ready", flush=True)
    while (now := time.monotonic()) - start < seconds:
        live = {slot[0]: i for i, slot in enumerate(slots) if slot}
        ready, _, _ = select.select(list(live), [], [], 0.05)
        now = time.monotonic()
        for s in ready:
            i = live[s]
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:  # reset: the server closed it with bytes unread
                data = b""
            if data.startswith(b"HTTP/1.1 "):
                status = data.split()[1].decode()
                answers[status] = answers.get(status, 0) + 1
            if not data:
                close(i, now, True)
        for i, slot in enumerate(slots):
            if slot is None:
                if now >= reopen[i]:
                    open_slot(i, now)
            elif i % 4 == 1 and now - slot[2] >= 0.25:
                try:
                    slot[0].send(b"a")
                    slots[i] = (slot[0], slot[1], now)
                except OSError:
                    close(i, now, True)
    now = time.monotonic()
    held = [now - slot[1] for slot in slots if slot]
    for slot in slots:
        if slot:
            slot[0].close()
    print(json.dumps({"opened": opened, "failed": failed, "closed": len(lifetimes),
                      "longest_closed_s": max(lifetimes, default=0.0),
                      "longest_open_s": max(held, default=0.0), "answers": answers}))
    """
)


def _tcp_daemon(tmp: Path, extra: str = "") -> tuple[Daemon, str, int]:
    token = tmp / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    cfg = tmp / "c.toml"
    cfg.write_text(f"[daemon]\ntcp_token_file = '{token}'\n{extra}")
    d = start_daemon(tmp, "--cache-dir", str(tmp / "c"), "--config", str(cfg), "--tcp-port", "0")
    host, port = d.client.health()["tcp"]
    return d, host, port


def _slow_honest_request(host: str, port: int, src: str, pause_s: float) -> int:
    """Connect from ``src``, say nothing for ``pause_s`` (under the deadline), then send a
    request with the token: the answer's status (0 when the server closed the connection)."""
    with socket.socket() as s:
        s.settimeout(10)
        s.bind((src, 0))
        s.connect((host, port))
        time.sleep(pause_s)  # a slow client, on purpose: still inside auth_deadline_s
        head = f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {TOKEN}"
        try:
            s.sendall(head.encode() + b"\r\nConnection: close\r\n\r\n")
            data = s.recv(65536)
        except OSError:
            return 0
    return int(data.split()[1]) if data.startswith(b"HTTP/1.1 ") else 0


def _read_to_end(s: socket.socket) -> bytes:
    """What arrives on ``s`` until the server closes it (its timeout bounds each read)."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def _flood(
    users: Users, rt: Runtime, host: str, port: int, count: int, seconds: float
) -> subprocess.Popen[str]:
    """The outsider (a real user outside the group) running :data:`FLOODER` from 127.0.0.1,
    once it has tried every slot."""
    script = users.base / "flood.py"
    script.write_text(FLOODER)
    flood = subprocess.Popen(
        [rt.python, str(script), host, str(port), str(count), str(seconds), "127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        **run_as(users.carol, users),  # type: ignore[arg-type]
    )
    assert flood.stdout is not None
    if flood.stdout.readline().strip() != "ready":
        flood.kill()
        _, err = flood.communicate(timeout=10)
        raise AssertionError(f"the flooder did not start: {err}")
    return flood


def test_an_outsider_without_the_token_cannot_lock_token_holders_out(
    tmp_path: Path, users: Users, other_runtime: Runtime
) -> None:
    d, host, port = _tcp_daemon(tmp_path)
    flood = _flood(users, other_runtime, host, port, 200, FLOOD_S)
    assert flood.stdout is not None
    try:
        started = time.monotonic()
        took: list[float] = []
        slow_other_address: list[int] = []
        for n in range(10):  # a new connection each time: each must find a place
            while time.monotonic() < started + n * 1.2:
                time.sleep(0.05)  # paced tries over ~12 s while the flood goes on
            t0 = time.monotonic()
            client = Client(tcp=(host, port), token=TOKEN, timeout_s=30)
            try:
                if n % 2:
                    assert client.compile(request_data()).ok
                else:
                    assert client.health()["pid"] == d.proc.pid
            finally:
                client.close()
            took.append(time.monotonic() - t0)
            # another source address is not starved by the flood from 127.0.0.1
            slow_other_address.append(_slow_honest_request(host, port, "127.0.0.2", 1.0))
        assert time.monotonic() - started < FLOOD_S, "the tries outlasted the flood"
        out, _ = flood.communicate(timeout=60)
    finally:
        flood.kill()
        flood.wait(10)
        d.stop()
    assert max(took) < 5.0, took
    assert slow_other_address == [200] * 10, slow_other_address
    seen = json.loads(out)
    assert seen["opened"] >= 200, seen
    # the server closed every connection that did not authenticate, within the deadline
    assert seen["longest_closed_s"] < AUTH_DEADLINE_S + SLACK_S, seen
    assert seen["longest_open_s"] < AUTH_DEADLINE_S + SLACK_S, seen
    log = d.log()
    assert "evicted an unauthenticated TCP connection from 127.0.0.1" in log, log[-3000:]


def test_a_full_tcp_share_evicts_unauthenticated_connections_never_token_holders(
    tmp_path: Path, users: Users, other_runtime: Runtime
) -> None:
    # a share of 40: 24 held by token holders, so the outsider's connections fill the rest
    # (16, fewer than max_unauth_connections) and the share itself is what is full
    extra = "max_connections_per_caller = 40\nmax_unauth_per_address = 32\n"
    d, host, port = _tcp_daemon(tmp_path, extra)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    kept = []
    for _ in range(24):
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", "/health", headers=auth)
        assert conn.getresponse().read()
        kept.append((conn, conn.sock))
    flood = _flood(users, other_runtime, host, port, 100, 8.0)
    try:
        started = time.monotonic()
        for n in range(5):
            while time.monotonic() < started + n * 1.2:
                time.sleep(0.05)  # paced tries while the flood goes on
            t0 = time.monotonic()
            client = Client(tcp=(host, port), token=TOKEN, timeout_s=30)
            try:
                assert client.health()["pid"] == d.proc.pid
            finally:
                client.close()
            assert time.monotonic() - t0 < 5.0
        assert time.monotonic() - started < 8.0, "the tries outlasted the flood"
        flood.communicate(timeout=60)
        for conn, sock in kept:  # never evicted: the same connections still answer
            conn.request("GET", "/health", headers=auth)
            assert conn.getresponse().status == 200 and conn.sock is sock
            conn.close()
    finally:
        flood.kill()
        flood.wait(10)
        d.stop()


def test_a_connection_that_authenticated_once_stays_open(tmp_path: Path) -> None:
    d, host, port = _tcp_daemon(tmp_path)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", "/health", headers=auth)
        first = conn.getresponse()
        assert first.status == 200 and first.read()
        sock = conn.sock
        assert sock is not None
        # past the auth deadline the kept-alive connection is still served (the idle
        # timeout, 30 s, is what closes it): nothing, not even end-of-file, arrives meanwhile
        readable, _, _ = select.select([sock], [], [], AUTH_DEADLINE_S + SLACK_S)
        assert not readable
        conn.request("GET", "/health", headers=auth)
        second = conn.getresponse()
        assert second.status == 200 and second.read() and conn.sock is sock
        conn.close()
        with socket.create_connection((host, port), timeout=10) as s:
            t0 = time.monotonic()
            answer = _read_to_end(s)  # never authenticated: 408 with the setting, then closed
            assert time.monotonic() - t0 < AUTH_DEADLINE_S + SLACK_S
            assert answer.startswith(b"HTTP/1.1 408 ") and b"auth_deadline_s" in answer
    finally:
        d.stop()


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ("max_unauth_connections = 128", "max_unauth_connections = 128 must be below"),
        ("max_unauth_per_address = 0", "max_unauth_per_address = 0 is invalid; accepted: an int"),
        ("auth_deadline_s = 0", "auth_deadline_s = 0 is invalid; accepted: a number of sec"),
    ],
)
def test_bad_unauthenticated_bounds_are_one_line(tmp_path: Path, setting: str, needle: str) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[daemon]\ntcp_token_file = '{token}'\n{setting}\n")
    exe = [sys.executable, "-m", "cachemgr", "serve", *AS_ROOT, "--config", str(cfg)]
    done = subprocess.run(
        [*exe, "--cache-dir", str(tmp_path / "c"), "--tcp-port", "0"],
        env=daemon_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and needle in done.stderr, done.stderr
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("cachemgr: error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr


def test_the_pool_evicts_the_oldest_of_the_address_then_of_the_largest() -> None:
    from cachemgr.daemon.unauth import UnauthPool

    pool: UnauthPool[str] = UnauthPool(per_address=2, total=3)
    assert pool.add("a1", "A") is None and pool.add("a2", "A") is None
    assert pool.add("a3", "A") == "a1"  # its address is full: its own oldest goes
    assert pool.add("b1", "B") is None  # total 3 now
    assert pool.add("c1", "C") == "a2"  # the pool is full: the oldest of the largest (A)
    assert pool.count("A") == 1 and len(pool) == 3
    assert pool.remove("b1") and not pool.remove("b1")
    assert "a3" in pool and "a1" not in pool
