"""A group member against another user's hit (docs/security.md, "Fast paths review"): a
folder of the shared cache swapped for a link between the hit's walk and its last write
(nothing may be read, created or changed through the link), and the shared stats lock held.
Real files, real processes, real fcntl locks; the swap is made once the victim's process
holds the folder it walked (seen in ``/proc/<pid>/fd``)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cachemgr import direct
from cachemgr.storage import counters
from tests.compile_util import SOC
from tests.proc_util import fd_targets
from tests.test_direct import Kit, Run


def _holds(pid: int, folder: Path) -> bool:
    """True when process ``pid`` has ``folder`` open."""
    return str(folder) in fd_targets(pid)


def test_kernel_cache_swapped_for_a_link_under_a_direct_hit_gets_no_counts_through_it(
    tmp_path: Path,
) -> None:
    """A member holds ``cachemgr_stats.lock`` (any member may lock it: it is ``0660``), so a
    direct hit, past its walk, waits for it; meanwhile ``kernel_cache`` is renamed aside and
    a link put in its place, to a folder of the hitting user's that holds a stats lock and a
    stats file (another cache of theirs). The direct path opened, locked, read and replaced
    that folder's stats file through the link."""
    kit = Kit(tmp_path)
    kit.primed()
    kcache = kit.cache / "kernel_cache"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "cachemgr_stats.lock").write_bytes(b"")
    theirs = victim / f"cachemgr_stats_{SOC}.json"
    theirs.write_text('{"hits": 5}')
    before = sorted(p.name for p in victim.iterdir())

    held = os.open(kcache / "cachemgr_stats.lock", os.O_RDWR)
    fcntl.lockf(held, fcntl.LOCK_EX)
    argv = [sys.executable, "-X", "importtime", "-m", "cachemgr", *kit.argv]
    proc = subprocess.Popen(
        argv, env=kit.env, cwd=kit.project, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not _holds(proc.pid, kit.chip):
            assert proc.poll() is None, "the hit ended before it walked to its chip folder"
            assert time.monotonic() < deadline, "the hit never opened its chip folder"
            time.sleep(0.005)
        os.rename(kcache, kit.cache / "kc.aside")
        os.symlink(victim, kcache)
    finally:
        os.close(held)
        out, err = proc.communicate(timeout=120)
    run = Run(subprocess.CompletedProcess(argv, proc.returncode, out, err))
    assert run.direct, "the direct path answered (it walked before the swap)"
    assert sorted(p.name for p in victim.iterdir()) == before, run.out + run.err
    assert json.loads(theirs.read_text()) == {"hits": 5}, "a hit counted through the link"


def test_a_member_holding_the_stats_lock_costs_a_hit_seconds_not_a_minute(
    tmp_path: Path,
) -> None:
    """``cachemgr_stats.lock`` is ``0660``: any member may take it and keep it. Every
    ``cachemgr compile`` hit of every user then waited 30 s for it in direct mode, handed
    over, and waited 30 s more in the full path's end-of-run flush (60.5 s per hit, the
    counts lost anyway). Counters are statistics: a run waits for their lock briefly, then
    keeps its hit, says the counts were not saved, and ends."""
    kit = Kit(tmp_path)
    kit.primed()
    held = os.open(kit.cache / "kernel_cache" / "cachemgr_stats.lock", os.O_RDWR)
    fcntl.lockf(held, fcntl.LOCK_EX)
    argv = [sys.executable, "-X", "importtime", "-m", "cachemgr", *kit.argv]
    try:
        proc = subprocess.Popen(
            argv, env=kit.env, cwd=kit.project, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            out, err = proc.communicate(timeout=20)  # it took 60.5 s
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise AssertionError("a hit waited more than 20 s for a held stats lock") from None
    finally:
        os.close(held)
    run = Run(subprocess.CompletedProcess(argv, proc.returncode, out, err))
    assert run.code == 0 and run.status() == "hit", run.out + run.err
    assert "cannot save the counters" in run.err, run.err


def test_direct_mode_waits_for_the_stats_lock_as_a_run_ends() -> None:
    """Direct mode (standard library only) spells the full path's wait itself."""
    assert direct.STATS_LOCK_WAIT_S == counters.RUN_END_WAIT_S
