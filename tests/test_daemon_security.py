"""The daemon side of docs/security.md (sections 5 in part, 6, 7, 8, 11 and the systemd unit): each
attack is run for real — real daemons on real sockets, FIFOs, real Unix users where one is needed
(the ``users``/``other_runtime`` fixtures, root only), a fake daemon started by an outsider.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cachemgr.client import Client, DaemonError
from cachemgr.errors import CacheMgrError
from cachemgr.sockcheck import UntrustedDaemon, check_peer
from tests.compile_util import request_data
from tests.conftest import ROOT, run_cli
from tests.daemon_util import AS_ROOT, Daemon, daemon_env, start_daemon, wait_for
from tests.users_util import Runtime, Users, run_as, user_home

TOKEN = "c0ffee" * 8


def _serve_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "cachemgr", "serve", *args]


def _serve_refused(*args: str, env: dict[str, str], started: str) -> tuple[int, str]:
    """Run ``cachemgr serve ARGS``, which must refuse to start: its exit code and stderr.

    :raises AssertionError: with ``started`` when it still runs after 60 s.
    """
    proc = subprocess.Popen(
        _serve_cmd(*args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(started) from None
    return proc.returncode, err


def _raw(
    sock_path: Path, method: str, path: str, body: bytes, headers: str = ""
) -> tuple[int, dict]:
    """One HTTP request over the Unix socket; the status and the decoded JSON answer."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(60)
        s.connect(str(sock_path))
        s.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"{headers}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data, f"empty reply to {body[:80]!r}"
    head, _, payload = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


# --- security.md 5: serve refuses root; each compile is logged with its caller --------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="the refusal concerns root")
def test_serve_refuses_root_without_the_flag(tmp_path: Path) -> None:
    code, err = _serve_refused(
        "--cache-dir",
        str(tmp_path / "c"),
        env=daemon_env(tmp_path),
        started="serve ran as root without --allow-root",
    )
    assert code == 2, err
    assert err.count("\n") == 1 and "refusing to run the daemon as root" in err
    assert "--allow-root" in err and "Traceback" not in err
    assert not (tmp_path / "c").exists()  # nothing was started or created


def test_each_compile_is_logged_with_the_callers_credentials(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "c"))
    try:
        out = (
            Client(d.socket_path, local_hits=False).compile(request_data(), base_dir="/").to_json()
        )
        assert out["status"] == "compiled"
        line = wait_for(
            lambda: [
                ln for ln in d.log().splitlines() if out["kernel_name"] in ln and " for " in ln
            ],
            30,
            "the compile's log line",
        )
        assert f"pid {os.getpid()} uid {os.getuid()} gid {os.getgid()} (" in line[0], line
        assert "compiled" in line[0], line
    finally:
        d.stop()


# --- security.md 11: JSON that is not a request is a 400 with one line, never an empty reply ------

NOT_REQUESTS = [
    b"1" * 5000,  # a number of 5000 digits
    b"[" * 100_000 + b"]" * 100_000,  # nesting deeper than the parser's recursion limit
    b'{"request": ' + b"9" * 5000 + b"}",
    b'{"request": {}, "base_dir": "/", "priority": NaN}',
    b'{"request": {}, "base_dir": "/\\ud800"}',  # a lone surrogate
]


def _bad_compile_bodies() -> list[bytes]:
    good = request_data()
    bodies = [
        {"request": good, "base_dir": "/", "wait": "no"},
        {"request": good, "base_dir": "/", "replace": 1},
        {"request": good, "base_dir": "/", "priority": 10**400 // 10**390},
        {"request": {**good, "kernel_source": "\ud800"}, "base_dir": "/"},
    ]
    return [json.dumps(b).encode() for b in bodies]


def test_json_that_is_not_a_request_gets_400_with_one_line(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "c"))
    try:
        cases = [("/compile", b) for b in NOT_REQUESTS + _bad_compile_bodies()]
        cases += [("/gc", b'{"dry_run": "yes"}'), ("/gc", b'{"min_age_s": Infinity}')]
        for path, body in cases:
            status, answer = _raw(d.socket_path, "POST", path, body)
            assert status == 400, (body[:80], status, answer)
            assert "\n" not in answer["error"] and answer["error"], answer
        assert d.client.health()["status"] == "ok"
        assert not (tmp_path / "c" / "kernel_cache").exists() or not list(
            (tmp_path / "c" / "kernel_cache").rglob("*.json")
        )
    finally:
        d.stop()


