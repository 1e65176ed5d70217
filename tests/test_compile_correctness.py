"""A hit is always the binary of exactly these bytes (source, headers, include
folders, flags), in-process and through the daemon; packages match exactly; force clears
every time. Real multi-file kernels are made by each test; real gcc and nvcc compile them."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from cachemgr.client import Client
from cachemgr.compile import precompiled
from cachemgr.compile.queue import CompileQueue
from cachemgr.compile.request import load_request
from cachemgr.storage import manifest
from tests.compile_util import (
    SOC,
    counting_cc,
    make_settings,
    nvcc_missing,
    scale_request,
    wait_for,
)
from tests.conftest import run_cli
from tests.daemon_util import daemon_env, start_daemon


def _write(path: Path, text: str, age_s: float = 0.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if age_s:  # an mtime in the past: a digest remembered per file identity is not "racy"
        old = time.time() - age_s
        os.utime(path, (old, old))
    return path


def _request(folder: Path, name: str, source: str, **over: Any) -> Path:
    return _write(folder / f"{name}.json", json.dumps(scale_request(source, **over)))


def _c_project(root: Path, factor: int = 2) -> Path:
    """``root/src/k.c`` with a local header ``k.h`` and ``common.h`` in ``root/include``."""
    _write(
        root / "src" / "k.c",
        '#include "k.h"\n#include "common.h"\n'
        "void scale_kernel(float *x) { for (int i = 0; i < N; i++) x[i] *= FACTOR + BIAS; }\n",
        10,
    )
    _write(root / "src" / "k.h", f"#define FACTOR {factor}\n", 10)
    _write(root / "include" / "common.h", "#define N 16\n#define BIAS 0\n", 10)
    return _request(root / "src", "req", "k.c", include_dirs=["../include"])


def _binary(outcome: Any) -> bytes:
    files = [Path(f) for f in (outcome.files if hasattr(outcome, "files") else outcome["files"])]
    return next(f for f in files if f.suffix in (".o", ".cubin")).read_bytes()


def _status(outcome: Any) -> str:
    return outcome.status if hasattr(outcome, "status") else outcome["status"]


def _kernel(outcome: Any) -> str:
    return outcome.kernel_name if hasattr(outcome, "kernel_name") else outcome["kernel_name"]


# --- headers and include folders are in the key --------------------------------------


def _edit_revert_cycle(compile_once, header: Path, edited: str, cold: bool = True) -> None:
    """cold → compiled; warm → hit; header edit → compiled, new binary; revert → hit on
    the first binary (the same entry)."""
    original = header.read_text()
    first = compile_once()
    assert _status(first) == ("compiled" if cold else "hit"), first
    warm = compile_once()
    assert _status(warm) == "hit" and _kernel(warm) == _kernel(first)
    _write(header, edited, 5)
    changed = compile_once()
    assert _status(changed) == "compiled", "a header edit must not be served the old object"
    assert _kernel(changed) != _kernel(first) and _binary(changed) != _binary(first)
    _write(header, original, 10)
    back = compile_once()
    assert _status(back) == "hit" and _kernel(back) == _kernel(first)
    assert _binary(back) == _binary(first)


def test_c_header_edit_recompiles_and_revert_hits_in_process(tmp_path, clean_env) -> None:
    req = _c_project(tmp_path / "proj")
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as q:
        _edit_revert_cycle(
            lambda: q.compile(load_request(req)),
            tmp_path / "proj" / "src" / "k.h",
            "#define FACTOR 7\n",
        )
        # a header found through include_dirs is in the key too
        _edit_revert_cycle(
            lambda: q.compile(load_request(req)),
            tmp_path / "proj" / "include" / "common.h",
            "#define N 16\n#define BIAS 1\n",
            cold=False,
        )
    chip = tmp_path / "cache" / "kernel_cache" / SOC
    manifests = list(chip.glob("*.manifest"))
    assert len(manifests) == 1
    variants = manifest.read(manifests[0])
    assert {Path(p).name for v in variants for p in v.files} == {"k.h", "common.h"}


def test_include_dirs_and_two_projects_never_share_an_entry(tmp_path, clean_env) -> None:
    """Same k.c, other headers (another project, another include folder) → another kernel."""
    a = _c_project(tmp_path / "a")
    b = _c_project(tmp_path / "b", factor=3)
    _write(tmp_path / "alt" / "common.h", "#define N 16\n#define BIAS 4\n", 10)
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as q:
        ra, rb = q.compile(load_request(a)), q.compile(load_request(b))
        assert (ra.status, rb.status) == ("compiled", "compiled")
        assert ra.kernel_name != rb.kernel_name and _binary(ra) != _binary(rb)
        data = json.loads(a.read_text())
        data["include_dirs"] = [str(tmp_path / "alt")]
        alt = _write(tmp_path / "a" / "src" / "alt.json", json.dumps(data))
        ralt = q.compile(load_request(alt))
        assert ralt.status == "compiled" and ralt.kernel_name != ra.kernel_name
        assert q.compile(load_request(a)).status == "hit"


def test_a_copied_project_has_the_same_key(tmp_path, clean_env) -> None:
    """The key holds header paths relative to the source: a project built in another folder
    (or a package made elsewhere) finds the same entry."""
    a = _c_project(tmp_path / "a")
    b = _c_project(tmp_path / "elsewhere" / "b")
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as q:
        first = q.compile(load_request(a))
        second = q.compile(load_request(b))
    assert first.status == "compiled" and second.status == "hit"
    assert second.kernel_name == first.kernel_name


def test_header_edit_through_the_daemon(tmp_path, clean_env) -> None:
    req = _c_project(tmp_path / "proj")
    daemon = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "cache"))
    try:
        client = Client(daemon.socket_path, timeout_s=120)
        _edit_revert_cycle(
            lambda: client.compile_file(req).to_json(),
            tmp_path / "proj" / "src" / "k.h",
            "#define FACTOR 9\n",
        )
        remote = Client(daemon.socket_path, timeout_s=120, local_hits=False)
        assert remote.compile_file(req).to_json()["status"] == "hit"
        _write(tmp_path / "proj" / "src" / "k.h", "#define FACTOR 11\n", 5)
        assert remote.compile_file(req).to_json()["status"] == "compiled", (
            "the daemon keys headers too"
        )
    finally:
        daemon.stop()


@pytest.mark.skipif(nvcc_missing() is not None, reason=str(nvcc_missing()))
def test_cuda_kernel_with_a_header(tmp_path, clean_env) -> None:
    root = tmp_path / "cu"
    _write(
        root / "scale.cu",
        '#include "scale.h"\n'
        'extern "C" __global__ void scale_kernel(float *x) { x[threadIdx.x] *= FACTOR; }\n',
        10,
    )
    header = _write(root / "scale.h", "#define FACTOR 2.0f\n", 10)
    req = _request(root, "req", "scale.cu", language="cuda")
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as q:
        _edit_revert_cycle(lambda: q.compile(load_request(req)), header, "#define FACTOR 3.0f\n")
    chip = tmp_path / "cache" / "kernel_cache" / SOC
    (found,) = chip.glob("*.manifest")
    files = [p for v in manifest.read(found) for p in v.files]
    assert files and all(Path(p).name == "scale.h" for p in files), "CUDA's own headers: identity"


@pytest.mark.skipif(nvcc_missing() is not None, reason=str(nvcc_missing()))
def test_templated_cuda_kernel_names_its_mangled_candidates(tmp_path, clean_env) -> None:
    root = tmp_path / "tpl"
    src = _write(
        root / "tpl.cu",
        '#include "tpl.h"\n'
        "template <int S> __global__ void scale_kernel(float *x) { x[threadIdx.x] *= S * K; }\n"
        "template __global__ void scale_kernel<2>(float *);\n",
        10,
    )
    _write(root / "tpl.h", "#define K 1\n", 10)
    req = _request(root, "req", "tpl.cu", language="cuda")
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as q:
        one = q.compile(load_request(req))
        assert one.status == "compiled", one.error
        assert q.compile(load_request(req)).status == "hit"
        _write(src, src.read_text() + "template __global__ void scale_kernel<3>(float *);\n", 5)
        two = q.compile(load_request(req))
        assert two.status == "failed"
        assert "_Z12scale_kernelILi2EEvPf" in two.error and "_Z12scale_kernelILi3EEvPf" in two.error
        assert 'extern "C"' not in two.error
        pick = _request(
            root, "pick", "tpl.cu", language="cuda", kernel_entry="_Z12scale_kernelILi3EEvPf"
        )
        assert q.compile(load_request(pick)).status == "compiled"


# --- the bytes hashed are the bytes compiled -------------------------------------------


def _race_project(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A slow job's request (its compiler waits for ``go``) and the raced request's source."""
    src = _write(
        tmp_path / "race" / "k.c",
        'const char tag[] = "TAG-two";\nint scale_kernel(int x) { return x * 2; }\n',
        10,
    )
    slow = _request(tmp_path / "race", "slow", "k.c", defines={"SLOW": 1})
    raced = _request(tmp_path / "race", "raced", "k.c")
    return src, slow, raced


