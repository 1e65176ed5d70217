"""The extra_flags allow-list judges each argument whole.

The rule: docs/compiling.md#extra-flags-the-allow-list.

``-fcompare-debug=-fplugin=libz.so.1`` passed it — ``-f…`` with harmless characters — and the
daemon's ``cc1`` tried to load a plugin: a flag whose value is another flag, a file or a
program cannot be judged by its name. Each such family is refused whatever it carries, with
one line naming the argument and why; the table below lists each backend's own spellings.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cachemgr.compile.queue import CompileQueue
from cachemgr.compile.request import load_request
from cachemgr.errors import InvalidInputError
from tests.compile_util import calls, counting_cc, make_settings, nvcc_missing, scale_request
from tests.test_deputy import RAW, _crafted, _setup
from tests.users_util import Runtime, Users, run_as

#: Each family: the words of its refusal, and its spellings per backend (gcc and clang are
#: the host backend's compilers, nvcc the CUDA backend's).
FAMILIES: dict[str, tuple[str, dict[str, list[str]]]] = {
    "response file": (
        "reads more arguments from a file",
        {"gcc": ["@args.txt"], "clang": ["@args.txt"], "nvcc": ["--options-file=f", "-optf"]},
    ),
    "second compile": (
        "runs a second compile with the flags it carries",
        {"gcc": ["-fcompare-debug=-fplugin=libz.so.1", "-fcompare-debug", "-fcompare-debug=-O0",
                 "-fcompare-debug-second"]},
    ),
    "plugin": (
        "loads a plugin into the compiler",
        {"gcc": ["-fplugin=libz.so.1", "-fplugin-arg-z-key=v", "-iplugindir=/tmp"],
         "clang": ["-fpass-plugin=libz.so.1", "-fplugin=x.so"]},
    ),
    "another program": (
        "passes flags to another program",
        {"gcc": ["-Wa,-adhln=/tmp/x", "-Wl,-rpath,/tmp", "-Wp,-MD,/tmp/x", "-Xassembler",
                 "-Xlinker", "-Xpreprocessor"],
         "clang": ["-mllvm", "-Xclang", "-Xarch_x86_64"],
         "nvcc": ["-Xcompiler", "-Xcompiler=-fplugin=x.so", "--compiler-options=-O2",
                  "-Xptxas=-v", "-Xptxas=-O3,-v", "-Xnvlink", "--linker-options"]},
    ),
    "own programs": (
        "changes where the compiler finds its own programs, or runs another",
        {"gcc": ["-B/tmp", "-B", "-specs=x.specs", "--specs=x.specs", "-wrapper",
                 "-fuse-ld=gold", "--sysroot=/tmp"],
         "clang": ["--gcc-toolchain=/tmp", "--ld-path=/tmp/ld"],
         "nvcc": ["-ccbin", "--compiler-bindir=/tmp", "--dryrun"]},
    ),
    "profile": (
        "reads or writes profile data",
        {"gcc": ["-fprofile-generate", "-fprofile-use=x", "-fprofile-dir=x", "-fprofile-arcs",
                 "-fprofile-prefix-path=x", "-fauto-profile=x"],
         "clang": ["-fprofile-instr-generate=x", "-fprofile-sample-use=x", "-fcoverage-mapping",
                   "-fcoverage-prefix-map=a=b", "-fcs-profile-generate"]},
    ),
    "writes files": (
        "writes files of its own",
        {"gcc": ["-fdump-tree-all", "-fdump-final-insns=x", "-fopt-info-vec=x", "-save-temps",
                 "-save-temps=obj", "-aux-info", "-MF", "-MD", "-MT", "-fstack-usage",
                 "-fcallgraph-info", "-frecord-gcc-switches", "-ftest-coverage", "-o"],
         "clang": ["-ftime-trace", "-fsave-optimization-record", "-fmodules",
                   "-fcrash-diagnostics-dir=x"],
         "nvcc": ["--keep", "--keep-dir=x", "-odir", "--save-temps", "--output-directory=x",
                  "--generate-dependencies"]},
    ),
    "paths": (
        "rewrites the paths its outputs record",
        {"gcc": ["-fdebug-prefix-map=a=b", "-ffile-prefix-map=a=b", "-fmacro-prefix-map=a=b"],
         "clang": ["-fdebug-compilation-dir=x", "-ffile-compilation-dir=x"]},
    ),
    "reads a file": (
        "reads a file or folder that the request's include_dirs and key do not cover",
        {"gcc": ["-include", "-imacros", "-isystem", "-idirafter", "-iquote"],
         "clang": ["-fsanitize-ignorelist=x", "-fxray-attr-list=x", "-fmodule-file=x",
                   "-frandomize-layout-seed-file=x", "-fbasic-block-sections=list=x"]},
    ),
    "a flag in the value": (
        "its value carries the flag",
        {"gcc": ["-fsanitize=-fplugin=x", "-finline-limit=-fplugin", "-mtune=-fplugin=x",
                 "-Wframe-larger-than=@x"],
         "clang": ["-fsanitize=address,-fplugin=x"]},
    ),
}  # fmt: skip

#: Flags of the same prefixes that are accepted, compiled with each real compiler.
ACCEPTED = {
    "gcc": ["-O2", "-fno-strict-aliasing", "-fvisibility=hidden", "-ffp-contract=fast",
            "-march=x86-64", "-fsanitize=undefined", "-Wall", "-g"],
    "clang": ["-O2", "-fno-strict-aliasing", "-fvisibility=hidden", "-ffp-contract=fast",
              "-march=x86-64", "-fsanitize=undefined", "-Wall", "-g"],
    "nvcc": ["-O2", "-Xptxas=-O3", "--use_fast_math", "-lineinfo"],
}  # fmt: skip

CUDA_KERNEL = 'extern "C" __global__ void scale_kernel(float *x) { x[0] *= 2; }\n'
C_KERNEL = "void scale_kernel(float *x) { x[0] *= 2; }\n"


def _request_file(folder: Path, backend: str, flags: list[str]) -> Path:
    """A request of ``backend``'s language (c for gcc/clang, cuda for nvcc) with ``flags``."""
    cuda = backend == "nvcc"
    source = folder / ("k.cu" if cuda else "k.c")
    source.write_text(CUDA_KERNEL if cuda else C_KERNEL)
    data = scale_request(str(source), extra_flags=flags, language="cuda" if cuda else "c")
    path = folder / "req.json"
    path.write_text(json.dumps(data))
    return path


