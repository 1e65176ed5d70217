"""The daemon is no deputy, and a caller's outputs are
the caller's.

A real daemon runs as one user (alice, standing for the daemon user) and keeps a secret only
it may read (``0600`` in its HOME); another real user (bob, a group member) attacks it the
ways docs/security.md section 5 lists — ``kernel_source``, ``op_debug_config``, ``#include`` and
``.incbin`` of that file — with the real client and with hand-made requests that bypass the client.
None may bring the secret back: not in an answer, an error text, or a binary in the cache. Then
bob compiles debug and ``disable`` requests through the daemon from his own folder: the files
land there, owned by him. Users and runtime come from ``tests/users_util.py`` (root only).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.compile_util import scale_request as _request
from tests.daemon_util import AS_ROOT, Daemon, daemon_env, start_daemon, wait_for
from tests.remote_util import keys_toml, site_key
from tests.users_util import Runtime, Users, run_as, user_home

SECRET = "TOPSECRET_4c1d9"
SOC = "Ascend910B1"


def alices_daemon_folders(users: Users) -> tuple[Path, Path, dict[str, str], Path]:
    """What a daemon run by alice for the group needs: the shared root (``root:<group>``,
    ``2775``), alice's home with her daemon environment in it, and the socket's folder
    (alice's, the group may enter: ``0750``)."""
    root = users.base / "shared"
    root.mkdir()
    shutil.chown(root, "root", users.group)
    root.chmod(0o2775)
    home = user_home(users, users.alice)
    env = daemon_env(home)
    for sub in ("home", "run", "state"):
        shutil.chown(home / sub, users.alice)
    sock_dir = users.base / "sock"
    sock_dir.mkdir()
    shutil.chown(sock_dir, users.alice, users.group)
    sock_dir.chmod(0o750)
    return root, home, env, sock_dir


def _setup(
    users: Users, rt: Runtime, config: str = "", **popen: Any
) -> tuple[Daemon, Path, Path, Path]:
    """alice's daemon on a shared root with a group-reachable socket; her secret; bob's folder
    (``popen``: more arguments for the daemon's Popen)."""
    root, home, env, sock_dir = alices_daemon_folders(users)
    secret = home / "home" / "secret.txt"
    secret.write_text(f"int leaked = {SECRET};\n")
    shutil.chown(secret, users.alice)
    secret.chmod(0o600)
    (home / "home").chmod(0o700)
    args = ["--cache-dir", str(root), "--socket", str(sock_dir / "cachemgr.sock")]
    if config:
        cfg = users.base / "cachemgr.toml"
        cfg.write_text(config)
        cfg.chmod(0o644)
        args += ["--config", str(cfg)]
    env["PYTHONPATH"] = rt.pythonpath
    daemon = start_daemon(
        home,
        *args,
        env=env,
        notify=False,
        python=rt.python,
        popen_kw={**run_as(users.alice, users), "group": users.group, **popen},
    )
    bob = user_home(users, users.bob)
    return daemon, root, secret, bob


def _as_bob(users: Users, rt: Runtime, bob: Path, code: str, *args: str) -> dict:
    """Run ``code`` (Python) as bob in his folder; it prints one JSON object."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": rt.pythonpath,
        "HOME": str(bob),
        "CACHEMGR_DAEMON_USER": users.alice,  # bob trusts the daemon's socket
    }
    out = subprocess.run(
        [rt.python, "-c", code, *args],
        env=env,
        cwd=bob,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        **run_as(users.bob, users),  # type: ignore[arg-type]
    )
    assert SECRET not in out.stdout + out.stderr, "the secret came back"
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


CLIENT = """
import json, sys
from cachemgr.client import Client, DaemonError
req = json.loads(sys.argv[2])
try:
    out = Client(sys.argv[1], timeout_s=120).compile(req, base_dir=sys.argv[3])
    print(json.dumps(out.to_json()))
except DaemonError as exc:
    print(json.dumps({"error": str(exc), "status_code": exc.status}))
"""

RAW = """
import http.client, json, socket, sys
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(sys.argv[1])
c = C("localhost", timeout=120)
c.request("POST", "/compile", body=sys.argv[2], headers={"Content-Type": "application/json"})
r = c.getresponse()
print(json.dumps({"code": r.status, "body": r.read().decode(errors="replace")}))
"""


def _crafted(path: str, text: str, **over: object) -> str:
    """A /compile body that carries a source's bytes itself (no client involved)."""
    data = base64.b64encode(text.encode()).decode()
    body = {
        "request": _request(path, **over),
        "base_dir": os.path.dirname(path),
        "inputs": {"source": {"path": path, "data": data}, "headers": []},
    }
    return json.dumps(body)


def _no_secret_in_cache(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), f"{path} holds the secret"


def test_the_daemon_reads_nothing_for_a_caller(users: Users, other_runtime: Runtime) -> None:
    rt = other_runtime
    daemon, root, secret, bob = _setup(users, rt)
    try:
        sock = str(daemon.socket_path)
        # 1. kernel_source naming the daemon user's file: bob's own client cannot read it
        out = _as_bob(users, rt, bob, CLIENT, sock, json.dumps(_request(str(secret))), str(bob))
        assert out.get("status_code") == 400 and "Permission denied" in out["error"]
        # ... and a hand-made request naming the path (no bytes) is refused
        body = json.dumps({"request": _request(str(secret)), "base_dir": str(bob)})
        raw = _as_bob(users, rt, bob, RAW, sock, body)
        assert raw["code"] == 400 and "carries no inputs" in raw["body"]
        # 2. op_debug_config naming it
        (bob / "k.c").write_text("void scale_kernel(float *x) { x[0] *= 2; }\n")
        (bob / "k.c").chmod(0o644)
        cfg = _request(str(bob / "k.c"), options={"op_debug_config": str(secret)})
        out = _as_bob(users, rt, bob, CLIENT, sock, json.dumps(cfg), str(bob))
        assert out.get("status_code") == 400 and "op_debug_config" in out["error"]
        raw = _as_bob(users, rt, bob, RAW, sock, _crafted(str(bob / "k.c"), "int x;", **{
            "options": {"op_debug_config": str(secret)}
        }))  # fmt: skip
        assert raw["code"] == 400 and "bytes were not sent" in raw["body"]
        # 3. #include of the file, in bytes bob sends himself (his client would refuse)
        include = f'#include "{secret}"\nvoid scale_kernel(float *x) {{ x[0] *= 2; }}\n'
        raw = _as_bob(users, rt, bob, RAW, sock, _crafted(str(bob / "inc.c"), include))
        assert raw["code"] == 200 and json.loads(raw["body"])["status"] == "failed"
        # 4. .incbin: the assembler would put the whole file into a group-readable .o
        incbin = (
            f'__asm__(".section .rodata\\n.incbin \\"{secret}\\"\\n.previous");\n'
            "void scale_kernel(float *x) { x[0] *= 2; }\n"
        )
        raw = _as_bob(users, rt, bob, RAW, sock, _crafted(str(bob / "bin.c"), incbin))
        assert raw["code"] == 200 and json.loads(raw["body"])["status"] == "failed"
        _no_secret_in_cache(root)
        log = daemon.log()
        assert f"uid {os.stat(bob).st_uid}" in log, "each compile is logged with its caller"
    finally:
        daemon.stop()


def test_outputs_through_the_daemon_are_the_callers(users: Users, other_runtime: Runtime) -> None:
    rt = other_runtime
    daemon, root, _, bob = _setup(users, rt)
    try:
        sock = str(daemon.socket_path)
        work = bob / "work"
        work.mkdir()
        shutil.chown(work, users.bob)
        (work / "k.c").write_text("void scale_kernel(float *x) { x[0] *= 2; }\n")
        (work / "k.c").chmod(0o644)
        debug = _request(str(work / "k.c"), options={"op_debug_level": 2})
        out = _as_bob(users, rt, bob, CLIENT, sock, json.dumps(debug), str(work))
        assert out["status"] == "debug" and out["via"] == "daemon", out
        files = [Path(f) for f in out["files"]]
        assert files and all(f.parent.parent == bob / "kernel_meta" for f in files), files
        for path in files:
            assert path.stat().st_uid == os.stat(bob).st_uid, f"{path} is not bob's"
        assert {f.suffix for f in files} >= {".o", ".json"}
        assert not any(root.rglob("kernel_meta")), "nothing in the daemon's folders"
        disable = _request(str(work / "k.c"), options={"op_compiler_cache_mode": "disable"})
        out = _as_bob(users, rt, bob, CLIENT, sock, json.dumps(disable), str(work))
        assert out["status"] == "compiled", out
        files = [Path(f) for f in out["files"]]
        assert files and all(f.parent == bob for f in files), files  # bob's cwd
        assert all(f.stat().st_uid == os.stat(bob).st_uid for f in files)
        # the CLI from a folder bob cannot write: one line before compiling
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": rt.pythonpath, "HOME": str(bob),
               "CACHEMGR_DAEMON_USER": users.alice}  # fmt: skip
        (work / "req.json").write_text(json.dumps(_request("k.c")))
        (work / "req.json").chmod(0o644)
        cli = subprocess.run(
            [rt.python, "-m", "cachemgr", "compile", str(work / "req.json"), "--op-debug-level",
             "1", "--socket", sock, "--cache-dir", str(root)],
            env=env, cwd="/", capture_output=True, text=True, timeout=120, check=False,
            **run_as(users.bob, users),  # type: ignore[arg-type]
        )  # fmt: skip
        assert cli.returncode == 2, cli
        line = cli.stderr.strip()
        assert "\n" not in line and "/kernel_meta" in line and "debug_dir" in line, line
    finally:
        daemon.stop()