def _racing_cc(tmp_path: Path) -> Path:
    go = tmp_path / "go"
    body = f'case "$*" in *-DSLOW=1*) while [ ! -f {go} ]; do sleep 0.02; done;; esac'
    return counting_cc(tmp_path / "w", body=body)


FIVE = 'const char tag[] = "TAG-five";\nint scale_kernel(int x) { return x * 5; }\n'


def test_source_edited_while_queued_in_process(tmp_path, clean_env) -> None:
    src, slow, raced = _race_project(tmp_path)
    settings = make_settings(tmp_path, clean_env, compilers={"cc": str(_racing_cc(tmp_path))})
    with CompileQueue(settings, workers=1) as q:
        first = q.submit(load_request(slow))
        wait_for(lambda: (tmp_path / "w" / "calls.log").exists(), 30, "the slow compile")
        queued = q.submit(load_request(raced))  # hashed now: x*2
        _write(src, FIVE, 3)  # edited while the job waits behind the slow one
        (tmp_path / "go").write_text("")
        out, _ = queued.result(60), first.result(60)
        assert out.status == "compiled"
        assert b"TAG-two" in _binary(out) and b"TAG-five" not in _binary(out)
        five = q.compile(load_request(raced))
        assert five.status == "compiled" and b"TAG-five" in _binary(five)
        _write(src, src.read_text().replace("five", "two").replace("* 5", "* 2"), 10)
        two = q.compile(load_request(raced))
        assert two.status == "hit" and two.kernel_name == out.kernel_name
        assert b"TAG-two" in _binary(two)


