"""Host C/C++ backend: gcc or clang → relocatable ELF object ``.o`` (docs/design.md#compilers).

Compiler: ``config["cc"]`` (a path or a name on PATH), else the first of ``gcc``, ``clang``,
``cc`` on PATH. Command: ``<cc> -x c|c++ -c -fPIC -O2 <-I...> <extra flags> <debug flags>
<-D...> <source> -o <out>.o`` (a debug build at ``-O0`` has no ``-O2``).
The entry must be an exported function; a C++ entry should be ``extern "C"`` (a single
mangled match is accepted, see :meth:`CompilerBackend.find_kernel_symbol`).
"""

from __future__ import annotations

from pathlib import Path

from cachemgr.compilers import envvars, native, process
from cachemgr.compilers.base import CompileJob, CompilerBackend, config_str, find_executable
from cachemgr.compilers.process import Outcome

_DEFAULT_CCS = ["gcc", "clang", "cc"]
_LANG_FLAG = {"c": "c", "cpp": "c++"}
#: Debug flag → gcc/clang flags. ``oom``: array-bounds checks that trap (no runtime library
#: needed in a ``.o``); ``instrument``: function entry/exit hooks. No host equivalent exists for
#: ``check_flag`` (Ascend pipeline sync flags); it is logged and skipped.
_DEBUG_MAP = {
    "g": ["-g"],
    "oom": ["-fsanitize=bounds", "-fsanitize-undefined-trap-on-error"],
    "instrument": ["-finstrument-functions"],
}


class HostBackend(CompilerBackend):
    """gcc/clang for ``c`` and ``cpp`` kernels. Config keys: ``cc``, ``readelf``."""

    name = "host"
    languages = frozenset({"c", "cpp"})
    bin_suffix = ".o"
    magic = "RT_DEV_BINARY_MAGIC_ELF"
    core_type = "HostCPU"
    #: ``cc`` may be gcc or clang: the variables either reads (:mod:`.envvars`)
    env_names = envvars.GCC | envvars.CLANG

    def executable(self) -> str:
        """Path of ``config["cc"]`` or of gcc/clang/cc on PATH.

        :raises CompileError: naming the compiler(s) tried.
        """
        configured = config_str(self.config, "cc")
        if configured:
            return find_executable([configured], "host C compiler", "cc")
        return find_executable(_DEFAULT_CCS, "host C compiler")

    def flags(self, job: CompileJob) -> list[str]:
        """``-O2`` or ``-O0``, then ``-g`` (also for ``emit`` loc), bounds checks, hooks."""
        return [*self.base_flags(job), *self.debug_args(job)]

    def base_flags(self, job: CompileJob) -> list[str]:
        """``-O2`` — the default the request's ``extra_flags`` may override — or nothing for
        a debug build at ``-O0`` (:meth:`debug_args` says ``-O0``)."""
        return [] if "O0" in job.debug_flags else ["-O2"]

    def debug_args(self, job: CompileJob) -> list[str]:
        """``-O0`` for O0, then ``-g`` (also for ``emit`` loc), bounds checks, hooks: placed
        after the request's ``extra_flags``, so they win (docs/compiling.md#debug-flags-win)."""
        out = ["-O0"] if "O0" in job.debug_flags else []
        wanted = set(job.debug_flags)
        if "loc" in job.emit:
            wanted.add("g")  # the line map needs DWARF line info; -g leaves .text unchanged
        for flag in sorted(wanted - {"O0"}):
            out.extend(_DEBUG_MAP.get(flag, []))
        return out

    def resolve_native(self, words: tuple[str, ...]) -> tuple[str, ...]:
        """The target flags gcc or clang expands ``-march=native``-style ``words`` to on
        this host (:func:`.native.resolve`, remembered).

        :raises CompileError: the compiler cannot tell (its message).
        """

        def run(argv: list[str]) -> Outcome:
            keep = process.up_to(native.MAX_VERBOSE_BYTES)
            return self._run(argv, 30.0, None, f"resolving {' '.join(words)}", keep_stderr=keep)

        return native.resolve(self.identity(), words, run, "c")

    def unsupported_debug_flags(self, job: CompileJob) -> frozenset[str]:
        """``check_flag``: gcc/clang have no equivalent."""
        return job.debug_flags - {"O0"} - _DEBUG_MAP.keys()

    writes_depfile = True

    def command(self, job: CompileJob) -> list[str]:
        """``<cc> -x <lang> -c -fPIC <flags> <defines> <source> -o <out_dir>/<out_name>.o``."""
        return [*self._argv(job, "-c", self.binary_path(job)), *self.depfile_args(job)]

    def preprocess_command(self, job: CompileJob, output: Path) -> list[str]:
        """The same argv with ``-E`` (flags kept: ``-O`` levels change predefined macros)."""
        return self._argv(job, "-E", output)

    def _argv(self, job: CompileJob, mode: str, output: Path) -> list[str]:
        return [
            self.executable(),
            "-x",
            _LANG_FLAG[job.language],
            mode,
            "-fPIC",
            *self.path_map_args(job),
            *self.base_flags(job),
            *self.include_args(job),
            *self.debug_args(job),
            *self.define_args(job),
            str(job.source),
            "-o",
            str(output),
        ]