def test_without_namespaces_other_users_are_refused(users: Users, other_runtime: Runtime) -> None:
    rt = other_runtime
    config = '[sandbox]\nbwrap = "/nonexistent/bwrap"\n'
    daemon, _, _, bob = _setup(users, rt, config)
    try:
        (bob / "k.c").write_text("void scale_kernel(float *x) { x[0] *= 2; }\n")
        (bob / "k.c").chmod(0o644)
        req = json.dumps(_request(str(bob / "k.c")))
        out = _as_bob(users, rt, bob, CLIENT, str(daemon.socket_path), req, str(bob))
        assert out.get("status_code") == 400, out
        assert "compiles only for its own user" in out["error"] and "bubblewrap" in out["error"]
    finally:
        daemon.stop()


def test_compiler_resource_limits_from_the_config(tmp_path, clean_env) -> None:
    """[sandbox] output_mb = 1: a compile writing a 4 MiB object fails (RLIMIT_FSIZE)."""
    src = tmp_path / "big.c"
    src.write_text(
        "__attribute__((used)) const char big[4 << 20] = {1};\n"
        "void scale_kernel(float *x) { x[0] *= big[0]; }\n"
    )
    req = tmp_path / "req.json"
    req.write_text(json.dumps(_request(str(src))))
    cfg = tmp_path / "c.toml"
    cfg.write_text("[sandbox]\noutput_mb = 1\naddress_space_mb = 8192\ncpu_s = 60\n")
    daemon = start_daemon(
        tmp_path,
        "--cache-dir",
        str(tmp_path / "cache"),
        "--config",
        str(cfg),
        env=daemon_env(tmp_path),
    )
    try:
        from cachemgr.client import Client

        out = Client(daemon.socket_path, timeout_s=120).compile_file(req).to_json()
        assert out["status"] == "failed", out
        small = tmp_path / "small.c"
        small.write_text("void scale_kernel(float *x) { x[0] *= 2; }\n")
        req.write_text(json.dumps(_request(str(small))))
        assert (
            Client(daemon.socket_path, timeout_s=120).compile_file(req).to_json()["status"]
            == "compiled"
        )
    finally:
        daemon.stop()


