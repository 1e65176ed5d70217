"""A hit is the binary of exactly this environment, this compiler, this CPU and this time:
real kernels made by each test, compiled by real gcc and nvcc, linked and run where the
value matters; in-process, through a daemon and through ``cachemgr.Client``
(docs/compiling.md#what-is-in-a-key)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cachemgr.client import Client, DaemonError
from cachemgr.compile import keys, pipeline
from cachemgr.compile.queue import CompileQueue
from cachemgr.compile.request import load_request
from cachemgr.errors import InvalidInputError
from tests.compile_util import SOC, make_settings, nvcc_missing, scale_request
from tests.conftest import run_cli
from tests.daemon_util import daemon_env, own_tmp, start_daemon

GCC = shutil.which("gcc") or "/usr/bin/gcc"


def _write(path: Path, text: str, age_s: float = 10.0) -> Path:
    """Write ``text`` with an mtime ``age_s`` seconds ago (not "racy": digests are reused)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    old = time.time() - age_s
    os.utime(path, (old, old))
    return path


def _request(folder: Path, source: str, name: str = "req", **over: Any) -> Path:
    return _write(folder / f"{name}.json", json.dumps(scale_request(source, **over)))


def _binary(outcome: Any) -> Path:
    files = [Path(f) for f in outcome.files]
    return next(f for f in files if f.suffix in (".o", ".cubin"))


def _run_kernel(obj: Path, tmp: Path) -> str:
    """Link the host object ``obj`` with a main that calls ``scale_kernel`` on 1.0 and run
    it: the factor the kernel was built with."""
    main = _write(
        tmp / "main.c",
        "#include <stdio.h>\nvoid scale_kernel(float *x);\n"
        'int main(void) { float x = 1; scale_kernel(&x); printf("%g", x); return 0; }\n',
    )
    exe = tmp / f"run-{time.monotonic_ns()}"
    subprocess.run([GCC, str(main), str(obj), "-o", str(exe)], check=True)
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


def _chip(tmp: Path) -> Path:
    return tmp / "cache" / "kernel_cache" / SOC


# --- the environment -------------------------------------------------------------------------


def _cpath_project(root: Path) -> Path:
    """``root/k.c`` including ``<k.h>``, found through CPATH in ``c1`` (factor 2) or ``c2``
    (factor 3)."""
    _write(root / "k.c", "#include <k.h>\nvoid scale_kernel(float *x) { x[0] *= F; }\n")
    _write(root / "c1" / "k.h", "#define F 2\n")
    _write(root / "c2" / "k.h", "#define F 3\n")
    return _request(root, "k.c")


def test_switching_cpath_in_process_never_serves_the_other_folders_binary(
    tmp_path, clean_env, monkeypatch
) -> None:
    req = _cpath_project(tmp_path / "p")
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as q:
        monkeypatch.setenv("CPATH", str(tmp_path / "p" / "c1"))
        one = q.compile(load_request(req))
        assert one.status == "compiled" and _run_kernel(_binary(one), tmp_path) == "2"
        monkeypatch.setenv("CPATH", str(tmp_path / "p" / "c2"))
        two = q.compile(load_request(req))
        assert two.status == "compiled", "CPATH=c2 must not be served the c1 binary"
        assert two.kernel_name != one.kernel_name
        assert _run_kernel(_binary(two), tmp_path) == "3"
        monkeypatch.setenv("CPATH", str(tmp_path / "p" / "c1"))
        back = q.compile(load_request(req))
        assert back.status == "hit" and back.kernel_name == one.kernel_name
        copy = _cpath_project(tmp_path / "copy")  # CPATH is keyed relative to the source
        monkeypatch.setenv("CPATH", str(tmp_path / "copy" / "c1"))
        assert q.compile(load_request(copy)).kernel_name == one.kernel_name
        monkeypatch.setenv("CPATH", "")  # empty: the current folder, where no k.h is
        empty = q.compile(load_request(req))
        assert empty.status == "failed" and "k.h" in str(empty.error), empty


