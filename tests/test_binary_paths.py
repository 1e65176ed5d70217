"""Paths in the binary are the caller's (docs/compiling.md#paths-in-the-binary).

Every compile runs from a private build mirror; ``__FILE__`` (an ``assert``, a
``GGML_ABORT``-style macro in a project header) and DWARF (``DW_AT_name``,
``DW_AT_comp_dir``) named that mirror, and a copy of the project got a hit naming the first
copy. Now each copy's object names its own files, never the mirror, and a project copied
without ``__FILE__`` or ``-g`` still shares the entry. In-process, through a real daemon with
:class:`cachemgr.Client`, and through the CLI with ``CACHEMGR_SOCKET``; real gcc and nvcc."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cachemgr.client import Client
from cachemgr.compile.queue import CompileQueue
from cachemgr.compile.request import load_request
from tests.compile_util import make_settings, nvcc_missing, scale_request
from tests.conftest import run_cli
from tests.daemon_util import daemon_env, start_daemon

#: A project header with an abort macro that names the file (as ggml's ``GGML_ABORT``).
ABORT_H = (
    "#include <stdlib.h>\n"
    "void report(const char *file, int line);\n"
    "#define K_ABORT() do { report(__FILE__, __LINE__); abort(); } while (0)\n"
    "const char *k_abort_header = __FILE__;\n"
)
WITH_FILE = (
    "#include <assert.h>\n"
    '#include "abort.h"\n'
    "void scale_kernel(float *x) { assert(x); if (x[0] < 0) K_ABORT(); x[0] *= 2; }\n"
)
PLAIN = '#include "k.h"\nvoid scale_kernel(float *x) { x[0] *= F; }\n'
MIRROR_MARKS = (b"/.src/", b"cachemgr-build-")


def _project(root: Path, files: dict[str, str], **over: Any) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(text)
    req = root / "req.json"
    req.write_text(json.dumps(scale_request("k.c", **over)))
    return req


def _two_copies(tmp: Path, files: dict[str, str], **over: Any) -> tuple[Path, Path]:
    return _project(tmp / "a" / "proj", files, **over), _project(tmp / "b" / "proj", files, **over)


def _binary(out: Any) -> Path:
    files = out.files if hasattr(out, "files") else out["files"]
    return next(Path(f) for f in files if Path(f).suffix in (".o", ".cubin"))


def _compile_each(tmp: Path, clean_env: dict[str, str], reqs: list[Path], route: str) -> list[Any]:
    """Compile ``reqs`` in order on ``route``: their outcomes (objects or JSON dicts)."""
    if route == "in-process":
        with CompileQueue(make_settings(tmp, clean_env), workers=1) as q:
            return [q.compile(load_request(r)) for r in reqs]
    daemon = start_daemon(tmp, "--cache-dir", str(tmp / "cache"), env=daemon_env(tmp))
    try:
        if route == "client":
            client = Client(daemon.socket_path, timeout_s=120)
            return [client.compile_file(r).to_json() for r in reqs]
        env = {**daemon.env, "CACHEMGR_SOCKET": str(daemon.socket_path)}
        outs = []
        for r in reqs:
            proc = run_cli("compile", "--cache-dir", str(tmp / "cache"), "--json", str(r), env=env)
            assert proc.returncode == 0, proc.stderr
            outs.append(json.loads(proc.stdout.splitlines()[-1]))
        return outs
    finally:
        daemon.stop()


def _status(out: Any) -> str:
    return out.status if hasattr(out, "status") else out["status"]


def _kernel(out: Any) -> str:
    return out.kernel_name if hasattr(out, "kernel_name") else out["kernel_name"]


ROUTES = ["in-process", "client", "cli-daemon"]


@pytest.mark.parametrize("route", ROUTES)
def test_each_copy_names_its_own_files_never_the_mirror(tmp_path, clean_env, route) -> None:
    a, b = _two_copies(tmp_path, {"k.c": WITH_FILE, "abort.h": ABORT_H})
    first, second = _compile_each(tmp_path, clean_env, [a, b], route)
    assert (_status(first), _status(second)) == ("compiled", "compiled"), "no shared entry"
    assert _kernel(first) != _kernel(second)
    for out, own, other in ((first, a.parent, b.parent), (second, b.parent, a.parent)):
        data = _binary(out).read_bytes()
        assert f"{own}/k.c".encode() in data, "assert's __FILE__: the caller's source"
        assert f"{own}/abort.h".encode() in data, "a header's __FILE__: the caller's header"
        assert str(other).encode() not in data
        assert not any(mark in data for mark in MIRROR_MARKS), "never the build mirror"


def _dwarf(obj: Path) -> dict[str, str]:
    """The compile unit's ``DW_AT_name`` and ``DW_AT_comp_dir`` (``readelf``)."""
    text = subprocess.run(
        ["readelf", "--debug-dump=info", str(obj)], capture_output=True, text=True, check=True
    ).stdout
    found = {}
    for attr in ("DW_AT_name", "DW_AT_comp_dir"):
        m = re.search(rf"{attr}\s*:.*?(/\S+)\s*$", text, re.MULTILINE)
        assert m, (attr, text[:2000])
        found[attr] = m.group(1)
    return found