@pytest.mark.parametrize(
    "bad",
    ["namespaces = 'sometimes'", "output_mb = -1", "bogus = 1", "allow = ['/']",
     "allow = ['/no/such/folder']", "allow = '/opt'"],
)  # fmt: skip
def test_bad_sandbox_table_is_one_line(tmp_path, clean_env, bad: str) -> None:
    from tests.conftest import run_cli

    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[sandbox]\n{bad}\n")
    env = daemon_env(tmp_path, clean_env)
    args = ("--cache-dir", str(tmp_path / "cache"), "--config", str(cfg))
    out = run_cli("serve", *AS_ROOT, *args, env=env)
    assert out.returncode == 2 and "[sandbox]" in out.stderr, out.stderr


def test_a_compile_sees_only_the_allow_list_view(users: Users, other_runtime: Runtime) -> None:
    """An attack review found that the sandbox hid a deny-list (HOME, state, config,
    runtime) and showed the rest of the host. A hand-made source could ``#include`` any other
    file the daemon user may read and get its lines quoted in the failed compile's error
    text, and ``__has_include`` told whether any path existed. Now other users' compiles run
    in bubblewrap's allow-list view: neither the file nor its folder exists there."""
    rt = other_runtime
    daemon, root, _, bob = _setup(users, rt)
    private = users.base / "alice-data"  # the daemon user's, outside every hidden folder
    private.mkdir()
    secret = private / "token.h"
    secret.write_text(f"int leaked = {SECRET};\n")
    for path, mode in ((private, 0o700), (secret, 0o600)):
        shutil.chown(path, users.alice)
        path.chmod(mode)
    try:
        sock = str(daemon.socket_path)
        kernel = "void scale_kernel(float *x) { x[0] *= 2; }\n"
        include = f'#include "{secret}"\n{kernel}'
        raw = _as_bob(users, rt, bob, RAW, sock, _crafted(str(bob / "inc.c"), include))
        answer = json.loads(raw["body"])
        assert raw["code"] == 200 and answer["status"] == "failed", raw
        assert "No such file" in answer["error"], answer["error"]

        def probe(path: Path) -> str:
            text = f'#if __has_include("{path}")\n#error FOUND\n#else\n#error ABSENT\n#endif\n'
            body = _crafted(str(bob / "probe.c"), text + kernel)
            out = json.loads(_as_bob(users, rt, bob, RAW, sock, body)["body"])
            assert out["status"] == "failed", out
            return "FOUND" if "FOUND" in out["error"] else "ABSENT"

        # the existence oracle: the daemon user's file, the cache, a missing path all alike;
        # a system header (shown read-only) is found, so the probe itself works
        assert probe(secret) == "ABSENT"
        assert probe(root) == "ABSENT"
        assert probe(users.base / "no-such-file") == "ABSENT"
        assert probe(Path("/usr/include/stdio.h")) == "FOUND"
        _no_secret_in_cache(root)
    finally:
        daemon.stop()


