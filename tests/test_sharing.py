"""A cache shared by users and hosts (docs/design.md#sharing-and-locking): file modes whatever the
umask, NFS names and dead writers' leftovers, the start-up lock probe, single-flight across daemons,
a stuck holder, and a full disk (ENOSPC) on a real small tmpfs."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cachemgr import eviction
from cachemgr.config import options
from cachemgr.config.ini import OpCacheIni
from cachemgr.constants import short_host
from cachemgr.daemon import rootcheck
from cachemgr.daemon.config import DaemonConfig
from cachemgr.errors import ConfigError, NoSpaceError
from cachemgr.storage import entry, fsprobe, fsutil
from cachemgr.storage.chiplock import ChipLock
from cachemgr.storage.events import Events, NoSpaceEvent
from cachemgr.storage.store import Store
from tests import mount_util
from tests.conftest import kernel_json, publish
from tests.daemon_util import daemon_env, own_tmp, start_daemon, wait_first_scan, wait_for
from tests.shared_util import SOC, compiles, kernel_request, timed_cc

NFS_NAME = ".nfs000000000012abcd00000001"


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_files_and_folders_are_group_shareable_whatever_the_umask(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o2775)
    old = os.umask(0o077)  # a careless user's umask: nothing may come out private
    try:
        chip = root / "kernel_cache" / SOC
        publish(chip, "te_add_1", b"\x7fELF" + b"x" * 100)
        with ChipLock(root / "kernel_cache" / f"{SOC}.chip.lock").shared(timeout_s=5):
            pass
        with fsutil.FcntlLock(chip / "op_cache_file_del.lock"):
            pass
        ini = OpCacheIni.load(root / "kernel_cache" / "op_cache.ini")
        ini.set("max_op_cache_size", 10)
        ini.save()
    finally:
        os.umask(old)
    for path in [root / "kernel_cache", chip]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o2775, path
    files = [p for p in (root / "kernel_cache").rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {
        "te_add_1.json",
        "te_add_1.o",
        "te_add_1.lock",
        "op_cache_file_del.lock",
        f"{SOC}.chip.lock",
        "op_cache.ini",
    }
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o664, path  # never world-writable


def test_nfs_silly_renamed_files_are_never_touched(chip: Path) -> None:
    publish(chip, "te_keep_1", os.urandom(500), atime_s=1_000_000)
    silly = chip / NFS_NAME
    silly.write_bytes(b"open elsewhere")
    os.utime(silly, (1_000_000, 1_000_000))  # old: still not ours to remove
    scan = entry.scan_chip(chip)
    assert NFS_NAME in scan.silly and NFS_NAME not in scan.orphans
    assert scan.used_bytes >= len(b"open elsewhere")  # it still holds space
    assert Store(chip).verify_all(repair=True).findings == []
    eviction.gc_chip(chip, 1, 0, 0, force_ratio=True)
    eviction.purge_chip(chip)
    assert silly.read_bytes() == b"open elsewhere"
    assert not (chip / "te_keep_1.json").exists()


def test_temps_of_dead_writers_go_at_once_others_stay(chip: Path) -> None:
    dest = chip / "te_x_1.o"
    dead = fsutil.temp_path(dest).name.replace(f".{os.getpid()}.", f".{_dead_pid()}.")
    live = fsutil.temp_path(dest).name
    other_host = f"te_x_1.o.otherhost.{_dead_pid()}.0123abcd.temp"
    cann = "te_y_1.json.temp"
    for name in (dead, live, other_host, cann):
        (chip / name).write_bytes(b"partial")
    report = eviction.gc_chip(chip, -1, 50, 0)
    assert report.reclaimed.temps == 1
    assert sorted(os.listdir(chip)) == sorted([live, other_host, cann, "op_cache_file_del.lock"])


def test_lock_probe_works_here_and_cleans_dead_probes(tmp_path: Path) -> None:
    folder = tmp_path / "kc"
    folder.mkdir()
    stale = folder / f"{fsprobe.PROBE_PREFIX}.{short_host()}.{_dead_pid()}"
    stale.write_bytes(b"")
    probe = fsprobe.probe_locks(folder)
    assert probe.ok, probe.detail
    assert os.listdir(folder) == []


def test_a_python_this_user_cannot_run_stops_the_probe_with_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe's second process runs this interpreter: where the user may not run it (a
    venv made from a Python under /root, for the unit's user), the probe says so — not a
    bare "Permission denied" that reads as the cache's — and leaves no probe file."""
    folder = tmp_path / "kc"
    python = tmp_path / "python3"
    python.write_bytes(b"#!/bin/sh\n")
    python.chmod(0o644)  # no execute bit: execve refuses it, root included
    monkeypatch.setattr(sys, "executable", str(python))
    with pytest.raises(ConfigError) as info:
        fsprobe.probe_locks(folder)
    message = str(info.value)
    assert "\n" not in message and str(python) in message and "Permission denied" in message
    assert "venv" in message and str(folder) in message
    assert os.listdir(folder) == []