@pytest.mark.parametrize("route", ROUTES)
def test_debug_info_names_the_callers_source_and_folder(tmp_path, clean_env, route) -> None:
    files = {"k.c": PLAIN, "k.h": "#define F 2\n"}
    a, b = _two_copies(tmp_path, files, extra_flags=["-g"])
    first, second = _compile_each(tmp_path, clean_env, [a, b], route)
    assert (_status(first), _status(second)) == ("compiled", "compiled"), "-g: the folder is keyed"
    for out, req in ((first, a), (second, b)):
        assert _dwarf(_binary(out)) == {
            "DW_AT_name": str(req.parent / "k.c"),
            "DW_AT_comp_dir": str(req.parent),
        }
        assert not any(mark in _binary(out).read_bytes() for mark in MIRROR_MARKS)


@pytest.mark.parametrize("route", ROUTES)
def test_a_copy_without_file_or_debug_info_still_shares_the_entry(
    tmp_path, clean_env, route
) -> None:
    a, b = _two_copies(tmp_path, {"k.c": PLAIN, "k.h": "#define F 2\n"})
    first, second = _compile_each(tmp_path, clean_env, [a, b], route)
    assert (_status(first), _status(second)) == ("compiled", "hit")
    assert _kernel(first) == _kernel(second)


def test_the_key_holds_the_folder_only_when_the_binary_can(tmp_path) -> None:
    from cachemgr.compile import pathkey

    assert pathkey.emits_debug_info(["-O2", "-g"]) and not pathkey.emits_debug_info(["-g", "-g0"])
    assert pathkey.emits_debug_info(["-lineinfo"]) and not pathkey.emits_debug_info(["-O3"])
    assert pathkey.names_a_path(b"x = __FILE__;") and pathkey.names_a_path(b"assert (p);")
    assert not pathkey.names_a_path(b"static_assert(sizeof(int) == 4);")


@pytest.mark.skipif(nvcc_missing() is not None, reason=str(nvcc_missing()))
def test_a_cuda_assert_names_the_callers_file(tmp_path, clean_env) -> None:
    source = (
        "#include <assert.h>\n"
        'extern "C" __global__ void scale_kernel(float *x) { assert(x); x[0] *= 2; }\n'
    )
    reqs = []
    for copy in ("a", "b"):
        root = tmp_path / copy / "cu"
        root.mkdir(parents=True)
        (root / "k.cu").write_text(source)
        req = root / "req.json"
        req.write_text(json.dumps(scale_request("k.cu", language="cuda")))
        reqs.append(req)
    outs = _compile_each(tmp_path, clean_env, reqs, "in-process")
    assert [_status(o) for o in outs] == ["compiled", "compiled"]
    for out, req in zip(outs, reqs, strict=True):
        data = _binary(out).read_bytes()
        assert f"{req.parent}/k.cu".encode() in data
        assert not any(mark in data for mark in MIRROR_MARKS)