def test_the_view_shows_the_allow_list_and_the_build_folder_only(tmp_path: Path) -> None:
    """The view with real bwrap processes: a folder outside it does not exist, one in
    ``[sandbox] allow`` is shown read-only, the working folder is the only one written, and
    ``/tmp`` is empty. Runs as any user (root too: the view, not permissions, hides)."""
    from cachemgr.compilers import sandbox

    site = tmp_path / "site"  # e.g. a toolchain under /opt
    site.mkdir()
    (site / "tool.h").write_text("#define TOOL 1\n")
    work = tmp_path / "work"
    work.mkdir()

    def sh(box: sandbox.Sandbox, script: str) -> subprocess.CompletedProcess[str]:
        argv = box.wrap(["/bin/sh", "-c", script], work)
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)

    plain = sandbox.from_table({}, [])
    if not plain.isolated:
        pytest.skip(f"bubblewrap cannot run here: {plain.why_not}")
    assert sh(plain, f"cat {site}/tool.h").returncode != 0
    allowed = sandbox.from_table({"allow": [str(site)]}, [])
    assert sh(allowed, f"cat {site}/tool.h").stdout == "#define TOOL 1\n"
    denied = sh(allowed, f"echo x > {site}/new")
    assert denied.returncode != 0 and not (site / "new").exists()
    assert sh(allowed, "echo built > out.o").returncode == 0
    assert (work / "out.o").read_text() == "built\n"
    # /tmp holds only the way to the working folder (the host's has the other callers')
    expected = [work.parts[2]] if work.parts[1] == "tmp" else []
    assert sh(allowed, "ls -A /tmp").stdout.split() == expected
    assert "No such file" in sh(allowed, "ls /proc 2>&1").stdout  # no /proc


