"""One service for every kernel cache on a build host
(docs/daemon.md#governing-every-cache-on-a-build-host): real users, each with a ``$HOME/atc_data``
the GE twin filled over its own limit, and one governor (``serve --govern-only``) run with the
capability set of
``systemd/cachemgr-governor.service`` through ``setpriv``."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from cachemgr.client import DaemonError
from cachemgr.daemon import gcchild
from tests import ge_twin
from tests.daemon_util import daemon_env, start_daemon, wait_for
from tests.unit_util import GOVERNOR_UNIT, root_setpriv_argv
from tests.users_util import Runtime, Users, _remove_users, other_runtime, user_home, users

__all__ = ["other_runtime", "users"]

SOC = "Ascend910B1"
ENTRY_BYTES = 64 * 1024  # one GE twin entry's binary


def _fill(rt: Runtime, twin: Path, name: str, chip: Path, count: int, ini: str | None) -> None:
    """As user ``name``: the GE twin writes ``count`` entries of 64 KiB into ``chip`` (GE's
    modes: 0750 folders, 0640 files) and ``ini`` (``op_cache.ini``) beside the chip folder."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import ge_twin; from pathlib import Path\n"
        "chip = Path(sys.argv[2])\n"
        "for i in range(int(sys.argv[3])):\n"
        "    ge_twin.write_entry(chip, f'te_add_{i:04d}', size=int(sys.argv[4]))\n"
        "if len(sys.argv) > 5: (chip.parent / 'op_cache.ini').write_text(sys.argv[5])\n"
    )
    argv = [rt.python, "-c", script, str(twin), str(chip), str(count), str(ENTRY_BYTES)]
    done = subprocess.run(
        [*argv, *([ini] if ini else [])],
        user=name,
        group=name if _has_group(name) else None,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": os.environ.get("PATH", ""), "HOME": "/"},
        check=False,
    )
    assert done.returncode == 0, done.stderr


def _has_group(name: str) -> bool:
    import grp

    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def _ini(max_mb: int, ratio: int) -> str:
    return (
        "[op_compiler_cache]\nadk_version=7.0.0\nops_version=7.0.0\n"
        f"max_op_cache_size={max_mb}\nremain_cache_size_ratio={ratio}\n"
    )


def _owners(root: Path, but: Path) -> set[int]:
    """The owners of ``root`` and everything in it, ``but`` (a folder) and its files aside."""
    return {p.lstat().st_uid for p in [root, *root.rglob("*")] if but not in (p, *p.parents)}


def _add_user(name: str, home: Path) -> None:
    subprocess.run(["useradd", "-M", "-N", "-d", str(home), name], check=True, capture_output=True)


