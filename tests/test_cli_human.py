"""Human output like ccache's, through the real CLI: aligned tables with
sensible units, hit rate, totals, plurals, progress bars only on a terminal, and a quiet
exit 0 when the reader of a pipe goes away."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from cachemgr.cli import human
from tests.conftest import ROOT, SOC, publish, run_cli
from tests.daemon_util import start_daemon

REQUEST = str(ROOT / "examples" / "requests" / "add_c.json")


def test_sizes_have_sensible_units() -> None:
    assert [human.size(n) for n in (0, 3, 1023, 3 * 1024, 1536 * 1024, 5 * 1024**3)] == [
        "0 B", "3 B", "1023 B", "3.0 KiB", "1.5 MiB", "5.0 GiB",
    ]  # fmt: skip
    assert human.size(1024**2 - 1) == "1.0 MiB" and human.size(None) == "-"
    assert [human.plural(n, "entry", "entries") for n in (0, 1, 2)] == [
        "0 entries", "1 entry", "2 entries",
    ]  # fmt: skip


def _cache(tmp_path: Path, sizes: list[int]) -> Path:
    root = tmp_path / "c"
    chip = root / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    for i, n in enumerate(sizes):
        publish(chip, f"te_add_{i}", b"k" * n, atime_s=1_700_000_000 + i)
    return root


def test_ls_is_an_aligned_table_with_human_sizes(clean_env: dict[str, str], tmp_path: Path) -> None:
    root = _cache(tmp_path, [3 * 1024, 5, 2 * 1024 * 1024])
    proc = run_cli("ls", "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == [
        "SOC",
        "KERNEL",
        "OP",
        "TYPE",
        "SIZE",
        "LAST",
        "ACCESS",
        "(UTC)",
        "PARTS",
    ]
    kernel_col = lines[0].index("KERNEL")
    assert all(line[kernel_col:].startswith("te_add_") for line in lines[1:])
    size_end = lines[0].index("SIZE") + len("SIZE")
    # the SIZE column is right-aligned: every size ends where the header ends
    assert all(line[size_end - 1] in "BKiMi" and line[size_end] == " " for line in lines[1:])
    sizes = [line[:size_end].split("  ")[-1].strip() for line in lines[1:]]
    json_sizes = [3 * 1024, 5, 2 * 1024 * 1024]
    assert any(s.endswith("KiB") for s in sizes) and "0.0 MiB" not in proc.stdout
    assert sorted(sizes) == sorted(
        human.size(n + len_json(root, i)) for i, n in enumerate(json_sizes)
    )
    assert "2023-11-14 22:13:20" in proc.stdout  # the access time, readable, in UTC
    assert proc.stderr.strip().startswith("3 entries, ")
    raw = run_cli("ls", "--bytes", "--cache-dir", str(root), env=clean_env)
    assert "BYTES" in raw.stdout.splitlines()[0] and " KiB" not in raw.stdout


def len_json(root: Path, i: int) -> int:
    return (root / "kernel_cache" / SOC / f"te_add_{i}.json").stat().st_size


def test_stats_shows_hit_rate_sizes_limits_and_fill(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    d = start_daemon(tmp_path, "--cache-dir", str(root))
    env = dict(d.env)
    env.pop("NOTIFY_SOCKET", None)
    try:
        for _ in range(2):  # a miss that compiles, then a hit
            assert run_cli("compile", REQUEST, "--cache-dir", str(root), env=env).returncode == 0
        proc = run_cli("stats", "--cache-dir", str(root), env=env)
    finally:
        d.stop()
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Hits:" in out and "1 / 2 (50.00 %)" in out, out
    assert "Limit:" in out and "500 MiB per chip folder, 50 % kept after an eviction" in out
    row = next(line for line in out.splitlines() if line.startswith(f"{SOC}:"))
    assert "1 entry, " in row and " KiB of 500.0 MiB (0.0 % full)" in row, row
    assert not re.search(r"(?<![0-9.])0\.0 MiB", out)  # never "0.0 MiB" for a few KiB


def test_gc_dry_run_lists_with_v_and_totals(clean_env: dict[str, str], tmp_path: Path) -> None:
    root = _cache(tmp_path, [400 * 1024] * 3)
    env = {**clean_env, "ASCEND_MAX_OP_CACHE_SIZE": "1", "ASCEND_REMAIN_CACHE_SIZE_RATIO": "50"}
    args = ["gc", "--dry-run", "--min-age", "0", "--local", "--cache-dir", str(root)]
    plain = run_cli(*args, env=env)
    verbose = run_cli(*args, "-v", env=env)
    assert plain.returncode == verbose.returncode == 0, plain.stderr
    assert "would evict 2 entries" in plain.stdout and "  would evict " not in plain.stdout
    listed = [
        ln.split()[-1] for ln in verbose.stdout.splitlines() if ln.startswith("  would evict ")
    ]
    assert listed == [f"{SOC}/te_add_0", f"{SOC}/te_add_1"]  # least recently accessed first
    total = plain.stdout.strip().splitlines()[-1]
    assert total.startswith("total: would free ") and total.endswith(
        "in 1 chip folder; would evict 2 entries"
    ), total
    assert len(list((root / "kernel_cache" / SOC).glob("*.json"))) == 3  # a dry run


def _on_a_terminal(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run the CLI with stdout and stderr on a pseudo-terminal; its exit code and output."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns
    proc = subprocess.Popen(
        [sys.executable, "-m", "cachemgr", *args], stdout=slave, stderr=slave, env=env
    )
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            proc.kill()
            pytest.fail(f"no output for 120 s from {args}")
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return proc.wait(timeout=60), out.decode(errors="replace")


def test_progress_bars_on_a_terminal_only(clean_env: dict[str, str], tmp_path: Path) -> None:
    root = _cache(tmp_path, [10] * 3)
    cache = ["--cache-dir", str(root), "--local"]
    code, out = _on_a_terminal(["gc", "--min-age", "0", *cache], clean_env)
    assert code == 0 and "gc: chip folders" in out and "folder" in out, out
    code, out = _on_a_terminal(["compile", REQUEST, REQUEST, *cache], clean_env)
    assert code == 0 and "compile: " in out and "kernel" in out, out
    code, out = _on_a_terminal(["purge", "--all", "--yes", *cache[:2]], clean_env)
    assert code == 0 and "purge: " in out, out
    piped = run_cli("gc", "--min-age", "0", *cache, env=clean_env)
    assert "gc: chip folders" not in piped.stdout + piped.stderr
    code, out = _on_a_terminal(["gc", "-q", *cache], clean_env)
    assert code == 0 and "gc: chip folders" not in out, out


def test_ls_into_head_exits_0_quietly(clean_env: dict[str, str], tmp_path: Path) -> None:
    root = tmp_path / "c"
    chip = root / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    for i in range(1500):  # far more than a pipe buffer of ls lines
        publish(chip, f"te_add_{i:05d}", b"k")
    bash = shutil.which("bash") or "bash"
    script = (
        f"set -o pipefail; {sys.executable} -m cachemgr ls --cache-dir {root} 2>{tmp_path}/err"
        " | head -2"
    )
    proc = subprocess.run([bash, "-c", script], env=clean_env, capture_output=True, text=True)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert len(proc.stdout.splitlines()) == 2
    assert (tmp_path / "err").read_text() == ""


def test_purge_and_verify_plurals(clean_env: dict[str, str], tmp_path: Path) -> None:
    root = _cache(tmp_path, [10])
    verify = run_cli("verify", "--cache-dir", str(root), env=clean_env)
    assert "checked 1 entry in 1 chip folder; 0 bad" in verify.stdout, verify.stdout
    purge = run_cli("purge", "--all", "--yes", "--cache-dir", str(root), env=clean_env)
    assert purge.returncode == 0, purge.stderr
    assert f"{SOC}: removed 1 entry, 2 files (" in purge.stdout, purge.stdout


def test_stats_shows_the_queue_only_from_a_daemon(tmp_path: Path) -> None:
    """``Queue jobs: 0`` was listed among the running totals (hits, compiles…) although it
    is the daemon's queue now, which the ``Queue`` line already gives (queued + running).
    The text shows the queue once, on that line, and only from a daemon (a local run has
    none); ``--json`` keeps the daemon's ``queue_jobs``. (``-v``: the default report leaves
    an empty queue out.)"""
    root = tmp_path / "cache"
    d = start_daemon(tmp_path, "--cache-dir", str(root))
    env = dict(d.env)
    env.pop("NOTIFY_SOCKET", None)
    try:
        assert run_cli("compile", REQUEST, "--cache-dir", str(root), env=env).returncode == 0
        daemon = run_cli("stats", "-v", "--cache-dir", str(root), env=env)
        as_json = run_cli("stats", "--json", "--cache-dir", str(root), env=env)
        local = run_cli("stats", "-v", "--local", "--cache-dir", str(root), env=env)
    finally:
        d.stop()
    for proc in (daemon, as_json, local):
        assert proc.returncode == 0, proc.stderr
    assert "(via daemon)" in daemon.stdout and "Compiles:" in daemon.stdout, daemon.stdout
    assert "Queue jobs" not in daemon.stdout, daemon.stdout
    queue = [ln for ln in daemon.stdout.splitlines() if ln.startswith("Queue")]
    assert len(queue) == 1 and "0 queued, 0 running" in queue[0], daemon.stdout
    assert json.loads(as_json.stdout)["queue_jobs"] == 0
    assert "(via local)" in local.stdout and "Compiles:" in local.stdout, local.stdout
    assert "Queue" not in local.stdout, local.stdout


def test_stats_local_says_a_daemon_of_this_cache_has_unsaved_counters(tmp_path: Path) -> None:
    """``stats --local`` next to a daemon of the same cache misses what the daemon counted
    since its last save (every counters_save_interval_s): one note line says so, with the
    interval; none once the daemon is gone, none for another cache, none without --local."""
    root = tmp_path / "cache"
    config = tmp_path / "cachemgr.toml"
    config.write_text("[daemon]\ncounters_save_interval_s = 3600\n")
    d = start_daemon(tmp_path, "--cache-dir", str(root), "--config", str(config))
    env = dict(d.env)
    env.pop("NOTIFY_SOCKET", None)
    args = ["--cache-dir", str(root)]
    try:
        assert run_cli("compile", REQUEST, *args, env=env).returncode == 0
        local = run_cli("stats", "--local", *args, env=env)
        other = run_cli("stats", "--local", "--cache-dir", str(tmp_path / "other"), env=env)
        routed = run_cli("stats", *args, env=env)
    finally:
        d.stop()
    after = run_cli("stats", "--local", *args, env=env)
    for proc in (local, other, routed, after):
        assert proc.returncode == 0, proc.stderr
    notes = [ln for ln in local.stdout.splitlines() if ln.startswith("note:")]
    assert len(notes) == 1, local.stdout
    assert "a daemon serves this cache" in notes[0] and "every 3600 s" in notes[0], notes
    assert "run without --local" in notes[0], notes
    for proc in (other, routed, after):
        assert "note:" not in proc.stdout, proc.stdout


def test_ls_shows_the_op_type_as_the_entry_records_it(tmp_path: Path, clean_env) -> None:
    """cachemgr's entry names are lower-cased (``te_softmaxv2_…``); ``ls`` showed that
    (``softmaxv2``) while the entry's json records ``SoftmaxV2``: text and ``--json`` now
    show the json's opType; an entry without one keeps its name's op type; its json's
    access time is left alone."""
    root = tmp_path / "cache"
    reqs = [str(ROOT / "examples" / "requests" / f"{n}.json") for n in ("add_c", "softmax_c")]
    done = run_cli("compile", *reqs, "--cache-dir", str(root), env=clean_env)
    assert done.returncode == 0, done.stderr
    chip = root / "kernel_cache" / SOC
    publish(chip, "te_plain_" + "ab" * 32, b"\x7fELF plain")  # no opType recorded
    past = 1_600_000_000
    for doc in chip.glob("*.json"):
        os.utime(doc, (past, doc.stat().st_mtime))
    text = run_cli("ls", "--cache-dir", str(root), env=clean_env)
    as_json = run_cli("ls", "--json", "--cache-dir", str(root), env=clean_env)
    assert text.returncode == 0 and as_json.returncode == 0, text.stderr + as_json.stderr
    ops = sorted(row["op_type"] for row in json.loads(as_json.stdout))
    assert ops == ["Add", "SoftmaxV2", "plain"], ops
    shown = sorted(line.split()[2] for line in text.stdout.splitlines()[1:])
    assert shown == ["Add", "SoftmaxV2", "plain"], text.stdout
    assert all(doc.stat().st_atime == past for doc in chip.glob("*.json"))


def test_sizes_in_human_output_say_mib_never_mb(tmp_path: Path, clean_env) -> None:
    """``Limit: 500 MB per chip folder`` stood next to ``88.4 KiB of 500.0 MiB``: one unit
    style, MiB (SPEC: MB means MiB), in stats, limits show and gc's fallback warning."""
    root = tmp_path / "cache"
    assert run_cli("compile", REQUEST, "--cache-dir", str(root), env=clean_env).returncode == 0
    args = ["--cache-dir", str(root)]
    stats = run_cli("stats", *args, env=clean_env)
    limits = run_cli("limits", "show", *args, env=clean_env)
    gc = run_cli("gc", "--dry-run", *args, env={**clean_env, "ASCEND_MAX_OP_CACHE_SIZE": "8x"})
    for proc in (stats, limits, gc):
        assert proc.returncode == 0, proc.stderr
        assert not re.search(r"\d MB\b", proc.stdout + proc.stderr), proc.stdout + proc.stderr
    assert "500 MiB per chip folder" in stats.stdout and "of 500.0 MiB" in stats.stdout
    assert "max_op_cache_size       500 MiB" in limits.stdout, limits.stdout
    assert "max_op_cache_size=8 MiB (env)" in gc.stderr, gc.stderr


@pytest.mark.parametrize("route", ["--local", None])
def test_stats_limit_line_names_each_settings_origin(
    tmp_path: Path, clean_env: dict[str, str], route: str | None
) -> None:
    """A remain ratio from the environment beside the default size: the Limit line says where
    each came from, on the full path and on the fast one (one origin was given for both)."""
    root = tmp_path / "cache"
    publish(root / "kernel_cache" / SOC, "te_one", b"\x7fELF" + bytes(64))
    env = {**clean_env, "ASCEND_REMAIN_CACHE_SIZE_RATIO": "70"}
    args = ["stats", "--cache-dir", str(root), *([route] if route else [])]
    proc = run_cli(*args, env=env)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("Limit:"))
    assert re.sub(r": +", ": ", line) == (
        "Limit: 500 MiB per chip folder (from default), 70 % kept after an eviction (from env)"
    ), line