def test_the_old_unshare_key_is_accepted_and_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``[sandbox] unshare`` named the tool of the deny-list namespace: a config that still
    sets it starts, and says once that it is no longer used."""
    from cachemgr.compilers import sandbox

    with caplog.at_level("WARNING", logger="cachemgr.compilers.sandbox"):
        sandbox.from_table({"unshare": "unshare"}, [])
    assert any("unshare is no longer used" in r.getMessage() for r in caplog.records)


CUDA_KERNEL = 'extern "C" __global__ void scale_kernel(float *x) { x[0] *= X; }\n'


def test_nvcc_runs_no_shell_command_a_caller_wrote(users: Users, other_runtime: Runtime) -> None:
    """Attack review after the allow-list view: nvcc runs its steps through ``sh -c`` with the
    defines and the source path between double quotes, unescaped. A group member's define
    ``X=$(kill -KILL -1)`` (or a ``-D`` extra flag, or a source folder of that name) ran as
    the daemon user — inside the view, but ``kill -1`` reaches every process of that user:
    the daemon died. Now each is refused with one line before nvcc runs."""
    from tests.compile_util import nvcc_missing

    if why := nvcc_missing():
        pytest.skip(why)
    rt = other_runtime
    daemon, _, _, bob = _setup(users, rt)
    payload = "$(kill -KILL -1)"
    attacks = [
        (str(bob / "k.cu"), {"defines": {"X": f"{payload}2"}}),
        (str(bob / "k.cu"), {"extra_flags": ["-DX=`kill -KILL -1`2"]}),
        (str(bob / payload / "k.cu"), {"defines": {"X": 2}}),
        (str(bob / "k.cu"), {"defines": {"X": '2" "-DY=1'}}),  # a quote: nvcc's own words
    ]
    try:
        sock = str(daemon.socket_path)
        for path, over in attacks:
            body = _crafted(path, CUDA_KERNEL, language="cuda", **over)  # type: ignore[arg-type]
            raw = _as_bob(users, rt, bob, RAW, sock, body)
            assert daemon.proc.poll() is None, f"the daemon died of {over or path}"
            text = raw["body"]
            assert "nvcc runs its steps through sh" in text and "\\n" not in text, raw
            assert "cachemgr-build-" not in text, "the message names the caller's path"
        body = _crafted(str(bob / "k.cu"), CUDA_KERNEL, language="cuda", defines={"X": 2})
        raw = _as_bob(users, rt, bob, RAW, sock, body)
        assert json.loads(raw["body"])["status"] == "compiled", raw
    finally:
        daemon.stop()


HOSTILE_CC = """#!/bin/sh
# a compiler whose input took it over (a crafted precompiled header, a compiler bug)
setsid sleep 300 </dev/null >/dev/null 2>&1 &
case "$*" in *-DHOSTILE=1*) kill -KILL -1 ;; esac
exec /usr/bin/gcc "$@"
"""


def test_a_subverted_compiler_cannot_reach_the_daemon_or_outlive_its_compile(
    users: Users, other_runtime: Runtime
) -> None:
    """Attack review after the allow-list view: a compiler is code that a member's bytes
    drive (nvcc's shell was one way in; a crafted ``.gch`` or any compiler bug is another).
    The view shared the host's process ids: such code could ``kill -1`` (or ``SIGSTOP``)
    every process of the daemon user — the daemon died — and a ``setsid`` child outlived
    the compile, holding the build folder where the worker's next jobs, other callers',
    are written. A stand-in compiler does both; now each compile has its own process ids
    (``--unshare-pid``): the daemon lives, and nothing of the compile is left."""
    rt = other_runtime
    tools = users.base / "tools"
    tools.mkdir()
    cc = tools / "cc"
    cc.write_text(HOSTILE_CC)
    cc.chmod(0o755)
    daemon, _, _, bob = _setup(users, rt, f'[compilers]\ncc = "{cc}"\n')
    alice_uid = int(subprocess.run(["id", "-u", users.alice], capture_output=True,
                                   text=True, check=True).stdout)  # fmt: skip

    def sleepers() -> list[str]:
        out = subprocess.run(["pgrep", "-u", str(alice_uid), "-x", "sleep"],
                             capture_output=True, text=True, check=False)  # fmt: skip
        return out.stdout.split()

    try:
        sock = str(daemon.socket_path)
        kernel = "void scale_kernel(float *x) { x[0] *= 2; }\n"
        raw = _as_bob(users, rt, bob, RAW, sock, _crafted(str(bob / "k.c"), kernel))
        assert json.loads(raw["body"])["status"] == "compiled", raw
        wait_for(lambda: not sleepers(), 10, "the compile's processes to end")
        hostile = _crafted(str(bob / "h.c"), kernel, extra_flags=["-DHOSTILE=1"])
        _as_bob(users, rt, bob, RAW, sock, hostile)  # its answer may be either
        assert daemon.proc.poll() is None, "the compiler killed the daemon"
        assert daemon.client.health()["status"] == "ok"
    finally:
        daemon.stop()


LINKING_CC = """#!/bin/sh
# a compiler whose input took it over: its preprocessed output is a link to SECRET
case " $* " in *" -E "*)
  prev=""; for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
  ln -sf SECRET "$out"; exit 0 ;;
