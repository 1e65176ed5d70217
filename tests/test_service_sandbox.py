"""The documented system service compiles members' kernels in the sandbox, and the sandbox
reaches no network.

* A real daemon runs as a dedicated user in the sharing group with exactly what
  ``systemd/cachemgr.service`` gives it — its ambient and bounding capability sets,
  ``NoNewPrivileges=``, ``UMask=``, its address families and namespaces — read from the unit
  file (``tests/unit_util.py``). Under those sets bubblewrap refused to start ("Unexpected
  capabilities but not setuid"), the daemon's probe said the view did not work, and every
  member's compile was refused. Now a member's kernel compiles in the view, each compiler
  process holds no capability (in the view and, for the daemon's own user, outside it),
  and the daemon keeps ``CAP_FOWNER`` in every thread.
* A compiler in the view connects to nothing: not a TCP listener on the host's loopback or
  its other address (the daemon's TCP port, a local Redis), not an abstract Unix socket
  (another user's), not a path socket outside the view — while the same program run
  outside the view reaches them all.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compile_util import scale_request
from tests.daemon_util import Daemon, start_daemon
from tests.test_deputy import CLIENT, _as_bob, _setup, alices_daemon_folders
from tests.unit_util import (
    NETPROBE,
    cap_bit,
    cap_sets,
    capabilities,
    capdump,
    restrict_helper,
    setpriv_argv,
    setting,
)
from tests.users_util import Runtime, Users, run_as, user_home

KERNEL = "void scale_kernel(float *x) { x[0] *= K; }\n"

#: The compiler of these tests: gcc, but with ``-DPROBE=1`` it runs ``PROBE_COMMAND`` and
#: fails with its output (which the daemon hands back as the error text; nothing a process
#: of the view writes outlives it). A dependency listing (``-MM``, run by the client as the
#: caller, outside any view) is never a probe.
WRAPPER = """#!/bin/sh
case " $* " in *" -MM "*) exec /usr/bin/gcc "$@";; esac
case "$*" in *-DPROBE=1*)
  echo "proc=$(test -d /proc/self && echo yes || echo no)" >&2
  {command} >&2
  exit 1;;
esac
exec /usr/bin/gcc "$@"
"""


def _tools(users: Users) -> Path:
    """A world-readable folder for the test's programs (shown in the view: the compiler's)."""
    tools = users.base / "tools"
    tools.mkdir(exist_ok=True)
    tools.chmod(0o755)
    return tools


def _wrapper(tools: Path, command: str) -> Path:
    """The compiler: :data:`WRAPPER` running ``command`` as its probe."""
    cc = tools / "cc"
    cc.write_text(WRAPPER.format(command=command))
    cc.chmod(0o755)
    return cc


def _config(cc: Path, tools: Path) -> str:
    """The daemon's config: ``cc`` the C compiler, ``tools`` shown in the view (in the temp
    folder, only the compiler's own file would be)."""
    return f'[compilers]\ncc = "{cc}"\n[sandbox]\nallow = ["{tools}"]\n'


def _unit_daemon(users: Users, rt: Runtime, config: str) -> tuple[Daemon, Path]:
    """alice, the daemon user (primary group the sharing one, as ``Group=``), serving a shared
    root on a group socket, started as the unit starts it; and bob's folder."""
    root, home, env, sock_dir = alices_daemon_folders(users)
    env["PYTHONPATH"] = rt.pythonpath
    cfg = users.base / "cachemgr.toml"
    cfg.write_text(config)
    cfg.chmod(0o644)
    args = ["--cache-dir", str(root), "--socket", str(sock_dir / "cachemgr.sock")]
    prefix = [*setpriv_argv(users.alice, users.group), str(restrict_helper(_tools(users)))]
    daemon = start_daemon(
        home,
        *args,
        "--config",
        str(cfg),
        env=env,
        notify=False,
        python=rt.python,
        popen_kw={"umask": int(setting("UMask") or "0022", 8)},
        prefix=prefix,
        runs_as=users.alice,
    )
    return daemon, user_home(users, users.bob)


