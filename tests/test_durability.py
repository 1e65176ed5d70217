"""The durability model (docs/compiling.md "Durability"): entries are published by
atomic rename without fsync, and every hit verifies them (sha256 of every binary, the json
parsed), so what a power loss can leave — a file of the right size full of zeros, or cut
short — is a miss that recompiles and replaces the entry, never a served kernel.

Real processes: ``cachemgr compile`` under ``strace`` (its fsyncs counted), real gcc."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.compile_util import request_data
from tests.daemon_util import daemon_env

SYNC_CALLS = ("fsync", "fdatasync", "sync_file_range", "syncfs", "sync")


def _compile(argv: list[str], env: dict[str, str], strace_log: Path | None = None) -> dict:
    """Run ``cachemgr compile --json`` (under ``strace`` counting sync calls when
    ``strace_log`` is given); its one JSON answer."""
    cmd = [sys.executable, "-m", "cachemgr", "compile", "--json", *argv]
    if strace_log is not None:
        strace = shutil.which("strace")
        assert strace, "strace is needed (scripts/test installs it)"
        trace = ",".join(SYNC_CALLS)
        cmd = [strace, "-f", "-qq", "-e", f"trace={trace}", "-o", str(strace_log), *cmd]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _sync_calls(log: Path) -> list[str]:
    return [
        line
        for line in log.read_text().splitlines()
        if any(f" {name}(" in line or line.startswith(f"{name}(") for name in SYNC_CALLS)
    ]


def _request(tmp_path: Path, name: str, variant: int) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(request_data(defines={"N": 16, "VARIANT": variant})))
    return path


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return daemon_env(tmp_path)  # no daemon: the compile runs in the CLI's process


def test_miss_and_hit_publish_without_fsync(tmp_path: Path, env: dict[str, str]) -> None:
    cache = ["--cache-dir", str(tmp_path / "cache")]
    first = _compile([*cache, str(_request(tmp_path, "a", 1))], env)  # makes op_cache.ini
    assert first["status"] == "compiled"
    log = tmp_path / "miss.strace"
    miss = _compile([*cache, str(_request(tmp_path, "b", 2))], env, log)
    assert miss["status"] == "compiled"
    assert miss["cached"] is True
    assert _sync_calls(log) == []
    log = tmp_path / "hit.strace"
    hit = _compile([*cache, str(_request(tmp_path, "b", 2))], env, log)
    assert hit["status"] == "hit"
    assert _sync_calls(log) == []


@pytest.mark.parametrize("part", [".o", ".json"])
@pytest.mark.parametrize("damage", ["zeros", "cut short"])
def test_torn_entry_is_recompiled_never_served(
    tmp_path: Path, env: dict[str, str], part: str, damage: str
) -> None:
    """What a power loss may leave of an unsynced file is a miss, and the entry is whole
    again afterwards."""
    cache = ["--cache-dir", str(tmp_path / "cache")]
    req = str(_request(tmp_path, "r", 3))
    first = _compile([*cache, req], env)
    assert first["status"] == "compiled"
    target = next(Path(f) for f in first["files"] if f.endswith(part))
    good = target.read_bytes()
    torn = b"\0" * len(good) if damage == "zeros" else good[: len(good) // 2]
    target.write_bytes(torn)
    again = _compile([*cache, req], env)
    assert again["status"] == "compiled", "a torn entry must not be a hit"
    assert again["kernel_name"] == first["kernel_name"]
    assert target.read_bytes() != torn, "the torn file was replaced"
    assert _compile([*cache, req], env)["status"] == "hit"  # verified again: whole