def test_nfs_mount_with_host_local_locks_fails_the_probe(tmp_path: Path) -> None:
    folder = tmp_path / "kc"
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        f"91 27 0:51 / {tmp_path} rw,relatime shared:40 - nfs4 filer:/export/ascend "
        "rw,vers=4.2,rsize=1048576,hard,proto=tcp,local_lock=all,addr=10.0.0.5\n"
    )
    probe = fsprobe.probe_locks(folder, mountinfo=mountinfo)
    assert not probe.ok
    assert "local_lock=all" in probe.detail and str(tmp_path) in probe.detail
    mountinfo.write_text(mountinfo.read_text().replace("local_lock=all", "local_lock=none"))
    assert fsprobe.probe_locks(folder, mountinfo=mountinfo).ok


def test_root_without_host_wide_locks_is_refused_or_replaced(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    shared = tmp_path / "nfs"
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        f"91 27 0:51 / {shared} rw - nfs filer:/x rw,vers=3,nolock,addr=10.0.0.5\n"
    )

    def probe(folder: Path) -> fsprobe.LockProbe:
        return fsprobe.probe_locks(folder, mountinfo=mountinfo)

    def resolve(values: object) -> options.Settings:
        return options.resolve(cli=dict(values), env=clean_env)  # type: ignore[call-overload]

    cli = {"op_compiler_cache_dir": str(shared)}
    with pytest.raises(rootcheck.LocksUnavailable) as info:
        rootcheck.check_root(cli, resolve, DaemonConfig(), probe)
    assert "nolock" in str(info.value) and 'lock_fallback = "local"' in str(info.value)
    local = tmp_path / "local"
    config = DaemonConfig(lock_fallback="local", local_cache_dir=str(local))
    checked = rootcheck.check_root(cli, resolve, config, probe)
    assert checked.settings.layout.kernel_cache_dir == local / "kernel_cache"
    assert (
        str(shared / "kernel_cache") in checked.fallback_note and "local" in checked.fallback_note
    )


def test_lock_fallback_is_checked() -> None:
    assert DaemonConfig.from_table({"lock_fallback": "local"}).lock_fallback == "local"
    with pytest.raises(ConfigError) as info:
        DaemonConfig.from_table({"lock_fallback": "maybe"}, "config c.toml [daemon]")
    assert "lock_fallback='maybe'" in str(info.value) and "c.toml" in str(info.value)


