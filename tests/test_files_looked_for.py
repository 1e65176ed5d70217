"""A hit is the binary of exactly these inputs — the files the compiler looked for and did not
find, the data it embeds, and the headers it reads the way the caller's own compiler does
(docs/compiling.md#files-looked-for, #embedded-data). Small real-style multi-file kernels are
made by each test and built by real gcc; each case runs in-process, through a daemon (every
request sent: ``Client(local_hits=False)``) and through ``cachemgr.Client`` (hits served in
the caller's process). The object's value is read by linking it into a real program."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cachemgr.client import Client
from cachemgr.compile.queue import CompileQueue
from cachemgr.compile.request import load_request
from cachemgr.compile.results import CompileOutcome
from tests.compile_util import make_settings, scale_request
from tests.daemon_util import start_daemon

ROUTES = ("in-process", "daemon", "client")
#: The kernel: its entry, and ``probe_value`` whose value tells which header was compiled.
KERNEL = "void scale_kernel(float *x) { x[0] *= 2; }\nint probe_value(void) { return V; }\n"

Compile = Callable[[Path], CompileOutcome]


@pytest.fixture(params=ROUTES)
def compile_via(request, tmp_path: Path, clean_env: dict[str, str]) -> Iterator[Compile]:
    """``compile(request file)`` on the route of the parameter."""
    if request.param == "in-process":
        with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as q:
            yield lambda req: q.compile(load_request(req))
        return
    daemon = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "cache"))
    client = Client(daemon.socket_path, timeout_s=120, local_hits=request.param == "client")
    try:
        yield lambda req: client.compile_file(req)
    finally:
        client.close()
        daemon.stop()


def _write(path: Path, text: str | bytes, age_s: float = 10.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    old = time.time() - age_s  # not "racy": a digest remembered per file identity is used
    os.utime(path, (old, old))
    return path


def _request(folder: Path, source: str, **over: Any) -> Path:
    return _write(folder / "req.json", json.dumps(scale_request(source, **over)))


def _object(outcome: CompileOutcome) -> Path:
    assert outcome.status in ("compiled", "hit"), outcome
    return next(Path(f) for f in outcome.files if str(f).endswith(".o"))


def _value(obj: Path, tmp: Path) -> int:
    """``probe_value()`` of the object ``obj``, linked into a real program and run."""
    work = tmp / f"link-{time.monotonic_ns()}"
    work.mkdir()
    main = _write(
        work / "main.c",
        '#include <stdio.h>\nint probe_value(void);\nint main(void) { printf("%d", '
        "probe_value()); return 0; }\n",
    )
    shutil.copy(obj, work / "k.o")
    subprocess.run(["gcc", str(main), str(work / "k.o"), "-o", str(work / "p")], check=True)
    return int(subprocess.run([str(work / "p")], check=True, capture_output=True).stdout)


def _by_hand(folder: Path, source: str, *flags: str) -> int:
    """``probe_value`` of the same command run by hand in ``folder`` (the caller's own)."""
    out = folder / "by-hand.o"
    subprocess.run(
        ["gcc", "-x", "c", "-c", "-fPIC", "-O2", *flags, source, "-o", str(out)],
        cwd=folder,
        check=True,
    )
    value = _value(out, folder)
    out.unlink()
    return value


# --- files looked for and not found ----------------------------------------------------------


def test_a_header_created_next_to_the_source_is_a_miss(tmp_path, compile_via) -> None:
    """PolyBench's layout: ``#include "polybench.h"`` found in ``utilities/``; a
    ``polybench.h`` created next to the source is what the same command reads now."""
    src = tmp_path / "proj" / "gemm"
    _write(src / "gemm.c", '#include "polybench.h"\n' + KERNEL)
    _write(tmp_path / "proj" / "utilities" / "polybench.h", "#define V 1\n")
    req = _request(src, "gemm.c", include_dirs=["../utilities"])
    first = compile_via(req)
    assert first.status == "compiled" and _value(_object(first), tmp_path) == 1
    assert compile_via(req).status == "hit"
    _write(src / "polybench.h", "#define V 2\n")
    after = compile_via(req)
    assert after.status == "compiled", "a header now found first must not keep the old hit"
    assert _value(_object(after), tmp_path) == 2 == _by_hand(src, "gemm.c", "-I../utilities")


def test_a_header_created_in_an_earlier_include_folder_is_a_miss(tmp_path, compile_via) -> None:
    proj = tmp_path / "proj"
    _write(proj / "k.c", "#include <conf.h>\n" + KERNEL)
    _write(proj / "late" / "conf.h", "#define V 1\n")
    req = _request(proj, "k.c", include_dirs=["early", "late"])
    (proj / "early").mkdir()
    first = compile_via(req)
    assert first.status == "compiled" and _value(_object(first), tmp_path) == 1
    assert compile_via(req).status == "hit"
    _write(proj / "early" / "conf.h", "#define V 3\n")
    after = compile_via(req)
    assert after.status == "compiled"
    assert _value(_object(after), tmp_path) == 3 == _by_hand(proj, "k.c", "-Iearly", "-Ilate")


def _git(repo: Path, *args: str) -> None:
    who = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t"}
    env = {**os.environ, **who, "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


def test_a_branch_switch_restoring_a_shadowing_header_serves_its_own_binary(
    tmp_path, compile_via
) -> None:
    """Branch ``main`` has ``local/polybench.h`` shadowing ``utilities/polybench.h``; branch
    ``flat`` does not. main → flat → main: the last compile must be main's binary (its own
    entry, a hit), not flat's, whose headers are all unchanged."""
    repo = tmp_path / "repo"
    _write(repo / "gemm.c", "#include <polybench.h>\n" + KERNEL)
    _write(repo / "local" / "polybench.h", "#define V 1\n")
    _write(repo / "utilities" / "polybench.h", "#define V 2\n")
    _request(repo, "gemm.c", include_dirs=["local", "utilities"])
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "main")
    _git(repo, "checkout", "-qb", "flat")
    _git(repo, "rm", "-q", "local/polybench.h")
    _git(repo, "commit", "-qm", "flat")
    req = repo / "req.json"
    _git(repo, "checkout", "-q", "main")
    on_main = compile_via(req)
    assert on_main.status == "compiled" and _value(_object(on_main), tmp_path) == 1
    _git(repo, "checkout", "-q", "flat")
    on_flat = compile_via(req)
    assert on_flat.status == "compiled" and _value(_object(on_flat), tmp_path) == 2
    _git(repo, "checkout", "-q", "main")
    back = compile_via(req)
    assert back.kernel_name == on_main.kernel_name, "flat's entry served after the switch back"
    by_hand = _by_hand(repo, "gemm.c", "-Ilocal", "-Iutilities")
    assert _value(_object(back), tmp_path) == 1 == by_hand


def test_a_has_include_probe_turned_true_is_a_miss(tmp_path, compile_via) -> None:
    """``__has_include("config.h")`` false at the first compile; a ``config.h`` made later
    changes the binary. A file only probed (``__has_include("tuned.h")`` true, never
    included) is in the build mirror too: the compile sees what the caller's would."""
    proj = tmp_path / "proj"
    _write(
        proj / "k.c",
        '#if __has_include("config.h")\n#include "config.h"\n#else\n#define BASE 1\n#endif\n'
        '#if __has_include("tuned.h")\n#define V (BASE + 10)\n#else\n#define V BASE\n#endif\n'
        + KERNEL,
    )
    _write(proj / "tuned.h", "/* present: the kernel is tuned */\n")
    req = _request(proj, "k.c")
    first = compile_via(req)
    assert first.status == "compiled"
    assert _value(_object(first), tmp_path) == 11 == _by_hand(proj, "k.c")
    assert compile_via(req).status == "hit"
    _write(proj / "config.h", "#define BASE 2\n")
    after = compile_via(req)
    assert after.status == "compiled", "__has_include is true now: not the old binary"
    assert _value(_object(after), tmp_path) == 12 == _by_hand(proj, "k.c")
    (proj / "tuned.h").unlink()
    untuned = compile_via(req)
    assert untuned.status == "compiled" and _value(_object(untuned), tmp_path) == 2


# --- embedded data ---------------------------------------------------------------------------

INCBIN = (
    '__asm__(".section .rodata\\n.global blob\\nblob:\\n.incbin \\"{name}\\"\\n.previous\\n");\n'
    "extern const char blob[];\n"
    "void scale_kernel(float *x) {{ x[0] *= 2; }}\nint probe_value(void) {{ return blob[0]; }}\n"
)


def test_an_incbin_file_is_keyed_and_compiled_from_its_hashed_bytes(tmp_path, compile_via) -> None:
    proj = tmp_path / "proj"
    _write(proj / "k.c", INCBIN.format(name="data/table.bin"))
    data = _write(proj / "data" / "table.bin", b"\x05")
    req = _request(proj, "k.c")
    first = compile_via(req)
    assert first.status == "compiled", first.error
    assert _value(_object(first), tmp_path) == 5 == _by_hand(proj, "k.c")
    assert compile_via(req).status == "hit"
    _write(data, b"\x07")
    after = compile_via(req)
    assert after.status == "compiled", "a changed .incbin file must not keep the old hit"
    assert _value(_object(after), tmp_path) == 7 == _by_hand(proj, "k.c")


def test_an_incbin_whose_name_is_built_by_macros_is_compiled_and_not_cached(
    tmp_path, compile_via
) -> None:
    proj = tmp_path / "proj"
    data = _write(proj / "table.bin", b"\x03")
    source = (
        f'#define TABLE "{data}"\n'
        '__asm__(".section .rodata\\n.global blob\\nblob:\\n"\n'
        '        ".incbin \\"" TABLE "\\"\\n.previous");\n'
        "extern const char blob[];\n"
        "void scale_kernel(float *x) { x[0] *= 2; }\nint probe_value(void) { return blob[0]; }\n"
    )
    _write(proj / "k.c", source)
    req = _request(proj, "k.c")
    for expected in (3, 4):
        out = compile_via(req)
        assert out.status == "compiled" and out.policy is not None
        why = str(out.policy.why_not_cached)
        assert out.policy.cached is False and "cannot resolve" in why, out
        assert _value(_object(out), tmp_path) == expected
        _write(data, b"\x04")


# --- the compile sees what the caller's compiler would ---------------------------------------


def test_a_project_header_reached_through_a_system_header_is_compiled(
    tmp_path, compile_via
) -> None:
    """``inc/features.h`` (``#include_next``) is read only from ``<stdio.h>``: ``-MM`` left
    it out of the build mirror, and the cold compile built 0 where gcc by hand builds 1."""
    proj = tmp_path / "proj"
    _write(proj / "inc" / "features.h", "#include_next <features.h>\n#define PROJECT_FEATURES 1\n")
    _write(
        proj / "k.c",
        "#include <stdio.h>\n#ifdef PROJECT_FEATURES\n#define V 1\n#else\n#define V 0\n#endif\n"
        + KERNEL,
    )
    req = _request(proj, "k.c", include_dirs=["inc"])
    out = compile_via(req)
    assert _by_hand(proj, "k.c", "-Iinc") == 1
    assert out.status == "compiled" and _value(_object(out), tmp_path) == 1


def test_a_linked_source_reads_headers_from_the_links_folder(tmp_path, compile_via) -> None:
    """``proj/k.c`` is a link to ``shared/k.c``: gcc run on ``proj/k.c`` reads ``proj/x.h``."""
    _write(tmp_path / "shared" / "k.c", '#include "x.h"\n' + KERNEL)
    _write(tmp_path / "shared" / "x.h", "#define V 2\n")
    proj = tmp_path / "proj"
    _write(proj / "x.h", "#define V 1\n")
    (proj / "k.c").symlink_to("../shared/k.c")
    req = _request(proj, "k.c")
    out = compile_via(req)
    assert _by_hand(proj, "k.c") == 1
    assert out.status == "compiled" and _value(_object(out), tmp_path) == 1


# --- the same search through clang and nvcc --------------------------------------------------


@pytest.mark.parametrize("compiler", ["clang", "nvcc"])
def test_clang_and_nvcc_see_a_header_created_next_to_the_source(
    tmp_path, clean_env, compiler
) -> None:
    """The search order is the same for clang and nvcc's host preprocessor: a quoted
    header created next to the source, ahead of the include folder's, is a miss."""
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} is not installed")
    proj = tmp_path / "proj"
    cuda = compiler == "nvcc"
    name = "k.cu" if cuda else "k.c"
    body = (
        'extern "C" __global__ void scale_kernel(float *x) { x[threadIdx.x] *= V; }\n'
        if cuda
        else KERNEL
    )
    _write(proj / "src" / name, '#include "tune.h"\n' + body)
    _write(proj / "include" / "tune.h", "#define V 2\n")
    language = "cuda" if cuda else "c"
    req = _request(proj / "src", name, language=language, include_dirs=["../include"])
    compilers = {} if cuda else {"cc": compiler}
    with CompileQueue(make_settings(tmp_path, clean_env, compilers), workers=1) as q:
        first = q.compile(load_request(req))
        assert first.status == "compiled", first.error
        assert q.compile(load_request(req)).status == "hit"
        _write(proj / "src" / "tune.h", "#define V 3\n")
        after = q.compile(load_request(req))
        assert after.status == "compiled" and after.kernel_name != first.kernel_name
        assert q.compile(load_request(req)).status == "hit"


