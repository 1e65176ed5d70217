"""Chip folders are recognised the way CANN makes them (``cachemgr/config/layout.py``,
``is_chip_folder``): GE's chip folder is ``kernel_cache/ + soc_version``
(``cache/te_cache_manager.cc``, ``TeCacheManager::SetCacheDirPath``) — a real folder named
like a ``soc_version``. Anything else a group member plants beside the chip folders — a folder
``Ascend910B1.chip.lock/`` holding entry-shaped files, a link named like a chip, a FIFO, a
plain file, a lock file — is no chip folder: purge, gc, ls, stats and the daemon leave it
alone and never count it. Real users (root only), real CLI processes, a real daemon.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from cachemgr.client import Client
from tests.conftest import SOC, publish
from tests.daemon_util import wait_for
from tests.test_daemon_resources import _user_daemon
from tests.users_util import Runtime, Users, run_python_as


def _as(users: Users, rt: Runtime, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_python_as(users, rt, name, "-m", "cachemgr", *args)


def _plant(users: Users, kcache: Path) -> dict[Path, bytes | None]:
    """Bob's planted things at the chip-folder level; returns path → content (None: a
    folder, link or FIFO that must stay as it is)."""
    outside = users.base / "bob-private"
    outside.mkdir()
    publish(outside, "te_outside_1", b"outside" * 100)  # entries behind a chip-named link
    fake = kcache / f"{SOC}.chip.lock"  # a folder where cachemgr's lock file would go
    fake.mkdir()
    publish(fake, "te_planted_1", b"planted" * 100)  # entry-shaped: purge used to take it
    (kcache / "Ascend310P3").symlink_to(outside)
    os.mkfifo(kcache / "Ascend910B2")
    (kcache / "notes.txt").write_bytes(b"bob's notes\n")
    (kcache / "Ascend910B3.chip.lock").write_bytes(b"")
    (kcache / ".hidden").mkdir()
    (kcache / ".hidden" / "x.json").write_bytes(b"{}")
    planted: dict[Path, bytes | None] = {}
    for path in [
        *fake.iterdir(),
        *outside.iterdir(),
        kcache / "notes.txt",
        kcache / ".hidden" / "x.json",
    ]:
        planted[path] = path.read_bytes()
    for path in (fake, kcache / "Ascend310P3", kcache / "Ascend910B2", kcache / ".hidden"):
        planted[path] = None
    for path in [outside, *outside.iterdir(), fake, *fake.iterdir()]:
        os.chown(path, _uid(users.bob), -1, follow_symlinks=False)
    return planted


def _uid(name: str) -> int:
    return int(subprocess.check_output(["id", "-u", name], text=True))


def _intact(planted: dict[Path, bytes | None]) -> None:
    for path, data in planted.items():
        assert os.path.lexists(path), f"{path} was removed"
        if data is not None:
            assert path.read_bytes() == data, f"{path} was changed"


def test_planted_non_chip_entries_are_left_alone_by_purge_gc_ls_stats(
    users: Users, other_runtime: Runtime
) -> None:
    root = users.base / "shared"
    kcache = root / "kernel_cache"
    chip = kcache / SOC
    chip.mkdir(parents=True)
    for n in range(3):
        publish(chip, f"te_real_{n}", b"real" * 100, atime_s=1_000_000 + n)
    for path in [root, kcache, chip, *chip.iterdir()]:
        shutil.chown(path, users.alice, users.group)
    root.chmod(0o2775)
    kcache.chmod(0o2775)
    chip.chmod(0o2775)
    planted = _plant(users, kcache)
    args = ("--cache-dir", str(root), "--local")
    alice = users.alice

    ls = _as(users, other_runtime, alice, "ls", "--json", *args[:2])
    assert ls.returncode == 0, ls.stderr
    assert {row["soc_version"] for row in json.loads(ls.stdout)} == {SOC}, ls.stdout
    stats = _as(users, other_runtime, alice, "stats", "--json", *args)
    assert stats.returncode == 0, stats.stderr
    assert set(json.loads(stats.stdout)["chip_folders"]) == {SOC}, stats.stdout
    gc = _as(users, other_runtime, alice, "gc", "--ratio", "0", "--min-age", "0", "--json", *args)
    assert gc.returncode == 0, gc.stderr
    assert set(json.loads(gc.stdout)["chip_folders"]) == {SOC}, gc.stdout
    _intact(planted)

    # the daemon (as alice) indexes, reports and governs only the real chip folder
    for n in range(2):
        publish(chip, f"te_again_{n}", b"again" * 100)
        for suffix in (".json", ".o"):
            shutil.chown(chip / f"te_again_{n}{suffix}", alice, users.group)
    d = _user_daemon(users, other_runtime, alice, "")
    try:
        client = Client(d.socket_path, local_hits=False, daemon_user=alice)
        wait_for(
            lambda: client.health().get("scan", {}).get("state") in ("done", "failed"),
            60,
            "the daemon's first scan",
        )
        assert set(client.stats().to_json()["chip_folders"]) == {SOC}
    finally:
        d.stop()
    _intact(planted)

    purge = _as(users, other_runtime, alice, "purge", "--all", "--yes", "--json", *args[:2])
    assert purge.returncode == 0, purge.stderr
    assert set(json.loads(purge.stdout)["chip_folders"]) == {SOC}, purge.stdout
    assert not [p for p in chip.iterdir() if p.suffix in (".json", ".o")]  # the real one purged
    _intact(planted)
    # a planted name is no soc_version either: one line, exit 2, nothing touched
    bad = _as(users, other_runtime, alice, "purge", "--soc", f"{SOC}.chip.lock", "--yes", *args[:2])
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert f"{SOC}.chip.lock" in bad.stderr
    _intact(planted)