@pytest.fixture
def twin_dir() -> Path:
    """A world-readable copy of the GE twin (``tests/`` may sit in a private folder)."""
    folder = Path(tempfile.mkdtemp(prefix="cachemgr-twin-"))
    shutil.copy(Path(ge_twin.__file__), folder / "ge_twin.py")
    folder.chmod(0o755)
    (folder / "ge_twin.py").chmod(0o644)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_one_governor_keeps_every_users_cache_within_its_own_limit(
    users: Users, other_runtime: Runtime, twin_dir: Path, tmp_path: Path
) -> None:
    rt, base = other_runtime, users.base
    # alice 1 MB at 50 %, bob 1 MB at 20 %, carol 2 MB at 50 % (each their own op_cache.ini)
    plan = {users.alice: (1, 50, 24), users.bob: (1, 20, 24), users.carol: (2, 50, 48)}
    chips = {}
    for name, (max_mb, ratio, count) in plan.items():
        home = user_home(users, name)
        chips[name] = home / "atc_data" / "kernel_cache" / SOC
        _fill(rt, twin_dir, name, chips[name], count, _ini(max_mb, ratio))
        assert ge_twin.directory_size(chips[name]) > max_mb << 20  # over its limit
    # carol's private folder: a chip folder a root-run job left (root's, 0700): she may not
    # change it, so neither may the governor, which acts as her
    private = chips[users.carol].parent / "Ascend310P3"
    for i in range(24):
        ge_twin.write_entry(private, f"te_mul_{i:04d}", size=ENTRY_BYTES)
    private.chmod(0o700)
    private_files = sorted(p.name for p in private.iterdir())
    # a linked home: /base/eve -> a folder elsewhere holding an atc_data over its limit
    elsewhere = Path(tempfile.mkdtemp(prefix="cachemgr-elsewhere-"))
    linked_chip = elsewhere / "atc_data" / "kernel_cache" / SOC
    for i in range(24):
        ge_twin.write_entry(linked_chip, f"te_sub_{i:04d}", size=ENTRY_BYTES)
    shutil.chown(elsewhere, users.alice)
    for p in elsewhere.rglob("*"):
        shutil.chown(p, users.alice)
    (base / "eve").symlink_to(elsewhere)
    linked_before = sorted(p.name for p in linked_chip.iterdir())

    cfg = tmp_path / "governor.toml"
    cfg.write_text(
        "min_age_s = 0\n"
        f'[daemon]\ngovern = ["{base}/*/atc_data"]\n'
        "reconcile_interval_s = 1.5\nreconcile_jitter_s = 0\nevict_debounce_s = 0.2\n"
    )
    env = {**daemon_env(tmp_path), "PYTHONPATH": rt.pythonpath}
    sock = tmp_path / "run" / "governor.sock"
    fourth = f"cmd{os.urandom(3).hex()}"
    gov = start_daemon(
        tmp_path,
        "--govern-only",
        "--config",
        str(cfg),
        "--socket",
        str(sock),
        env=env,
        python=rt.python,
        prefix=root_setpriv_argv(GOVERNOR_UNIT),
    )
    try:
        # the unit's capability set, really: nothing else (CAP_DAC_OVERRIDE would have let
        # it into the private folder)
        status = Path(f"/proc/{gov.proc.pid}/status").read_text()
        eff = int(re.search(r"CapEff:\s*([0-9a-f]+)", status).group(1), 16)
        assert eff == (1 << 2) | (1 << 6) | (1 << 7), hex(eff)  # dac_read_search, setgid, setuid

        def at_target(name: str) -> bool:
            max_mb, ratio, _ = plan[name]
            return ge_twin.directory_size(chips[name]) <= (max_mb << 20) * ratio // 100

        for name in plan:
            wait_for(lambda n=name: at_target(n), 60, f"{name}'s cache at its own target")
        # each root brought to its own target, not one shared one: bob's (20 %) holds less
        sizes = {n: ge_twin.directory_size(chips[n]) for n in plan}
        assert sizes[users.bob] < sizes[users.alice] < sizes[users.carol], sizes
        # what the governor changed there, it changed as the root's owner: no file of root's
        for name in plan:
            uid = int(subprocess.check_output(["id", "-u", name]))
            assert _owners(chips[name].parents[1], private) == {uid}, name

        # a fourth user, created now, is governed after the next reconciliation
        home4 = base / fourth
        _add_user(fourth, home4)
        home4.mkdir()
        shutil.chown(home4, fourth)
        chip4 = home4 / "atc_data" / "kernel_cache" / SOC
        _fill(rt, twin_dir, fourth, chip4, 24, _ini(1, 50))
        wait_for(
            lambda: ge_twin.directory_size(chip4) <= (1 << 20) // 2, 60, "the fourth user's cache"
        )
        # several reconciliations later: the skips were each reported once
        done = gov.client.health()["governed"]["reconciliations"]
        wait_for(
            lambda: gov.client.health()["governed"]["reconciliations"] >= done + 3,
            30,
            "three more reconciliations",
        )
        log = gov.log()
        linked = [ln for ln in log.splitlines() if "is a symbolic link" in ln]
        assert len(linked) == 1 and str(base / "eve") in linked[0], log
        denied = [ln for ln in log.splitlines() if "Ascend310P3: skipped" in ln]
        assert len(denied) == 1 and "may not change it" in denied[0], log
        assert sorted(p.name for p in private.iterdir()) == private_files  # untouched
        assert sorted(p.name for p in linked_chip.iterdir()) == linked_before

        # status, stats --all and /metrics report every root
        health = gov.client.health()
        roots = health["governed"]["roots"]
        homes = {str(base / n / "atc_data") for n in [*plan, fourth]}
        assert set(roots) == homes, roots
        assert str(base / "eve" / "atc_data") in health["governed"]["skipped"]
        cli_env = {"PATH": os.environ["PATH"], "PYTHONPATH": rt.pythonpath, "HOME": "/"}
        status_out = subprocess.run(
            [rt.python, "-m", "cachemgr", "status", "--socket", str(sock)],
            capture_output=True, text=True, env=cli_env, check=True,
        ).stdout  # fmt: skip
        assert "govern only" in status_out and "governed: 4 cache roots" in status_out
        assert f"skipped {base / 'eve' / 'atc_data'}" in status_out
        stats = subprocess.run(
            [rt.python, "-m", "cachemgr", "stats", "--all", "--socket", str(sock), "--json"],
            capture_output=True, text=True, env=cli_env, check=True,
        ).stdout  # fmt: skip
        governed = json.loads(stats)["governed"]["roots"]
        alice_kc = governed[str(base / users.alice / "atc_data")]["kernel_caches"]
        row = alice_kc[str(chips[users.alice].parent)]["chip_folders"][SOC]
        assert row["max_bytes"] == 1 << 20 and row["target_bytes"] == (1 << 20) // 2
        carol_kc = governed[str(base / users.carol / "atc_data")]["kernel_caches"]
        assert (
            "may not change it"
            in carol_kc[str(chips[users.carol].parent)]["chip_folders"]["Ascend310P3"]["skipped"]
        )
        metrics = gov.client.request("GET", "/metrics")
        series = re.findall(r"^cachemgr_governed_used_bytes\{([^}]*)\}", metrics, re.M)
        labelled = [dict(re.findall(r'(\w+)="([^"]*)"', s)) for s in series]
        per_root = {d["root"] for d in labelled if d["soc_version"] == SOC}
        assert per_root == homes, metrics
        assert len([d for d in labelled if d["soc_version"] == SOC]) == len(homes)
        # and it compiles nothing: members use the compile service's socket
        with pytest.raises(DaemonError, match="only governs cache roots"):
            gov.client.request("POST", "/compile", {"request": {}, "base_dir": "/"})
        with pytest.raises(DaemonError, match="only governs cache roots"):
            gov.client.request("POST", "/gc", {})
        # the rights are real, not only a check of modes: a gc child as carol (the governor's
        # way of changing her cache) cannot even open the private folder
        owner = pwd.getpwnam(users.carol)
        (out,) = gcchild.run_jobs(
            [gcchild.GcJob(private, 1, 50, 0.0)], run_as=(owner.pw_uid, owner.pw_gid)
        )
        assert out.report is None and "Permission denied" in out.error, out
        assert sorted(p.name for p in private.iterdir()) == private_files
    finally:
        gov.stop()
        _remove_users([fourth])
        shutil.rmtree(elsewhere, ignore_errors=True)


@pytest.mark.parametrize(
    ("govern", "expected"),
    [
        ('["*/atc_data"]', "'*/atc_data' is not accepted: a glob of cache roots is an absolute"),
        ('["/*/atc_data"]', "'/*/atc_data' is not accepted"),
        ("[]", "serve --govern-only needs govern = [globs of cache roots]"),
        ('"/home/*"', "govern = '/home/*' is invalid; accepted: a list of absolute globs"),
    ],
)
def test_a_bad_govern_setting_is_one_line(tmp_path: Path, govern: str, expected: str) -> None:
    from tests.conftest import run_cli

    cfg = tmp_path / "g.toml"
    cfg.write_text(f"[daemon]\ngovern = {govern}\n")
    env = daemon_env(tmp_path)
    proc = run_cli("serve", "--govern-only", "--config", str(cfg), env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if "WARNING" not in ln]
    assert len(lines) == 1 and expected in lines[0], proc.stderr