def test_source_edited_while_queued_through_the_daemon(tmp_path, clean_env) -> None:
    src, slow, raced = _race_project(tmp_path)
    cc = _racing_cc(tmp_path)
    config = _write(tmp_path / "d.toml", f'[compilers]\ncc = "{cc}"\n[daemon]\nworkers = 1\n')
    daemon = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "cache"), "--config", str(config))
    try:
        client = Client(daemon.socket_path, timeout_s=120)
        job_slow = client.compile_file(slow, wait=False)["job_id"]
        wait_for(lambda: (tmp_path / "w" / "calls.log").exists(), 30, "the slow compile")
        job = client.compile_file(raced, wait=False)["job_id"]
        _write(src, FIVE, 3)
        (tmp_path / "go").write_text("")
        wait_for(lambda: client.job(job)["state"] in ("done", "failed"), 60, "the raced job")
        out = client.job(job)
        assert out["status"] == "compiled", out
        assert b"TAG-two" in _binary(out) and b"TAG-five" not in _binary(out)
        wait_for(lambda: client.job(job_slow)["state"] == "done", 60, "the slow job")
        five = client.compile_file(raced).to_json()
        assert five["status"] == "compiled" and b"TAG-five" in _binary(five)
    finally:
        daemon.stop()


# --- extra_flags ------------------------------------------------------------------------


