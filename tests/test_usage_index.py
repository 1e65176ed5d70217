"""The daemon's usage index: one row per file in an in-memory SQLite table,
kept current by file events and periodic rescans — on real files, and through a real daemon.
"""

from __future__ import annotations

import os
import re
import tracemalloc
from pathlib import Path

from cachemgr.daemon.usage import UsageIndex
from cachemgr.storage.chipcount import usage_stream
from tests.conftest import SOC, publish, publish_mix
from tests.daemon_util import Daemon, start_daemon, wait_first_scan, wait_for
from tests.shared_util import chip_bytes


def _write(chip: Path, name: str, size: int) -> Path:
    path = chip / name
    path.write_bytes(b"x" * size)
    return path


def _main_jsons(chip: Path) -> int:
    return sum(1 for p in chip.iterdir() if p.name.endswith(".json") and "_mix_" not in p.name)


def test_rescan_drops_vanished_files_and_keeps_event_updates(tmp_path: Path) -> None:
    """A rescan replaces what it saw, deletes what it no longer sees, and agrees with the
    disk; events between rescans add and subtract exact sizes."""
    kc = tmp_path / "kernel_cache"
    chip = kc / SOC
    chip.mkdir(parents=True)
    for i in range(300):
        publish(chip, f"te_idx_{i:03d}", os.urandom(1000 + i))
    publish_mix(chip, "te_idx_mix", os.urandom(700), os.urandom(900))
    index = UsageIndex(kc)
    assert index.reconcile() == {SOC: chip_bytes(chip)}
    assert index.entries(SOC) == _main_jsons(chip) == 301
    assert index.total_files() == sum(1 for _ in chip.iterdir())
    # behind the index's back (another host): 50 entries gone, one binary grown
    for i in range(50):
        for ext in (".json", ".o"):
            (chip / f"te_idx_{i:03d}{ext}").unlink()
    grown = _write(chip, "te_idx_299.o", 64 * 1024)
    assert index.used_bytes(SOC) != chip_bytes(chip)
    assert index.reconcile_chip(SOC) == chip_bytes(chip) == index.used_bytes(SOC)
    assert index.entries(SOC) == 251 and index.size_of(grown) == 64 * 1024
    assert index.size_of(chip / "te_idx_000.o") is None
    # events: a new file counted, a removed one subtracted with the size it had
    added = _write(chip, "te_new.o", 4321)
    assert index.file_changed(added) == SOC
    removed = chip / "te_idx_100.o"
    size = removed.stat().st_size
    removed.unlink()
    before = index.used_bytes(SOC)
    assert index.file_removed(removed) == SOC
    assert index.used_bytes(SOC) == before - size == chip_bytes(chip)
    # a second rescan (the other generation) keeps what the events wrote
    assert index.reconcile_chip(SOC) == chip_bytes(chip)
    assert index.size_of(added) == 4321
    index.forget(SOC)
    assert index.chips() == [] and index.used_bytes(SOC) == 0


