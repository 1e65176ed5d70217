"""gc at the floor: one ``lstat`` pass over the chip folder, however many
entries, and the figures it reports still measured on the disk — on real files.

Timing is ``scripts/bench --only eviction``'s job (ratios, never asserted here); these tests
pin the structure that the time depends on and the behaviour that must not change with it.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cachemgr.eviction import gc_chip
from cachemgr.storage.entry import scan_chip
from tests.conftest import publish, publish_mix
from tests.shared_util import chip_bytes

MIB = 2**20
OLD = 1_000_000  # an access time long past (seconds since the epoch)
_STATS = ("DirEntry.stat", "lstat", "stat")


@contextmanager
def _stat_calls() -> Iterator[Counter[str]]:
    """The ``stat`` calls (``DirEntry.stat``, ``os.lstat``, ``os.stat``) this thread makes
    inside the block, counted by a profile hook (C calls are reported to it)."""
    seen: Counter[str] = Counter()

    def hook(frame: object, event: str, arg: object) -> None:
        if event == "c_call":
            name = getattr(arg, "__qualname__", "")
            if name in _STATS:
                seen[name] += 1

    sys.setprofile(hook)
    try:
        yield seen
    finally:
        sys.setprofile(None)


def _fill(chip: Path) -> None:
    for i in range(120):
        publish(chip, f"te_scan_{i:03d}", os.urandom(4096 + i), atime_s=OLD + i)
    publish_mix(chip, "te_scan_mix", os.urandom(2048), os.urandom(2048))
    os.utime(chip / "te_scan_mix.json", (OLD - 1, OLD - 1))
    (chip / "te_scan_orphan.o").write_bytes(b"o" * 100)  # young: left by reclaim
    (chip / "te_scan_000.lock").write_bytes(b"")


def test_gc_stats_every_file_once(chip: Path) -> None:
    """One ``lstat`` per file for the scan, and none after the removal: ``bytes_after`` is
    counted (docs/eviction.md#what-a-gc-leaves), not a second ``lstat`` of every file (which
    cost as much as the scan's; the removal threads' re-check of each candidate is not
    counted here: it runs on their threads)."""
    _fill(chip)
    files = sum(1 for _ in chip.iterdir())
    before = chip_bytes(chip)
    with _stat_calls() as seen:
        report = gc_chip(chip, 1, 20, 0, force_ratio=True)
    assert files <= sum(seen.values()) <= files + 10, (files, seen)
    assert report.bytes_before == before
    assert report.bytes_after == chip_bytes(chip) <= MIB * 20 // 100
    assert report.evicted[0] == "te_scan_mix" and "te_scan_000" in report.evicted
    assert not (chip / "te_scan_mix_aic.o").exists()  # a mix entry leaves whole
    assert (chip / "te_scan_orphan.o").exists()


def _others_write(chip: Path) -> None:
    """Another writer meanwhile: an entry published, an entry removed, a file of no kind,
    and a symbolic link planted as a json (never counted: not a regular file)."""
    publish(chip, "te_scan_new", os.urandom(30_000))
    for ext in (".json", ".o"):
        (chip / f"te_scan_119{ext}").unlink()
    (chip / "stray.bin").write_bytes(b"s" * 777)
    os.symlink("/etc/passwd", chip / "te_scan_link.json")


def test_bytes_after_is_the_scan_less_what_went(chip: Path) -> None:
    """docs/eviction.md#what-a-gc-leaves: under the limit after the run, ``bytes_after`` is
    counted (the scan's bytes less those evicted and those found gone), not listed again:
    what another writer did meanwhile is left to the next count."""
    _fill(chip)
    seen: dict[str, int] = {}

    def others(plan: object) -> None:
        seen["before"] = chip_bytes(chip)
        _others_write(chip)
        seen["delta"] = chip_bytes(chip) - seen["before"]

    report = gc_chip(chip, 1, 20, 0, force_ratio=True, on_planned=others)
    assert report.evicted and "te_scan_119" not in report.evicted  # the newest: kept
    assert report.bytes_after == report.bytes_before - report.evicted_bytes - report.gone_bytes
    assert report.bytes_after == chip_bytes(chip) - seen["delta"] < MIB
    assert report.bytes_after < report.max_bytes and not report.stuck_over_limit


def test_bytes_after_of_a_folder_still_over_its_limit_is_measured(chip: Path) -> None:
    """Still at or over the limit after the run (the aging guard kept the rest), the
    folder is listed again: what others wrote and removed meanwhile is counted, a file of
    an unknown kind is ``lstat``-ed, a symbolic link is never counted — so "still over its
    limit" is said of what is there."""
    for i in range(40):
        publish(chip, f"te_scan_{i:03d}", os.urandom(30_000 + i), atime_s=OLD + i)
    for i in range(40, 120):  # young: kept by the aging guard
        publish(chip, f"te_scan_{i:03d}", os.urandom(30_000 + i))
    report = gc_chip(chip, 1, 20, 1800, force_ratio=True, on_planned=lambda p: _others_write(chip))
    assert len(report.evicted) == 40 and report.kept_by_age
    assert report.bytes_after == chip_bytes(chip) > MIB
    assert report.stuck_over_limit
    assert report.bytes_after != report.bytes_before - report.evicted_bytes  # others counted


def test_grouping_is_by_name_with_parts_and_leftovers(chip: Path) -> None:
    """The one-pass grouping places every kind of file as before: an entry's own files, a
    mix kernel's parts, GE's pre-build entry on its own, locks, temps, orphans, links."""
    publish(chip, "te_g", b"g" * 10, atime_s=OLD)
    publish_mix(chip, "te_m", b"a" * 5, b"b" * 6)
    (chip / "te_p_pre.json").write_text('{"pattern": "x"}')
    (chip / "te_g.lock").write_bytes(b"")
    (chip / "te_g.o.temp").write_bytes(b"t")
    (chip / "lost.o").write_bytes(b"l" * 3)
    (chip / "noext").write_bytes(b"n")
    os.symlink("/etc/passwd", chip / "te_l.json")
    scan = scan_chip(chip)
    assert set(scan.entries) == {"te_g", "te_m", "te_p_pre"}
    assert set(scan.entries["te_g"].files) == {"te_g.json", "te_g.o"}
    assert set(scan.entries["te_m"].files) == {
        "te_m.json",
        "te_m_mix_aic.json",
        "te_m_mix_aic.o",
        "te_m_mix_aiv.json",
        "te_m_mix_aiv.o",
    }
    assert scan.entries["te_g"].resolved and scan.entries["te_p_pre"].resolved
    assert scan.entries["te_g"].atime_ns == OLD * 10**9
    assert {"te_g.lock", "te_m.lock"} >= set(scan.locks) >= {"te_g.lock"} and set(scan.temps) == {
        "te_g.o.temp"
    }
    assert set(scan.orphans) == {"lost.o", "noext"}
    assert set(scan.odd) == {"te_l.json"}
    assert scan.used_bytes == chip_bytes(chip)


def test_an_entry_whose_json_alone_went_meanwhile_still_counts_its_other_files(
    chip: Path,
) -> None:
    """A member (or a remover between its json and its binary) takes only the json of a
    candidate after the plan: its binary, which holds the bytes, is still there. Counting
    the whole entry as gone said 'under the limit' (exit 0, not stuck) of a folder still
    over it; only the files found absent are gone (docs/eviction.md#what-a-gc-leaves)."""
    publish(chip, "te_scan_big", os.urandom(700_000), atime_s=OLD)  # the candidate
    for i in range(14):  # young: kept by the aging guard, 14 × 40 KB
        publish(chip, f"te_scan_{i:03d}", os.urandom(40_000 + i))

    def json_only(plan: object) -> None:
        (chip / "te_scan_big.json").unlink()

    report = gc_chip(chip, 1, 50, 1800, on_planned=json_only)
    assert report.gone == ["te_scan_big"] and report.kept_by_age
    assert (chip / "te_scan_big.o").exists()
    assert report.bytes_after == chip_bytes(chip) > MIB
    assert report.stuck_over_limit


def test_files_of_an_evicted_entry_someone_else_removed_are_not_counted_as_left(
    chip: Path,
) -> None:
    """The other way: a binary removed by someone else after the plan, its json by the
    run, is neither evicted by it nor left; ``bytes_after`` is what is there."""
    for i in range(20):
        publish(chip, f"te_scan_{i:03d}", os.urandom(60_000 + i), atime_s=OLD + i)

    def binaries(plan: object) -> None:
        for i in range(10):
            (chip / f"te_scan_{i:03d}.o").unlink()

    report = gc_chip(chip, 1, 50, 0, on_planned=binaries)
    assert report.evicted
    assert report.bytes_after == chip_bytes(chip)


def test_a_hard_link_counts_for_nothing_in_bytes_after_as_in_the_scan(
    chip: Path, tmp_path: Path
) -> None:
    """docs/security.md item 2: a hard link planted in a chip folder counts for nothing —
    the scan leaves it out of ``bytes_before``; the listing that measures a folder still
    over its limit counted it, so a gc reported more left than it found ('1.2 -> 9.2 MiB')."""
    for i in range(40):  # young: kept by the aging guard, over the 1 MiB limit
        publish(chip, f"te_scan_{i:03d}", os.urandom(30_000 + i))
    big = tmp_path / "members_own.bin"
    big.write_bytes(b"b" * (8 * MIB))
    os.link(big, chip / "te_scan_hl.o")
    os.link(big, chip / "stray_hl.bin")
    report = gc_chip(chip, 1, 50, 1800)
    assert report.kept_by_age and report.stuck_over_limit
    assert report.bytes_after == report.bytes_before == chip_bytes(chip) - 16 * MIB


def test_a_kept_file_replaced_by_a_fifo_link_or_folder_counts_for_nothing(chip: Path) -> None:
    """docs/eviction.md#what-a-gc-leaves: the listing that measures a folder still over its
    limit counted each name the scan knew at its scanned size, even when a member had renamed
    a FIFO, a link or a folder over it meanwhile — the bytes were freed, yet gc said 'still
    over its limit' (exit 1) of a folder at 2 % of it. Both tables of the snapshot: kept
    entries in columns (plain names) and by name (a dot in the stem)."""
    kept = [f"te_scan_{i:03d}" for i in range(30)] + [f"te.dot_{i}" for i in range(6)]
    for kernel in kept:  # young: kept by the aging guard, over the 1 MiB limit
        publish(chip, kernel, os.urandom(60_000))

    def replace(plan: object) -> None:
        for i, kernel in enumerate(kept):
            tmp = chip / "planted"
            if i % 3 == 0:
                os.mkfifo(tmp)
            elif i % 3 == 1:
                os.symlink("/etc/passwd", tmp)
            else:  # a folder cannot be renamed over a file: removed, then made
                os.unlink(chip / (kernel + ".o"))
                (chip / (kernel + ".o")).mkdir()
                continue
            os.rename(tmp, chip / (kernel + ".o"))

    report = gc_chip(chip, 1, 50, 1800, on_planned=replace)
    assert report.kept_by_age and report.bytes_before > MIB
    assert report.bytes_after == chip_bytes(chip) < MIB
    assert not report.stuck_over_limit


def test_a_candidate_whose_json_became_a_fifo_is_gone_not_saved_by_a_hit(chip: Path) -> None:
    """docs/eviction.md#what-a-gc-leaves: a FIFO a member renames over a candidate's json
    after the plan has another access time, so gc called the entry 'saved by a hit' and
    counted its freed json as left; it is no entry any more: gone, its json's bytes not left,
    its binary (still there) left."""
    for i in range(40):
        publish(chip, f"te_scan_{i:03d}", os.urandom(60_000 + i), atime_s=OLD + i)
    hit: list[str] = []

    def plant(plan: object) -> None:
        hit.extend(list(plan.kernels)[:3])  # type: ignore[attr-defined]
        for kernel in hit:
            os.mkfifo(chip / "planted")
            os.rename(chip / "planted", chip / (kernel + ".json"))

    report = gc_chip(chip, 1, 50, 1800, on_planned=plant)
    assert sorted(report.gone) == sorted(hit) and not report.saved_by_hit
    assert report.bytes_after == chip_bytes(chip)
