"""A cache root that turns read-only (or fills up) under cachemgr
(docs/security.md#12-a-read-only-or-full-cache-root): hits are served, a compile that succeeds
returns its kernel outside the cache (``compiled``, ``"cached": false`` and one warning line), gc
says so in one line, the daemon reports the state (log once, ``STATUS=``, ``/health``, a metric) and
recovers by itself. Real read-only remounts of a real tmpfs (root only)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachemgr.client import Client, DaemonError
from tests import mount_util
from tests.compile_util import request_data, write_request
from tests.conftest import SOC, run_cli
from tests.daemon_util import daemon_env, own_tmp, start_daemon, wait_for


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs mounted for the test (root only)."""
    with mount_util.tmpfs(tmp_path / "mnt", "size=16m,mode=0755") as mnt:
        yield mnt


def _remount(mnt: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mnt)], check=True)


def _good(files: list[str]) -> bool:
    doc_path = next(Path(f) for f in files if f.endswith(".json"))
    doc = json.loads(doc_path.read_text())
    binary = doc_path.parent / (doc["binFileName"] + doc["binFileSuffix"])
    return hashlib.sha256(binary.read_bytes()).hexdigest() == doc["sha256"]


def test_daemon_serves_a_root_turned_read_only_and_recovers(tmpfs: Path, tmp_path: Path) -> None:
    d = start_daemon(
        tmp_path, "--cache-dir", str(tmpfs), env=own_tmp(daemon_env(tmp_path), tmp_path)
    )
    client = Client(d.socket_path, timeout_s=120, local_hits=False)
    first, second = (
        request_data(defines={"N": 7001, "B_N": 1}),
        request_data(defines={"N": 7002, "B_N": 1}),
    )
    try:
        assert client.compile(first).to_json()["status"] == "compiled"
        _remount(tmpfs, "ro")
        wait_for(lambda: client.health()["status"] == "degraded", 20, "the degraded state")
        assert "read-only" in client.health()["degraded"][0]
        for _ in range(3):  # hits are served; the access time is not updated (one warning)
            hit = client.compile(first).to_json()
            assert hit["status"] == "hit" and _good(hit["files"])
        answer = client.compile(second).to_json()
        assert answer["status"] == "compiled" and answer["cached"] is False, answer
        assert "read-only" in answer["warning"] and _good(answer["files"])
        assert not str(answer["files"][0]).startswith(str(tmpfs))
        assert str(answer["files"][0]).startswith(str(tmp_path)), answer  # not the real /tmp
        with pytest.raises(DaemonError) as err:
            client.gc()
        assert "read-only" in str(err.value) and "\n" not in str(err.value)
        gc = run_cli("gc", "--cache-dir", str(tmpfs), "--socket", str(d.socket_path), env=d.env)
        assert gc.returncode == 1 and len(gc.stderr.strip().splitlines()) == 1, gc.stderr
        assert "read-only" in gc.stderr
        assert "cachemgr_root_not_writable 1.0" in client.request("GET", "/metrics")
        d.wait_notify("STATUS=degraded")
        _remount(tmpfs, "rw")
        wait_for(lambda: client.health()["status"] == "ok", 20, "the recovery")
        again = client.compile(second).to_json()
        assert again["status"] == "compiled" and again["cached"] is True
    finally:
        _remount(tmpfs, "rw")
        d.stop()
    log = d.log()
    assert log.count("hits are served, access times are not updated") == 1
    assert "writable again" in log


def test_cli_compile_on_a_read_only_or_full_root_returns_the_kernel(
    tmpfs: Path, tmp_path: Path, clean_env: dict[str, str]
) -> None:
    (tmpfs / "kernel_cache").mkdir()
    _remount(tmpfs, "ro")
    try:
        req = write_request(tmp_path / "req", defines={"N": 7101, "B_N": 1})
        out = run_cli(
            "compile", str(req), "--json", "--cache-dir", str(tmpfs), env=clean_env, cwd=tmp_path
        )
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["status"] == "compiled" and doc["cached"] is False and _good(doc["files"])
        warnings = [ln for ln in out.stderr.splitlines() if "warning" in ln]
        assert len(warnings) == 1 and "read-only" in warnings[0], out.stderr
        gc = run_cli("gc", "--cache-dir", str(tmpfs), env=clean_env)
        assert gc.returncode == 1 and "read-only" in gc.stderr
        assert len(gc.stderr.strip().splitlines()) == 1, gc.stderr
    finally:
        _remount(tmpfs, "rw")
    filler = tmpfs / "filler"  # now full: the publish hits ENOSPC
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
        except OSError:
            pass
    req = write_request(tmp_path / "req2", defines={"N": 7102, "B_N": 1})
    out = run_cli(
        "compile", str(req), "--json", "--cache-dir", str(tmpfs), env=clean_env, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["status"] == "compiled" and doc["cached"] is False and _good(doc["files"])
    assert "not cached" in out.stderr


@pytest.mark.parametrize("left", [1, 3])  # the entry's lock file fails, or its parts do
def test_a_root_out_of_inodes_says_so_not_only_its_free_bytes(
    left: int, tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """A filesystem can run out of files (inodes) with bytes to spare: the publish's
    ``ENOSPC`` said ``no space left in … (16748544 bytes free): entry … needs 4918 bytes``,
    or only ``No space left on device``; both name the inodes left too."""
    with mount_util.tmpfs(tmp_path / "mnt", "size=16m,nr_inodes=64,mode=0755") as mnt:
        chip = mnt / "kernel_cache" / SOC
        chip.mkdir(parents=True)
        out = tmp_path / "out"
        out.mkdir()
        req = write_request(tmp_path, defines={"N": 7301, "B_N": 1})
        fillers = []
        for n in range(64):
            try:
                (mnt / f"f{n}").touch()
            except OSError:
                break
            fillers.append(mnt / f"f{n}")
        for filler in fillers[-left:]:
            filler.unlink()
        proc = run_cli(
            "compile", "--local", "--cache-dir", str(mnt), "--out-dir", str(out), str(req),
            env=clean_env,
        )  # fmt: skip
        assert os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize > 1 << 20  # bytes to spare
        (line,) = [ln for ln in proc.stderr.splitlines() if "not cached" in ln]
        assert "no space left" in line.lower() and " of its 64 inodes" in line, line
