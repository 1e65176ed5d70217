"""Attacks on what a site sends to and takes from its remotes (docs/security.md, "Fast paths
review"): a group member writing into the daemon's own entries to get its code signed with the
site's key, and a remote server that answers too slowly to ever finish. Real daemons, a real
``redis-server``, a real HTTP server on loopback, real users."""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from cachemgr.remote import blob
from cachemgr.remote.config import RemoteConfig, parse_spec
from cachemgr.remote.http_tier import HttpTier
from cachemgr.remote.redis_tier import RedisTier
from cachemgr.remote.tierset import RemoteTiers
from tests.compile_util import counting_cc, request_data
from tests.conftest import SOC, kernel_json, run_cli
from tests.daemon_util import daemon_env, start_daemon, wait_for
from tests.remote_util import (
    RedisServer,
    http_server,
    keys_config,
    keys_toml,
    site_keys,
    trust_fields,
)
from tests.users_util import Users, run_as


def _write_in_place_as(users: Users, name: str, path: Path, data: Path) -> None:
    """User ``name`` rewrites ``path`` in place (same inode, same owner) with the bytes of
    ``data``: what any member may do to a group-writable file."""
    script = (
        "import os, sys\n"
        "data = open(sys.argv[2], 'rb').read()\n"
        "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)\n"
        "os.write(fd, data)\n"
        "os.close(fd)\n"
    )
    done = subprocess.run(
        ["/usr/bin/python3", "-c", script, str(path), str(data)],
        capture_output=True,
        text=True,
        check=False,
        **run_as(name, users),  # type: ignore[arg-type]
    )
    assert done.returncode == 0, done.stderr


def test_a_member_writing_into_the_daemons_own_entry_gets_nothing_signed(
    redis_server: RedisServer, tmp_path: Path, users: Users
) -> None:
    """The daemon's own entries are ``0660`` for the sharing group, so any member may write
    into them without changing their owner. A member rewrites the binary and the json of an
    entry the daemon compiled (same inodes, still the daemon user's files) after the remote
    lost it (its LRU eviction): the daemon must not sign the member's bytes with the site's
    key and upload them, where every other site would serve them as a verified remote hit."""
    cc = counting_cc(tmp_path / "cc")
    remote = redis_server.url + "|name=r"
    folder = tmp_path / "site"
    folder.mkdir()
    cfg = folder / "c.toml"
    cfg.write_text(f'[compilers]\ncc = "{cc}"\n[remote]\nstorage = ["{remote}"]\n')
    cfg.write_text(cfg.read_text() + keys_toml(tmp_path))
    root = users.base / "cache"
    root.mkdir()
    shutil.chown(root, group=users.group)
    root.chmod(0o2770)
    env = daemon_env(folder)
    d = start_daemon(folder, "--cache-dir", str(root), "--config", str(cfg), env=env)
    probe = redis_server.client()
    try:
        first = d.client.compile(request_data(defines={"N": 7171, "B_N": 1})).to_json()
        assert first["status"] == "compiled", first
        kernel = first["kernel_name"]
        chip = Path(first["files"][0]).parent
        key = RedisTier.key(chip.name, kernel)
        wait_for(lambda: probe.exists(key), 30, "the compile's own upload")
        probe.delete(key)  # the remote's maxmemory LRU evicted it
        main, binary = chip / f"{kernel}.json", chip / f"{kernel}.o"
        assert main.stat().st_uid == os.geteuid() and main.stat().st_mode & 0o020

        evil = b"\x7fELF a member's code " + os.urandom(64)
        doc = json.loads(main.read_bytes())
        doc["sha256"] = kernel_json(kernel, evil)["sha256"]
        staged = users.base / "staged"
        staged.mkdir()
        (staged / "o").write_bytes(evil)
        (staged / "json").write_bytes(json.dumps(doc).encode())
        staged.chmod(0o755)
        for part in ("o", "json"):
            (staged / part).chmod(0o644)
        _write_in_place_as(users, users.alice, binary, staged / "o")
        _write_in_place_as(users, users.alice, main, staged / "json")
        assert main.stat().st_uid == os.geteuid()  # still the daemon user's file

        def settled() -> bool:
            remotes = d.client.stats().to_json()
            return bool(probe.exists(key)) or remotes["remote_upload_refused"] >= 1

        wait_for(settled, 30, "the daemon to upload or refuse the rewritten entry")
        raw = probe.get(key)
        if raw is not None:
            got = blob.decode(raw, chip.name, kernel, site_keys(tmp_path))
            assert evil not in got.files.values(), "the member's binary went out signed"
        assert raw is None, "a member's bytes were uploaded under the site's key"
    finally:
        d.stop()