def test_cpath_through_the_daemon_is_the_callers_not_the_daemons(
    tmp_path, clean_env, monkeypatch
) -> None:
    """The daemon's own CPATH (c2) is never used: the client's (c1) goes with the request,
    its headers are mirrored, and switching it gives another entry."""
    req = _cpath_project(tmp_path / "p")
    env = own_tmp({**daemon_env(tmp_path), "CPATH": str(tmp_path / "p" / "c2")}, tmp_path)
    daemon = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "cache"), env=env)
    try:
        client = Client(daemon.socket_path, timeout_s=120)
        remote = Client(daemon.socket_path, timeout_s=120, local_hits=False)
        monkeypatch.setenv("CPATH", str(tmp_path / "p" / "c1"))
        one = client.compile_file(req)
        assert one.status == "compiled", one
        assert _run_kernel(_binary(one), tmp_path) == "2", "the caller's CPATH, not the daemon's"
        assert remote.compile_file(req).status == "hit"
        monkeypatch.setenv("CPATH", str(tmp_path / "p" / "c2"))
        two = remote.compile_file(req)
        assert two.status == "compiled" and two.kernel_name != one.kernel_name, two
        assert _run_kernel(_binary(two), tmp_path) == "3"
        assert client.compile_file(req).status == "hit"
        monkeypatch.setenv("CPATH", str(tmp_path / "p" / "c1"))
        assert client.compile_file(req).kernel_name == one.kernel_name
        monkeypatch.setenv("COMPILER_PATH", str(tmp_path))
        with pytest.raises(DaemonError) as refused:
            remote.compile_file(req)
        text = str(refused.value)
        assert refused.value.status == 400 and "COMPILER_PATH" in text and "\n" not in text
    finally:
        daemon.stop()


def test_a_relative_cpath_sent_to_the_daemon_is_refused_in_one_line(tmp_path, clean_env) -> None:
    req = _cpath_project(tmp_path / "p")
    daemon = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "cache"))
    try:
        body = {
            "request": json.loads(req.read_text()),
            "base_dir": str(req.parent),
            "compile_env": {"CPATH": "c1"},
        }
        with pytest.raises(DaemonError) as refused:
            Client(daemon.socket_path, timeout_s=120).request("POST", "/compile", body)
        text = str(refused.value)
        assert "CPATH" in text and "'c1'" in text and "\n" not in text, text
    finally:
        daemon.stop()


_CU = (
    'extern "C" __global__ void scale_kernel(float *x) {\n'
    "#ifdef X\n  x[0] *= 3.0f;\n#else\n  x[0] *= 2.0f;\n#endif\n}\n"
)


@pytest.mark.skipif(nvcc_missing() is not None, reason=str(nvcc_missing()))
def test_nvcc_append_flags_never_stores_its_cubin_under_a_key_without_it(
    tmp_path, clean_env, monkeypatch
) -> None:
    _write(tmp_path / "k.cu", _CU)
    req = _request(tmp_path, "k.cu", language="cuda")
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as q:
        monkeypatch.setenv("NVCC_APPEND_FLAGS", "-DX")
        with_x = q.compile(load_request(req))
        assert with_x.status == "compiled", with_x
        monkeypatch.delenv("NVCC_APPEND_FLAGS")
        plain = q.compile(load_request(req))
        assert plain.status == "compiled", "a caller without -DX must not get its cubin"
        assert _binary(plain).read_bytes() != _binary(with_x).read_bytes()
        monkeypatch.setenv("NVCC_APPEND_FLAGS", "-DX")
        again = q.compile(load_request(req))
        assert again.status == "hit" and again.kernel_name == with_x.kernel_name
        monkeypatch.setenv("NVCC_APPEND_FLAGS", "-arch=native")
        with pytest.raises(InvalidInputError, match="NVCC_APPEND_FLAGS='-arch=native'"):
            q.compile(load_request(req))