def test_extra_flags_are_in_the_key_and_checked(tmp_path, clean_env) -> None:
    _write(tmp_path / "k.c", "void scale_kernel(float *x) { x[0] *= 2; }\n", 10)
    plain = _request(tmp_path, "plain", "k.c")
    fast = _request(tmp_path, "fast", "k.c", extra_flags=["-O3", "-ffast-math", "-DX=1"])
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as q:
        a, b = q.compile(load_request(plain)), q.compile(load_request(fast))
    assert (a.status, b.status) == ("compiled", "compiled") and a.kernel_name != b.kernel_name
    for bad in ["-o", "@args.txt", "-B/tmp", "-specs=x.specs", "-fplugin=evil.so", "--unknown"]:
        req = _request(
            tmp_path, "bad", "k.c", extra_flags=[bad, "/tmp/x"] if bad == "-o" else [bad]
        )
        proc = run_cli("compile", str(req), "--cache-dir", str(tmp_path / "cache"), env=clean_env)
        assert proc.returncode == 2, proc.stderr
        assert repr(bad) in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# --- packages match exactly -------------------------------------------------------------


def test_package_from_scale_2_never_answers_scale_3(tmp_path, clean_env) -> None:
    _write(tmp_path / "k.c", "void scale_kernel(float *x) { x[0] *= SCALE; }\n", 10)
    dyn = {"shape": [-1], "dtype": "float32", "format": "ND"}
    two = _request(tmp_path, "two", "k.c", defines={"SCALE": 2}, inputs=[dyn], outputs=[dyn])
    three = _request(tmp_path, "three", "k.c", defines={"SCALE": 3}, inputs=[dyn], outputs=[dyn])
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as q:
        built = q.compile(load_request(two))
    chip = tmp_path / "cache" / "kernel_cache" / SOC
    precompiled.pack(chip, [built.kernel_name], tmp_path / "pkg")
    for jit in ("false", "auto"):  # auto: a dynamic shape looks for a binary first
        settings = make_settings(tmp_path / f"fresh-{jit}", clean_env, jit_compile=jit)
        with CompileQueue(settings, workers=1, binary_dirs=[tmp_path / "pkg"]) as q:
            assert q.compile(load_request(three)).status == "compiled"
            assert q.compile(load_request(two)).status == "binary"


@pytest.mark.skipif(nvcc_missing() is not None, reason=str(nvcc_missing()))
def test_a_cubin_package_never_answers_a_c_request(tmp_path, clean_env) -> None:
    _write(
        tmp_path / "k.cu", 'extern "C" __global__ void scale_kernel(float *x) { x[0] *= 2; }\n', 10
    )
    _write(tmp_path / "k.c", "void scale_kernel(float *x) { x[0] *= 2; }\n", 10)
    cu = _request(tmp_path, "cu", "k.cu", language="cuda")
    c = _request(tmp_path, "c", "k.c")
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as q:
        built = q.compile(load_request(cu))
    precompiled.pack(
        tmp_path / "cache" / "kernel_cache" / SOC, [built.kernel_name], tmp_path / "pkg"
    )
    settings = make_settings(tmp_path / "fresh", clean_env, jit_compile="false")
    with CompileQueue(settings, workers=1, binary_dirs=[tmp_path / "pkg"]) as q:
        out = q.compile(load_request(c))
    assert out.status == "compiled" and all(f.suffix != ".cubin" for f in out.files)


# --- force means force, every time ------------------------------------------------------