class _Quiet(http.server.BaseHTTPRequestHandler):
    """A test server's handler that writes no access log line."""

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Trickles(_Quiet):
    """An HTTP cache server that answers every ``GET`` with a ``Content-Length`` and then one
    byte every 0.1 s: never silent for the read timeout, never done."""

    stop = threading.Event()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "4000")
        self.end_headers()
        try:
            self.body()
        except OSError:  # the client gave up: what it should do
            return

    def body(self) -> None:
        for _ in range(4000):
            if self.stop.wait(0.1):
                return
            self.wfile.write(b"x")
            self.wfile.flush()


@pytest.fixture
def trickling() -> Iterator[str]:
    with http_server(_Trickles) as url:
        try:
            yield url
        finally:
            _Trickles.stop.set()  # before the server shuts down: its handler stops writing


def test_a_server_trickling_its_answer_costs_a_lookup_a_bounded_time(
    trickling: str, tmp_path: Path
) -> None:
    """A remote that sends its answer one byte at a time, each within the read timeout
    (``operation-timeout``, 500 ms), held a lookup — a compile, under its entry lock — for as
    long as the answer lasts (4,000 bytes: 400 s; a 64 MiB one: months). The lookup must end
    as a miss that opens the breaker, long before the answer would."""
    spec = parse_spec(f"{trickling}|name=slow|operation-timeout=500", "test")
    config = RemoteConfig((spec,), "test", failures_before_open=3, **trust_fields(tmp_path))
    tiers = RemoteTiers.from_config(config)
    assert tiers is not None
    got: list[object] = []
    lookup = threading.Thread(target=lambda: got.append(tiers.fetch(SOC, "te_slow")), daemon=True)
    lookup.start()
    lookup.join(timeout=60)  # the answer would take 400 s
    assert not lookup.is_alive(), "the lookup is still reading the trickled answer"
    assert got == [None]
    row = tiers.stats()["slow"]
    assert row["errors"] == 1 and row["state"] == "failing", row


class _GoesSilent(_Trickles):
    """An HTTP cache server that answers every ``GET`` with a ``Content-Length`` of 4,000,
    sends ten bytes and then nothing, the connection left open."""

    stop = threading.Event()

    def body(self) -> None:
        self.wfile.write(b"x" * 10)
        self.wfile.flush()
        self.stop.wait(60)


def test_a_server_silent_in_the_middle_of_its_answer_is_a_failed_lookup(
    tmp_path: Path,
) -> None:
    """A remote that stops sending halfway through an answer trips the read timeout inside
    the body's read. That is the tier's failure (``requests.RequestException``), which the
    tier set turns into a miss that counts an error, not urllib3's own exception escaping
    to the compile (a CI run saw it escape a writer's index flush under load)."""
    _GoesSilent.stop.clear()
    with http_server(_GoesSilent) as url:
        try:
            spec = parse_spec(f"{url}|name=silent|operation-timeout=300", "test")
            config = RemoteConfig((spec,), "test", **trust_fields(tmp_path))
            tier = HttpTier(spec, writer="a" * 16, keys=site_keys(tmp_path))
            with pytest.raises(requests.RequestException, match="timed out"):
                tier.fetch_blob(SOC, "te_silent")
            tiers = RemoteTiers.from_config(config)
            assert tiers is not None
            assert tiers.fetch(SOC, "te_silent") is None
            assert tiers.stats()["silent"]["errors"] == 1
        finally:
            _GoesSilent.stop.set()


class _Redirects(_Quiet):
    """An HTTP cache server that answers every request with a redirect to another path of
    its own (``Location``), counting what it was asked."""

    asked: list[str] = []  # noqa: RUF012 (the test reads it)

    def _redirect(self) -> None:
        self.asked.append(f"{self.command} {self.path}")
        self.send_response(302)
        self.send_header("Location", f"/hop{len(self.asked)}{self.path}")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = do_DELETE = _redirect

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._redirect()


def _serving(handler: type[_Redirects] | type[_BadHeader]) -> Iterator[str]:
    """A loopback server of ``handler`` (its ``asked`` list emptied first): its URL."""
    handler.asked.clear()
    with http_server(handler) as url:
        yield url


