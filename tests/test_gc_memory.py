"""gc in bounded memory (docs/eviction.md#memory): the snapshot that keeps entries in columns
and the planner that names only the entries it walks give the same plan as the full scan
and today's planner (``entry.scan_chip`` + ``plan.plan_eviction``, kept unchanged: the
reference) on the same real folder — and a gc's memory does not grow with the entries.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cachemgr.eviction import DryRun, gc_chip, order
from cachemgr.eviction.compact import CompactEntries, scan_compact
from cachemgr.eviction.order import CompactPlan, plan_compact
from cachemgr.eviction.plan import EvictionPlan, plan_eviction
from cachemgr.eviction.reclaim import reclaim
from cachemgr.storage.entry import ChipScan, EntryGroup, scan_chip
from tests.conftest import kernel_json, publish, publish_mix
from tests.users_util import Users

MIB = 2**20
NOW_NS = time.time_ns()  # the planner's clock: every time below is relative to it
S = 10**9


def _write(chip: Path, name: str, data: bytes, atime_ns: int | None = None) -> None:
    path = chip / name
    path.write_bytes(data)
    if atime_ns is not None:
        os.utime(path, ns=(atime_ns, path.stat().st_mtime_ns))


def _entry(chip: Path, kernel: str, size: int, atime_ns: int, ext: str = ".o") -> None:
    binary = os.urandom(size)
    _write(chip, kernel + ext, binary)
    _write(chip, kernel + ".json", json.dumps(kernel_json(kernel, binary)).encode(), atime_ns)


def _fill(chip: Path, seed: int, owner: int | None) -> None:
    """Every kind of file a chip folder holds, with sizes and access times that tie often."""
    rng = random.Random(seed)
    chip.mkdir(parents=True, exist_ok=True)
    old = NOW_NS - 86400 * S
    for _ in range(400):
        tie = rng.choice([0, 0, 1, 2, 3])  # a fifth of the entries share access times
        atime = old + (rng.randrange(200) * S if tie == 0 else tie * S)
        _entry(chip, f"te_Add_{rng.getrandbits(64):016x}", rng.randrange(1, 9000), atime)
    for i in range(30):  # accessed within the aging guard
        _entry(chip, f"te_young_{i:02d}", 3000, NOW_NS - rng.randrange(1, 1000) * S)
    for i in range(8):  # a host whose clock runs ahead
        _entry(chip, f"te_future_{i}", 2000, NOW_NS + (400 + i * 100) * S)
    for i in range(20):  # GE's pre-build entries: a json alone
        _write(chip, f"te_Mul_{i:04d}_pre.json", b'{"pattern": "Opaque"}' * (i + 1), old + i * S)
    for i in range(10):  # with a header, with another binary kind
        _entry(chip, f"te_h_{i}", 100 + i, old + 3 * S)
        _write(chip, f"te_h_{i}.h", b"h" * (10 + i))
        _entry(chip, f"te_so_{i}", 500, old + (50 + i) * S, ext=".so")
    _entry(chip, "te_two", 700, old + 2 * S)
    _write(chip, "te_two.so", b"s" * 70)  # a second binary kind: kept the old way
    _entry(chip, "te_tar", 300, old + 5 * S)
    _write(chip, "te_tar.tar.gz", b"t" * 33)  # placed by its first name
    for i in range(6):
        publish_mix(chip, f"te_mix_{i}", os.urandom(900 + i), os.urandom(400))
        os.utime(chip / f"te_mix_{i}.json", ns=(old + i * S, old))
    _entry(chip, "te_dot.v2", 1200, old + 4 * S)  # a name with a dot
    _entry(chip, "te_x_loc", 800, old + 6 * S)  # ends with a part suffix, no base json
    _write(chip, "te_lonely.json", json.dumps({"binFileName": "te_elsewhere"}).encode(), old)
    _write(chip, "te_elsewhere.bin", b"e" * 64)  # named by te_lonely's json only
    _write(chip, "te_hdr_only.json", b"{}", old + 7 * S)
    _write(chip, "te_hdr_only.h", b"hh")
    for name, size in (("lost.o", 50), ("noext", 5), ("te_gone.h", 9), ("te_q.o.temp", 7)):
        _write(chip, name, b"x" * size)
    _write(chip, "te_Add_lock.lock", b"")
    _write(chip, "headers.manifest", b"{}")
    os.symlink("/etc/passwd", chip / "te_link.json")
    publish(chip, "te_published", os.urandom(5000), atime_s=(old + 9 * S) / S)
    if owner is not None:  # another user's entries: the same bytes, another owner
        for path in sorted(chip.iterdir())[::3]:
            os.chown(path, owner, owner, follow_symlinks=False)


@pytest.fixture
def cache(tmp_path: Path, users: Users) -> Path:
    """A kernel cache with two chip folders, a third of the files another user's."""
    uid = int(subprocess.run(["id", "-u", users.bob], capture_output=True, text=True).stdout)
    root = tmp_path / "kernel_cache"
    for seed, soc in enumerate(("Ascend910B1", "Ascend310P3")):
        _fill(root / soc, seed, uid)
    return root


