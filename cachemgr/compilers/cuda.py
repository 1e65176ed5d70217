"""CUDA backend: nvcc → cubin for one SM architecture (docs/design.md#compilers; no GPU needed to
compile).

Compiler: ``config["nvcc"]``, else ``nvcc`` on PATH, else the ``nvcc`` of the PyPI
``nvidia-cuda-nvcc`` wheel (``nvidia/cu13/bin`` for CUDA 13, ``nvidia/cuda_nvcc/bin`` for 12),
else ``$CUDA_HOME/bin/nvcc`` or ``/usr/local/cuda/bin/nvcc``. Command (arch from
``config["cuda_arch"]``, default ``sm_90``):
``nvcc -cubin -arch=<arch> <-I...> <extra flags> <debug flags> <-D...> -x cu <src> -o
<out>.cubin``.
Kernels should be ``extern "C" __global__`` so the symbol is the entry name.

nvcc runs each of its steps (host preprocessor, ``cicc``, ``ptxas``) through ``sh -c`` and
puts the defines and the source path between double quotes there without escaping them: a
define ``X=$(kill -9 -1)`` or a source folder named ``$(…)`` ran that command as the daemon
user (attack review after the allow-list view). A word holding a character the shell
interprets inside double quotes (``$``, a backquote, a double quote, a backslash) is refused
before nvcc runs (:data:`SHELL_SPECIAL`).
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Any

from cachemgr.compilers import envvars
from cachemgr.compilers.base import (
    CompileJob,
    CompilerBackend,
    caller_folder,
    config_str,
    find_executable,
)
from cachemgr.compilers.elf import ElfFile
from cachemgr.errors import ConfigError, InvalidInputError

DEFAULT_ARCH = "sm_90"
_ARCH = re.compile(r"^sm_\d+[af]?$")
#: Characters ``sh`` interprets between double quotes, where nvcc puts defines and paths.
SHELL_SPECIAL = frozenset('$`"\\')
#: Debug flag → nvcc flags. ``O0`` turns off both device optimisers (NVVM and ptxas); ``g`` is
#: full device debug (``-G``). nvcc has no compile-time bounds checks (``oom`` is
#: compute-sanitizer's job at run time), no function instrumentation and no sync-flag checks.
_DEBUG_MAP = {"O0": ["-Xcicc", "-O0", "-Xptxas", "-O0"], "g": ["-G"]}
_WHEEL_BINS = ("cu13/bin/nvcc", "cuda_nvcc/bin/nvcc")
#: ``.nv.info.<kernel>`` attribute encoding: format EIFMT_SVAL carries a u16 payload size;
#: attribute EIATTR_KPARAM_INFO occurs once per kernel parameter.
_EIFMT_SVAL = 0x04
_EIATTR_KPARAM_INFO = 0x17


class CudaBackend(CompilerBackend):
    """nvcc for ``cuda`` kernels. Config keys: ``nvcc``, ``cuda_arch``, ``readelf``."""

    name = "cuda"
    languages = frozenset({"cuda"})
    bin_suffix = ".cubin"
    magic = "RT_DEV_BINARY_MAGIC_CUBIN"
    core_type = "CudaSM"
    #: nvcc's own variables and its host compiler's (:mod:`.envvars`)
    env_names = envvars.NVCC

    @property
    def arch(self) -> str:
        """Target SM architecture, e.g. ``sm_90``.

        :raises ConfigError: for a value that is not ``sm_<digits>[a|f]``.
        """
        arch = config_str(self.config, "cuda_arch", DEFAULT_ARCH) or DEFAULT_ARCH
        if not _ARCH.match(arch):
            raise ConfigError(f"cuda_arch={arch!r} (config) is not a real SM arch like sm_90")
        return arch

    def executable(self) -> str:
        """Path of nvcc (see module docstring for the search order).

        :raises CompileError: naming nvcc and where it was looked for.
        """
        configured = config_str(self.config, "nvcc")
        if configured:
            return find_executable([configured], "nvcc", "nvcc")
        return find_executable(["nvcc", *_fallback_nvccs()], "nvcc")

    def flags(self, job: CompileJob) -> list[str]:
        """``-G`` for g (it implies O0; adding ``-Xcicc -O0`` would make NVVM reject a second
        ``-opt``), else ``-Xcicc -O0 -Xptxas -O0`` for O0 and ``-lineinfo`` for emit loc."""
        if "g" in job.debug_flags:
            return ["-G"]  # device debug already compiles without optimisation (NVVM -O0)
        out = list(_DEBUG_MAP["O0"]) if "O0" in job.debug_flags else []
        if "loc" in job.emit:
            out.append("-lineinfo")  # line table without changing the generated code
        return out

    #: ``-G`` compiles the device code without optimisation too: ptxas refuses it with an
    #: optimisation level ("Optimized debugging not supported"), so the request's go.
    unoptimised_by = frozenset({"O0", "g"})

    def path_map_args(self, job: CompileJob) -> list[str]:
        """``-Xcompiler -ffile-prefix-map=<mirror>/=/``: nvcc preprocesses the source with
        its host compiler, so ``__FILE__`` (a device ``assert``, a ``printf``) names the
        caller's path. nvcc has no map for the device DWARF that ``-G`` and ``-lineinfo``
        write: those name the build mirror (docs/compiling.md#paths-in-the-binary).
        Nothing for a mirror whose path holds a comma (``-Xcompiler`` splits on commas)."""
        if caller_folder(job) is None or "," in str(job.mirror_root):
            return []
        return ["-Xcompiler", f"-ffile-prefix-map={job.mirror_root}/=/"]

    def unsupported_debug_flags(self, job: CompileJob) -> frozenset[str]:
        """``oom``, ``instrument``, ``check_flag``: no nvcc equivalent."""
        return job.debug_flags - _DEBUG_MAP.keys()

    writes_depfile = True

    def command(self, job: CompileJob) -> list[str]:
        """``nvcc -cubin -arch=<arch> <include folders, extra flags> <debug flags> <defines>
        -x cu <source> -o <out>.cubin``."""
        return [*self._argv(job, "-cubin", self.binary_path(job)), *self.depfile_args(job)]

    def preprocess_command(self, job: CompileJob, output: Path) -> list[str]:
        """The same argv with ``-E`` instead of ``-cubin``."""
        return self._argv(job, "-E", output)

    def version_line(self, version_text: str) -> str:
        """``Cuda compilation tools, release X, VX.Y.Z; Build ...`` (nvcc's first line is
        the same for every release, so it would not tell versions apart in the cache key)."""
        lines = [ln.strip() for ln in version_text.splitlines()]
        picked = [ln for ln in lines if ln.startswith(("Cuda compilation tools", "Build "))]
        return "; ".join(picked) or super().version_line(version_text)

    def json_fields(self, job: CompileJob, elf: ElfFile, kernel_name: str) -> dict[str, Any]:
        """``parameters``: one 0 per kernel parameter (read from the cubin's ``.nv.info``)."""
        count = kernel_param_count(elf, kernel_name)
        fields: dict[str, Any] = {"cudaArch": self.arch}
        if count is not None:
            fields["parameters"] = [0] * count
        return fields

    def _argv(self, job: CompileJob, mode: str, output: Path) -> list[str]:
        """nvcc's argv for ``mode`` into ``output``.

        :raises InvalidInputError: a word (a define, flag, include folder or the source
            path) holds a character of :data:`SHELL_SPECIAL` — named as the caller wrote it.
        """
        argv = [
            self.executable(),
            mode,
            f"-arch={self.arch}",
            *self.path_map_args(job),
            *self.include_args(job),
            *self.flags(job),
            *self.define_args(job),
            "-x",
            "cu",
            str(job.source),
            "-o",
            str(output),
        ]
        for word in argv[1:]:
            if SHELL_SPECIAL.intersection(word):
                raise InvalidInputError(
                    f"nvcc argument {job.user_view(word)!r}: nvcc runs its steps through sh, "
                    "which would expand its $, backquote, double quote or backslash"
                )
        return argv


def kernel_param_count(elf: ElfFile, kernel_name: str) -> int | None:
    """Number of parameters of ``kernel_name`` in a cubin, or None when it has no ``.nv.info``."""
    data = elf.section(f".nv.info.{kernel_name}")
    if data is None:
        return None
    count, pos = 0, 0
    while pos + 4 <= len(data):
        fmt, attr = data[pos], data[pos + 1]
        if fmt == _EIFMT_SVAL:
            count += attr == _EIATTR_KPARAM_INFO
            pos += 4 + int.from_bytes(data[pos + 2 : pos + 4], "little")
        else:
            pos += 4
    return count


def _fallback_nvccs() -> list[str]:
    """nvcc of the PyPI wheels if installed, then the usual toolkit folders."""
    out: list[str] = []
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        out.extend(os.path.join(root, rel) for rel in _WHEEL_BINS)
    if os.environ.get("CUDA_HOME"):
        out.append(os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc"))
    out.append("/usr/local/cuda/bin/nvcc")
    return out
