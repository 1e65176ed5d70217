"""Contract tests for the compiler backends (docs/design.md#debug-compiles-and-kernel_meta,
#compilers), run over every backend, for real.

Every backend compiles the real example kernels with a real compiler (gcc, nvcc, and the
template backend pointed at gcc). Failure modes use small shell scripts as the compiler: one
that hangs (with a child process that must die with its process group), one that crashes, one
that exits 0 without writing anything. No mocks.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from cachemgr.compilers import CompileJob, CompilerBackend, get_backend
from cachemgr.errors import CompileError, ConfigError, InvalidInputError

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "examples" / "kernels"
REQUESTS = ROOT / "examples" / "requests"
REQUEST_KEYS = [
    "op_type",
    "soc_version",
    "language",
    "kernel_source",
    "kernel_entry",
    "inputs",
    "outputs",
    "attrs",
    "defines",
    "options",
]

CPP_KERNEL = """\
#define ADD(x, y) ((x) + (y))
extern "C" void add_kernel(const float *a, const float *b, float *out)
{
    for (int i = 0; i < N; ++i)
        out[i] = ADD(a[i], b[i]);
}
"""


def _nvcc_missing() -> str | None:
    try:
        get_backend("cuda").executable()
    except CompileError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class Flavour:
    """One backend configuration under test and the real kernel it compiles."""

    id: str
    language: str
    config: Mapping[str, object]
    compiler_key: str  # config key naming the compiler executable (cce_command: template)
    kernel: Path | None  # None: write CPP_KERNEL
    entry: str = "add_kernel"
    needs: str = "gcc"

    def config_with(self, exe: str) -> dict[str, object]:
        """This flavour's config with the compiler replaced by ``exe``."""
        if self.compiler_key == "cce_command":
            return {**self.config, "cce_command": f"{exe} -c {{source}} -o {{output}} {{flags}}"}
        return {**self.config, self.compiler_key: exe}


FLAVOURS = [
    Flavour("host-gcc-c", "c", {"cc": "gcc"}, "cc", KERNELS / "c" / "add.c"),
    Flavour("host-clang-c", "c", {"cc": "clang"}, "cc", KERNELS / "c" / "add.c", needs="clang"),
    Flavour("host-gcc-cpp", "cpp", {"cc": "gcc"}, "cc", None),
    Flavour("cuda-nvcc", "cuda", {}, "nvcc", KERNELS / "cuda" / "add.cu", needs="nvcc"),
    Flavour(
        "template-gcc",
        "cce",
        {"cce_command": "gcc -x c -c -fPIC -O2 {source} -o {output} {defines} {flags}"},
        "cce_command",
        KERNELS / "c" / "add.c",
    ),
]


def _skip_reason(flavour: Flavour) -> str | None:
    if flavour.needs == "nvcc":
        missing = _nvcc_missing()
        return f"nvcc unavailable: {missing}" if missing else None
    return None if shutil.which(flavour.needs) else f"{flavour.needs} not on PATH"


@pytest.fixture(params=FLAVOURS, ids=[f.id for f in FLAVOURS])
def flavour(request: pytest.FixtureRequest) -> Flavour:
    reason = _skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    return request.param


@pytest.fixture
def backend(flavour: Flavour) -> CompilerBackend:
    return get_backend(flavour.language, flavour.config)


@pytest.fixture
def source(flavour: Flavour, tmp_path: Path) -> Path:
    if flavour.kernel is not None:
        return flavour.kernel
    path = tmp_path / "src" / "add.cpp"
    path.parent.mkdir()
    path.write_text(CPP_KERNEL)
    return path


def _job(flavour: Flavour, src: Path, out: Path, name: str = "k", **kw: object) -> CompileJob:
    out.mkdir(parents=True, exist_ok=True)
    defines = kw.pop("defines", {"N": 256})
    return CompileJob(src, flavour.language, flavour.entry, defines, out, name, **kw)