def _files(group: EntryGroup | None) -> dict[str, int]:
    assert group is not None
    return {name: fst.size for name, fst in group.files.items()}


def _scans(chip: Path, fd: int) -> tuple[ChipScan, ChipScan]:
    old, new = scan_chip(chip, fd), scan_compact(chip, fd)
    assert isinstance(new.entries, CompactEntries)
    return old, new


def _same_scan(old: ChipScan, new: ChipScan) -> None:
    assert isinstance(new.entries, CompactEntries)
    assert new.used_bytes == old.used_bytes
    assert sorted(new.entries) == sorted(old.entries) and len(new.entries) == len(old.entries)
    for kernel, group in old.entries.items():
        made = new.entries.transient(kernel)
        assert made is not None and _files(made) == _files(group), kernel
        assert (made.resolved, made.atime_ns) == (group.resolved, group.atime_ns), kernel
    for table in ("orphans", "temps", "locks", "silly", "manifests", "odd"):
        assert getattr(new, table) == getattr(old, table), table


def _reserve(plan: EvictionPlan | CompactPlan) -> list[str]:
    return [g.kernel for g in plan.pending()][len(plan.kernels) :]


def _same_plan(old: EvictionPlan, new: CompactPlan) -> None:
    assert (new.used_bytes, new.max_bytes, new.target_bytes, new.triggered) == (
        old.used_bytes,
        old.max_bytes,
        old.target_bytes,
        old.triggered,
    )
    assert list(new.kernels) == old.kernels
    assert [_files(g) for g in new.candidates] == [_files(g) for g in old.candidates]
    assert new.evict_bytes == old.evict_bytes and list(new.kept_kernels) == old.kept_kernels
    assert sorted(g.kernel for g in new.suspect) == sorted(g.kernel for g in old.suspect)
    assert _reserve(new) == _reserve(old)


#: (max_mb, ratio_pct, min_age_s, force_ratio, target_bytes, clock_skew_s); max_mb None =
#: the folder's used size in whole MiB (the trigger), 0 = just over it
LIMITS = [
    (None, 80, 1800.0, False, None, 300.0),
    (None, 50, 0.0, False, None, None),
    (None, 0, 1800.0, False, None, 300.0),  # everything past the guard goes
    (None, 100, 1800.0, False, None, 300.0),  # used == max at ratio 100: nothing to free
    (0, 95, 1800.0, True, None, 300.0),  # gc --ratio 95 below the trigger
    (0, 99, 0.0, True, None, None),
    (500, 50, 1800.0, False, 123_456, 300.0),  # the daemon after ENOSPC: bytes
    (500, 50, 1800.0, False, 0, 0.0),
    (1, 100, 10**9, True, None, 300.0),  # the guard keeps everything
    (-1, 50, 1800.0, False, None, 300.0),  # eviction off
]