@pytest.mark.skipif(nvcc_missing() is not None, reason=str(nvcc_missing()))
def test_nvcc_append_flags_through_the_daemon_and_the_client(
    tmp_path, clean_env, monkeypatch
) -> None:
    _write(tmp_path / "k.cu", _CU)
    req = _request(tmp_path, "k.cu", language="cuda")
    env = own_tmp({**daemon_env(tmp_path), "NVCC_APPEND_FLAGS": "-DX"}, tmp_path)
    daemon = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "cache"), env=env)
    try:
        client = Client(daemon.socket_path, timeout_s=300)
        remote = Client(daemon.socket_path, timeout_s=300, local_hits=False)
        plain = remote.compile_file(req)  # the daemon's own -DX is not the caller's
        assert plain.status == "compiled", plain
        monkeypatch.setenv("NVCC_APPEND_FLAGS", "-DX")
        with_x = client.compile_file(req)
        assert with_x.status == "compiled" and with_x.kernel_name != plain.kernel_name
        assert _binary(plain).read_bytes() != _binary(with_x).read_bytes()
        assert remote.compile_file(req).kernel_name == with_x.kernel_name
        monkeypatch.setenv("NVCC_APPEND_FLAGS", f"-DX -I{tmp_path}/inc")  # not mirrored
        with pytest.raises(DaemonError) as refused:
            remote.compile_file(req)
        text = str(refused.value)
        assert "NVCC_APPEND_FLAGS" in text and "include_dirs" in text and "\n" not in text
    finally:
        daemon.stop()


# --- the compiler ----------------------------------------------------------------------------


def _v_project(root: Path) -> Path:
    _write(
        root / "k.c",
        "#ifndef V\n#define V 1\n#endif\nvoid scale_kernel(float *x) { x[0] *= V; }\n",
    )
    return _request(root, "k.c")


def _wrapper(folder: Path) -> Path:
    """``folder/gcc``: the real gcc (same ``--version`` line) adding ``-DV=99``."""
    return _write(folder / "gcc", f'#!/bin/sh\nexec {GCC} -DV=99 "$@"\n', 0)


def test_a_wrapper_with_the_same_version_line_never_shares_an_entry(
    tmp_path, clean_env, monkeypatch
) -> None:
    req = _v_project(tmp_path / "p")
    wrap = _wrapper(tmp_path / "wrap")
    wrap.chmod(0o755)
    out = subprocess.run([str(wrap), "--version"], capture_output=True, text=True).stdout
    assert out == subprocess.run([GCC, "--version"], capture_output=True, text=True).stdout
    path = os.environ["PATH"]
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as q:
        monkeypatch.setenv("PATH", f"{wrap.parent}:{path}")
        wrapped = q.compile(load_request(req))
        assert wrapped.status == "compiled" and _run_kernel(_binary(wrapped), tmp_path) == "99"
        monkeypatch.setenv("PATH", path)
        real = q.compile(load_request(req))
        assert real.status == "compiled", "the wrapper's entry must not answer /usr/bin/gcc"
        assert real.kernel_name != wrapped.kernel_name
        assert _run_kernel(_binary(real), tmp_path) == "1"
    # another process (a daemon) with the real gcc on the same root: its own entry
    daemon = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "cache"))
    try:
        remote = Client(daemon.socket_path, timeout_s=120, local_hits=False)
        served = remote.compile_file(req)
        assert served.status == "hit" and served.kernel_name == real.kernel_name
        assert _run_kernel(_binary(served), tmp_path) == "1"
    finally:
        daemon.stop()


