"""Admin endpoints are for the daemon's own user and root (``cachemgr/daemon/api.py``,
``ADMIN_ONLY``): ``/reload``, ``/stats/zero`` and ``/stop`` change the service, not the cache,
and the socket is group-writable. A group member who asks gets ``403`` with one line saying
who may; the member keeps what the group is for (``/compile``, ``/lookup``, ``/hits``, ``/gc``).
Real daemon running as a real user, real socket, real group member (root only:
``users``/``other_runtime``).
"""

from __future__ import annotations

import json
import subprocess
import textwrap

from cachemgr.client import Client
from tests.test_cli_operator import _toolkit
from tests.test_daemon_resources import _user_daemon
from tests.users_util import Runtime, Users, run_python_as

#: Posts each path of argv[2:] (``/hits`` with 5 hits, ``/gc`` as a dry run, the others
#: empty) and prints ``{path: [status, message]}``.
ASK = textwrap.dedent(
    """
    import json, sys
    from cachemgr.client import Client, DaemonError
    client = Client(sys.argv[1], timeout_s=60, local_hits=False)
    bodies = {"/hits": {"hits": 5}, "/gc": {"dry_run": True}}
    out = {}
    for path in sys.argv[2:]:
        try:
            client.request("POST", path, bodies.get(path, {}))
            out[path] = [200, ""]
        except DaemonError as exc:
            out[path] = [exc.status, str(exc)]
    print(json.dumps(out), flush=True)
    """
)


def _as_bob(users: Users, rt: Runtime, *argv: str, env: dict[str, str] | None = None):
    env = {"CACHEMGR_DAEMON_USER": users.alice, **(env or {})}  # bob trusts alice's socket
    return run_python_as(users, rt, users.bob, *argv, env=env, timeout=120)


def test_a_group_member_may_not_reload_zero_or_stop_the_daemon(
    users: Users, other_runtime: Runtime
) -> None:
    d = _user_daemon(users, other_runtime, users.alice, "")
    script = users.base / "ask.py"
    script.write_text(ASK)
    sock = str(d.socket_path)
    bob_uid = int(subprocess.check_output(["id", "-u", users.bob], text=True))
    try:
        out = _as_bob(users, other_runtime, str(script), sock, "/hits", "/gc", *sorted(
            ("/reload", "/stats/zero", "/stop")
        ))  # fmt: skip
        assert out.returncode == 0, out.stderr + d.log()
        answers = json.loads(out.stdout)
        assert answers.pop("/hits") == [200, ""] and answers.pop("/gc") == [200, ""]
        for path, (status, message) in answers.items():
            assert status == 403, (path, status, message)
            assert message.startswith(f"{path}: only the daemon's user ({users.alice}, uid ")
            assert f"or root may, on the Unix socket; you are uid {bob_uid} ({users.bob})" in (
                message
            )
            assert "\n" not in message
        client = Client(d.socket_path, local_hits=False, daemon_user=users.alice)
        assert client.available()  # not stopped
        assert client.stats().counters["hits"] == 5  # bob's hits counted, not zeroed
        # the CLI: one line, exit 2
        root = str(users.base / "shared")
        cli = _as_bob(
            users, other_runtime, "-m", "cachemgr", "stats", "--zero", "--socket", sock,
            "--cache-dir", root,
        )  # fmt: skip
        assert cli.returncode == 2, cli.stdout + cli.stderr
        assert cli.stderr.count("\n") == 1 and "only the daemon's user" in cli.stderr
        line = cli.stderr.strip()  # as the CLI's other refusals, not the raw "/stats/zero: …"
        assert line.startswith(f"cachemgr: error: stats --zero: refused by the daemon at {sock}")
        assert line.endswith("; counters unchanged"), line
        assert client.stats().counters["hits"] == 5
        # root may (the test runs as root; the daemon as alice)
        assert client.reload().get("reloaded", True)
        client.request("POST", "/stats/zero", {})
        assert client.stats().counters["hits"] == 0
        assert client.request("POST", "/stop")["stopping"] is True
        assert d.proc.wait(timeout=120) == 0
    finally:
        if d.proc.poll() is None:
            d.stop()


def test_limits_set_by_a_group_member_writes_the_ini_and_says_who_reloads(
    users: Users, other_runtime: Runtime
) -> None:
    d = _user_daemon(users, other_runtime, users.alice, "")
    toolkit = _toolkit(users.base)
    root = users.base / "shared"
    try:
        out = _as_bob(
            users, other_runtime, "-m", "cachemgr", "limits", "set", "--max-size", "1234",
            "--cache-dir", str(root), "--socket", str(d.socket_path), env=toolkit,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        assert "max_op_cache_size=1234" in (root / "kernel_cache" / "op_cache.ini").read_text()
        assert "follows it at its next reconciliation" in out.stdout, out.stdout
        assert "only its user or root may reload it now" in out.stdout
    finally:
        d.stop()
