"""``op_debug_level`` 2 and ``ccec_O0`` build at ``-O0`` whatever the request's own ``-O``
flags say (docs/compiling.md#debug-flags-win): on the host backend, the template backend
(CANN's ``ccec`` shape of command, here driven by gcc) and nvcc. Each build is compared with
the same source compiled by hand: the ``.text`` disassembly of a direct ``-O0`` build, and
for nvcc the kernel's code section of a direct ``-G`` build."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cachemgr.client import Client
from cachemgr.compile.queue import CompileQueue
from cachemgr.compile.request import load_request
from cachemgr.compilers.elf import ElfFile
from tests.compile_util import make_settings, nvcc_missing, scale_request
from tests.daemon_util import daemon_env, start_daemon

#: ``folded`` is one constant at -O2 (4950) and a loop at -O0.
C_SOURCE = (
    "int folded(void) { int s = 0; for (int i = 0; i < 100; i++) s += i; return s; }\n"
    "void scale_kernel(float *x) { x[0] *= folded(); }\n"
)
CU_SOURCE = (
    'extern "C" __global__ void scale_kernel(float *x) {\n'
    "  float s = 0; for (int i = 0; i < 64; i++) s += i * 2.0f; x[threadIdx.x] += s; }\n"
)


def _text(obj: Path) -> str:
    """``objdump -d`` of ``.text`` without its header line (which names the file)."""
    out = subprocess.run(
        ["objdump", "-d", "-j", ".text", str(obj)], capture_output=True, text=True, check=True
    ).stdout
    return out.split("Disassembly of section .text:", 1)[1]


def _direct(tmp: Path, source: Path, *flags: str) -> Path:
    """``gcc -x c -c -fPIC <flags>`` of ``source`` by hand."""
    out = tmp / f"direct{len(list(tmp.glob('direct*')))}.o"
    subprocess.run(
        ["gcc", "-x", "c", "-c", "-fPIC", *flags, str(source), "-o", str(out)], check=True
    )
    return out


def _request(tmp: Path, source: Path, **over: Any) -> Path:
    req = tmp / f"req{len(list(tmp.glob('req*.json')))}.json"
    req.write_text(json.dumps(scale_request(str(source), **over)))
    return req


def _binary(files: Any) -> Path:
    return next(Path(f) for f in files if Path(f).suffix in (".o", ".cubin"))


@pytest.mark.parametrize(
    ("spec", "by_hand"),
    [
        ({"op_debug_level": 2}, ("-O0", "-g", "-finstrument-functions")),
        ("ccec_O0", ("-O0",)),
    ],
)
def test_host_debug_build_is_O0_despite_the_requests_O2(
    tmp_path, clean_env, spec: Any, by_hand: tuple[str, ...]
) -> None:
    source = tmp_path / "k.c"
    source.write_text(C_SOURCE)
    options: dict[str, Any] = {"debug_dir": str(tmp_path / "dbg")}
    if isinstance(spec, dict):
        options.update(spec)
    else:
        cfg = tmp_path / "debug.cfg"
        cfg.write_text(f"op_debug_config = {spec}\n")
        options["op_debug_config"] = str(cfg)
    req = _request(tmp_path, source, extra_flags=["-O2"], options=options)
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as q:
        out = q.compile(load_request(req))
    assert out.status == "debug", out.error
    built = _text(_binary(out.files))
    assert built == _text(_direct(tmp_path, source, *by_hand)), "a -O0 build"
    assert built != _text(_direct(tmp_path, source, "-O2")), "the test tells -O0 from -O2"


def test_ccec_O0_wins_over_O2_on_the_template_backend(tmp_path, clean_env) -> None:
    """CANN's template shape (``ccec -c {source} -o {output} {flags}``), gcc standing for
    ``ccec``: the ``.cfg``'s ``ccec_O0`` wins over the request's ``-O2``."""
    source = tmp_path / "k.cce"
    source.write_text(C_SOURCE)
    cfg = tmp_path / "debug.cfg"
    cfg.write_text("op_debug_config = ccec_O0\n")
    template = "gcc -x c -c -fPIC {flags} {defines} {source} -o {output}"
    settings = make_settings(tmp_path, clean_env, compilers={"cce_command": template})
    options = {"op_debug_config": str(cfg), "debug_dir": str(tmp_path / "dbg")}
    req = _request(tmp_path, source, language="cce", extra_flags=["-O2"], options=options)
    with CompileQueue(settings, workers=1) as q:
        out = q.compile(load_request(req))
    assert out.status == "debug", out.error
    assert _text(_binary(out.files)) == _text(_direct(tmp_path, source, "-O0"))


def test_level_2_is_O0_through_the_daemon_and_the_client(tmp_path, clean_env) -> None:
    source = tmp_path / "k.c"
    source.write_text(C_SOURCE)
    options = {"op_debug_level": 2, "debug_dir": str(tmp_path / "dbg")}
    req = _request(tmp_path, source, extra_flags=["-O2"], options=options)
    daemon = start_daemon(
        tmp_path, "--cache-dir", str(tmp_path / "cache"), env=daemon_env(tmp_path)
    )
    try:
        out = Client(daemon.socket_path, timeout_s=120).compile_file(req).to_json()
    finally:
        daemon.stop()
    assert out["status"] == "debug", out
    direct = _direct(tmp_path, source, "-O0", "-g", "-finstrument-functions")
    assert _text(_binary(out["files"])) == _text(direct)


@pytest.mark.skipif(nvcc_missing() is not None, reason=str(nvcc_missing()))
def test_cuda_level_2_drops_the_requests_ptxas_O3(tmp_path, clean_env) -> None:
    """``-G`` with ``-Xptxas=-O3`` is fatal to ptxas ("Optimized debugging not supported"):
    the request's optimisation goes, and the kernel's code is that of a direct ``-G`` build."""
    source = tmp_path / "k.cu"
    source.write_text(CU_SOURCE)
    options = {"op_debug_level": 2, "debug_dir": str(tmp_path / "dbg")}
    req = _request(tmp_path, source, language="cuda", extra_flags=["-Xptxas=-O3"], options=options)
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as q:
        out = q.compile(load_request(req))
    assert out.status == "debug", out.error
    nvcc = shutil.which("nvcc") or "nvcc"
    direct = tmp_path / "direct.cubin"
    subprocess.run(
        [nvcc, "-cubin", "-arch=sm_90", "-G", "-x", "cu", str(source), "-o", str(direct)],
        check=True,
    )
    section = ".text.scale_kernel"
    assert ElfFile(_binary(out.files)).section(section) == ElfFile(direct).section(section)