# --- the manifest and the wire ---------------------------------------------------------------


def test_a_version_1_manifest_is_a_miss_not_a_hit_without_the_checks(tmp_path) -> None:
    """A manifest written before absent places were recorded names no place to check: it
    must not answer (its variant could hide a shadowing header)."""
    from cachemgr.storage import manifest

    chip = tmp_path / "kernel_cache" / "Ascend910B1"
    chip.mkdir(parents=True)
    header = _write(tmp_path / "k.h", "#define V 1\n")
    digest = __import__("hashlib").sha256(header.read_bytes()).hexdigest()
    old = {"cachemgr_manifest": 1, "variants": [{"kernel": "te_x_" + "a" * 64, "files": [
        [str(header), digest]]}]}  # fmt: skip
    where = chip / "x_base.manifest"
    where.write_text(json.dumps(old))
    assert manifest.match(where, lambda p: digest) is None
    manifest.record(where, "te_x_" + "b" * 64, {str(header): digest}, [str(tmp_path / "a.h")])
    (found,) = manifest.read(where)
    assert found.absent == (str(tmp_path / "a.h"),)
    assert manifest.match(where, lambda p: digest, lambda places: True) == found
    assert manifest.match(where, lambda p: digest, lambda places: False) is None


@pytest.mark.parametrize("absent", [["relative.h"], "/a.h", [1], ["/ok.h", "/nul\0.h"]], ids=str)
def test_a_malformed_absent_list_on_the_wire_is_one_line(absent: Any) -> None:
    from cachemgr.compile import inputs
    from cachemgr.errors import InvalidInputError

    doc = {"source": {"path": "/k.c", "data": ""}, "headers": [], "absent": absent}
    with pytest.raises(InvalidInputError, match=r"^/compile request: inputs\.absent"):
        inputs.from_wire(doc, "/compile request")
