"""The daemon's memory with a large chip folder, and its gc child.

The daemon keeps an index of ~20 bytes per file (an SQLite table); the start-up reclaim pass
and the evictions it runs scan the folder into one Python object per entry (~1.1 KiB). That
scan runs in a child process (:mod:`cachemgr.daemon.gcchild`): the daemon's own peak (VmHWM)
stays near an empty daemon's plus the index. Real daemons, real folders, real signals, real
fcntl locks.
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cachemgr.daemon import gcchild
from cachemgr.eviction import chip_usage
from cachemgr.storage import fsutil
from cachemgr.storage.entry import scan_chip
from tests.conftest import SOC, publish
from tests.daemon_util import Daemon, start_daemon, wait_first_scan, wait_for

MIB = 1 << 20
#: Entries of the large folder: enough that a scan held in the daemon (~1.1 KiB an entry,
#: ~45 MB) cannot hide under the bound, small enough to build in seconds.
ENTRIES = 40_000
#: What the daemon may add to an empty daemon's peak for them: the index (~2 MB) and
#: allocator slack; a scan in its heap would add ~45 MB.
ALLOWED_MB = 15


def _kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _cache(tmp: Path, max_mb: int) -> tuple[Path, Path]:
    root = tmp / "cache"
    kc = root / "kernel_cache"
    (kc / SOC).mkdir(parents=True)
    (kc / "op_cache.ini").write_text(
        f"[op_compiler_cache]\nmax_op_cache_size={max_mb}\nremain_cache_size_ratio=50\n"
        "adk_version=1\nops_version=1\n"
    )
    return root, kc / SOC


def _config(tmp: Path) -> Path:
    cfg = tmp / "c.toml"
    cfg.write_text("min_age_s = 0\n[daemon]\nevict_debounce_s = 0.2\n")
    return cfg


def _fill(chip: Path, n: int) -> None:
    """``n`` entries grouped by name: ``<kernel>.json`` beside ``<kernel>.o`` (32 bytes)."""
    fd = os.open(chip, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(n):
            for name, data in ((f"te_m{i:06d}.o", b"b" * 32), (f"te_m{i:06d}.json", b"{}")):
                out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o664, dir_fd=fd)
                os.write(out, data)
                os.close(out)
    finally:
        os.close(fd)


def _evicted(d: Daemon) -> float:
    for line in str(d.client.request("GET", "/metrics")).splitlines():
        if line.startswith("cachemgr_evicted_entries_total "):
            return float(line.split()[1])
    return 0.0


def _peak_mb(tmp: Path, max_mb: int, fill: int) -> tuple[float, Daemon]:
    """Start a daemon on a chip folder of ``fill`` entries; its VmHWM (MB) once its first
    scan and (``max_mb`` > 0) the eviction that follows are done. The daemon still runs."""
    root, chip = _cache(tmp, max_mb)
    _fill(chip, fill)
    d = start_daemon(tmp, "--cache-dir", str(root), "--config", str(_config(tmp)))
    try:
        wait_first_scan(d, 300)
        assert d.client.health()["scan"]["state"] == "done", d.log()
        if max_mb > 0:
            wait_for(lambda: f"eviction of {SOC}" in d.log(), 300, "the daemon's eviction")
            assert _evicted(d) > fill // 4
    except BaseException:
        d.stop()
        raise
    return _kb(d.proc.pid, "VmHWM") / 1024, d


def test_daemon_peak_memory_stays_near_the_index_through_reclaim_evictions_and_stats(
    tmp_path: Path,
) -> None:
    empty_peak, empty = _peak_mb(tmp_path / "empty", -1, 0)
    empty.stop()
    # 1 MB limit: the 40,000 entries (~1.3 MB) are over it; the daemon evicts to 50 %
    peak, d = _peak_mb(tmp_path / "large", 1, ENTRIES)
    try:
        row = d.client.stats().to_json()["chip_folders"][SOC]  # counted as a stream too
        assert 0 < row["entries"] < ENTRIES
        done = d.client.gc(ratio=25).to_json()["chip_folders"][SOC]  # /gc: in a child too
        assert not done["skipped"], done["skipped"]  # no second eviction of its own runs
        assert done["evicted_entries"] > ENTRIES // 8 and len(done["evicted"]) > ENTRIES // 8
        peak = _kb(d.proc.pid, "VmHWM") / 1024
    finally:
        d.stop()
    assert peak <= empty_peak + ALLOWED_MB, (
        f"the daemon peaked at {peak:.1f} MB with {ENTRIES} entries; an empty one at "
        f"{empty_peak:.1f} MB (allowed: + {ALLOWED_MB} MB for the index)"
    )
    assert "the gc child" not in d.log()  # it ran, and ended well, twice


# --- the child dies: one line, the lock is the kernel's to drop, the daemon serves ----------


def _lock_holder(path: Path) -> int:
    """The pid holding a write lock on ``path`` (F_GETLK: asks, takes nothing), or 0."""
    fd = os.open(path, os.O_RDONLY)
    try:
        query = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        l_type, _, _, _, pid = struct.unpack("hhqqi", fcntl.fcntl(fd, fcntl.F_GETLK, query))
    finally:
        os.close(fd)
    return 0 if l_type == fcntl.F_UNLCK else pid


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV, signal.SIGTERM])
def test_a_gc_child_that_dies_is_one_line_and_the_daemon_keeps_serving(
    tmp_path: Path, sig: signal.Signals
) -> None:
    root, chip = _cache(tmp_path, -1)
    publish(chip, "te_good_1", os.urandom(300))
    # a bad entry (json unreadable, no binary) whose lock we hold: the reclaim pass waits
    # for it (up to 5 s) while it holds op_cache_file_del.lock
    (chip / "te_bad_1.json").write_text("{not json")
    entry_lock = fsutil.FcntlLock(chip / "te_bad_1.lock")
    assert entry_lock.acquire(blocking=False)
    try:
        d = start_daemon(tmp_path, "--cache-dir", str(root))
        try:
            del_lock = chip / "op_cache_file_del.lock"
            holder = wait_for(
                lambda: del_lock.exists() and _lock_holder(del_lock), 30, "the child's lock"
            )
            assert _parent(int(holder)) == d.proc.pid, "the chip lock is the child's"
            os.kill(int(holder), sig)  # type: ignore[arg-type]
            wait_first_scan(d)
            scan = d.client.health()["scan"]
            assert scan["state"] == "done", scan  # the index was built all the same
            assert _lock_holder(del_lock) == 0  # the kernel dropped the dead child's lock
            wait_for(lambda: "the gc child" in d.log(), 10, "the line about the child")
            lines = [ln for ln in d.log().splitlines() if "the gc child" in ln]
            assert len(lines) == 1, lines
            assert f"killed by signal {int(sig)} ({sig.name})" in lines[0]
            # a death is a warning; SIGTERM (systemctl stop reaches every process of the
            # unit) is a stop, said at info level
            level = "INFO" if sig == signal.SIGTERM else "WARNING"
            assert f" {level} cachemgr.daemon.gcchild: the gc child" in lines[0], lines[0]
            assert str(chip) in lines[0] and "the next run tries again" in lines[0]
            assert "Traceback" not in d.log()
            assert d.client.health()["status"] == "ok"
            assert d.client.stats().to_json()["chip_folders"][SOC]["entries"] >= 1
        finally:
            d.stop()
    finally:
        entry_lock.release()
    assert (chip / "te_good_1.json").exists()


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_the_gc_child_ends_with_the_daemon(tmp_path: Path, how: str) -> None:
    """A daemon that is stopped or killed while its gc child waits on entry locks takes the
    child with it (attack review: the child ran on, holding op_cache_file_del.lock)."""
    root, chip = _cache(tmp_path, -1)
    locks = []
    for i in range(4):  # four bad entries whose locks we hold: ~20 s of waiting in the child
        (chip / f"te_bad_{i}.json").write_text("{not json")
        lock = fsutil.FcntlLock(chip / f"te_bad_{i}.lock")
        assert lock.acquire(blocking=False)
        locks.append(lock)
    try:
        d = start_daemon(tmp_path, "--cache-dir", str(root))
        del_lock = chip / "op_cache_file_del.lock"
        child = int(wait_for(lambda: del_lock.exists() and _lock_holder(del_lock), 30, "the child"))
        assert _parent(child) == d.proc.pid
        os.kill(d.proc.pid, getattr(signal, how))
        d.proc.wait(30)
        wait_for(lambda: not Path(f"/proc/{child}").exists() or _zombie(child), 8, "no child")
        assert _lock_holder(del_lock) == 0
    finally:
        for lock in locks:
            lock.release()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_the_gc_child_does_not_import_from_the_working_folder(tmp_path: Path) -> None:
    """A daemon started by hand from a folder others can write must not run their
    ``cachemgr/__init__.py`` in its gc child (``-m`` put the working folder first)."""
    chip = tmp_path / "kc" / SOC
    chip.mkdir(parents=True)
    publish(chip, "te_good_1", os.urandom(300))
    planted = tmp_path / "planted"
    (planted / "cachemgr" / "daemon").mkdir(parents=True)
    marker = tmp_path / "PWNED"
    (planted / "cachemgr" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (planted / "cachemgr" / "daemon" / "__init__.py").write_text("")
    (planted / "cachemgr" / "daemon" / "gcchild.py").write_text("")
    code = (
        "import sys; from pathlib import Path; from cachemgr.daemon import gcchild; "
        f"(o,) = gcchild.run_jobs([gcchild.GcJob(Path({str(chip)!r}))]); "
        "print('ok' if o.report is not None else 'failed: ' + o.error)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(gcchild.__file__).parents[2])}
    proc = subprocess.run(
        [sys.executable, "-P", "-c", code], cwd=planted, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.stdout.strip() == "ok", proc.stdout + proc.stderr
    assert not marker.exists()


# --- the protocol, with a real child ------------------------------------------------------


def test_gc_child_reclaims_and_reports_like_gc_chip(tmp_path: Path) -> None:
    chip = tmp_path / "kc" / SOC
    chip.mkdir(parents=True)
    publish(chip, "te_good_1", os.urandom(300))
    temp = chip / "te_x.o.otherhost.1.0123abcd.temp"
    temp.write_bytes(b"half")
    old = time.time() - 7200
    os.utime(temp, (old, old))
    first_seen: dict[str, int] = {"te_gone": 5}
    (outcome,) = gcchild.run_jobs([gcchild.GcJob(chip, first_seen=first_seen)])
    assert outcome.error == "" and outcome.report is not None
    assert outcome.report["reclaimed"]["temps"] == 1 and not temp.exists()
    assert outcome.report["entries_before"] == 1 and (chip / "te_good_1.json").exists()
    assert first_seen == {"te_gone": 5}  # the child's copy came back


def test_gc_child_error_and_crash_are_outcomes_not_exceptions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = tmp_path / "kc" / SOC
    good.mkdir(parents=True)
    publish(good, "te_good_1", os.urandom(300))
    too_long = tmp_path / ("x" * 300) / SOC  # ENAMETOOLONG: an OSError of that folder
    jobs = [gcchild.GcJob(too_long), gcchild.GcJob(good)]
    errored, fine = gcchild.run_jobs(jobs)
    assert "File name too long" in errored.error and not errored.died
    assert fine.report is not None and fine.report["entries_before"] == 1
    # a request the child cannot read (a bug: a time that is not a number): it dies with a
    # traceback; one warning line with its last line, and every job not done is marked so
    bad = gcchild.GcJob(good, first_seen={"te_good_1": "soon"})  # type: ignore[dict-item]
    with caplog.at_level("WARNING", logger="cachemgr.daemon.gcchild"):
        crashed, after = gcchild.run_jobs([bad, gcchild.GcJob(good)])
    assert crashed.died and after.died and after.report is None
    lines = [r.getMessage() for r in caplog.records if "the gc child" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "exited with status 1: ValueError: invalid literal for int()" in lines[0]
    assert "2 of 2 chip folders not done" in lines[0]


# --- stats counts as it lists: the same figures as the scan ------------------------------


def test_chip_usage_streams_the_same_figures_as_the_scan(tmp_path: Path) -> None:
    chip = tmp_path / "kc" / SOC
    chip.mkdir(parents=True)
    for i in range(5):
        publish(chip, f"te_k{i}", os.urandom(100 + i), atime_s=1_000_000 + i)
    (chip / "te_k1_mix_aic.json").write_text("{}")  # a part of te_k1: not an entry
    (chip / "te_lone_mix_aiv.json").write_text("{}")  # no te_lone.json: an entry
    (chip / "te_k2.o.host.1.abcd1234.temp").write_bytes(b"half")
    (chip / "te_k3.lock").write_bytes(b"")
    os.link(chip / "te_k4.o", tmp_path / "elsewhere")  # two links: counted by neither
    (chip / "te_link.json").symlink_to(chip / "te_k0.json")
    (chip / "sub").mkdir()
    scan = scan_chip(chip)
    atimes = [g.atime_ns for g in scan.entries.values()]
    usage = chip_usage(chip)
    assert (usage.entries, usage.bytes) == (len(scan.entries), scan.used_bytes) == (6, usage.bytes)
    assert (usage.oldest_atime_ns, usage.newest_atime_ns) == (min(atimes), max(atimes))
    assert chip_usage(tmp_path / "kc" / "Ascend310P3").exists is False
