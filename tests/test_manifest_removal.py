"""A header manifest goes with the last entry it names, wherever an entry is removed —
``verify --repair``, a bad entry removed on lookup, eviction, purge — and stays while another
entry it names is present: no removal leaves a cache that ``verify`` reports
(docs/commands.md, ``verify``). Real compiles, real files, real locks held by another
process."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cachemgr.compile.queue import CompileQueue
from cachemgr.compile.request import load_request
from cachemgr.eviction import purge
from cachemgr.storage import manifest
from cachemgr.storage.tiers import chip_store
from tests.compile_util import SOC, make_settings, scale_request
from tests.conftest import run_cli
from tests.test_security_fs import _hold_lock


def _write(path: Path, text: str, age_s: float = 10.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    old = time.time() - age_s  # in the past: a digest remembered per file identity holds
    os.utime(path, (old, old))
    return path


class Project:
    """A C kernel with a local header, compiled with two versions of that header: two
    entries with one base key, so one manifest names both."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        src = tmp / "proj" / "src"
        _write(
            src / "k.c",
            '#include "k.h"\nvoid scale_kernel(float *x) { for (int i = 0; i < 16; i++) '
            "x[i] *= FACTOR; }\n",
        )
        self.header = _write(src / "k.h", "#define FACTOR 2\n")
        self.request = _write(src / "req.json", json.dumps(scale_request("k.c")))
        self.settings = make_settings(tmp, env)
        self.chip = tmp / "cache" / "kernel_cache" / SOC
        self.cache = ["--cache-dir", str(tmp / "cache")]
        self.env = env

    def compile(self, factor: int) -> str:
        """Compile with ``#define FACTOR factor``; the entry's kernel name."""
        _write(self.header, f"#define FACTOR {factor}\n", age_s=10 + factor)
        with CompileQueue(self.settings, workers=1) as q:
            done = q.compile(load_request(self.request))
        assert done.status in ("compiled", "hit"), done
        return str(done.kernel_name)

    def manifest(self) -> Path:
        (found,) = self.chip.glob("*.manifest")
        return found

    def corrupt(self, kernel: str) -> None:
        (binary,) = self.chip.glob(f"{kernel}.o")
        binary.write_bytes(b"\x7fELF not what the json's sha256 says")

    def verify(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_cli("verify", *args, *self.cache, env=self.env)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = run_cli(*args, *self.cache, env=self.env)
        assert done.returncode == 0, done.stdout + done.stderr
        return done


@pytest.fixture
def project(tmp_path: Path, clean_env: dict[str, str]) -> Project:
    return Project(tmp_path, clean_env)


def _two_entries(project: Project) -> tuple[str, str, Path]:
    first, second = project.compile(2), project.compile(3)
    assert first != second
    found = project.manifest()
    assert {v.kernel for v in manifest.read(found)} == {first, second}
    return first, second, found


def test_verify_repair_leaves_a_cache_that_verify_accepts(project: Project) -> None:
    """``verify --repair && verify`` (cron): the repaired entry's manifest went with it; it
    had been left behind and reported BAD by the next ``verify`` (exit 1)."""
    kernel = project.compile(2)
    found = project.manifest()
    project.corrupt(kernel)
    bad = project.verify()
    assert bad.returncode == 1 and kernel in bad.stdout, bad.stdout
    repaired = project.verify("--repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    after = project.verify()
    assert after.returncode == 0, after.stdout + after.stderr
    assert "BAD" not in after.stdout and not found.exists()


def test_verify_repair_keeps_a_manifest_another_entry_needs(project: Project) -> None:
    first, second, found = _two_entries(project)
    project.corrupt(first)
    assert project.verify("--repair").returncode == 0
    assert found.exists(), "the manifest still names a present entry"
    assert project.verify().returncode == 0
    project.corrupt(second)
    assert project.verify("--repair").returncode == 0
    after = project.verify()
    assert after.returncode == 0, after.stdout
    assert not found.exists()


def test_a_bad_entry_removed_on_lookup_takes_its_last_manifest(project: Project) -> None:
    first, second, found = _two_entries(project)
    store = chip_store(project.chip)
    project.corrupt(first)
    assert store.lookup(first).removed
    assert found.exists() and {v.kernel for v in manifest.read(found)} >= {second}
    project.corrupt(second)
    assert store.lookup(second).removed
    assert not found.exists(), "the manifest goes with the last entry it names"
    after = project.verify()
    assert after.returncode == 0, after.stdout


def test_eviction_keeps_the_manifest_until_its_last_entry_goes(project: Project) -> None:
    first, second, found = _two_entries(project)
    old = time.time() - 7200  # first: last used two hours ago; second: just now
    json_first = project.chip / f"{first}.json"
    os.utime(json_first, (old, json_first.stat().st_mtime))
    project.run("gc", "--local", "--ratio", "0", "--min-age", "3600")
    assert not json_first.exists() and (project.chip / f"{second}.json").exists()
    assert found.exists(), "the manifest still names a present entry"
    assert project.verify().returncode == 0
    project.run("gc", "--local", "--ratio", "0", "--min-age", "0")
    assert not found.exists()
    assert project.verify().returncode == 0


def test_purge_keeps_the_manifest_of_an_entry_it_could_not_remove(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A purge that finds an entry's lock held leaves that entry — and so the manifest that
    names it (it had removed every manifest, whatever it left)."""
    _, second, found = _two_entries(project)
    monkeypatch.setattr(purge, "ENTRY_LOCK_WAIT_S", 0.2)  # the held lock is never released
    holder = _hold_lock(project.chip / f"{second}.lock")
    try:
        report: Any = purge.purge_chip(project.chip)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    assert report.busy == [second] and report.entries == 1
    assert found.exists(), "the manifest still names a present entry"
    assert project.verify().returncode == 0
    assert purge.purge_chip(project.chip).entries == 1
    assert not found.exists()
    assert project.verify().returncode == 0