def test_force_through_the_daemon_clears_every_time(tmp_path, clean_env) -> None:
    _write(tmp_path / "k.c", "void scale_kernel(float *x) { x[0] *= N; }\n", 10)
    forced = _request(
        tmp_path, "forced", "k.c", defines={"N": 1}, options={"op_compiler_cache_mode": "force"}
    )
    between = _request(tmp_path, "between", "k.c", defines={"N": 2})
    daemon = start_daemon(
        tmp_path, "--cache-dir", str(tmp_path / "cache"), env=daemon_env(tmp_path)
    )
    try:
        client = Client(daemon.socket_path, timeout_s=120)
        for round_ in (1, 2):  # today the second force acts as enable
            out = client.compile_file(between).to_json()
            assert out["status"] == "compiled", out
            files = [Path(f) for f in out["files"]]
            assert all(f.is_file() for f in files)
            first = client.compile_file(forced).to_json()
            assert first["status"] == "compiled", "force recompiles"
            assert not any(f.exists() for f in files), f"round {round_}: force cleared the chip"
    finally:
        daemon.stop()


# --- the manifest is part of the cache ---------------------------------------------------


def test_manifest_is_counted_verified_and_evicted_with_its_last_entry(tmp_path, clean_env) -> None:
    req = _c_project(tmp_path / "proj")
    cache = ["--cache-dir", str(tmp_path / "cache")]
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as q:
        built = q.compile(load_request(req))
    chip = tmp_path / "cache" / "kernel_cache" / SOC
    (found,) = chip.glob("*.manifest")
    stats = json.loads(run_cli("stats", "--json", *cache, env=clean_env).stdout)
    files = sum(p.stat().st_size for p in chip.iterdir() if p.is_file())
    assert stats["chip_folders"][SOC]["bytes"] == files, "a manifest's bytes are counted"
    assert run_cli("verify", *cache, env=clean_env).returncode == 0
    good = found.read_bytes()
    found.write_text('{"cachemgr_manifest": 1, "variants": [{"kernel": "../x"}]}')
    proc = run_cli("verify", *cache, env=clean_env)
    assert proc.returncode == 1 and found.name in proc.stdout
    assert run_cli("verify", "--repair", *cache, env=clean_env).returncode == 0
    assert not found.exists()
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as q:
        again = q.compile(load_request(req))  # a lost manifest costs one header listing
    assert again.status == "hit" and again.kernel_name == built.kernel_name
    assert found.read_bytes() != b"" and manifest.read(found)
    found.write_bytes(good)
    gc = run_cli("gc", "--ratio", "0", "--min-age", "0", "--json", *cache, env=clean_env)
    assert gc.returncode == 0, gc.stderr
    assert not (chip / f"{built.kernel_name}.json").exists()
    assert not found.exists(), "the manifest goes with its last entry"


@pytest.mark.parametrize(
    ("source", "system_only"),
    [
        (b"#include <math.h>\nint x;", True),
        (b"#include <a.h> // c\n  #  include<b.h>\n", True),
        (b"int x;", True),
        (b'#include "k.h"\n', False),
        (b'#define I "x"\n#include I\n', False),
        (b"/* include */ int x;", False),
        (b'#/**/include "x"', False),
        (b'%:include "x"', False),
        (b"#include <x.h> /* c */", False),
        (b'#inc\\\nlude "x"', False),
        (b"#if __has_include(<x.h>)\n#endif", False),
    ],
)
def test_which_sources_need_no_header_listing(source: bytes, system_only: bool) -> None:
    """A miss skips the dependency listing only for a source that cannot name a header
    outside the system folders (conservative: any other 'include' means a listing)."""
    from cachemgr.compile.inputs import reads_only_system_headers

    assert reads_only_system_headers(source, "c", (), {}) is system_only
    assert not reads_only_system_headers(source, "c", (Path("/inc"),), {})
    assert not reads_only_system_headers(source, "c", (), {"CPATH": "/inc"})
    assert not reads_only_system_headers(source, "cce", (), {})