# --- security.md 8: request files never block, must be regular and under a cap --------------------


def _source_request(folder: Path) -> tuple[dict, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "k.c"
    shutil.copy(ROOT / "examples" / "kernels" / "c" / "add.c", src)
    return request_data(kernel_source=str(src)), src


def test_a_source_swapped_for_a_fifo_behind_the_parsed_cache_is_refused(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "c"))
    try:
        client = Client(d.socket_path, timeout_s=20, local_hits=False)
        data, src = _source_request(tmp_path / "src")
        assert client.compile(data, base_dir="/").to_json()["status"] == "compiled"
        src.unlink()
        os.mkfifo(src)  # the same request again: the daemon's parsed-request cache knows it
        start = time.monotonic()
        for _ in range(3):
            with pytest.raises(CacheMgrError) as info:
                client.compile(data, base_dir="/")
            assert info.value.exit_code == 2 and "not a regular file" in str(info.value)
        assert time.monotonic() - start < 15  # refused at once, no thread blocked
        assert client.health()["status"] == "ok"
    finally:
        d.stop()


def test_a_huge_source_is_refused_unread(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "c"))
    try:
        client = Client(d.socket_path, timeout_s=20, local_hits=False)
        data, src = _source_request(tmp_path / "src")
        assert client.compile(data, base_dir="/").to_json()["status"] == "compiled"
        os.truncate(src, 65 << 20)  # a sparse 65 MiB file: over the 64 MiB cap, never read
        start = time.monotonic()
        with pytest.raises(CacheMgrError) as info:
            client.compile(data, base_dir="/")
        assert info.value.exit_code == 2 and "over" in str(info.value), info.value
        assert time.monotonic() - start < 10
    finally:
        d.stop()


