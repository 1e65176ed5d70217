"""What the daemon answers reaches the caller, in one clear line, on every route:

* a request over ``[daemon] max_body_bytes`` (a real source with a big header) is answered
  413 naming the setting and the size needed — not "daemon … hung up" because the daemon
  closed while the client still sent; raising the setting lets it through;
* ``--mode disable --out-dir`` works with a daemon named by ``CACHEMGR_SOCKET`` (the
  documented set-up), as ``compile --help`` says: the kernel is handed back and written there;
* a ``static __global__`` CUDA kernel, a ``static`` C entry and a C file exporting no function
  fail with a first error that says why.

Real gcc/nvcc, real daemons on real sockets, the real CLI and :class:`cachemgr.Client`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cachemgr.client import Client, DaemonError
from cachemgr.compile.queue import CompileQueue
from cachemgr.compile.request import load_request
from tests.compile_util import make_settings, nvcc_missing, scale_request
from tests.conftest import run_cli
from tests.daemon_util import Daemon, daemon_env, start_daemon


def _daemon(tmp: Path, config: str = "") -> Daemon:
    args = ["--cache-dir", str(tmp / "cache")]
    if config:
        cfg = tmp / f"cachemgr-{len(list(tmp.glob('cachemgr-*.toml')))}.toml"
        cfg.write_text(config)
        args += ["--config", str(cfg)]
    return start_daemon(tmp, *args, env=daemon_env(tmp))


def _request(folder: Path, source: str, text: str, **over: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / source).write_text(text)
    req = folder / f"{Path(source).stem}.json"
    req.write_text(json.dumps(scale_request(source, **over)))
    return req


def _cli(daemon: Daemon, *args: str, cwd: Path) -> Any:
    env = {**daemon.env, "CACHEMGR_SOCKET": str(daemon.socket_path)}
    return run_cli("compile", "--cache-dir", str(cwd / "cache"), *args, env=env, cwd=cwd)


# --- the 413 reaches the caller ---------------------------------------------------------------


def _big_project(tmp: Path) -> Path:
    """A kernel whose header is 1.6 MB (a table, as generated code has): with base64 the
    request body is over 2 MiB."""
    rows = ",\n".join(", ".join(str((i * 31 + j) % 1000) for j in range(32)) for i in range(12000))
    (tmp / "big").mkdir(parents=True, exist_ok=True)
    (tmp / "big" / "table.h").write_text(f"static const int table[] = {{\n{rows}\n}};\n")
    text = '#include "table.h"\nvoid scale_kernel(float *x) { x[0] *= table[7]; }\n'
    return _request(tmp / "big", "k.c", text)


def test_a_request_over_max_body_bytes_is_answered_413_on_every_route(tmp_path, clean_env) -> None:
    req = _big_project(tmp_path)
    daemon = _daemon(tmp_path)
    try:
        with pytest.raises(DaemonError) as caught:
            Client(daemon.socket_path, timeout_s=120).compile_file(req)
        assert caught.value.status == 413, caught.value
        message = str(caught.value)
        size = int(message.split("request body of ")[1].split(" bytes")[0])
        assert size > 2 << 20 and "[daemon] max_body_bytes" in message, message
        assert f"max_body_bytes = {size} or more" in message and "hung up" not in message
        proc = _cli(daemon, str(req), cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert "[daemon] max_body_bytes" in proc.stderr and "hung up" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert daemon.client.health()["status"] == "ok", "the daemon goes on serving"
    finally:
        daemon.stop()
    bigger = _daemon(tmp_path, f"[daemon]\nmax_body_bytes = {size}\n")
    try:
        out = Client(bigger.socket_path, timeout_s=120).compile_file(req)
        assert out.status == "compiled", out.error
    finally:
        bigger.stop()
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as q:
        assert q.compile(load_request(req)).status == "hit", "in-process: no body limit"


# --- --mode disable --out-dir through the daemon ----------------------------------------------


def test_mode_disable_out_dir_through_the_daemon_writes_the_kernel_there(
    tmp_path, clean_env
) -> None:
    req = _request(tmp_path / "proj", "k.c", "void scale_kernel(float *x) { x[0] *= 2; }\n")
    out = tmp_path / "out"
    out.mkdir()
    daemon = _daemon(tmp_path)
    try:
        proc = _cli(
            daemon, "--mode", "disable", "--out-dir", str(out), "--json", str(req), cwd=tmp_path
        )
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout.splitlines()[-1])
        assert doc["status"] == "compiled" and doc["via"] == "daemon", doc
        assert {Path(f).parent for f in doc["files"]} == {out}
        assert sorted(p.suffix for p in out.iterdir()) == [".json", ".o"]
        mine = tmp_path / "client-out"
        mine.mkdir()
        data = json.loads(req.read_text())
        data["options"] = {"op_compiler_cache_mode": "disable"}
        answer = Client(daemon.socket_path, timeout_s=120).compile(
            data, base_dir=req.parent, out_dir=mine
        )
        assert answer.status == "compiled" and {f.parent for f in answer.files} == {mine}
    finally:
        daemon.stop()
    local = tmp_path / "local-out"
    proc = run_cli(
        "compile", "--local", "--cache-dir", str(tmp_path / "cache"), "--mode", "disable",
        "--out-dir", str(local), str(req), env=clean_env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0 and sorted(p.suffix for p in local.iterdir()) == [".json", ".o"]


# --- an entry that is not exported says why ---------------------------------------------------

STATIC_C = "static void scale_kernel(float *x) { x[0] *= 2; }\nint keep;\n"
NO_EXPORT_C = "static void helper(float *x) { x[0] *= 2; }\nint keep;\n"
STATIC_CU = "static __global__ void scale_kernel(float *x) { x[0] *= 2; }\n"
CASES = [
    ("k.c", STATIC_C, "c", "kernel 'scale_kernel' is declared static in k.c, so not exported"),
    ("k.c", NO_EXPORT_C, "c", "k.c exports no function"),
    (
        "k.cu",
        STATIC_CU,
        "cuda",
        "kernel 'scale_kernel' is declared static in k.cu, so not exported",
    ),
]


def _why_lines(tmp: Path, clean_env: dict[str, str], req: Path) -> list[str]:
    """The error of ``req`` in-process, through the CLI with a daemon, and through the
    ``Client``."""
    with CompileQueue(make_settings(tmp, clean_env), workers=1) as q:
        local = q.compile(load_request(req))
    assert local.status == "failed"
    daemon = _daemon(tmp)
    try:
        proc = _cli(daemon, str(req), cwd=tmp)
        assert proc.returncode == 1, proc.stderr
        cli = proc.stderr.strip().splitlines()[0].split(": ", 3)[-1]
        client = Client(daemon.socket_path, timeout_s=120).compile_file(req)
    finally:
        daemon.stop()
    return [str(local.error), cli, str(client.error)]


@pytest.mark.parametrize(("source", "text", "language", "why"), CASES)
def test_an_entry_that_is_not_exported_says_why_first(
    tmp_path, clean_env, source: str, text: str, language: str, why: str
) -> None:
    if language == "cuda" and nvcc_missing():
        pytest.skip(str(nvcc_missing()))
    req = _request(tmp_path / "proj", source, text, language=language)
    for line in _why_lines(tmp_path, clean_env, req):
        assert line.startswith(why), line
        assert "cachemgr needs an exported symbol named 'scale_kernel'" in line, line
        assert "\n" not in line and ".src" not in line and "cachemgr-build" not in line
