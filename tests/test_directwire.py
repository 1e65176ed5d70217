"""Direct mode through a running daemon (:mod:`cachemgr.directwire`): a memo's hit is one
request (``POST /compile/if-config``, with the digest of the settings it was prepared with)
from a process that imports neither :mod:`json` nor :mod:`re`; a daemon whose settings are
not those answers ``412`` with nothing done, and the full path then answers. Real
``python -m cachemgr`` processes, a real daemon on its real socket, ``strace`` for what
goes over it."""

from __future__ import annotations

import json
import marshal
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachemgr import directwire
from tests.daemon_util import start_daemon, wait_for
from tests.test_deputy import _as_bob, _crafted, _request, _setup
from tests.test_direct import DaemonKit, Kit, Run
from tests.users_util import Runtime, Users

#: Modules the lean path through the daemon must not load: json (which imports re), and
#: binascii (which loads libz) while the inputs' base64 fits in the memo.
NOT_LOADED = ("json", "re", "binascii", "base64")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[DaemonKit]:
    kit = DaemonKit(tmp_path)
    try:
        yield kit
    finally:
        kit.daemon.stop()


def _traced(kit: DaemonKit, trace: Path) -> Run:
    """The kit's command under ``strace`` (the requests it writes) and ``-X importtime``."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed")
    proc = subprocess.run(
        [strace, "-f", "-qq", "-s", "64", "-e", "trace=sendto,sendmsg,write", "-o", str(trace),
         sys.executable, "-X", "importtime", "-m", "cachemgr", *kit.argv],
        env=kit.env, cwd=kit.project, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return Run(proc)


def _floor(kit: DaemonKit) -> set[str]:
    """What the interpreter imports before any of cachemgr's code (an editable install's
    finder imports pathlib, and so re): not the hit's."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"],
        env=kit.env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Run(proc).modules


def _requests(trace: Path) -> list[str]:
    """The HTTP request lines the traced process sent."""
    sent = re.findall(
        r'(?:sendto|write|sendmsg)\(\d+, .*?"((?:GET|POST) [^ ]+) HTTP/1', trace.read_text()
    )
    return list(sent)


def test_direct_hit_through_the_daemon_is_one_request_without_json(served: DaemonKit) -> None:
    served.primed()
    hits, misses = served.daemon_counts()
    trace = served.tmp / "trace"
    lean = _traced(served, trace)
    assert lean.code == 0 and lean.direct and lean.status() == "hit", lean.out + lean.err
    assert _requests(trace) == [f"POST {directwire.ENDPOINT}"], "one round trip"
    assert served.daemon_counts() == (hits + 1, misses)
    mine = lean.modules - _floor(served)
    assert [m for m in mine if m.split(".")[0] in NOT_LOADED] == []
    memo = marshal.loads(served.memos()[0].read_bytes())
    assert "\\u0000data" not in memo["body"], "small inputs are recorded with their bytes"


def _memo_body(kit: DaemonKit) -> tuple[dict[str, object], bytes]:
    """The memo the full path recorded, and the body a direct hit sends for it now."""
    memo = marshal.loads(kit.memos()[0].read_bytes())
    return memo, directwire.body(memo)