def _thread_sets(pid: int) -> list[dict[str, int]]:
    """The capability sets of every thread of process ``pid``."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.append(cap_sets((task / "status").read_text()))
        except FileNotFoundError:  # that thread ended meanwhile
            continue
    return found


def _compile(users: Users, rt: Runtime, who: str, folder: Path, sock: str, **defines: int) -> dict:
    """Compile the scale kernel with ``defines`` through the daemon as user ``who``, from
    ``folder``; the client's answer (or ``{"error": ...}``)."""
    src = folder / f"k{'_'.join(f'{k}{v}' for k, v in defines.items())}.c"
    src.write_text(KERNEL)
    src.chmod(0o644)
    shutil.chown(src, who)
    req = json.dumps(scale_request(str(src), defines=defines))
    out = subprocess.run(
        [rt.python, "-c", CLIENT, sock, req, str(folder)],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": rt.pythonpath, "HOME": str(folder),
             "CACHEMGR_DAEMON_USER": users.alice},
        cwd=folder, capture_output=True, text=True, timeout=180, check=False,
        **run_as(who, users),  # type: ignore[arg-type]
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_the_units_daemon_compiles_a_members_kernel_in_the_view_holding_no_capability(
    users: Users, other_runtime: Runtime
) -> None:
    rt = other_runtime
    ambient, bounding = capabilities()
    assert ambient, "the unit gives the daemon no capability: this test proves nothing"
    given = sum(cap_bit(c) for c in ambient)
    tools = _tools(users)
    cc = _wrapper(tools, str(capdump(tools)))
    daemon, bob = _unit_daemon(users, rt, _config(cc, tools))
    try:
        pid = daemon.proc.pid
        status = Path(f"/proc/{pid}/status").read_text()
        sets = cap_sets(status)  # the daemon got what the unit gives
        assert sets["CapAmb"] == given and sets["CapEff"] & given == given, status
        assert sets["CapBnd"] == sum(cap_bit(c) for c in bounding), status
        assert "NoNewPrivs:\t1" in status, status
        sock = str(daemon.socket_path)

        real = _compile(users, rt, users.bob, bob, sock, K=3)
        assert real.get("status") == "compiled", (real, daemon.log())
        viewed = _compile(users, rt, users.bob, bob, sock, K=4, PROBE=1)
        assert viewed.get("status") == "failed" and "proc=no" in viewed["error"], viewed
        inside = cap_sets(viewed["error"].split("proc=no", 1)[1])
        assert inside == dict.fromkeys(("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"), 0), (
            viewed["error"]
        )

        # the daemon's own user: its compiles run outside the view, and hold none either
        home = users.base / users.alice / "work"
        home.mkdir()
        shutil.chown(home, users.alice)
        own = _compile(users, rt, users.alice, home, sock, K=5, PROBE=1)
        assert own.get("status") == "failed" and "proc=yes" in own["error"], own
        outside = cap_sets(own["error"].split("proc=yes", 1)[1])
        held = {k: outside[k] for k in ("CapInh", "CapPrm", "CapEff", "CapAmb")}
        assert held == dict.fromkeys(held, 0), own["error"]

        for thread in _thread_sets(pid):  # every thread kept what the unit gave
            assert thread["CapAmb"] == given and thread["CapEff"] & given == given, thread
    finally:
        daemon.stop()


@pytest.fixture
def listeners(users: Users) -> Iterator[list[str]]:
    """What a compiler must not reach, each listening (``kind:address``, NETPROBE's words): a
    TCP port on every address of the host (loopback and the outward one), an abstract Unix
    socket, and a path socket anyone may connect to, outside the view."""
    tcp = socket.create_server(("0.0.0.0", 0), backlog=64)
    port = tcp.getsockname()[1]
    addresses = ["127.0.0.1"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: the route names the address
            outward = probe.getsockname()[0]
            if outward != "127.0.0.1":
                addresses.append(outward)
        except OSError:
            pass
    name = f"cachemgr-test-{secrets.token_hex(4)}"
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind("\0" + name)
    abstract.listen(64)
    outside = users.base / "outside"
    outside.mkdir()
    outside.chmod(0o755)
    path = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path.bind(str(outside / "s.sock"))
    (outside / "s.sock").chmod(0o777)
    path.listen(64)
    try:
        yield [
            *(f"tcp:{a}:{port}" for a in addresses),
            f"abstract:{name}",
            f"unix:{outside}/s.sock",
        ]
    finally:
        for sock in (tcp, abstract, path):
            sock.close()


def test_a_compiler_in_the_view_connects_to_nothing(
    users: Users, other_runtime: Runtime, listeners: list[str]
) -> None:
    rt = other_runtime
    tools = _tools(users)
    probe = tools / "netprobe.py"
    probe.write_text(NETPROBE)
    probe.chmod(0o644)
    command = f"/usr/bin/python3 {probe} {' '.join(listeners)}"
    cc = _wrapper(tools, command)
    # the same program outside the view, as the daemon user: every target is there
    there = subprocess.run(
        command.split(), capture_output=True, text=True, timeout=60, check=False,
        **run_as(users.alice, users),  # type: ignore[arg-type]
    )  # fmt: skip
    assert there.stdout.count(" connected") == len(listeners), there.stdout + there.stderr
    daemon, _, _, bob = _setup(users, rt, _config(cc, tools))
    try:
        src = bob / "k.c"
        src.write_text(KERNEL)
        src.chmod(0o644)
        req = json.dumps(scale_request(str(src), defines={"K": 2, "PROBE": 1}))
        out = _as_bob(users, rt, bob, CLIENT, str(daemon.socket_path), req, str(bob))
    finally:
        daemon.stop()
    assert out.get("status") == "failed" and "proc=no" in out["error"], out
    for target in listeners:
        assert f"{target} refused" in out["error"], (target, out["error"])
    assert " connected" not in out["error"], out["error"]
