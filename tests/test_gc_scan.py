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
    """One ``lstat`` per file for the scan; bytes after are measured by a name listing,
    not by a second ``lstat`` of every file (which cost as much as the scan's; the removal
    threads' re-check of each candidate is not counted here: it runs on their threads)."""
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


def test_bytes_after_counts_what_others_wrote_and_removed_meanwhile(chip: Path) -> None:
    """Measured, not computed, with the listing: a file another writer
    published during the gc is counted, files another host removed are not, a file of an
    unknown kind is lstat-ed, and a symbolic link is never counted."""
    _fill(chip)

    def others(plan: object) -> None:
        publish(chip, "te_scan_new", os.urandom(30_000))
        for ext in (".json", ".o"):
            (chip / f"te_scan_119{ext}").unlink()
        (chip / "stray.bin").write_bytes(b"s" * 777)
        os.symlink("/etc/passwd", chip / "te_scan_link.json")

    report = gc_chip(chip, 1, 20, 0, force_ratio=True, on_planned=others)
    assert report.bytes_after == chip_bytes(chip)
    assert (chip / "te_scan_new.o").exists()


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