@pytest.fixture
def redirecting() -> Iterator[str]:
    yield from _serving(_Redirects)


def test_a_remote_answering_redirects_is_asked_once_a_lookup(
    redirecting: str, tmp_path: Path
) -> None:
    """A remote that answers every lookup with a redirect to another of its paths: each
    lookup followed 30 of them (31 requests, each allowed its own ``operation-timeout``: a
    server answering each near the timeout held a compile for 15 s, times the failures
    before the breaker opens), wherever they pointed. A cache server's URL names the server:
    a redirect is not followed, it is one failure naming it."""
    spec = parse_spec(f"{redirecting}|name=moved", "test")
    config = RemoteConfig((spec,), "test", failures_before_open=1, **trust_fields(tmp_path))
    tiers = RemoteTiers.from_config(config)
    assert tiers is not None
    assert tiers.fetch(SOC, "te_moved") is None
    assert len(_Redirects.asked) == 1, _Redirects.asked[:3]
    row = tiers.stats()["moved"]
    assert row["errors"] == 1 and row["state"] == "failing", row
    assert (
        "HTTP 302" in tiers.breakers["moved"].why and "not followed" in tiers.breakers["moved"].why
    )


class _BadHeader(_Quiet):
    """An HTTP cache server whose every answer carries a line that is no header (no colon)
    among its headers: urllib3 logs it as a WARNING with its own traceback."""

    asked: list[str] = []  # noqa: RUF012 (the test reads it)

    def _answer(self) -> None:
        self.asked.append(f"{self.command} {self.path}")
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nno header here\r\n\r\nhello")
        self.wfile.flush()

    do_GET = do_HEAD = do_PUT = _answer


@pytest.fixture
def bad_header() -> Iterator[str]:
    yield from _serving(_BadHeader)


def test_a_malformed_header_line_is_one_log_line_without_a_traceback(
    bad_header: str, tmp_path: Path
) -> None:
    """A remote answering with a line that is no header among its headers: cachemgr says the
    answer is garbage (one line), but urllib3's own logger wrote a WARNING *and its
    multi-line traceback* to the CLI's stderr. Another library's record is one line without
    ``-vv``; with ``-vv`` its traceback is kept, for a developer."""
    home = tmp_path / "home"
    home.mkdir()
    base = ("--soc", SOC, "--cache-dir", str(tmp_path / "cache"))
    base += ("--config", str(keys_config(tmp_path)), "--remote", bad_header)
    env = {**os.environ, "HOME": str(home)}
    out = run_cli("warm", *base, env=env)
    assert _BadHeader.asked, "the remote was not asked"
    assert "index registry is not JSON" in out.stderr, out.stderr  # cachemgr's own line
    assert "Traceback" not in out.stderr, out.stderr
    for line in out.stderr.splitlines():  # each line an event: a level or cachemgr's prefix
        assert line.startswith(("WARNING ", "ERROR ", "cachemgr: ")), out.stderr
    assert out.stderr.count("Failed to parse headers") == 1, out.stderr
    debug = run_cli("-vv", "warm", *base, env=env)
    assert "Traceback" in debug.stderr and "HeaderParsingError" in debug.stderr, debug.stderr


def test_a_malformed_header_line_is_one_line_of_the_daemons_log(
    bad_header: str, tmp_path: Path
) -> None:
    """The daemon's log (``-v``, as the unit runs it): a compile's lookup and upload to a
    remote whose answers carry a malformed header line leave one log line per event —
    every line starts with its time stamp, none is a traceback's."""
    cc = counting_cc(tmp_path / "cc")
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[compilers]\ncc = "{cc}"\n[remote]\nstorage = ["{bad_header}|name=bad"]\n'
        + keys_toml(tmp_path)
    )
    d = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "cache"), "--config", str(cfg))
    try:
        done = d.client.compile(request_data(defines={"N": 7272, "B_N": 1})).to_json()
        assert done["status"] == "compiled", done
        wait_for(lambda: "Failed to parse headers" in d.log(), 30, "urllib3's warning")
        wait_for(lambda: "rejected" in d.log(), 30, "cachemgr's own line for the answer")
    finally:
        d.stop()
    log = d.log()
    assert "Traceback" not in log, log
    stamped = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")
    for line in log.splitlines():
        assert stamped.match(line), (line, log)
