"""Real remote servers for the remote-tier tests: ``redis-server`` on a
random loopback port, in a tmp folder, persistence off; wsgidav and nginx (WebDAV); and the
site keys every remote needs (docs/remote.md#keys): :func:`keys_toml`, :func:`keys_config`,
:func:`trust_fields`."""

from __future__ import annotations

import http.server
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from cachemgr.remote import signing
from cachemgr.storage.store import Store
from tests.daemon_util import wait_for


def publish_own(chip: Path, kernel: str, binary: bytes) -> Mapping[str, str]:
    """Publish a good single-binary entry as this process's own compile does: the parts'
    SHA-256 as written, which an upload of it must still read (``upload_now``'s
    ``digests``)."""
    from tests.conftest import kernel_json

    binaries = {kernel + ".o": binary}
    return Store(chip).publish(kernel, binaries, kernel_json(kernel, binary)).digests


#: The key name the tests' sites sign with unless a test names another.
TEST_KEY = "test-site"


def site_key(folder: Path, name: str = TEST_KEY) -> tuple[Path, str]:
    """A private key file ``<folder>/<name>.key`` (made once, mode 0600, as ``cachemgr remote
    keygen`` makes it) and its public key line."""
    path, public = folder / f"{name}.key", folder / f"{name}.pub"
    if not path.exists():  # the public line is kept beside it (the key may be chowned)
        folder.mkdir(parents=True, exist_ok=True)
        public.write_text(signing.create_key_file(path, name).line)
    return path, public.read_text()


def keys_toml(folder: Path, name: str = TEST_KEY, trusted: tuple[str, ...] = ()) -> str:
    """``[remote]`` lines: sign with the key ``name`` (made in ``folder``) and trust it and
    the public key lines ``trusted``."""
    path, line = site_key(folder, name)
    keys = ", ".join(f'"{k}"' for k in (line, *trusted))
    return f'signing_key = "{path}"\ntrusted_keys = [{keys}]\n'


def keys_config(folder: Path, name: str = TEST_KEY) -> Path:
    """A config file with only ``[remote]``'s keys (for a run that names its remotes with
    ``--remote``)."""
    cfg = folder / f"keys-{name}.toml"
    cfg.write_text("[remote]\n" + keys_toml(folder, name))
    return cfg


def site_keys(folder: Path, name: str = TEST_KEY) -> signing.Keys:
    """Keys that sign with the key ``name`` (made in ``folder``) and trust it (for a tier
    made directly: ``RedisTier(spec, keys=...)``)."""
    path, line = site_key(folder, name)
    secret = signing.read_key_file(path, "test")  # this user's own key
    return signing.Keys((signing.parse_public_key(line, "test"),), secret)


def trust_fields(folder: Path, name: str = TEST_KEY) -> dict[str, object]:
    """``RemoteConfig`` fields: sign with the key ``name`` (made in ``folder``), trust it."""
    path, line = site_key(folder, name)
    return {
        "signing_key": path,
        "trusted_keys": (signing.parse_public_key(line, "test"),),
    }


