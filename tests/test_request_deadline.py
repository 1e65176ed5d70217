"""Slowloris: a whole-request read deadline (``[daemon] request_timeout_s``).

A group member that sends its request one byte at a time (each read succeeds, so the idle
timeout never fires) used to hold its connection, and one of its 128 slots, for as long as it
liked. Now the request line, headers and body must all arrive within ``request_timeout_s`` of
the request's first byte; a slower request is answered ``408`` and closed. The answer is not
timed: an honest compile that takes longer than the deadline still comes back. Real daemon,
real socket, real users (root only: ``users``/``other_runtime``).
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

from tests.daemon_util import wait_for
from tests.shared_util import kernel_request
from tests.test_daemon_resources import _slow_cc, _user_daemon
from tests.users_util import Runtime, Users, run_as

#: The deadline the tests configure (seconds); far below the idle timeout (30 s).
DEADLINE_S = 3

#: Sends ``head`` then ``body`` one byte every ``gap`` seconds until the daemon answers or
#: closes, or 60 s pass; prints what came back and when.
TRICKLE = textwrap.dedent(
    """
    import json, socket, sys, time
    path, head, gap = sys.argv[1], sys.argv[2].encode(), float(sys.argv[3])
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.setblocking(False)
    start = time.monotonic()
    got, sent = b"", 0
    while time.monotonic() - start < 60:
        try:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
            continue
        except BlockingIOError:
            pass
        except OSError:
            break
        try:
            s.send(head[sent % len(head):][:1])
            sent += 1
        except OSError:
            break
        time.sleep(gap)
    print(json.dumps({"after_s": time.monotonic() - start, "sent": sent,
                      "answer": got.decode(errors="replace")}), flush=True)
    """
)

#: An honest compile through the Client, as another group member.
COMPILE = textwrap.dedent(
    """
    import json, sys, time
    from cachemgr.client import Client
    client = Client(sys.argv[1], timeout_s=120, local_hits=False)
    start = time.monotonic()
    out = client.compile(json.loads(sys.argv[2]), "/").to_json()
    print(json.dumps({"status": out["status"], "took_s": time.monotonic() - start}), flush=True)
    """
)


def _env(rt: Runtime, users: Users) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": rt.pythonpath,
        "CACHEMGR_DAEMON_USER": users.alice,  # bob trusts alice's socket
    }


def _trickle(users: Users, rt: Runtime, sock: str, head: str, gap_s: float) -> dict:
    script = users.base / "trickle.py"
    script.write_text(TRICKLE)
    out = subprocess.run(
        [rt.python, str(script), sock, head, str(gap_s)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(rt, users),
        **run_as(users.bob, users),  # type: ignore[arg-type]
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_request_trickled_a_byte_at_a_time_is_answered_408_and_closed(
    users: Users, other_runtime: Runtime
) -> None:
    config = f"[daemon]\nrequest_timeout_s = {DEADLINE_S}\n"
    d = _user_daemon(users, other_runtime, users.alice, config)
    try:
        # headers that never end: one byte every 0.3 s keeps every read well inside the
        # idle timeout (30 s), so only a whole-request deadline can end it
        head = "GET /health HTTP/1.1\r\n" + "X-Pad: " + "a" * 400 + "\r\n"
        got = _trickle(users, other_runtime, str(d.socket_path), head, 0.3)
        assert got["answer"].startswith("HTTP/1.1 408"), got
        assert "request_timeout_s" in got["answer"], got
        assert DEADLINE_S - 0.5 < got["after_s"] < 20, got  # not before, and long before idle
        # the same with the headers complete and the body trickled
        body = '{"hits": 1}' + " " * 200
        head = f"POST /hits HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n{body}"
        got = _trickle(users, other_runtime, str(d.socket_path), head, 0.3)
        assert got["answer"].startswith("HTTP/1.1 408"), got
        assert got["after_s"] < 20, got
        bob_uid = int(subprocess.check_output(["id", "-u", users.bob], text=True))
        wait_for(
            lambda: f"uid {bob_uid}" in d.log() and "request_timeout_s" in d.log(),
            30,
            "one warning naming the slow caller",
        )
        assert d.client.health()["status"] == "ok"  # the daemon serves on
    finally:
        d.stop()


def test_an_honest_compile_longer_than_the_deadline_still_answers(
    users: Users, other_runtime: Runtime
) -> None:
    cc = _slow_cc(users.base / "cc", DEADLINE_S + 3)
    config = f"[daemon]\nrequest_timeout_s = {DEADLINE_S}\n[compilers]\ncc = '{cc}'\n"
    d = _user_daemon(users, other_runtime, users.alice, config)
    script = users.base / "compile.py"
    script.write_text(COMPILE)
    try:
        request = kernel_request(7)
        request["kernel_source"] = str(other_runtime.kernels / "c" / "add.c")
        out = subprocess.run(
            [other_runtime.python, str(script), str(d.socket_path), json.dumps(request)],
            capture_output=True,
            text=True,
            timeout=180,
            env=_env(other_runtime, users),
            **run_as(users.bob, users),  # type: ignore[arg-type]
        )
        assert out.returncode == 0, out.stderr + d.log()
        answer = json.loads(out.stdout)
        assert answer["status"] == "compiled", answer
        assert answer["took_s"] > DEADLINE_S + 3, answer  # the answer outlived the deadline
    finally:
        d.stop()
