"""``POST /hits`` cannot be abused (docs/daemon.md#hits-a-client-reports).

A client serves hits in its own process and reports their count; any member pushed 8 billion
hits into the counters with a few requests. One report holds at most 100,000, and a caller
other than the daemon's user or root may add at most ``[daemon] max_reported_hits_per_s`` a
second. Real daemon (a dedicated user), a real member on the group's socket.
"""

from __future__ import annotations

import json
import subprocess
import time

from cachemgr.client import Client
from tests.test_deputy import _setup
from tests.users_util import Runtime, Users, run_as

RATE = 1000

REPORT = """
import http.client, json, socket, sys
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(sys.argv[1])
out = []
for hits in json.loads(sys.argv[2]):
    c = C("localhost", timeout=60)
    c.request("POST", "/hits", body=json.dumps({"hits": hits}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out.append([r.status, json.loads(r.read())])
    c.close()
print(json.dumps(out))
"""


def _report(users: Users, rt: Runtime, sock: str, hits: list[int]) -> list[list]:
    """POST /hits once per item of ``hits`` as bob; each answer's ``[status, body]``."""
    out = subprocess.run(
        [rt.python, "-c", REPORT, sock, json.dumps(hits)],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        **run_as(users.bob, users),  # type: ignore[arg-type]
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_member_cannot_push_billions_of_hits(users: Users, other_runtime: Runtime) -> None:
    rt = other_runtime
    config = f"[daemon]\nmax_reported_hits_per_s = {RATE}\n"
    daemon, _, _, _ = _setup(users, rt, config)
    sock = str(daemon.socket_path)
    owner = Client(daemon.socket_path, daemon_user=users.alice)  # root: not bounded

    def counted() -> int:
        return int(owner.stats().counters["hits"])

    try:
        # one report of what no client could have counted (8 of them made 8 billion): refused
        ((status, body),) = _report(users, rt, sock, [1_000_000_000])
        assert status == 400 and "0..100000" in body["error"], body
        assert "\n" not in body["error"]
        assert counted() == 0
        # an honest report is counted
        ((status, body),) = _report(users, rt, sock, [5])
        assert status == 200, body
        assert counted() == 5
        # a flood of full reports: what fits in the member's budget, no more
        start = time.monotonic()
        answers = _report(users, rt, sock, [100_000] * 20)
        elapsed = time.monotonic() - start
        added = counted() - 5
        assert 0 < added <= RATE * (elapsed + 1) + 1, (added, elapsed)
        refused = [b["error"] for s, b in answers if s == 429]
        assert refused, answers
        assert "max_reported_hits_per_s" in refused[0] and "\n" not in refused[0], refused[0]
        assert f"{RATE} hits a second" in refused[0], refused[0]
        # the daemon's own side (root here) is not bounded
        before = counted()
        owner.request("POST", "/hits", {"hits": 100_000})
        assert counted() == before + 100_000
        warnings = [ln for ln in daemon.log().splitlines() if "over its budget" in ln]
        assert len(warnings) == 1, warnings  # one warning, not one per refused report
    finally:
        daemon.stop()