def test_daemon_start_reclaims_what_a_killed_publish_left(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    chip = root / "kernel_cache" / SOC
    publish(chip, "te_good_1", os.urandom(300))
    dead = _dead_pid()
    temp = chip / f"te_half_1.o.{short_host()}.{dead}.0123abcd.temp"
    temp.write_bytes(b"half")
    (chip / "te_half_1.lock").write_bytes(b"")
    (chip / NFS_NAME).write_bytes(b"x")
    d = start_daemon(tmp_path, "--cache-dir", str(root))
    try:  # the start-up reclaim runs in the background after READY=1
        wait_first_scan(d)
        # the dead lock file stays until an hour old: a GE process may be about to lock it
        # (its removal when old is tested in test_eviction)
        assert sorted(os.listdir(chip)) == sorted(
            [
                NFS_NAME,
                "op_cache_file_del.lock",
                "te_good_1.json",
                "te_good_1.o",
                "te_good_1.lock",
                "te_half_1.lock",
            ]
        )
        assert "fcntl locks work on" in d.log()
    finally:
        d.stop()


def _two_daemons(tmp_path: Path, config: str) -> tuple[list, Path, Path]:
    root = tmp_path / "cache"
    cc_dir = tmp_path / "cc"
    cc = timed_cc(cc_dir)
    slow = cc_dir / "slowcc"
    slow.write_text(f'#!/bin/sh\ncase " $* " in *" -c "*) sleep 1;; esac\nexec {cc} "$@"\n')
    slow.chmod(0o755)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[compilers]\ncc = "{slow}"\n{config}')
    daemons = []
    for host in ("hostA", "hostB"):
        home = tmp_path / host
        home.mkdir()
        daemons.append(
            start_daemon(
                home,
                *("--cache-dir", str(root), "--host-id", host, "--config", str(cfg)),
                env=own_tmp(daemon_env(home), home),
            )
        )
    return daemons, root, cc_dir


def test_single_flight_across_daemons(tmp_path: Path) -> None:
    daemons, root, cc_dir = _two_daemons(tmp_path, "")
    try:
        answers: list[dict] = []

        def ask(i: int) -> None:
            answers.append(daemons[i % 2].client.compile(kernel_request(7)).to_json())

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(answers) == 4 and {a["status"] for a in answers} <= {"compiled", "hit"}
        assert len({a["kernel_name"] for a in answers}) == 1
        assert len(compiles(cc_dir)) == 1  # one real compile for two hosts
        chip = root / "kernel_cache" / SOC
        assert (chip / (answers[0]["kernel_name"] + ".json")).exists()
    finally:
        for d in daemons:
            d.stop()


def test_a_stuck_holder_makes_the_other_host_compile_itself(tmp_path: Path) -> None:
    daemons, root, _ = _two_daemons(tmp_path, "[daemon]\nlock_wait_s = 1.5\n")
    chip = root / "kernel_cache" / SOC
    try:
        first = daemons[0].client.compile(kernel_request(8)).to_json()
        kernel = first["kernel_name"]
        Store(chip).remove(kernel)
        holder = fsutil.FcntlLock(chip / f"{kernel}.lock")  # a host stuck mid-compile
        holder.acquire()
        try:
            alone = daemons[1].client.compile(kernel_request(8)).to_json()
        finally:
            holder.release()
        assert alone["status"] == "compiled" and alone["seconds"] >= 1.5
        assert all(not f.startswith(str(chip)) for f in alone["files"])
        assert all(f.startswith(str(tmp_path)) for f in alone["files"]), alone  # not /tmp
        assert not (chip / f"{kernel}.json").exists()  # the cache was not written unlocked
        assert "stayed locked" in daemons[1].log()
        again = daemons[1].client.compile(kernel_request(8)).to_json()
        assert again["status"] == "compiled" and (chip / f"{kernel}.json").exists()
    finally:
        for d in daemons:
            d.stop()


@pytest.fixture
def small_fs(tmp_path: Path):
    """A real 256 KiB tmpfs (skipped with the reason where mounting is not permitted)."""
    with mount_util.tmpfs(tmp_path / "small", "size=256k,mode=0775") as mnt:
        yield mnt


def _fill_until_full(chip: Path, sink: Events | None = None) -> list[str]:
    kernels, i = [], 0
    while True:
        kernel = f"te_fill_{i:03d}"
        data = os.urandom(24 * 1024)
        try:
            Store(chip, events=sink).publish(
                kernel, {kernel + ".o": data}, kernel_json(kernel, data)
            )
        except NoSpaceError as exc:
            assert str(chip) in str(exc) and f"{kernel} needs" in str(exc), exc
            assert "\n" not in str(exc)
            return kernels
        kernels.append(kernel)
        i += 1


def test_enospc_in_publish_leaves_nothing_and_tells_the_sink(small_fs: Path) -> None:
    chip = small_fs / "cache" / "kernel_cache" / SOC
    told: list[tuple[Path, int]] = []
    sink = Events()  # an object passed in, not a module-level listener
    sink.subscribe(NoSpaceEvent, lambda e: told.append((e.chip_dir, e.bytes_needed)))
    kept = _fill_until_full(chip, sink)
    assert kept and told and told[0][0] == chip and told[0][1] > 24 * 1024
    names = os.listdir(chip)
    assert not [n for n in names if n.endswith(".temp")]
    assert {n[:-5] for n in names if n.endswith(".json")} == set(kept)  # no partial entry
    assert all(Store(chip).lookup(k, touch=False).hit for k in kept)


def test_enospc_through_the_daemon_evicts_then_compiles(small_fs: Path, tmp_path: Path) -> None:
    root = small_fs / "cache"
    kcache = root / "kernel_cache"
    chip = kcache / SOC
    kcache.mkdir(parents=True)
    (kcache / "op_cache.ini").write_text(
        "[op_compiler_cache]\nmax_op_cache_size=1\nremain_cache_size_ratio=50\n"
        "adk_version=1\nops_version=1\n"
    )
    kept = _fill_until_full(chip)
    cfg = tmp_path / "c.toml"
    cfg.write_text("min_age_s = 0\n[daemon]\nevict_debounce_s = 0.1\n")
    env = own_tmp(daemon_env(tmp_path), tmp_path)
    d = start_daemon(tmp_path, "--cache-dir", str(root), "--config", str(cfg), env=env)
    try:
        full = d.client.compile(kernel_request(9)).to_json()  # the kernel, uncached
        assert full["status"] == "compiled" and full["cached"] is False, full
        assert str(chip) in full["warning"] and "needs" in full["warning"], full["warning"]
        assert "\n" not in full["warning"]
        assert all(not f.startswith(str(chip)) and os.path.exists(f) for f in full["files"])
        assert all(f.startswith(str(tmp_path)) for f in full["files"]), full  # not /tmp
        kernel = full["kernel_name"]
        assert not (chip / f"{kernel}.json").exists()
        assert not [n for n in os.listdir(chip) if n.endswith(".temp")]
        wait_for(
            lambda: sum((chip / f"{k}.json").exists() for k in kept) < len(kept),
            30,
            "eviction after ENOSPC",
        )
        assert "no space left in" in d.log()
        wait_for(lambda: d.client.stats().to_json()["no_space"] >= 1, 10, "the no_space counter")
        again = d.client.compile(kernel_request(9)).to_json()
        assert again["status"] == "compiled", again
        assert json.loads((chip / f"{kernel}.json").read_text())["sha256"]
    finally:
        d.stop()