def test_a_request_file_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "req.json"
    os.mkfifo(fifo)
    env = {**daemon_env(tmp_path), "PATH": os.environ["PATH"]}
    args = ["compile", str(fifo), "--cache-dir", str(tmp_path / "c")]
    out = subprocess.run(
        [sys.executable, "-m", "cachemgr", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out
    assert "FIFO" in out.stderr and str(fifo) in out.stderr, out.stderr
    with pytest.raises(DaemonError, match="FIFO"):
        Client(tmp_path / "none.sock").compile_file(fifo)


# --- security.md 6: the TCP listener --------------------------------------------------------------


def _token_file(tmp: Path, mode: int = 0o600) -> Path:
    path = tmp / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(mode)
    return path


def test_tcp_listener_refuses_to_start_without_a_private_token(tmp_path: Path) -> None:
    env = daemon_env(tmp_path)
    cases = {"": "needs a secret token", "0644": "chmod 600", "link": "symbolic link"}
    for case, needle in cases.items():
        cfg = tmp_path / f"c{case}.toml"
        lines = "[daemon]\n"
        if case == "0644":
            lines += f"tcp_token_file = '{_token_file(tmp_path, 0o644)}'\n"
        elif case == "link":
            link = tmp_path / "token-link"
            link.symlink_to(_token_file(tmp_path))
            lines += f"tcp_token_file = '{link}'\n"
        cfg.write_text(lines)
        code, err = _serve_refused(
            *AS_ROOT,
            "--tcp-port",
            "0",
            "--cache-dir",
            str(tmp_path / "c"),
            "--config",
            str(cfg),
            env=env,
            started=f"the TCP listener started ({case or 'no token'})",
        )
        assert code == 2 and needle in err, (case, err)
        errors = [ln for ln in err.splitlines() if ln.startswith("cachemgr: error:")]
        assert len(errors) == 1 and "Traceback" not in err, err
        assert not (tmp_path / "c").exists()  # refused before anything was made


def _tcp_daemon(tmp: Path) -> tuple[Daemon, str, int]:
    cfg = tmp / "c.toml"
    cfg.write_text(f"[daemon]\ntcp_token_file = '{_token_file(tmp)}'\n")
    d = start_daemon(tmp, "--cache-dir", str(tmp / "c"), "--config", str(cfg), "--tcp-port", "0")
    host, port = d.client.health()["tcp"]
    return d, host, port


def _tcp(
    host: str, port: int, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> int:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request(method, path, body=body or None, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def test_tcp_requests_need_the_token_their_own_host_and_json(tmp_path: Path) -> None:
    d, host, port = _tcp_daemon(tmp_path)
    try:
        own = f"{host}:{port}"
        auth = {"Host": own, "Authorization": f"Bearer {TOKEN}"}
        body = json.dumps({"dry_run": True}).encode()
        js = {"Content-Type": "application/json"}
        assert _tcp(host, port, "GET", "/health", auth) == 200
        assert _tcp(host, port, "GET", "/health", {"Host": own}) == 401
        wrong = {**auth, "Authorization": f"Bearer {TOKEN[:-1]}0"}
        assert _tcp(host, port, "GET", "/config", wrong) == 401
        assert _tcp(host, port, "GET", "/config", {**auth, "Authorization": TOKEN}) == 401
        # DNS rebinding: a foreign name resolving to 127.0.0.1 carries its own Host
        assert _tcp(host, port, "GET", "/config", {**auth, "Host": f"evil.example:{port}"}) == 421
        # a page of another site posting from the browser
        cross = {**auth, **js, "Origin": "http://evil.example"}
        assert _tcp(host, port, "POST", "/gc", cross, body) == 403
        form = {**auth, "Content-Type": "application/x-www-form-urlencoded"}
        assert _tcp(host, port, "POST", "/gc", form, body) == 415
        assert _tcp(host, port, "POST", "/gc", {**auth, "Content-Type": "text/plain"}, body) == 415
        assert _tcp(host, port, "POST", "/gc", {**auth, **js}, body) == 200
        same = {**auth, **js, "Origin": f"http://{own}"}
        assert _tcp(host, port, "POST", "/gc", same, body) == 200
        client = Client(tcp=(host, port), token=TOKEN, timeout_s=30)
        assert client.health()["pid"] == d.proc.pid
        with pytest.raises(DaemonError) as info:
            Client(tcp=(host, port), timeout_s=30).health()
        assert info.value.status == 401
        assert d.client.health()["status"] == "ok"  # the Unix socket needs no token
    finally:
        d.stop()


# --- security.md 7: the client authenticates the daemon -------------------------------------------

FAKE_DAEMON = textwrap.dedent(
    """
    import json, os, socketserver, sys
    from http.server import BaseHTTPRequestHandler
    path, cache, loot = sys.argv[1], sys.argv[2], sys.argv[3]
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *args):
            pass
        def _send(self, obj):
            data = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def do_GET(self):
            self._send({"status": "ok", "service": "cachemgr", "pid": os.getpid(),
                        "kernel_cache_dir": {"value": cache, "origin": "default"}})
        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            with open(loot, "ab") as f:
                f.write(self.rfile.read(n) + b"\\n")
            self._send({"kernel_name": "te_evil", "status": "hit", "seconds": 0,
                        "files": ["/tmp/evil.o"]})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.chmod(os.path.dirname(path), 0o755)
    srv = socketserver.ThreadingUnixStreamServer(path, H)
    os.chmod(path, 0o666)
    print("ready", flush=True)
    srv.serve_forever()
    """
)


def test_a_fake_daemon_of_an_outsider_in_the_tmp_fallback_is_refused(
    users: Users, other_runtime: Runtime
) -> None:
    alice_uid = int(subprocess.check_output(["id", "-u", users.alice], text=True))
    folder = Path(f"/tmp/cachemgr-{alice_uid}")  # the fallback of a uid made for this test
    assert not folder.exists()
    alice_home = user_home(users, users.alice)
    carol_home = user_home(users, users.carol)
    loot = carol_home / "loot"
    script = carol_home / "fake.py"
    script.write_text(FAKE_DAEMON)
    fake = subprocess.Popen(
        [
            other_runtime.python,
            str(script),
            str(folder / "cachemgr.sock"),
            str(alice_home / "atc_data" / "kernel_cache"),
            str(loot),
        ],
        stdout=subprocess.PIPE,
        text=True,
        **run_as(users.carol, users),  # type: ignore[arg-type]
    )
    try:
        assert fake.stdout is not None and fake.stdout.readline().strip() == "ready"
        req = alice_home / "req.json"
        data = request_data(kernel_source=str(other_runtime.kernels / "c" / "add.c"))
        req.write_text(json.dumps(data))
        shutil.chown(req, users.alice)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": other_runtime.pythonpath,
            "HOME": str(alice_home),
        }
        out = subprocess.run(
            [other_runtime.python, "-m", "cachemgr", "compile", str(req), "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=alice_home,
            **run_as(users.alice, users),  # type: ignore[arg-type]
        )
        assert out.returncode == 2, out
        assert out.stderr.count("\n") == 1, out.stderr
        assert f"refusing daemon socket {folder}/cachemgr.sock" in out.stderr
        assert users.carol in out.stderr, out.stderr
        assert not loot.exists()  # the fake daemon received nothing
        # the line's way out is one alice can take: she may not remove carol's folder of
        # the sticky /tmp (it said "remove it"); --local, or a runtime folder of her own
        for needle in (f"ask {users.carol} or root to remove it", "--local", "XDG_RUNTIME_DIR"):
            assert needle in out.stderr, out.stderr
        own = alice_home / "run"
        own.mkdir(mode=0o700)
        shutil.chown(own, users.alice)
        for way in ({"XDG_RUNTIME_DIR": str(own)}, {}):
            argv = [other_runtime.python, "-m", "cachemgr", "compile", str(req), "--json"]
            done = subprocess.run(
                argv + ([] if way else ["--local"]),
                env={**env, **way},
                capture_output=True,
                text=True,
                timeout=120,
                cwd=alice_home,
                **run_as(users.alice, users),  # type: ignore[arg-type]
            )
            assert done.returncode == 0, (way, done.stderr)
        assert not loot.exists()
    finally:
        fake.kill()
        fake.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def test_the_serving_process_is_checked_after_connecting(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as srv:
        srv.bind(str(path))
        srv.listen(1)
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(str(path))
            check_peer(conn, path, {os.getuid()})  # served by us: trusted
            with pytest.raises(UntrustedDaemon, match=f"served by pid {os.getpid()}"):
                check_peer(conn, path, {os.getuid() + 4242})


def test_a_socket_in_a_folder_others_may_write_is_refused(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "c"))
    try:
        d.socket_path.parent.chmod(0o777)  # anyone could swap the socket now
        with pytest.raises(UntrustedDaemon, match="mode 0777"):
            Client(d.socket_path, local_hits=False).health()
        d.socket_path.parent.chmod(0o1777)  # sticky: only the owner replaces its names
        assert Client(d.socket_path, local_hits=False).health()["status"] == "ok"
    finally:
        d.socket_path.parent.chmod(0o700)
        d.stop()


def test_a_symbolic_link_to_the_daemons_socket_is_refused_as_a_link(tmp_path: Path) -> None:
    """``--socket`` naming a symbolic link to a real daemon's socket is refused (its
    target's folder is not the one checked), but the line said "it is not a socket" of a
    link that points at one. It says what the name is — a symbolic link, to where, not
    followed — in one line, for ``status`` as for a command routed to the daemon."""
    d = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "c"))
    links = tmp_path / "links"
    links.mkdir(mode=0o700)
    link = links / "cachemgr.sock"
    link.symlink_to(d.socket_path)
    try:
        for args in (("status",), ("stats", "--cache-dir", str(tmp_path / "c"))):
            out = run_cli(*args, "--socket", str(link), env=d.env)
            assert out.returncode == 2, (args, out.stdout)  # a socket not trusted: as stop
            (line,) = out.stderr.splitlines()
            assert f"refusing daemon socket {link}: it is a symbolic link " in line, line
            assert f"(to {d.socket_path})" in line and "not followed" in line, line
            assert "not a socket" not in line, line
    finally:
        d.stop()


# --- the systemd unit -----------------------------------------------------------------------


def _exposure(unit: Path) -> float:
    proc = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", proc.stdout)
    assert found, proc.stdout + proc.stderr
    return float(found.group(1))


def _final_list(unit_text: str, key: str) -> set[str]:
    """The value of a list setting after every assignment (an empty one resets it)."""
    value: set[str] = set()
    for line in unit_text.splitlines():
        if line.startswith(f"{key}="):
            words = line.split("=", 1)[1].split()
            value = set() if not words else value | set(words)
    return value


def _unit_scored(tmp_path: Path, name: str) -> str:
    """The text of ``systemd/<name>``, after checking that ``systemd-analyze security
    --offline`` scores a copy of it at most 3.0 (skips without systemd-analyze ≥ 250)."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    version = subprocess.run(["systemd-analyze", "--version"], capture_output=True, text=True)
    if int(version.stdout.split()[1]) < 250:
        pytest.skip("systemd-analyze security --offline needs systemd >= 250")
    text = (ROOT / "systemd" / name).read_text()
    unit = tmp_path / name
    unit.write_text(text)
    assert _exposure(unit) <= 3.0
    return text


def test_the_systemd_unit_scores_ok_with_what_the_daemon_needs(tmp_path: Path) -> None:
    text = _unit_scored(tmp_path, "cachemgr.service")
    # what other items need must still be there: the ambient capability inside the
    # bounding set (and not reset by a later empty line), user + mount + pid + network
    # namespaces (the sandbox's view; its own process ids; its own network, brought up over
    # netlink)
    ambient = _final_list(text, "AmbientCapabilities")
    bounding = _final_list(text, "CapabilityBoundingSet")
    assert ambient == {"CAP_FOWNER"} and ambient <= bounding, (ambient, bounding)
    assert bounding == {"CAP_FOWNER"}, bounding
    assert _final_list(text, "RestrictNamespaces") == {"user", "mnt", "pid", "net"}
    assert "AF_NETLINK" in _final_list(text, "RestrictAddressFamilies")
    # memory bounded with the compilers, and an OOM kill ends a compile, not the service
    assert _final_list(text, "MemoryMax") == {"4G"} and _final_list(text, "OOMPolicy") == {
        "continue"
    }
    assert _final_list(text, "UMask") == {"0007"}  # outsiders read nothing
    docs = (ROOT / "docs" / "security.md").read_text()
    for setting in ("PrivateNetwork", "PrivateUsers", "RestrictNamespaces", "UMask", "CAP_FOWNER"):
        assert setting in docs, f"docs/security.md does not say why {setting} stays open"


def test_the_governor_unit_scores_ok_with_only_the_rights_it_needs(tmp_path: Path) -> None:
    """``systemd/cachemgr-governor.service`` (docs/daemon.md#the-privileges-it-needs): root
    bounded to reading every folder and becoming each root's owner — no capability that
    overrides write permission, ownership or the owner's rights — at ≤ 3.0; the member-facing
    unit is a separate file, still as its own test wants it."""
    text = _unit_scored(tmp_path, "cachemgr-governor.service")
    bounding = _final_list(text, "CapabilityBoundingSet")
    assert bounding == {"CAP_DAC_READ_SEARCH", "CAP_SETUID", "CAP_SETGID"}, bounding
    assert not _final_list(text, "AmbientCapabilities")
    assert _final_list(text, "NoNewPrivileges") == {"yes"}
    assert "--govern-only" in _final_list(text, "ExecStart")
    # it serves no member and no network: its socket is root's, Unix only
    assert _final_list(text, "RestrictAddressFamilies") == {"AF_UNIX"}
    assert _final_list(text, "RuntimeDirectoryMode") == {"0700"}
    docs = (ROOT / "docs" / "daemon.md").read_text()
    for cap in (
        "CAP_DAC_READ_SEARCH",
        "CAP_SETUID",
        "CAP_SETGID",
        "CAP_DAC_OVERRIDE",
        "CAP_FOWNER",
    ):
        assert cap in docs, f"docs/daemon.md does not say why {cap} is (not) given"


@pytest.mark.skipif(os.geteuid() != 0, reason="the line concerns root, who may remove it")
def test_root_is_told_to_name_the_daemons_user_not_to_ask_root(
    users: Users, tmp_path: Path
) -> None:
    """Root reaching the service's socket without the members' environment is refused (its
    folder belongs to the daemon's user, not trusted without ``CACHEMGR_DAEMON_USER``); the
    line told root to "ask <owner> or root to remove it". It names the setting with the
    owner's name, and root may remove the folder itself."""
    folder = tmp_path / "run"
    folder.mkdir(mode=0o750)
    shutil.chown(folder, users.carol)
    env = {k: v for k, v in os.environ.items() if k != "CACHEMGR_DAEMON_USER"}
    out = run_cli("status", "--socket", str(folder / "cachemgr.sock"), env=env)
    assert out.returncode == 2, out
    assert out.stderr.count("\n") == 1, out.stderr
    assert f"set CACHEMGR_DAEMON_USER={users.carol} if that user runs your daemon" in out.stderr
    assert "or root to remove it" not in out.stderr and "else remove it" in out.stderr