def _exported(binary: Path) -> set[str]:
    """Global/weak defined functions per binutils ``readelf -s`` (independent of our reader)."""
    out = subprocess.run(["readelf", "-sW", str(binary)], capture_output=True, text=True)
    names = set()
    for line in out.stdout.splitlines():
        cols = line.split()
        is_func = len(cols) >= 8 and cols[3] == "FUNC" and cols[4] in ("GLOBAL", "WEAK")
        if is_func and cols[-2] != "UND":
            names.add(cols[-1])
    return names


def _script(path: Path, body: str) -> Path:
    """A fake compiler: answers ``--version``, otherwise runs ``body``."""
    path.write_text(
        f'#!/bin/sh\nif [ "$1" = "--version" ]; then echo "fakecc 1.0"; exit 0; fi\n{body}\n'
    )
    path.chmod(0o755)
    return path


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie is dead, only not yet reaped


def _wait_until(cond: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


# ----- the contract, over every backend ---------------------------------------------------------


def test_compiles_real_kernel(flavour: Flavour, backend: CompilerBackend, source, tmp_path):
    result = backend.compile(_job(flavour, source, tmp_path / "out", "te_Add_0001"))

    assert result.binary == tmp_path / "out" / f"te_Add_0001{backend.bin_suffix}"
    assert result.binary.stat().st_size > 0
    doc = json.loads(result.json_path.read_text())
    assert result.json_path == tmp_path / "out" / "te_Add_0001.json"
    assert doc["binFileName"] == "te_Add_0001"
    assert doc["binFileSuffix"] == backend.bin_suffix == result.bin_suffix
    assert doc["sha256"] == hashlib.sha256(result.binary.read_bytes()).hexdigest()
    assert doc["kernelName"] == result.kernel_name == flavour.entry
    assert result.kernel_name in _exported(result.binary)
    for key in ("blockDim", "magic", "coreType", "parameters", "opParaSize"):
        assert key in doc
    info = doc["compileInfo"]
    assert info["version"] == backend.identity().version != ""
    assert (
        info["command"]
        == list(result.command)
        == backend.command(_job(flavour, source, tmp_path / "out", "te_Add_0001"))
    )
    assert result.artefacts == ()
    assert result.seconds > 0


@pytest.mark.parametrize("debug", [{"O0"}, {"g"}, {"O0", "g"}], ids=["O0", "g", "O0+g"])
def test_debug_flags_change_command_and_binary(flavour, backend, source, tmp_path, debug):
    plain = backend.compile(_job(flavour, source, tmp_path / "plain"))
    job = _job(flavour, source, tmp_path / "debug", debug_flags=frozenset(debug))
    result = backend.compile(job)

    extra = set(result.command) - set(plain.command) - {str(result.binary)}
    assert extra & {"-O0", "-g", "-G"}, f"{debug} must add compiler flags, got {extra}"
    assert plain.binary.read_bytes() != result.binary.read_bytes()
    doc = json.loads(result.json_path.read_text())
    assert doc["compileInfo"]["flags"] == backend.flags(job)
    assert doc["sha256"] == hashlib.sha256(result.binary.read_bytes()).hexdigest()


def test_emit_cce_and_loc_are_real(flavour, backend, source, tmp_path):
    job = _job(
        flavour, source, tmp_path / "out", defines={"N": 777}, emit=frozenset({"cce", "loc"})
    )
    result = backend.compile(job)

    cce, loc = tmp_path / "out" / "k.cce", tmp_path / "out" / "k_loc.json"
    assert result.artefacts == (cce, loc)
    text = cce.read_text()
    assert flavour.entry in text and "777" in text
    assert "#define" not in text and "#ifndef" not in text  # really preprocessed
    doc = json.loads(loc.read_text())
    assert doc["kernelName"] == result.kernel_name
    rows = doc["lines"]
    assert rows and all(isinstance(r["address"], int) for r in rows)
    src_lines = source.read_text().splitlines()
    store = next(i for i, ln in enumerate(src_lines, 1) if re.match(r"^\s*out\[.*\] = ", ln))
    ours = [r for r in rows if r["file"] == source.name]
    assert store in {r["line"] for r in ours}, f"line {store} missing from {ours[:20]}"
    assert max(r["line"] for r in ours) <= len(src_lines)


def test_compiler_error_shows_its_message(flavour, backend, tmp_path):
    suffix = {"cuda": ".cu", "cpp": ".cpp"}.get(flavour.language, ".c")
    bad = tmp_path / f"bad{suffix}"
    bad.write_text('#error "cachemgr-marker-4711"\n')
    with pytest.raises(CompileError, match="cachemgr-marker-4711") as info:
        backend.compile(_job(flavour, bad, tmp_path / "out"))
    assert "exit" in str(info.value)


def test_missing_entry_symbol_is_an_error(flavour, backend, source, tmp_path):
    job = _job(flavour, source, tmp_path / "out")
    job = CompileJob(**{**job.__dict__, "entry": "no_such_kernel"})
    with pytest.raises(CompileError, match="no_such_kernel"):
        backend.compile(job)


def test_missing_compiler_is_named(flavour, source, tmp_path):
    backend = get_backend(flavour.language, flavour.config_with("cachemgr-no-such-compiler"))
    with pytest.raises(CompileError, match="cachemgr-no-such-compiler"):
        backend.identity()
    with pytest.raises(CompileError, match="cachemgr-no-such-compiler"):
        backend.compile(_job(flavour, source, tmp_path / "out"))


def test_hanging_compiler_is_killed_with_its_group(flavour, source, tmp_path):
    pidfile = tmp_path / "child.pid"
    fake = _script(tmp_path / "hangcc", f"sleep 300 &\necho $! > {pidfile}\nwait")
    backend = get_backend(flavour.language, flavour.config_with(str(fake)))

    start = time.monotonic()
    with pytest.raises(CompileError, match=r"timed out after 1 s"):
        backend.compile(_job(flavour, source, tmp_path / "out", timeout_s=1.0))
    assert time.monotonic() - start < 8.0
    child = int(pidfile.read_text())
    assert _wait_until(lambda: not _alive(child), timeout_s=5.0), f"child {child} survived"


def test_crashing_compiler_is_reported(flavour, source, tmp_path):
    fake = _script(tmp_path / "crashcc", "echo 'internal compiler error' >&2\nkill -SEGV $$")
    backend = get_backend(flavour.language, flavour.config_with(str(fake)))
    with pytest.raises(CompileError, match=r"crashed \(SIGSEGV\).*internal compiler error"):
        backend.compile(_job(flavour, source, tmp_path / "out"))


def test_exit_zero_without_binary_is_an_error(flavour, source, tmp_path):
    fake = _script(tmp_path / "lazycc", "exit 0")
    backend = get_backend(flavour.language, flavour.config_with(str(fake)))
    out = tmp_path / "out"
    out.mkdir()
    stale = out / f"k{backend.bin_suffix}"
    stale.write_bytes(b"left over from an earlier compile")
    with pytest.raises(CompileError, match="wrote no binary"):
        backend.compile(_job(flavour, source, out))
    assert not (out / "k.json").exists()


def test_bad_job_is_invalid_input(flavour, backend, source, tmp_path):
    with pytest.raises(InvalidInputError, match="ccec_O0"):
        backend.compile(_job(flavour, source, tmp_path / "a", debug_flags=frozenset({"ccec_O0"})))
    with pytest.raises(InvalidInputError, match="out_name"):
        backend.compile(_job(flavour, source, tmp_path / "b", name="../escape"))
    with pytest.raises(InvalidInputError, match="define name"):
        backend.compile(_job(flavour, source, tmp_path / "c", defines={"N; rm": 1}))


# ----- the real example kernels ------------------------------------------------------------------


def _requests() -> list[Path]:
    return sorted(REQUESTS.glob("*.json"))


@pytest.mark.parametrize("path", _requests(), ids=lambda p: p.stem)
def test_example_request_compiles(path: Path, tmp_path):
    req = json.loads(path.read_text())
    assert list(req) == REQUEST_KEYS
    if req["language"] == "cuda" and _nvcc_missing():
        pytest.skip(f"nvcc unavailable: {_nvcc_missing()}")
    src = (path.parent / req["kernel_source"]).resolve()
    job = CompileJob(src, req["language"], req["kernel_entry"], req["defines"], tmp_path, "k")
    result = get_backend(req["language"]).compile(job)
    assert result.kernel_name == req["kernel_entry"]
    if req["language"] == "cuda":
        n_tensors = len(req["inputs"]) + len(req["outputs"])
        assert json.loads(result.json_path.read_text())["parameters"] == [0] * n_tensors


def test_every_kernel_has_a_request_per_language():
    kernels = {p.stem for p in (KERNELS / "c").glob("*.c")}
    assert kernels == {p.stem for p in (KERNELS / "cuda").glob("*.cu")}
    assert kernels >= {"add", "mul", "softmax", "layernorm", "gemm", "reduce_sum"}
    assert {p.stem for p in _requests()} == {
        f"{k}_{lang}" for k in kernels for lang in ("c", "cuda")
    }


def _run_c_kernel(name: str, defines: dict, args: list[list[float]], n_out: int, tmp_path):
    """Compile examples/kernels/c/<name>.c, link it, call it; return the output buffer."""
    job = CompileJob(KERNELS / "c" / f"{name}.c", "c", f"{name}_kernel", defines, tmp_path, name)
    result = get_backend("c").compile(job)
    lib = tmp_path / f"lib{name}.so"
    subprocess.run(["gcc", "-shared", "-o", str(lib), str(result.binary), "-lm"], check=True)
    fn = getattr(ctypes.CDLL(str(lib)), result.kernel_name)
    bufs = [(ctypes.c_float * len(a))(*a) for a in args]
    out = (ctypes.c_float * n_out)()
    fn(*bufs, out)
    return list(out)


def _close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(
        math.isclose(g, w, rel_tol=1e-5, abs_tol=1e-5) for g, w in zip(got, want, strict=True)
    )


def test_c_kernels_compute_the_right_numbers(tmp_path):
    a, b = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [10.0, 20.0, 30.0]
    got = _run_c_kernel("add", {"M": 2, "N": 3, "B_M": 1}, [a, b], 6, tmp_path)
    assert _close(got, [11, 22, 33, 14, 25, 36])
    got = _run_c_kernel("mul", {"M": 2, "N": 3, "A_N": 1, "B_M": 1}, [[2, 3], b], 6, tmp_path)
    assert _close(got, [20, 40, 60, 30, 60, 90])  # outer product by broadcast
    got = _run_c_kernel("reduce_sum", {"M": 2, "N": 3}, [a], 2, tmp_path)
    assert _close(got, [6, 15])
    got = _run_c_kernel("gemm", {"M": 2, "K": 3, "N": 1}, [a, [1, 0, -1]], 2, tmp_path)
    assert _close(got, [-2, -2])
    got = _run_c_kernel("softmax", {"M": 2, "N": 3}, [a], 6, tmp_path)
    e = [math.exp(x) for x in (0, 1, 2)]
    assert _close(got, [x / sum(e) for x in e] * 2)
    gamma, beta = [1.0, 2.0, 3.0], [0.0, 0.0, 1.0]
    got = _run_c_kernel("layernorm", {"M": 2, "N": 3}, [a, gamma, beta], 6, tmp_path)
    z = 1 / math.sqrt(2 / 3 + 1e-5)
    assert _close(got, [-z, 0, 3 * z + 1] * 2)


# ----- backend specifics -------------------------------------------------------------------------


def test_registry_maps_every_language_and_base_imports_no_backend() -> None:
    """The registry is its own module; base.py never imports a backend (not
    even lazily inside a function, as get_backend once did), so there is no cycle."""
    import grimp

    from cachemgr.compilers import BACKENDS, LANGUAGES

    assert set(BACKENDS) == LANGUAGES
    assert all(issubclass(cls, CompilerBackend) for cls in BACKENDS.values())
    graph = grimp.build_graph("cachemgr")
    backends = {"cachemgr.compilers." + name for name in ("host", "cuda", "template")}
    assert not graph.find_modules_directly_imported_by("cachemgr.compilers.base") & backends
    importers = set()
    for backend in backends:
        importers |= graph.find_modules_that_directly_import(backend)
    assert importers == {"cachemgr.compilers.registry"}
    # importing a backend first (a fresh interpreter) must not meet a half-initialised base
    code = "import cachemgr.compilers.cuda as c; from cachemgr.compilers import get_backend as g"
    code += "; assert isinstance(g('cuda'), c.CudaBackend)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_get_backend_rejects_unknown_language_and_missing_template():
    with pytest.raises(InvalidInputError, match="'fortran'"):
        get_backend("fortran")
    with pytest.raises(ConfigError, match="cce_command"):
        get_backend("cce", {})
    with pytest.raises(ConfigError, match="bogus"):
        get_backend("cce", {"cce_command": "ccec -c {source} -o {output} {bogus}"})
    with pytest.raises(ConfigError, match="word alone"):
        get_backend("cce", {"cce_command": "ccec -c {source} -o {output} -I{flags}"})


def test_cpp_entry_without_extern_c(tmp_path):
    src = tmp_path / "k.cpp"
    src.write_text("void add_kernel(float *o) { o[0] = 1; }\n")
    result = get_backend("cpp").compile(CompileJob(src, "cpp", "add_kernel", {}, tmp_path, "k"))
    assert result.kernel_name == "_Z10add_kernelPf"  # the real symbol, what a loader needs
    src.write_text(
        "void add_kernel(float *o) { o[0] = 1; }\nvoid add_kernel(int *o) { o[0] = 1; }\n"
    )
    with pytest.raises(CompileError, match=r"_Z10add_kernelPf', '_Z10add_kernelPi'") as err:
        get_backend("cpp").compile(CompileJob(src, "cpp", "add_kernel", {}, tmp_path, "k"))
    assert "set kernel_entry to one of these" in str(err.value)
    job = CompileJob(src, "cpp", "_Z10add_kernelPi", {}, tmp_path, "k")
    assert get_backend("cpp").compile(job).kernel_name == "_Z10add_kernelPi"


def test_static_entry_is_not_exported(tmp_path):
    src = tmp_path / "k.c"
    src.write_text(
        "static void add_kernel(float *o) { o[0] = 1; }\nvoid keep(float *o) { add_kernel(o); }\n"
    )
    job = CompileJob(src, "c", "add_kernel", {}, tmp_path, "k", debug_flags=frozenset({"O0"}))
    with pytest.raises(CompileError, match="not exported"):
        get_backend("c").compile(job)


def test_template_flag_map_and_unmapped_flags(tmp_path):
    config = {
        "cce_command": "gcc -x c -c {source} -o {output} {defines} {flags}",
        "cce_flags": {"oom": "-fsanitize=bounds -fsanitize-undefined-trap-on-error"},
    }
    backend = get_backend("cce", config)
    job = CompileJob(
        KERNELS / "c" / "add.c",
        "cce",
        "add_kernel",
        {"N": 8},
        tmp_path,
        "k",
        debug_flags=frozenset({"O0", "oom", "check_flag"}),
    )
    assert backend.flags(job) == ["-O0", "-fsanitize=bounds", "-fsanitize-undefined-trap-on-error"]
    assert backend.unsupported_debug_flags(job) == {"check_flag"}
    assert backend.compile(job).command[-3:] == (
        "-O0",
        "-fsanitize=bounds",
        "-fsanitize-undefined-trap-on-error",
    )


def test_nvcc_identity_tells_releases_apart():
    if _nvcc_missing():
        pytest.skip(f"nvcc unavailable: {_nvcc_missing()}")
    version = get_backend("cuda").identity().version
    assert re.search(r"release \d+\.\d+, V\d+\.\d+\.\d+", version), version


def test_cuda_arch_must_be_real(tmp_path):
    with pytest.raises(ConfigError, match="sm_9x"):
        get_backend("cuda", {"cuda_arch": "sm_9x"}).command(
            CompileJob(KERNELS / "cuda" / "add.cu", "cuda", "add_kernel", {}, tmp_path, "k")
        )