esac
exec /usr/bin/gcc "$@"
"""


def test_a_link_a_compiler_leaves_in_its_build_folder_is_never_followed(
    users: Users, other_runtime: Runtime
) -> None:
    """Attack review after the allow-list view: the daemon reads a compile's outputs outside
    the view, following links. A compiler taken over by its input (stand-in: a script) made
    its preprocessed output ``<kernel>.cce`` a symbolic link to the daemon user's ``0600``
    file; a debug compile handed the "artefact" back to the member — the file's bytes. Now a
    compile that leaves anything but plain files and folders in its build folder fails with
    one line, before the daemon reads any output (every process of it is gone by then: its
    own pid namespace)."""
    rt = other_runtime
    tools = users.base / "tools"
    tools.mkdir()
    cc = tools / "cc"
    daemon_home = users.base / users.alice
    cc.write_text(LINKING_CC.replace("SECRET", str(daemon_home / "home" / "secret.txt")))
    cc.chmod(0o755)
    daemon, root, _, bob = _setup(users, rt, f'[compilers]\ncc = "{cc}"\n')
    try:
        (bob / "k.c").write_text("void scale_kernel(float *x) { x[0] *= 2; }\n")
        (bob / "k.c").chmod(0o644)
        debug = _request(str(bob / "k.c"), options={"op_debug_level": 2})
        out = _as_bob(users, rt, bob, CLIENT, str(daemon.socket_path), json.dumps(debug), str(bob))
        leaked = [p for p in bob.rglob("*.cce") if SECRET in p.read_text(errors="replace")]
        assert not leaked, f"the daemon user's file came back as {leaked}"
        assert out["status"] == "failed", out
        assert "symbolic link" in out["error"] and "\n" not in out["error"], out
        for path in bob.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert SECRET.encode() not in path.read_bytes(), f"{path} holds the secret"
        _no_secret_in_cache(root)
    finally:
        daemon.stop()


def test_the_daemons_secret_files_are_hidden_wherever_they_are_shown(
    users: Users, other_runtime: Runtime
) -> None:
    """Attack review after the allow-list view: the view hid the daemon user's HOME, state,
    config and runtime folders, but not the folders of the secret files its config names
    (``[daemon] tcp_token_file``, a remote's ``password-file=``). One that sits in a shown
    folder — ``[sandbox] allow`` (a site folder), beside the compiler, or ``/usr/local/etc``
    — was ``#include``d by a member's source and its line quoted in the error. Now their
    folders are covered like the private ones."""
    rt = other_runtime
    site = users.base / "site"  # e.g. /opt/site: a toolchain and the service's secrets
    (site / "etc").mkdir(parents=True)
    token = site / "etc" / "tcp.token"
    token.write_text(f"{SECRET}_tcp_token_0123456789abcdef0123456789\n")
    password = site / "etc" / "redis.pw"
    password.write_text(f"{SECRET}_redis\n")
    (site / "include").mkdir()
    (site / "include" / "tool.h").write_text("#define TOOL 2\n")
    for path in (site, site / "etc", site / "include", site / "include" / "tool.h"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    key, _ = site_key(site / "etc")  # the site's signing key (docs/remote.md#keys)
    for path in (token, password, key):
        shutil.chown(path, users.alice)
        path.chmod(0o600)
    config = (
        f'[daemon]\ntcp_token_file = "{token}"\n'
        f'[remote]\nstorage = ["redis://127.0.0.1:1/0|password-file={password}"]\n'
        + keys_toml(site / "etc")
        + f'[sandbox]\nallow = ["{site}"]\n'
    )
    daemon, root, _, bob = _setup(users, rt, config)
    try:
        sock = str(daemon.socket_path)
        kernel = "void scale_kernel(float *x) { x[0] *= 2; }\n"
        probe = f'#if __has_include("{site}/include/tool.h")\n#error FOUND\n#endif\n'
        raw = _as_bob(users, rt, bob, RAW, sock, _crafted(str(bob / "p.c"), probe + kernel))
        assert "FOUND" in json.loads(raw["body"])["error"], raw  # the allowed folder is shown
        for secret in (token, password, key):
            text = f'#include "{secret}"\n{kernel}'
            raw = _as_bob(users, rt, bob, RAW, sock, _crafted(str(bob / "s.c"), text))
            answer = json.loads(raw["body"])
            assert answer["status"] == "failed" and "No such file" in answer["error"], raw
        _no_secret_in_cache(root)
    finally:
        daemon.stop()


def test_a_private_folder_inside_a_shown_one_is_covered_though_its_parent_is_private(
    tmp_path: Path,
) -> None:
    """Attack review after the allow-list view: hidden folders were reduced to the outermost
    ones, and one was covered only when it fell inside a shown folder. A compiler installed
    in ``~/.local/bin`` shows ``~/.local``; HOME (private) holds it, so the state folder
    ``~/.local/state/cachemgr`` was dropped as "inside HOME" and shown whole. Real bwrap."""
    from cachemgr.compilers import sandbox

    home = tmp_path / "home"
    state = home / ".local" / "state" / "cachemgr"
    state.mkdir(parents=True)
    (state / "stats.json").write_text(SECRET)
    (home / ".local" / "bin").mkdir()
    box = sandbox.from_table({"allow": [str(home / ".local")]}, [home, state])
    if not box.isolated:
        pytest.skip(f"bubblewrap cannot run here: {box.why_not}")
    work = tmp_path / "work"
    work.mkdir()
    argv = box.wrap(["/bin/sh", "-c", f"ls {home}/.local/bin && cat {state}/stats.json"], work)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert SECRET not in done.stdout + done.stderr and done.returncode != 0, done


def test_a_members_debug_compile_writes_nothing_where_he_points(
    users: Users, other_runtime: Runtime
) -> None:
    """Attack review after the allow-list view: outputs are handed back only when the
    request says ``"deliver": true`` (the client always does). A member's hand-made request
    with ``"deliver": false`` and ``debug_dir`` naming a ``0700`` folder of the daemon user
    had the daemon create ``kernel_meta/<host>_<pid>/`` with the kernel's files there — a
    write where the member may not. Now every other user's outputs are handed back."""
    rt = other_runtime
    daemon, _, _, bob = _setup(users, rt)
    private = users.base / "alice-data"
    private.mkdir()
    shutil.chown(private, users.alice)
    private.chmod(0o700)
    try:
        kernel = "void scale_kernel(float *x) { x[0] *= 2; }\n"
        options = {"op_debug_level": 2, "debug_dir": str(private)}
        body = json.loads(_crafted(str(bob / "k.c"), kernel, options=options))
        body["deliver"] = False
        raw = _as_bob(users, rt, bob, RAW, str(daemon.socket_path), json.dumps(body))
        assert list(private.iterdir()) == [], "the daemon wrote where the member pointed"
        answer = json.loads(raw["body"])
        assert answer["status"] == "debug" and answer["outputs"], answer
    finally:
        daemon.stop()


def test_readelf_reads_a_members_object_in_the_view(users: Users, other_runtime: Runtime) -> None:
    """Attack review after the allow-list view: the line map (``*_loc.json`` of a debug
    compile) came from ``readelf`` run by the daemon outside the view and the limits, on an
    object whose sections a member writes with inline assembly. readelf follows a
    ``.gnu_debuglink`` to any absolute path (and says whether it exists there): a link to
    a private object of the daemon user, with its CRC, put that object's line table — its
    source file's name — into the member's ``_loc.json``. Now readelf runs like a compiler
    process: in the view, under the limits."""
    import zlib

    rt = other_runtime
    daemon, _, _, bob = _setup(users, rt)
    private = users.base / "alice-data"
    private.mkdir()
    hidden_src = private / f"{SECRET}_kernel.c"
    hidden_src.write_text("int hidden(int a) { return a + 42; }\n")
    hidden_obj = private / "hidden.o"
    subprocess.run(["gcc", "-g", "-c", str(hidden_src), "-o", str(hidden_obj)], check=True)
    crc = zlib.crc32(hidden_obj.read_bytes())
    for path, mode in ((private, 0o700), (hidden_obj, 0o600), (hidden_src, 0o600)):
        shutil.chown(path, users.alice)
        path.chmod(mode)
    try:
        link = (
            '__asm__(".section .gnu_debuglink,\\"\\",@progbits\\n'
            f'.asciz \\"{hidden_obj}\\"\\n.balign 4\\n.long {crc}\\n.previous");\n'
        )
        (bob / "k.c").write_text(link + "void scale_kernel(float *x) { x[0] *= 2; }\n")
        (bob / "k.c").chmod(0o644)
        debug = _request(str(bob / "k.c"), options={"op_debug_level": 2})
        out = _as_bob(users, rt, bob, CLIENT, str(daemon.socket_path), json.dumps(debug), str(bob))
        assert out["status"] == "debug", out
        locs = [Path(f) for f in out["files"] if f.endswith("_loc.json")]
        assert locs, out
        for path in bob.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), f"{path} names the secret"
    finally:
        daemon.stop()


