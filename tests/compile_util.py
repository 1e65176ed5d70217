"""Helpers for the compile-queue tests: settings over a temp cache, request files that use the
real example kernels, and wrapper compilers that count their real invocations."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cachemgr.compile.request import CompileRequest, load_request
from cachemgr.compilers import get_backend
from cachemgr.config import options
from cachemgr.config.options import Settings
from cachemgr.errors import CompileError
from tests.daemon_util import wait_for  # noqa: F401 (one helper for every test)

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "examples" / "kernels"
REQUESTS = ROOT / "examples" / "requests"
SOC = "Ascend910B1"


def nvcc_missing() -> str | None:
    """Why nvcc cannot be used here, or None."""
    try:
        get_backend("cuda").executable()
    except CompileError as exc:
        return str(exc)
    return None


def make_settings(
    tmp: Path,
    env: Mapping[str, str],
    compilers: Mapping[str, object] | None = None,
    precompiled: list[str] | None = None,
    **cli: Any,
) -> Settings:
    """Settings with the cache at ``tmp/cache`` and, optionally, a ``[compilers]`` table."""
    config = None
    if compilers or precompiled:
        config = tmp / "cachemgr.toml"
        lines = []
        if compilers:
            lines.append("[compilers]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in compilers.items()]
        if precompiled:
            lines += ["[precompiled]", f"paths = {json.dumps(precompiled)}"]
        config.write_text("\n".join(lines) + "\n")
    cli = {"op_compiler_cache_dir": str(tmp / "cache"), **cli}
    return options.resolve(cli=cli, env=dict(env), config_file=config, cwd=tmp)


def request_data(example: str = "add_c", **over: Any) -> dict[str, Any]:
    """The example request ``examples/requests/<example>.json`` with an absolute source and
    the fields in ``over`` replaced."""
    data = json.loads((REQUESTS / f"{example}.json").read_text())
    data["kernel_source"] = str((REQUESTS / data["kernel_source"]).resolve())
    data.update(over)
    return data


#: The tensor of the hand-written ``scale_kernel`` requests: 16 float32, ND.
TENSOR = {"shape": [16], "dtype": "float32", "format": "ND"}


def scale_request(source: str, **over: Any) -> dict[str, Any]:
    """A request for ``scale_kernel`` (op ``Scale``, C) in ``source``, with the fields in
    ``over`` added or replaced."""
    return {
        "op_type": "Scale",
        "soc_version": SOC,
        "language": "c",
        "kernel_source": source,
        "kernel_entry": "scale_kernel",
        "inputs": [TENSOR],
        "outputs": [TENSOR],
        **over,
    }


def write_request(folder: Path, name: str = "req", **over: Any) -> Path:
    """Write a request file into ``folder`` and return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(request_data(**over)))
    return path


def request(folder: Path, name: str = "req", **over: Any) -> CompileRequest:
    """A loaded request (see :func:`write_request`)."""
    return load_request(write_request(folder, name, **over))


def counting_cc(folder: Path, sleep_s: float = 0.0, real: str = "gcc", body: str = "") -> Path:
    """A wrapper compiler: answers ``--version`` like ``real``; otherwise appends its argv to
    ``<folder>/calls.log``, runs ``body``, sleeps, and execs ``real``."""
    folder.mkdir(parents=True, exist_ok=True)
    real_path = shutil.which(real) or real
    script = folder / f"cc-{real}"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then exec {real_path} --version; fi\n'
        # a dependency listing (-MM) is not a compile: not logged, never slowed
        f'case " $* " in *" -MM "*) exec {real_path} "$@";; esac\n'
        f'echo "$$ $*" >> {folder / "calls.log"}\n'
        f"{body}\n"
        f"sleep {sleep_s}\n"
        f'exec {real_path} "$@"\n'
    )
    script.chmod(0o755)
    return script


def calls(folder: Path, needle: str = " -c ") -> list[str]:
    """Lines of ``calls.log`` (compile invocations: those with ``-c`` by default)."""
    log = folder / "calls.log"
    if not log.exists():
        return []
    return [ln for ln in log.read_text().splitlines() if needle in ln]