def test_an_angle_include_found_through_cpath_is_keyed(tmp_path, clean_env, monkeypatch) -> None:
    """``#include <k.h>`` resolves to a user header through CPATH: it is listed and keyed."""
    _write(tmp_path / "k.c", "#include <k.h>\nvoid scale_kernel(float *x) { x[0] *= F; }\n", 10)
    header = _write(tmp_path / "inc" / "k.h", "#define F 2\n", 10)
    req = _request(tmp_path, "req", "k.c")
    monkeypatch.setenv("CPATH", str(tmp_path / "inc"))
    with CompileQueue(make_settings(tmp_path, dict(os.environ)), workers=1) as q:
        _edit_revert_cycle(lambda: q.compile(load_request(req)), header, "#define F 3\n")


def test_a_header_read_in_place_that_changes_during_the_compile_is_not_cached(
    tmp_path, clean_env
) -> None:
    """An absolute #include is read where it is, not from the snapshot: the compile writes
    the files it read (-MD) and a changed one means the kernel is returned uncached."""
    header = _write(tmp_path / "abs" / "v.h", 'const char tag[] = "TAG-one";\n', 10)
    _write(
        tmp_path / "k.c", f'#include "{header}"\nvoid scale_kernel(float *x) {{ x[0] *= 2; }}\n', 10
    )
    req = _request(tmp_path, "req", "k.c")
    edited, two = tmp_path / "edited", 'const char tag[] = \\"TAG-two\\";'
    once = f'[ -f {edited} ] || {{ echo "{two}" > {header}; touch {edited}; }}'
    edit = f'case "$*" in *-MD*) {once};; esac'
    cc = counting_cc(tmp_path / "w", body=edit)
    out_dir = tmp_path / "out"
    settings = make_settings(tmp_path, clean_env, compilers={"cc": str(cc)})
    with CompileQueue(settings, workers=1, output_dir=out_dir) as q:
        raced = q.compile(load_request(req))
        assert raced.status == "compiled" and all(f.parent == out_dir for f in raced.files)
        assert raced.cached is False and f"{header} changed while it compiled" in str(
            raced.warning
        ), raced.warning
        chip = tmp_path / "cache" / "kernel_cache" / SOC
        assert not (chip / f"{raced.kernel_name}.json").exists(), "never cached"
        steady = q.compile(load_request(req))  # nothing changes now: cached
        assert steady.status == "compiled" and (chip / f"{steady.kernel_name}.json").exists()
        assert b"TAG-two" in _binary(steady)


def test_an_absolute_include_through_the_daemon_is_one_clear_line(tmp_path, clean_env) -> None:
    header = _write(tmp_path / "abs" / "v.h", "#define V 1\n", 10)
    _write(
        tmp_path / "k.c", f'#include "{header}"\nvoid scale_kernel(float *x) {{ x[0] *= V; }}\n', 10
    )
    req = _request(tmp_path, "req", "k.c")
    daemon = start_daemon(
        tmp_path, "--cache-dir", str(tmp_path / "cache"), env=daemon_env(tmp_path)
    )
    try:
        out = Client(daemon.socket_path, timeout_s=120).compile_file(req).to_json()
        assert out["status"] == "failed" and str(header) in out["error"], out
        assert "include_dirs" in out["error"] and "\n" not in out["error"]
    finally:
        daemon.stop()


@pytest.mark.parametrize(
    ("text", "in_place"),
    [
        (b'#include "/abs/x.h"', True),
        (b"#include </abs/x.h>", True),
        (b"#define M <x.h>\n#include M", True),
        (b'%:include "a.h"', True),
        (b'#include "k.h"\n#include <math.h>\n#include "../x/y.h"', False),
    ],
)
def test_when_a_compile_must_report_what_it_read(text: bytes, in_place: bool) -> None:
    """Only a compile that may read a file in place (not from the mirror) writes -MD."""
    from cachemgr.compile.inputs import Snapshot, may_read_in_place

    digest = hashlib.sha256(text).hexdigest()  # a snapshot's digests are its bytes'
    snap = Snapshot(Path("/p/k.c"), digest, {}, None, {"/p/k.c": text})
    assert may_read_in_place(snap, {}) is in_place
    assert may_read_in_place(snap, {"CPATH": "/inc"})