TTY_CC = """#!/bin/sh
# a compiler whose input took it over: it types a line into the daemon's terminal
/usr/bin/python3 -c 'import fcntl, termios
with open("/dev/tty", "wb") as tty:
    for c in b"PWNED\\n":
        fcntl.ioctl(tty, termios.TIOCSTI, bytes([c]))' 2>/dev/null
exec /usr/bin/gcc "$@"
"""


def test_a_subverted_compiler_cannot_type_into_the_daemons_terminal(
    users: Users, other_runtime: Runtime
) -> None:
    """Attack review after the allow-list view: the view's ``/dev/tty`` was the daemon's
    controlling terminal. A daemon started from a terminal (``sudo -u cachemgr cachemgr
    serve`` in an operator's shell) let a compiler taken over by its input push a command
    line into that terminal (``TIOCSTI``), which the operator's shell ran once the daemon
    stopped — bubblewrap's CVE-2017-5226. ``/dev/tty`` in the view is now a null device."""
    import pty

    rt = other_runtime
    master, slave = pty.openpty()
    slave_name = os.ttyname(slave)
    shutil.chown(slave_name, users.alice)
    tools = users.base / "tools"
    tools.mkdir()
    cc = tools / "cc"
    cc.write_text(TTY_CC)
    cc.chmod(0o755)

    def take_the_terminal() -> None:  # in the daemon, a session leader: its controlling tty
        os.close(os.open(slave_name, os.O_RDWR))

    try:
        daemon, _, _, bob = _setup(
            users, rt, f'[compilers]\ncc = "{cc}"\n', start_new_session=True,
            preexec_fn=take_the_terminal,
        )  # fmt: skip
        try:
            kernel = "void scale_kernel(float *x) { x[0] *= 2; }\n"
            raw = _as_bob(users, rt, bob, RAW, str(daemon.socket_path),
                          _crafted(str(bob / "k.c"), kernel))  # fmt: skip
            assert json.loads(raw["body"])["status"] == "compiled", raw
        finally:
            daemon.stop()
        os.set_blocking(slave, False)
        try:
            typed = os.read(slave, 4096)
        except BlockingIOError:
            typed = b""
        assert b"PWNED" not in typed, "the compiler typed into the daemon's terminal"
    finally:
        os.close(master)
        os.close(slave)