@pytest.mark.parametrize("reclaimed", [False, True], ids=["as-scanned", "after-reclaim"])
@pytest.mark.parametrize("chunks", ["as-shipped", "tiny"])
def test_the_bounded_memory_plan_is_the_full_scans_plan(
    cache: Path, reclaimed: bool, chunks: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scan both ways on the same real folders (the same snapshot), then plan each with every
    kind of limit: the same entries, in the same order, the same reserve, kept and
    suspect entries; after a (dry-run) reclaim too, as gc plans. ``tiny`` walks the order
    the way a folder of millions of entries is walked: histograms of 3 buckets refined
    down to 4 entries, the reserve 5 entries a chunk."""
    if chunks == "tiny":
        for name, value in (("SORT_AT", 4), ("BUCKETS", 3), ("CHUNK", 5)):
            monkeypatch.setattr(order, name, value)
    first_seen = {"te_future_1": NOW_NS - 99_000 * S, "te_future_2": NOW_NS - 5 * S}
    for chip in sorted(cache.iterdir()):
        fd = os.open(chip, os.O_RDONLY | os.O_DIRECTORY)
        try:
            old, new = _scans(chip, fd)
            _same_scan(old, new)
            if reclaimed:
                for scan in (old, new):
                    reclaim(scan, fd, NOW_NS, dry_run=True, min_age_s=1800)
                assert old.used_bytes < scan_chip(chip, fd).used_bytes  # it reclaimed
                _same_scan(old, new)
            for max_mb, ratio, age, force, target, skew in LIMITS:
                limit = old.used_bytes // MIB if max_mb is None else max_mb
                args = (limit or 1, ratio, age, NOW_NS, force, target, skew, first_seen)
                _same_plan(plan_eviction(old, *args), plan_compact(new, *args))
        finally:
            os.close(fd)


def test_a_gc_dry_run_names_what_todays_planner_names(cache: Path) -> None:
    """The whole gc (its own clock, the GE-fatal pass, reclaim) names the entries the full
    scan and today's planner name on the same folder, which it leaves as it was (but for
    GE's eviction lock file)."""
    chip = cache / "Ascend910B1"
    before = sorted(chip.iterdir())
    report = gc_chip(chip, 1, 40, 1800, force_ratio=True, dry_run=DryRun.YES)
    fd = os.open(chip, os.O_RDONLY | os.O_DIRECTORY)
    try:
        scan = scan_chip(chip, fd)
        reclaim(scan, fd, time.time_ns(), dry_run=True, min_age_s=1800)
        plan = plan_eviction(scan, 1, 40, 1800, time.time_ns(), True, None, 300.0)
    finally:
        os.close(fd)
    assert report.evicted == plan.kernels and len(report.evicted) > 100
    assert sorted(set(chip.iterdir()) - {chip / "op_cache_file_del.lock"}) == before


CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from cachemgr.eviction import DryRun, gc_chip

    def hwm():
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    gc_chip(Path(sys.argv[1]) / "small", 1, 80, 0, force_ratio=True, dry_run=DryRun.YES)
    before = hwm()
    report = gc_chip(Path(sys.argv[1]) / "big", 29, 90, 0, force_ratio=True, dry_run=DryRun.YES)
    print(json.dumps({"grew": hwm() - before, "evicted": len(report.evicted)}))
    """
)


def test_a_gc_of_30000_entries_grows_its_peak_memory_by_a_few_mib(tmp_path: Path) -> None:
    """The peak resident memory of a process running gc over 30,000 entries grows by less
    than 8 MiB over the same gc of 100 entries (the full scan took ~1.1 KiB an entry,
    ~33 MiB here; the columns ~50 bytes, plus the names of the ~3,300 entries that go)."""
    for name, count in (("small", 100), ("big", 30_000)):
        chip = tmp_path / name
        chip.mkdir()
        for i in range(count):
            kernel = f"te_Mul_{i:064x}"
            _write(chip, kernel + ".o", b"b" * (1024 + i % 7))
            _write(chip, kernel + ".json", b"{}", NOW_NS - (i * 7919 % count) * S)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    result = json.loads(out.stdout)
    assert 2000 < result["evicted"] < 5000  # ~11 %: 29 MiB used, 90 % of 29 MiB kept
    assert result["grew"] < 8 * MIB, result
