"""GE's own eviction and the mount's access-time rule
(docs/interop.md#ges-eviction-and-access-times): on a real tmpfs mounted ``relatime``,
``strictatime`` and ``noatime``, the GE twin's eviction — which reads each json during its scan and
deletes an entry only when its access time is unchanged, as GE's ``AgingCacheFileByAccessTime`` does
— removes nothing under
``relatime`` and ``strictatime``, while cachemgr keeps the cache within its limit on all
three; ``stats`` and ``config`` say which rule each governed kernel cache is on."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cachemgr.eviction import gc_chip
from cachemgr.storage import atimes
from tests import ge_twin, mount_util
from tests.conftest import SOC, run_cli

HOUR = 3600
MIB = 1 << 20
ENTRIES = 12
ENTRY_BYTES = 200 * 1024


def _plant(chip: Path) -> list[str]:
    """Twelve GE entries (about 2.4 MB) written 3 h ago and hit by GE 2 h ago: a hit sets
    the json's and the binary's access time with ``utime`` (``TeFileUtils::UpdateFileAccessTime``),
    modification time kept."""
    names = []
    written, hit = time.time() - 3 * HOUR, time.time() - 2 * HOUR
    for i in range(ENTRIES):
        name = f"te_add_{i:02d}"
        assert ge_twin.write_entry(chip, name, size=ENTRY_BYTES).files
        for part in (f"{name}.json", f"{name}.o"):
            os.utime(chip / part, (written, written))
            os.utime(chip / part, (hit - i, written))  # the oldest hit first
        names.append(name)
    return names


def _used(chip: Path) -> int:
    return ge_twin.directory_size(chip)


@pytest.mark.parametrize(
    ("option", "ge_evicts"),
    [("relatime", False), ("strictatime", False), ("noatime", True)],
)
def test_ge_evicts_by_the_mount_rule_and_cachemgr_keeps_the_limit_on_each(
    tmp_path: Path, clean_env: dict[str, str], option: str, ge_evicts: bool
) -> None:
    with mount_util.tmpfs(tmp_path / "mnt", f"size=16m,mode=0755,{option}") as mnt:
        root = mnt / "root"
        # the same entries, the same times, in two chip folders: GE's on one, cachemgr's on
        # the other (GE's scan would change what cachemgr sees: docs/interop.md)
        chip, twin = root / "kernel_cache" / SOC, root / "kernel_cache" / "Ascend310P3"
        names = _plant(chip)
        assert _plant(twin) == names
        before = _used(chip)
        assert before >= 2 * MIB
        # GE: 1 MiB limit, keep 50 %; every entry is older than MIN_CACHE_AGING_TIME
        gone = ge_twin.evict(chip, MIB, 50)
        report = gc_chip(twin, 1, 50, 1800)  # cachemgr: the same limits, the same aging guard
        assert len(report.evicted) >= 7 and _used(twin) <= MIB // 2, report
        kept = sorted(p.stem for p in twin.glob("*.json"))
        assert kept == names[: len(kept)]  # the most recently hit stay
        if ge_evicts:  # noatime: GE's read moves nothing, its re-check holds
            assert len(gone) >= 7 and _used(chip) <= MIB // 2, (gone, _used(chip))
            return
        # relatime / strictatime: GE's scan read moved every json's access time, its
        # re-check skipped every entry: nothing is gone, the folder stays over its limit
        assert gone == [] and _used(chip) == before
        assert sorted(p.stem for p in chip.glob("*.json")) == names
        assert all(time.time() - (chip / f"{n}.json").stat().st_atime < 60 for n in names)
        stats = json.loads(
            run_cli("stats", "--json", "--local", "--cache-dir", str(root), env=clean_env).stdout
        )
        (fs,) = stats["filesystems"]
        assert (fs["fstype"], fs["atime"], fs["mount_point"]) == ("tmpfs", option, str(mnt))
        assert "GE's own eviction removes nothing here" in fs["line"]
        assert fs["line"].startswith(f"kernel_cache on tmpfs {option}: ")


def test_noatime_mount_is_reported_as_ge_evicting(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    with mount_util.tmpfs(tmp_path / "mnt", "size=4m,mode=0755,noatime") as mnt:
        root = mnt / "root"
        (root / "kernel_cache" / SOC).mkdir(parents=True)
        text = run_cli("stats", "--local", "--cache-dir", str(root), env=clean_env)
        assert text.returncode == 0, text.stderr
        line = next(ln for ln in text.stdout.splitlines() if ln.startswith("Filesystem:"))
        assert "kernel_cache on tmpfs noatime: reads leave access times alone" in line
        config = run_cli("config", "--cache-dir", str(root), env=clean_env)
        assert f"(mount: {mnt}) filesystem = kernel_cache on tmpfs noatime" in config.stdout
        data = json.loads(
            run_cli("config", "--json", "--cache-dir", str(root), env=clean_env).stdout
        )
        (fs,) = data["kernel_cache_filesystems"]["value"]
        assert (fs["atime"], fs["kernel_cache_dir"]) == ("noatime", str(root / "kernel_cache"))


def test_every_governed_kernel_cache_gets_its_line(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """Under ``ASCEND_CACHE_PATH`` each ``kernel_cache_<host id>`` is governed: one line each."""
    with mount_util.tmpfs(tmp_path / "mnt", "size=4m,mode=0755,strictatime") as mnt:
        for kc in ("kernel_cache", "kernel_cache_hostb"):
            (mnt / kc / SOC).mkdir(parents=True)
        env = {**clean_env, "ASCEND_CACHE_PATH": str(mnt)}
        stats = json.loads(run_cli("stats", "--json", "--local", env=env).stdout)
        found = {Path(f["kernel_cache_dir"]).name: f["atime"] for f in stats["filesystems"]}
        # this host's own kernel_cache_<host id> (resolved, listed first) and the two others
        assert {"kernel_cache", "kernel_cache_hostb"} < set(found) and len(found) == 3, found
        assert set(found.values()) == {"strictatime"}
        text = run_cli("stats", "--local", env=env).stdout
        assert len([ln for ln in text.splitlines() if ln.startswith("Filesystem:")]) == 3


def test_rules_read_from_mountinfo(tmp_path: Path) -> None:
    """NFS mounts follow the server; an absent or unreadable mountinfo is said, not guessed."""
    for name in ("nfs", "lazy", "with space"):
        (tmp_path / name).mkdir()
    info = tmp_path / "mountinfo"
    info.write_text(
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        f"40 27 0:50 / {tmp_path}/nfs rw,noatime - nfs4 srv:/x rw,vers=4.2,lazytime\n"
        f"41 27 0:51 / {tmp_path}/lazy rw,relatime - xfs /dev/vdb rw,lazytime\n"
        f"42 27 0:52 / {tmp_path}/with\\040space rw - ext4 /dev/vdc rw\n"
    )
    nfs = atimes.cache_atimes(tmp_path / "nfs" / "kernel_cache", info)
    assert (nfs.rule, nfs.fstype) == (atimes.NFS, "nfs4")
    assert nfs.line().startswith(
        "kernel_cache on nfs4,lazytime: access times follow the NFS server"
    )
    lazy = atimes.cache_atimes(tmp_path / "lazy" / "kernel_cache", info)
    assert (lazy.rule, lazy.lazytime) == (atimes.RELATIME, True)
    spaced = atimes.cache_atimes(tmp_path / "with space" / "kernel_cache", info)
    assert (spaced.rule, spaced.mount_point) == (atimes.STRICTATIME, f"{tmp_path}/with space")
    gone = atimes.cache_atimes(tmp_path / "kernel_cache", tmp_path / "absent")
    assert gone.rule == atimes.UNKNOWN and "not in /proc/self/mountinfo" in gone.line()