def _post(sock: Path, target: str, body: bytes) -> tuple[int, dict[str, object]]:
    """One real request on the daemon's socket: its status and JSON answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(str(sock))
        head = f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        s.sendall(head.encode() + body)
        out = b""
        while b"\r\n\r\n" not in out or len(out.partition(b"\r\n\r\n")[2]) < _length(out):
            chunk = s.recv(65536)
            assert chunk, out
            out += chunk
    status = int(out.split(b" ", 2)[1])
    return status, json.loads(out.partition(b"\r\n\r\n")[2])


def _length(out: bytes) -> int:
    head = out.partition(b"\r\n\r\n")[0].decode().lower()
    found = re.search(r"content-length: (\d+)", head)
    return int(found.group(1)) if found else 0


def test_the_daemon_compiles_if_config_only_with_its_own_settings(served: DaemonKit) -> None:
    """Another digest: 412 and nothing counted; none: 400; its own: the hit."""
    served.primed()
    memo, body = _memo_body(served)
    digest = str(memo["config_answer"])
    hits, misses = served.daemon_counts()
    other = body.replace(digest.encode(), b"0" * 64)
    status, answer = _post(served.daemon.socket_path, directwire.ENDPOINT, other)
    assert status == directwire.CONFIG_CHANGED, answer
    assert "nothing was done" in str(answer["error"])
    doc = json.loads(body)
    del doc[directwire.CONFIG_FIELD]
    status, answer = _post(served.daemon.socket_path, directwire.ENDPOINT, json.dumps(doc).encode())
    assert status == 400 and directwire.CONFIG_FIELD in str(answer["error"]), answer
    assert served.daemon_counts() == (hits, misses), "nothing done"
    status, answer = _post(served.daemon.socket_path, directwire.ENDPOINT, body)
    assert status == 200 and answer["status"] == "hit", answer
    assert served.daemon_counts() == (hits + 1, misses)


class ConfiguredKit(DaemonKit):
    """A :class:`DaemonKit` whose daemon (alone: the CLI's environment has no
    ``CACHEMGR_CONFIG``) reads a config file of its own, ``conf``."""

    def __init__(self, tmp: Path) -> None:
        Kit.__init__(self, tmp)
        self.conf = tmp / "daemon.toml"
        self.conf.write_text("[daemon]\nworkers = 2\n")
        env = {**self.env, "CACHEMGR_CONFIG": str(self.conf)}
        self.daemon = start_daemon(tmp, "--cache-dir", str(self.cache), env=env)


@pytest.fixture
def configured(tmp_path: Path) -> Iterator[ConfiguredKit]:
    kit = ConfiguredKit(tmp_path)
    try:
        yield kit
    finally:
        kit.daemon.stop()


def test_settings_changed_behind_the_memo_hand_over_with_nothing_done(
    configured: ConfiguredKit,
) -> None:
    """The daemon reloads other settings after the memo was written: the memo's request is
    refused (412) before anything is done, and the full path asks and reports the hit."""
    kit = configured
    kit.primed()
    kit.conf.write_text("[daemon]\nworkers = 3\n")
    log_before = kit.daemon.log().count("configuration reloaded")
    kit.daemon.signal(signal.SIGHUP)
    wait_for(
        lambda: kit.daemon.log().count("configuration reloaded") > log_before, 60, "the reload"
    )
    hits, misses = kit.daemon_counts()
    after = kit.run()
    assert after.code == 0 and after.status() == "hit" and after.err == "", after.out + after.err
    assert not after.direct, "the full path answered"
    assert kit.daemon_counts() == (hits + 1, misses), "one compile request: the 412 did nothing"
    again = kit.run()  # the full path wrote a memo of the new settings
    assert again.direct and again.status() == "hit" and again.code == 0, again.err


def test_inputs_too_big_for_the_memo_are_encoded_when_sent(served: DaemonKit) -> None:
    """A header past :data:`directwire.EMBEDDED_BYTES`: its data is a placeholder, encoded
    (binascii) when sent; the hit is still direct and the same."""
    filler = "/* " + "x" * 100 + " */\n"
    header = served.project / "inc" / "k.h"
    header.write_text("#define SCALE 2.0f\n" + filler * (directwire.EMBEDDED_BYTES // 80))
    lean = served.primed()
    assert lean.status() == "hit" and "binascii" in lean.modules
    memo = marshal.loads(served.memos()[0].read_bytes())
    assert "\\u0000data1\\u0000" in memo["body"] and "\\u0000data0" not in memo["body"]
    header.write_text(header.read_text().replace("x", "y", 1))  # same size, other bytes
    after = served.run()
    assert not after.direct and after.status() == "compiled", after.out + after.err


#: Run as a group member: the daemon's settings digest as a client computes it, then one
#: ``POST /compile/if-config`` with that digest and the body given; prints status and body.
MEMBER = """
import json, socket, sys
from cachemgr import directwire
def ask(method, target, body=b""):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(120); s.connect(sys.argv[1])
        s.sendall(f"{method} {target} HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: {len(body)}\\r\\n"
                  "Connection: close\\r\\n\\r\\n".encode() + body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    head, _, payload = out.partition(b"\\r\\n\\r\\n")
    return int(head.split()[1]), payload
code, config = ask("GET", "/config?sections=1")
body = json.loads(sys.argv[2])
body[directwire.CONFIG_FIELD] = directwire.config_digest(json.loads(config))
code, payload = ask("POST", directwire.ENDPOINT, json.dumps(body).encode())
print(json.dumps({"code": code, "body": payload.decode(errors="replace")}))
"""


def test_a_member_meets_the_same_checks_on_if_config(users: Users, other_runtime: Runtime) -> None:
    """A group member (not the daemon's user) asking with the daemon's own settings digest:
    a request naming the daemon user's file without its bytes is refused as ``/compile``
    refuses it (the daemon reads nothing for a caller); the member's own bytes compile (in
    the sandbox) and then hit, the entry verified; nothing leaks (``_as_bob``)."""
    rt = other_runtime
    daemon, _, secret, bob = _setup(users, rt)
    try:
        sock = str(daemon.socket_path)
        body = json.dumps({"request": _request(str(secret)), "base_dir": str(bob)})
        out = _as_bob(users, rt, bob, MEMBER, sock, body)
        assert out["code"] == 400 and "carries no inputs" in out["body"], out
        crafted = _crafted(str(bob / "k.c"), "void scale_kernel(float *x) { x[0] *= 2; }\n")
        first = _as_bob(users, rt, bob, MEMBER, sock, crafted)
        assert first["code"] == 200 and json.loads(first["body"])["status"] == "compiled", first
        again = _as_bob(users, rt, bob, MEMBER, sock, crafted)
        assert again["code"] == 200 and json.loads(again["body"])["status"] == "hit", again
    finally:
        daemon.stop()


def test_a_second_checkout_of_the_kernels_gets_direct_through_the_daemon(
    served: DaemonKit,
) -> None:
    """An entry compiled from one folder and hit from a copy of it: the copy's headers come
    from a dependency listing (its manifest is its own), and the daemon's hit records them,
    as a local hit does — so the copy's next full hit writes the memo, and later hits are
    direct."""
    first = served.run()
    assert first.code == 0 and first.status() == "compiled", first.out + first.err
    manifests = set(served.chip.glob("*.manifest"))
    served.project = served.tmp / "checkout2"
    shutil.copytree(served.tmp / "proj", served.project)
    full = served.run()
    assert full.code == 0 and full.status() == "hit" and not full.direct, full.out + full.err
    assert len(set(served.chip.glob("*.manifest")) - manifests) == 1, "the copy's manifest"
    hits, misses = served.daemon_counts()
    for _ in range(2):  # the memo is written by the first full hit that needs no listing
        last = served.run()
        assert last.code == 0 and last.status() == "hit", last.out + last.err
    assert last.direct, "the copy's hits never got direct"
    assert served.daemon_counts() == (hits + 2, misses)
