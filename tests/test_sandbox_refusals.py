"""Through a daemon compiling in the sandbox, an absolute ``#include`` of the caller's own
header failed with gcc's bare "No such file or directory" (the view has no such path); now it
is the documented one-line refusal naming the header and what to do (docs/security.md: a
compile that reads a file in place instead of from the bytes sent is refused with one line).
Real users (bob calls alice's daemon), the real ``Client`` and CLI as bob, and in-process,
where the same kernel compiles (the caller's own process reads its own files)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from cachemgr.compile.queue import CompileQueue
from cachemgr.compile.request import load_request
from tests.compile_util import make_settings, scale_request
from tests.test_deputy import CLIENT, _as_bob, _setup
from tests.users_util import Runtime, Users, run_as


def test_an_absolute_include_in_the_sandbox_is_the_documented_refusal(
    users: Users, other_runtime: Runtime, tmp_path, clean_env
) -> None:
    rt = other_runtime
    daemon, root, _, bob = _setup(users, rt)
    try:
        header = bob / "abs" / "v.h"
        header.parent.mkdir()
        header.write_text("#define V 3\n")
        source = bob / "k.c"
        source.write_text(f'#include "{header}"\nvoid scale_kernel(float *x) {{ x[0] *= V; }}\n')
        for path in (header.parent, header, source):
            path.chmod(0o755 if path.is_dir() else 0o644)
        request = scale_request(str(source))
        sock = str(daemon.socket_path)
        out = _as_bob(users, rt, bob, CLIENT, sock, json.dumps(request), str(bob))
        assert out.get("status") == "failed", out
        for error in (out["error"], _cli_as_bob(users, rt, bob, sock, str(root), request)):
            assert f"#include of {header} in k.c: No such file in the daemon's sandbox" in error
            assert "only the files sent" in error and "include_dirs" in error, error
            assert "fatal error" not in error and "\n" not in error.strip(), error
    finally:
        daemon.stop()
    req = tmp_path / "req.json"
    req.write_text(json.dumps(request))
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as q:
        assert q.compile(load_request(req)).status == "compiled", "in-process it is read"


def _cli_as_bob(users: Users, rt: Runtime, bob: Path, sock: str, cache: str, request: dict) -> str:
    """``cachemgr compile`` as bob through the daemon at ``sock``: its error line."""
    req = bob / "req.json"
    req.write_text(json.dumps(request))
    req.chmod(0o644)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": rt.pythonpath,
        "HOME": str(bob),
        "CACHEMGR_DAEMON_USER": users.alice,
        "CACHEMGR_SOCKET": sock,
    }
    proc = subprocess.run(
        [rt.python, "-m", "cachemgr", "compile", "--cache-dir", cache, str(req)],
        env=env,
        cwd=bob,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        **run_as(users.bob, users),  # type: ignore[arg-type]
    )
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]
