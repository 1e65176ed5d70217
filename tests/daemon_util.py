"""Start real daemons for tests: temporary HOME and runtime dir, a real notify socket."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachemgr.client import Client

#: ``serve`` refuses root without this flag; tests run as root in CI.
AS_ROOT = ["--allow-root"] if os.geteuid() == 0 else []


def wait_for(
    cond: Callable[[], object], timeout_s: float = 30.0, what: str = "condition"
) -> object:
    """Poll ``cond`` until truthy or raise AssertionError after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)


@dataclass
class Daemon:
    """A running ``cachemgr serve`` subprocess and what talks to it."""

    proc: subprocess.Popen[str]
    socket_path: Path
    env: dict[str, str]
    notify: socket.socket | None
    log_path: Path
    messages: list[str] = field(default_factory=list)
    user: str | None = None  # the user it runs as, when not the test's

    @property
    def client(self) -> Client:
        return Client(self.socket_path, timeout_s=120, daemon_user=self.user)

    def read_notify(self, timeout_s: float = 0.0) -> list[str]:
        """Collect notify datagrams received so far (waiting up to ``timeout_s``)."""
        if self.notify is None:
            return self.messages
        self.notify.settimeout(timeout_s if timeout_s > 0 else 0.001)
        try:
            while True:
                data = self.notify.recv(4096)
                self.messages.append(data.decode())
                self.notify.settimeout(0.001)
        except (TimeoutError, BlockingIOError):
            pass
        return self.messages

    def wait_notify(self, needle: str, timeout_s: float = 30.0) -> None:
        wait_for(
            lambda: any(needle in m for m in self.read_notify(0.05)),
            timeout_s,
            f"notify {needle!r}; got {self.messages}",
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.notify is not None:
            self.notify.close()
            self.notify = None
        return self.proc.returncode


def daemon_env(tmp: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment with its own HOME, XDG_RUNTIME_DIR and state dir under ``tmp``."""
    env = {
        k: v
        for k, v in (base or os.environ).items()
        if not k.startswith(("ASCEND_", "CACHEMGR_", "NOTIFY_SOCKET", "WATCHDOG_"))
    }
    for name in ("home", "run", "state"):
        (tmp / name).mkdir(exist_ok=True)
    (tmp / "run").chmod(0o700)
    env.update(
        HOME=str(tmp / "home"), XDG_RUNTIME_DIR=str(tmp / "run"), XDG_STATE_HOME=str(tmp / "state")
    )
    return env


def own_tmp(env: dict[str, str], tmp: Path) -> dict[str, str]:
    """``env`` with ``TMPDIR=<tmp>/tmp`` (made): what a daemon writes to the temp folder —
    kernels it compiled outside the cache (a ``cachemgr-out-*`` folder, left for the caller to
    read) — lands in the test's folder, not in the real ``/tmp`` after every run."""
    (tmp / "tmp").mkdir(exist_ok=True)
    return {**env, "TMPDIR": str(tmp / "tmp")}


def start_daemon(
    tmp: Path,
    *args: str,
    env: dict[str, str] | None = None,
    notify: bool = True,
    wait_ready: bool = True,
    watchdog_usec: int | None = None,
    python: str = sys.executable,
    popen_kw: dict[str, Any] | None = None,
    prefix: Sequence[str] = (),
    runs_as: str | None = None,
) -> Daemon:
    """Start ``cachemgr serve`` with ``args``; wait for READY=1 (or the socket) unless told not.

    ``python`` runs it (another user needs a Python it may execute); ``popen_kw`` goes to
    :class:`subprocess.Popen` (e.g. ``user=``, ``group=``, ``extra_groups=``, ``umask=``);
    ``prefix`` runs before ``python`` (e.g. ``setpriv`` options: ``tests/unit_util.py``) and
    makes it user ``runs_as``.
    """
    env = dict(env or daemon_env(tmp))
    sock = None
    if notify:
        path = tmp / f"notify-{time.monotonic_ns()}.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(path))
        env["NOTIFY_SOCKET"] = str(path)
    if watchdog_usec:
        env["WATCHDOG_USEC"] = str(watchdog_usec)
    socket_path = Path(env["XDG_RUNTIME_DIR"]) / "cachemgr" / "cachemgr.sock"
    if "--socket" in args:
        socket_path = Path(args[args.index("--socket") + 1])
    log_path = tmp / f"daemon-{time.monotonic_ns()}.log"
    user = runs_as or (popen_kw or {}).get("user")
    as_root = AS_ROOT if user in (None, 0, "root") else []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [*prefix, python, "-m", "cachemgr", "-v", "serve", *as_root, *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            **(popen_kw or {}),
        )
    daemon = Daemon(proc, socket_path, env, sock, log_path, user=str(user) if user else None)
    if wait_ready:
        try:
            if notify:
                wait_for(
                    lambda: (
                        proc.poll() is not None
                        or any("READY=1" in m for m in daemon.read_notify(0.05))
                    ),
                    60,
                    "READY=1",
                )
            else:
                wait_for(
                    lambda: proc.poll() is not None or daemon.client.available(),
                    60,
                    "the daemon to answer",
                )
        except AssertionError:
            daemon.stop()
            raise AssertionError(f"daemon did not become ready:\n{daemon.log()}") from None
        if proc.poll() is not None:
            raise AssertionError(f"daemon exited {proc.returncode}:\n{daemon.log()}")
    return daemon


def wait_first_scan(daemon: Daemon, timeout_s: float = 60.0) -> None:
    """Wait until the daemon's first full scan (the start-up reclaim, then the usage index)
    has finished: it runs in the background after READY=1."""
    wait_for(
        lambda: daemon.client.health().get("scan", {}).get("state") in ("done", "failed"),
        timeout_s,
        "the first scan",
    )