CASES = [
    pytest.param(backend, flag, why, id=f"{family}-{backend}-{flag}")
    for family, (why, spellings) in FAMILIES.items()
    for backend, flags in spellings.items()
    for flag in flags
]


@pytest.mark.parametrize(("backend", "flag", "why"), CASES)
def test_a_flag_that_carries_flags_files_or_programs_is_refused_in_one_line(
    tmp_path: Path, backend: str, flag: str, why: str
) -> None:
    with pytest.raises(InvalidInputError) as err:
        load_request(_request_file(tmp_path, backend, [flag]))
    line = str(err.value)
    assert "\n" not in line and f"extra_flags: {flag!r} is not allowed" in line, line
    assert why in line and "docs/compiling.md" in line, line


@pytest.mark.parametrize("backend", sorted(ACCEPTED))
def test_flags_that_only_change_code_generation_still_compile(
    tmp_path: Path, clean_env: dict[str, str], backend: str
) -> None:
    if backend == "nvcc" and (why := nvcc_missing()):
        pytest.skip(why)
    wrapper = counting_cc(tmp_path / "w", real=backend)
    key = "nvcc" if backend == "nvcc" else "cc"
    settings = make_settings(tmp_path, clean_env, compilers={key: str(wrapper)})
    request = load_request(_request_file(tmp_path, backend, ACCEPTED[backend]))
    with CompileQueue(settings, workers=1) as q:
        outcome = q.compile(request)
    assert outcome.status == "compiled", outcome.error
    compiled = calls(tmp_path / "w", "")
    assert compiled and all(flag in compiled[-1] for flag in ACCEPTED[backend]), compiled


#: The daemon's compiler: says so on stderr (which a failed compile's answer shows) when it
#: is run with a -fcompare-debug flag, then runs gcc.
MARKING_CC = """#!/bin/sh
case "$*" in *-fcompare-debug*) echo "COMPILER-RAN-WITH: $*" >&2 ;; esac
exec /usr/bin/gcc "$@"
"""


def test_a_compare_debug_plugin_through_a_daemon_is_refused_before_any_compiler_runs(
    users: Users, other_runtime: Runtime
) -> None:
    """bob sends ``-fcompare-debug=-fplugin=libz.so.1`` to alice's daemon: 400 in one line
    naming the argument, before any compile (the daemon's ``cc1`` tried to load the plugin);
    the same request with ``-O2`` compiles through that compiler."""
    rt = other_runtime
    tools = users.base / "tools"
    tools.mkdir()
    cc = tools / "cc"
    cc.write_text(MARKING_CC)
    cc.chmod(0o755)
    daemon, _, _, bob = _setup(users, rt, f'[compilers]\ncc = "{cc}"\n')
    flag = "-fcompare-debug=-fplugin=libz.so.1"
    try:
        body = _crafted(str(bob / "k.c"), C_KERNEL, extra_flags=[flag])
        out = _post_as_bob(users, rt, bob, str(daemon.socket_path), body)
        honest = _crafted(str(bob / "k.c"), C_KERNEL, extra_flags=["-O2"])
        again = _post_as_bob(users, rt, bob, str(daemon.socket_path), honest)
    finally:
        daemon.stop()
    assert "COMPILER-RAN-WITH" not in out["body"] and "kernel_name" not in out["body"], out
    assert out["code"] == 400, out
    error = json.loads(out["body"])["error"]
    assert "\n" not in error and repr(flag) in error, error
    assert "runs a second compile with the flags it carries" in error, error
    assert json.loads(again["body"])["status"] == "compiled", again  # the compiler does run


def _post_as_bob(users: Users, rt: Runtime, bob: Path, sock: str, body: str) -> dict:
    """POST /compile as bob: ``{"code", "body"}``."""
    done = subprocess.run(
        [rt.python, "-c", RAW, sock, body],
        env={"PATH": "/usr/bin:/bin", "HOME": str(bob)},
        cwd=bob,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        **run_as(users.bob, users),  # type: ignore[arg-type]
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
