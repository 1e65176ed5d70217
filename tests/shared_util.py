"""Helpers for the shared-cache tests: distinct tiny kernels from the examples, a
wrapper compiler that logs every real invocation with a timestamp, and an independent
re-verification of what the cache served."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.compile_util import request_data

SOC = "Ascend910B1"


def kernel_request(n: int, **options: Any) -> dict[str, Any]:
    """The example ``add_c`` request with ``-DN=<1000 + n>``: a distinct tiny C kernel per n."""
    data = request_data("add_c", defines={"N": 1000 + n, "B_N": 1})
    if options:
        data["options"] = dict(options)
    return data


def timed_cc(folder: Path) -> Path:
    """A wrapper around gcc that appends ``<epoch s> <pid> <argv>`` to ``<folder>/cc.log`` for
    every compile (not for ``--version``), then execs gcc."""
    folder.mkdir(parents=True, exist_ok=True)
    gcc = shutil.which("gcc") or "gcc"
    script = folder / "cc"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then exec {gcc} --version; fi\n'
        f'echo "$(date +%s.%N) $$ $*" >> {folder / "cc.log"}\n'
        f'exec {gcc} "$@"\n'
    )
    script.chmod(0o755)
    return script


@dataclass(frozen=True)
class Compile:
    """One real compiler run: when (epoch seconds) and which kernel (from ``-o``)."""

    at: float
    kernel: str


def compiles(folder: Path) -> list[Compile]:
    """The compiler runs logged by :func:`timed_cc`, in log order."""
    log = folder / "cc.log"
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        match = re.search(r" -o (\S+)\.o(\s|$)", line)
        if " -c " in line and match:
            out.append(Compile(float(line.split()[0]), Path(match.group(1)).name))
    return out


GOOD, GONE = "good", "gone"


def reverify(files: list[str]) -> str:
    """Check what the cache served, independently of cachemgr: the json's ``sha256`` must be
    the SHA-256 of the binary it names. Returns ``good``, ``gone`` (removed since — eviction,
    purge or force — which is not corruption), or a one-line description of the corruption.

    A json and binary that change between the two reads (the entry was removed and published
    again) are read again, up to three times."""
    json_path = next((Path(f) for f in files if f.endswith(".json")), None)
    if json_path is None:
        return f"no json among {files}"
    verdict = ""
    for _ in range(3):
        try:
            raw = json_path.read_bytes()
            doc = json.loads(raw)
            binary = json_path.parent / (doc["binFileName"] + doc["binFileSuffix"])
            digest = hashlib.sha256(binary.read_bytes()).hexdigest()
            if json_path.read_bytes() != raw:
                continue  # replaced meanwhile: read again
        except FileNotFoundError:
            return GONE
        except (ValueError, KeyError) as exc:
            verdict = f"{json_path.name}: unreadable json ({exc})"
            continue
        if digest == doc["sha256"]:
            return GOOD
        verdict = f"{binary.name}: sha256 {digest} != {doc['sha256']} in {json_path.name}"
    return verdict or GOOD


def chip_bytes(chip: Path) -> int:
    """Used bytes of a chip folder as GE counts them: the apparent size of its regular files."""
    total = 0
    for path in chip.iterdir():
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        if path.is_file() and not path.is_symlink():
            total += st.st_size
    return total


_EVICTION_LINE = re.compile(r"evicted from (\S+): (.*?)\s*$")


def evictions_in_log(text: str) -> list[list[str]]:
    """The kernels each background eviction removed, one list per ``evicted from <soc>: k1
    k2 …`` debug line (the daemons log it with ``[daemon] debug_loggers = "cachemgr.evicted"``;
    the eviction's INFO line is a summary without names)."""
    runs = []
    for line in text.splitlines():
        match = _EVICTION_LINE.search(line)
        if match:
            runs.append(match.group(2).split())
    return runs