def test_a_hit_runs_no_compiler_process(tmp_path, clean_env) -> None:
    """Once the compiler (and what -march=native is here) is known, a one-shot
    ``cachemgr compile`` hit starts no process at all: strace counts every execve."""
    req = _request(tmp_path / "p", "k.c", extra_flags=["-march=native"])
    _write(tmp_path / "p" / "k.c", "void scale_kernel(float *x) { x[0] *= 2; }\n")
    args = ["compile", "--local", "--cache-dir", str(tmp_path / "cache"), "--json", str(req)]
    env = clean_env
    first = run_cli(*args, env=env, cwd=tmp_path)
    assert json.loads(first.stdout)["status"] == "compiled", first.stderr
    trace = tmp_path / "trace"
    strace = ["strace", "-f", "-qq", "-e", "trace=execve", "-o", str(trace)]
    hit = subprocess.run(
        [*strace, sys.executable, "-m", "cachemgr", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(hit.stdout)["status"] == "hit", hit.stderr
    execs = [ln for ln in trace.read_text().splitlines() if "execve(" in ln and "= 0" in ln]
    assert len(execs) == 1 and "python" in execs[0], execs


def test_compiler_check_content_keys_the_compiler_bytes(tmp_path, clean_env) -> None:
    """``compiler_check = "content"``: a copy of the wrapper with other bytes but the same
    size and mtime is another compiler; with ``mtime`` it would not be."""
    req = _v_project(tmp_path / "p")
    wrap = _write(tmp_path / "w" / "gcc", f'#!/bin/sh\nexec {GCC} -DV=98 "$@"\n', 100)
    wrap.chmod(0o755)
    settings = make_settings(
        tmp_path, clean_env, compilers={"cc": str(wrap), "compiler_check": "content"}
    )
    with CompileQueue(settings, workers=1) as q:
        first = q.compile(load_request(req))
        assert _run_kernel(_binary(first), tmp_path) == "98"
    st = wrap.stat()
    wrap.write_text(f'#!/bin/sh\nexec {GCC} -DV=97 "$@"\n')  # same size
    os.utime(wrap, ns=(st.st_atime_ns, st.st_mtime_ns))
    with CompileQueue(settings, workers=1) as q:
        second = q.compile(load_request(req))
        assert second.status == "compiled" and second.kernel_name != first.kernel_name
        assert _run_kernel(_binary(second), tmp_path) == "97"
    with pytest.raises(Exception, match="compiler_check"):
        make_settings(tmp_path, clean_env, compilers={"compiler_check": "size"})


# --- time macros -----------------------------------------------------------------------------


def _time_project(root: Path, macro: str = "__TIME__") -> Path:
    _write(root / "stamp.h", f"static const char stamp[] = {macro};\n")
    _write(
        root / "k.c",
        '#include "stamp.h"\nconst char *kernel_stamp(void) { return stamp; }\n'
        "void scale_kernel(float *x) { x[0] *= 2; }\n",
    )
    return _request(root, "k.c")


def test_time_macros_are_compiled_uncached_unless_source_date_epoch_is_set(
    tmp_path, clean_env, monkeypatch
) -> None:
    req = _time_project(tmp_path / "p")
    out_dir = tmp_path / "out"
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1, output_dir=out_dir) as q:
        first = q.compile(load_request(req))
        assert first.status == "compiled" and first.cached is False, first
        assert "stamp.h uses __TIME__" in str(first.warning) and "\n" not in str(first.warning)
        assert first.policy is not None and "SOURCE_DATE_EPOCH" in str(first.policy.why_not_cached)
        assert not (_chip(tmp_path) / f"{first.kernel_name}.json").exists(), "never cached"
        assert q.compile(load_request(req)).status == "compiled", "never a hit"
        monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
        fixed = q.compile(load_request(req))
        assert fixed.status == "compiled" and fixed.cached is True, fixed
        assert q.compile(load_request(req)).status == "hit"
        assert b"22:13:20" in _binary(q.compile(load_request(req))).read_bytes()
        monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000060")
        later = q.compile(load_request(req))
        assert later.status == "compiled" and later.kernel_name != fixed.kernel_name
    stamp = _time_project(tmp_path / "ts", "__TIMESTAMP__")
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1, output_dir=out_dir) as q:
        ts = q.compile(load_request(stamp))
        assert ts.cached is False and "__TIMESTAMP__" in str(ts.warning), ts