def test_indexed_files_are_not_python_objects(tmp_path: Path) -> None:
    """50,000 indexed files hold no Python memory: the rows live in SQLite's pages (about
    20 bytes a file), not in a dict of int objects (about 100 bytes a file, 5 MB here) —
    what lets 1,000,000 entries fit the daemon's 100 MB."""
    kc = tmp_path / "kernel_cache"
    chip = kc / SOC
    chip.mkdir(parents=True)
    fd = os.open(chip, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(50_000):
            os.close(os.open(f"te_mem_{i:05d}.o", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)
    index = UsageIndex(kc)
    tracemalloc.start()
    try:
        index.reconcile()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert index.total_files() == 50_000
    assert held < 1_000_000, f"{held} bytes of Python objects for 50,000 indexed files"


def _metric(d: Daemon, name: str) -> int:
    text = str(d.client.request("GET", "/metrics"))
    match = re.search(rf'{name}{{soc_version="{SOC}"}} (\S+)', text)
    return int(float(match.group(1))) if match else -1


def _root_with_limit(tmp_path: Path, max_mb: int) -> tuple[Path, Path]:
    """A cache root whose ``op_cache.ini`` sets ``max_op_cache_size`` (MiB), and its chip
    folder."""
    root = tmp_path / "cache"
    kc = root / "kernel_cache"
    chip = kc / SOC
    chip.mkdir(parents=True)
    (kc / "op_cache.ini").write_text(
        f"[op_compiler_cache]\nmax_op_cache_size={max_mb}\nremain_cache_size_ratio=50\n"
        "adk_version=1\nops_version=1\n"
    )
    return root, chip


def test_daemon_index_follows_events_and_rescans(tmp_path: Path) -> None:
    """A real daemon on real files: the first scan, inotify events (publish, remove) and the
    periodic rescan (a size change no event reports) all keep /metrics equal to the disk."""
    root, chip = _root_with_limit(tmp_path, -1)
    for i in range(200):
        publish(chip, f"te_d_{i:03d}", os.urandom(2000 + i))
    cfg = tmp_path / "c.toml"
    cfg.write_text("[daemon]\nreconcile_interval_s = 1.0\nreconcile_jitter_s = 0.0\n")
    d = start_daemon(tmp_path, "--cache-dir", str(root), "--config", str(cfg))
    try:
        wait_first_scan(d)

        def agrees() -> bool:
            used, entries = (
                _metric(d, "cachemgr_chip_used_bytes"),
                _metric(d, "cachemgr_chip_entries"),
            )
            return used == chip_bytes(chip) and entries == _main_jsons(chip)

        wait_for(agrees, 30, "the first scan's figures")
        for i in range(20):
            publish(chip, f"te_d_new_{i:02d}", os.urandom(3000))
        for i in range(30):
            for ext in (".json", ".o"):
                (chip / f"te_d_{i:03d}{ext}").unlink()
        wait_for(agrees, 30, "the events' figures")
        os.truncate(chip / "te_d_199.o", 10)  # IN_MODIFY: not subscribed, only a rescan sees it
        wait_for(agrees, 30, "the rescan's figures")
    finally:
        d.stop()


def test_a_hard_link_counts_for_nothing_in_the_index_as_in_gc(tmp_path: Path) -> None:
    """docs/security.md item 2: a hard link in a chip folder counts for nothing in gc's
    scan and in ``stats``; the index counted it, so a member's link to a large file of
    theirs (no disk used) put the folder over its limit for the daemon alone: an eviction
    scheduled on every event, each gc child finding nothing to do. Rescans and events
    count as gc does; an NFS ``.nfs*`` name with more links still counts, as there."""
    kc = tmp_path / "kernel_cache"
    chip = kc / SOC
    chip.mkdir(parents=True)
    publish(chip, "te_idx_one", os.urandom(1000))
    big = tmp_path / "members_own.bin"
    big.write_bytes(b"b" * 100_000)
    os.link(big, chip / "te_idx_hl.o")
    os.link(big, chip / ".nfs0000000000001")
    index = UsageIndex(kc)
    fd = os.open(chip, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _, used, _, _ = usage_stream(fd)
    finally:
        os.close(fd)
    assert index.reconcile() == {SOC: used} and used == chip_bytes(chip) - 100_000
    os.link(big, chip / "te_idx_hl2.o")
    index.file_changed(chip / "te_idx_hl2.o")
    assert index.used_bytes(SOC) == used and index.size_of(chip / "te_idx_hl2.o") is None


def test_a_hard_link_planted_in_a_daemons_chip_folder_schedules_no_eviction(
    tmp_path: Path,
) -> None:
    """A real daemon: a member's hard link to 8 MiB of their own in a chip folder of 1 MiB
    limit, under it by gc's count. Before, the index counted the link, said the folder was
    over its limit and scheduled a gc child on every event, each finding nothing to do."""
    root, chip = _root_with_limit(tmp_path, 1)
    publish(chip, "te_d_one", os.urandom(2000))
    big = tmp_path / "members_own.bin"
    big.write_bytes(b"b" * (8 << 20))
    d = start_daemon(tmp_path, "--cache-dir", str(root))
    try:
        wait_first_scan(d)
        os.link(big, chip / "te_d_hl.o")
        publish(chip, "te_d_two", os.urandom(3000))  # events after the link's
        wait_for(
            lambda: _metric(d, "cachemgr_chip_entries") == 2,
            30,
            "the second entry's events",
        )
        assert _metric(d, "cachemgr_chip_used_bytes") == chip_bytes(chip) - (8 << 20)
        assert "over its limit" not in d.log()
    finally:
        d.stop()