@contextmanager
def http_server(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A threaded stdlib HTTP server of ``handler`` on a loopback port, serving until the
    block ends: yields its remote URL (``http://127.0.0.1:<port>/cache``)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/cache"
    finally:
        server.shutdown()
        server.server_close()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _ServerProcess:
    """A server subprocess (``proc``) with its output in a log file; :meth:`stop` kills it
    and the subclass's ``start`` starts it again on the same port."""

    proc: subprocess.Popen[bytes] | None

    def _spawn(self, args: list[str], log_path: Path) -> None:
        log = open(log_path, "ab")  # noqa: SIM115 - kept by the process
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def _wait_listening(self, port: int, timeout_s: float, what: str) -> None:
        """Wait until something accepts TCP connections on ``127.0.0.1:port`` (or the process
        has exited: the caller's assertion then shows its log)."""

        def up() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return True
            except OSError:
                return self.proc is not None and self.proc.poll() is not None

        wait_for(up, timeout_s, what)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self.proc = None


@dataclass
class RedisServer(_ServerProcess):
    """A running ``redis-server``; :meth:`stop` and :meth:`start` keep its port."""

    folder: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:  # scripts/test and .ci/run install it (Debian package redis-server)
            pytest.fail("redis-server is not installed: apt-get install -y redis-server")
        args = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.folder), "--protected-mode", "yes"]
        self._spawn(args, self.folder / "redis.log")

        def up() -> bool:  # ours: another test's server on a port taken meanwhile is not
            if self.proc is not None and self.proc.poll() is not None:
                return True  # it exited (the port taken?): said below, with its log
            try:
                return int(self.client().info("server")["process_id"]) == self.proc.pid
            except redis.RedisError:
                return False

        wait_for(up, 30, f"redis-server on port {self.port}")
        assert self.proc is not None and self.proc.poll() is None, (
            self.folder / "redis.log"
        ).read_text()[-2000:]


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real Redis server on a random loopback port, stopped after the test."""
    folder = tmp_path / "redis"
    folder.mkdir()
    server = RedisServer(folder, free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class WebDavServer(_ServerProcess):
    """A running ``wsgidav`` (cheroot) serving ``root`` with anonymous read/write."""

    root: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/cache"

    def files(self) -> list[Path]:
        """Every file stored under the served folder."""
        return sorted(p for p in self.root.rglob("*") if p.is_file())

    def start(self) -> None:
        (self.root / "cache").mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "wsgidav.server.server_cli", "--host", "127.0.0.1"]
        args += ["--port", str(self.port), "--root", str(self.root), "--auth", "anonymous"]
        args += ["--no-config", "--server", "cheroot", "-q"]
        self._spawn(args, self.root.parent / "wsgidav.log")
        self._wait_listening(self.port, 60, f"wsgidav on port {self.port}")
        assert self.proc.poll() is None, (self.root.parent / "wsgidav.log").read_text()


@pytest.fixture
def webdav_server(tmp_path: Path) -> Iterator[WebDavServer]:
    """A real WebDAV server (wsgidav from PyPI) accepting PUT, on a random loopback port."""
    server = WebDavServer(tmp_path / "dav" / "root", free_port())
    server.root.mkdir(parents=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class NginxServer(_ServerProcess):
    """A running nginx (Debian's package) with its WebDAV module (``dav_methods PUT DELETE
    MKCOL``, ``create_full_put_path off``: a ``PUT`` into a missing folder is ``409``) serving
    ``root`` on a loopback port; its config, logs and temp files live in ``folder``.

    :param max_body: ``client_max_body_size`` (nginx answers ``413`` to a bigger ``PUT``).
    """

    folder: Path
    port: int
    max_body: str = "64m"
    proc: subprocess.Popen[bytes] | None = None

    @property
    def root(self) -> Path:
        return self.folder / "root"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def access_log(self) -> Path:
        return self.folder / "access.log"

    def files(self) -> list[Path]:
        """Every file stored under the served folder."""
        return sorted(p for p in self.root.rglob("*") if p.is_file())

    def requests(self, method: str) -> list[str]:
        """The access log's lines of ``method`` requests (``"PUT /a/b" 201``…)."""
        if not self.access_log.exists():
            return []
        return [ln for ln in self.access_log.read_text().splitlines() if f'"{method} ' in ln]

    def start(self) -> None:
        exe = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(exe).exists():  # scripts/test and .ci/run install it (Debian: nginx)
            pytest.fail("nginx is not installed: apt-get install -y nginx")
        self.root.mkdir(parents=True, exist_ok=True)
        user = "user root;\n" if os.geteuid() == 0 else ""  # workers write the root as we do
        conf = self.folder / "nginx.conf"
        conf.write_text(
            f"{user}worker_processes 1;\npid {self.folder}/nginx.pid;\n"
            f"error_log {self.folder}/error.log;\nevents {{ worker_connections 64; }}\n"
            "http {\n"
            f"  access_log {self.access_log};\n"
            f"  client_body_temp_path {self.folder}/body;\n"
            f"  proxy_temp_path {self.folder}/proxy;\n  fastcgi_temp_path {self.folder}/fcgi;\n"
            f"  uwsgi_temp_path {self.folder}/uwsgi;\n  scgi_temp_path {self.folder}/scgi;\n"
            f"  client_max_body_size {self.max_body};\n"
            f"  server {{\n    listen 127.0.0.1:{self.port};\n    root {self.root};\n"
            "    dav_methods PUT DELETE MKCOL;\n    create_full_put_path off;\n"
            "    dav_access user:rw group:r all:r;\n  }\n}\n"
        )
        args = [exe, "-p", str(self.folder), "-c", str(conf), "-g", "daemon off;"]
        self._spawn(args, self.folder / "nginx.out")
        self._wait_listening(self.port, 30, f"nginx on port {self.port}")
        assert self.proc is not None and self.proc.poll() is None, (
            self.folder / "nginx.out"
        ).read_text() + (self.folder / "error.log").read_text()

    def stop(self) -> None:
        """``SIGQUIT`` (a graceful stop: the master takes its worker along), then kill."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.proc = None


@pytest.fixture
def nginx_server(tmp_path: Path) -> Iterator[NginxServer]:
    """nginx with WebDAV on a random loopback port (1 MiB bodies at most), stopped after."""
    server = NginxServer(tmp_path / "nginx", free_port(), max_body="1m")
    server.folder.mkdir()
    server.start()
    try:
        yield server
    finally:
        server.stop()