def test_time_macros_through_the_daemon_and_the_client(tmp_path, clean_env, monkeypatch) -> None:
    req = _time_project(tmp_path / "p", "__DATE__")
    env = own_tmp(daemon_env(tmp_path), tmp_path)
    daemon = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "cache"), env=env)
    try:
        client = Client(daemon.socket_path, timeout_s=120)
        first = client.compile_file(req)
        assert first.status == "compiled" and first.cached is False, first
        assert "uses __DATE__" in str(first.warning)
        assert client.compile_file(req).status == "compiled", "never a hit"
        monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
        fixed = client.compile_file(req)
        assert fixed.status == "compiled" and fixed.cached is True, fixed
        assert client.compile_file(req).status == "hit"
        assert b"Jan  1 1970" in _binary(fixed).read_bytes()
    finally:
        daemon.stop()


# --- -march=native ---------------------------------------------------------------------------


def test_march_native_is_keyed_by_what_gcc_resolves_it_to_here(tmp_path, clean_env) -> None:
    _write(tmp_path / "k.c", "void scale_kernel(float *x) { x[0] *= 2; }\n")
    settings = make_settings(tmp_path, clean_env, compilers={"cc": GCC})
    compilers = keys.Compilers(settings.sections.get("compilers", {}))
    native = pipeline.prepare(
        load_request(_request(tmp_path, "k.c", "n", extra_flags=["-march=native"])),
        settings,
        compilers,
        pipeline.JobOptions(),
    )
    literal = pipeline.prepare(
        load_request(_request(tmp_path, "k.c", "l", extra_flags=["-march=x86-64"])),
        settings,
        compilers,
        pipeline.JobOptions(),
    )
    report = subprocess.run(
        [GCC, "-march=native", "-Q", "--help=target"], capture_output=True, text=True
    ).stdout
    cpu = re.search(r"^\s*-march=\s*(\S+)", report, re.MULTILINE)
    assert cpu is not None
    material = keys.key_material(
        native.request,
        native.opts,
        compilers.identity("c"),
        compilers.flags(native.request, compilers.identity("c"), frozenset(), frozenset()),
        native.inputs,
        native.backend.key_env(native.env),
        compilers.native(native.backend, ["-march=native"], compilers.identity("c")),
    )
    assert f"-march={cpu.group(1)}" in material["compiler"]["native"]
    assert keys.compute_key(material) == native.key
    without = {**material, "compiler": {**material["compiler"], "native": []}}
    assert keys.compute_key(without) != native.key != literal.key


# --- through the daemon's sandbox, for another user ------------------------------------------


def test_cpath_of_another_user_through_the_sandboxed_daemon(users, other_runtime) -> None:
    """bob's CPATH folders are mirrored into the view of alice's daemon (bubblewrap): his
    own headers, never the daemon's view of his folders (which it cannot see)."""
    from tests.test_deputy import CLIENT, _setup
    from tests.users_util import run_as

    daemon, root, _, bob = _setup(users, other_runtime)
    try:
        work = bob / "work"
        req = json.loads(_cpath_project(work).read_text())
        for path in [work, *work.rglob("*")]:
            shutil.chown(path, users.bob)
        outcomes = []
        for folder in ("c1", "c2", "c1"):
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "PYTHONPATH": other_runtime.pythonpath,
                "HOME": str(bob),
                "CACHEMGR_DAEMON_USER": users.alice,
                "CPATH": str(work / folder),
            }
            run = subprocess.run(
                [other_runtime.python, "-c", CLIENT, str(daemon.socket_path), json.dumps(req),
                 str(work)],
                env=env, cwd=work, capture_output=True, text=True, timeout=180, check=False,
                **run_as(users.bob, users),  # type: ignore[arg-type]
            )  # fmt: skip
            assert run.returncode == 0, run.stderr
            outcomes.append(json.loads(run.stdout))
        one, two, back = outcomes
        assert one["status"] == "compiled" and two["status"] == "compiled", (one, two)
        assert two["kernel_name"] != one["kernel_name"]
        assert back["status"] == "hit" and back["kernel_name"] == one["kernel_name"]
        obj = next(Path(f) for f in one["files"] if f.endswith(".o"))
        assert obj.parent.parent.parent == root and _run_kernel(obj, Path(bob)) == "2"
        obj2 = next(Path(f) for f in two["files"] if f.endswith(".o"))
        assert _run_kernel(obj2, Path(bob)) == "3"
    finally:
        daemon.stop()
