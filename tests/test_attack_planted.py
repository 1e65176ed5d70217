"""Outside review (attacker's view): what a hostile member of the cache's group plants in a
shared kernel cache, and what a careless operator types. Each test failed before its fix:
a command that hung for minutes, a kernel that failed forever, an internal error, or an
operator's terminal rewritten by a file name (docs/security.md items 2, 3, 4, 11)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, SOC, run_cli

REQUEST = ROOT / "examples" / "requests" / "add_c.json"
#: Far beyond any cap; sparse, so it costs no disk (reading it would take hours).
HUGE = 100 << 30
#: A command that reads a planted giant would run for minutes; every one here ends well
#: within this (seconds, also on a loaded machine).
QUICK_S = 60


def _request(tmp_path: Path) -> Path:
    data = json.loads(REQUEST.read_text())
    data["kernel_source"] = str((REQUEST.parent / data["kernel_source"]).resolve())
    path = tmp_path / "add.json"
    path.write_text(json.dumps(data))
    return path


def _compiled(tmp_path: Path, env: dict[str, str]) -> tuple[Path, Path, str]:
    """A cache at ``tmp_path/root`` with one compiled kernel: (root, chip folder, kernel)."""
    root = tmp_path / "root"
    proc = run_cli(
        "compile", "--local", "--json", "--cache-dir", str(root), str(_request(tmp_path)), env=env
    )
    assert proc.returncode == 0, proc.stderr
    kernel = json.loads(proc.stdout.splitlines()[0])["kernel_name"]
    return root, root / "kernel_cache" / SOC, kernel


def _one_line_no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("planted", ["op_cache.ini", f"cachemgr_stats_{SOC}.json"])
def test_a_huge_sparse_ini_or_counters_file_holds_no_command(
    clean_env: dict[str, str], tmp_path: Path, planted: str
) -> None:
    """A member truncates ``op_cache.ini`` (or the counters file) to 100 GiB, sparse: every
    compile, gc, stats and purge of every user read it whole — minutes, then memory. Now it
    is not read: an oversized ini is an invalid one (env/default limits, never a purge), an
    oversized counters file counts as empty."""
    root, chip, kernel = _compiled(tmp_path, clean_env)
    with open(root / "kernel_cache" / planted, "wb") as giant:
        giant.truncate(HUGE)
    req = str(_request(tmp_path))
    for args in (
        ("compile", "--local", "--replace", req),
        ("stats", "--local"),
        ("gc", "--local"),
        ("ls",),
    ):
        proc = run_cli(*args, "--cache-dir", str(root), env=clean_env, timeout=QUICK_S)
        assert proc.returncode == 0, (args, proc.stderr)
        _one_line_no_traceback(proc)
        if planted == "op_cache.ini" and args[0] != "ls":
            assert "more than 1048576" in proc.stderr and "env or defaults" in proc.stderr
    assert (chip / f"{kernel}.json").exists()  # never a purge for an unreadable ini
    proc = run_cli(
        "purge", "--all", "--yes", "--cache-dir", str(root), env=clean_env, timeout=QUICK_S
    )
    assert proc.returncode == 0, proc.stderr
    assert not (chip / f"{kernel}.json").exists()


@pytest.mark.parametrize("planted", ["cachemgr_stats.json", f"cachemgr_stats_{SOC}.json"])
def test_a_deeply_nested_counters_file_holds_no_command(
    clean_env: dict[str, str], tmp_path: Path, planted: str
) -> None:
    """Attack review: a member writes 60 KB of ``[[[…]]]`` (under the counters file's size
    cap) as a counters file. Python's parser raised ``RecursionError``, which was not
    handled: every user's ``stats`` and in-process compile ended in 'internal error' (exit
    70, after the kernel was compiled) and the daemon's ``/stats`` answered 500 with a
    traceback in its log. It counts as a damaged file: empty, replaced at the next save."""
    root, _, _ = _compiled(tmp_path, clean_env)
    (root / "kernel_cache" / planted).write_text("[" * 30000 + "]" * 30000)
    req = str(_request(tmp_path))
    for args in (("compile", "--local", "--replace", req), ("stats", "--local"), ("stats",)):
        proc = run_cli(*args, "--cache-dir", str(root), env=clean_env, timeout=QUICK_S)
        assert proc.returncode == 0, (args, proc.stderr)
        _one_line_no_traceback(proc)


@pytest.mark.parametrize("route", ["--local", "daemon"])
def test_a_deeply_nested_request_file_is_one_line(
    clean_env: dict[str, str], tmp_path: Path, route: str, request: pytest.FixtureRequest
) -> None:
    """A request file of ``[[[…]]]`` (or one such field) ended in 'internal error:
    RecursionError' (exit 70): bad input gets one line naming the file, exit 2."""
    root = tmp_path / "cache"
    via = ["--local"]
    if route == "daemon":
        via = ["--socket", str(request.getfixturevalue("daemon").socket_path)]
    for name, text in (
        ("deep.json", "[" * 30000 + "]" * 30000),
        ("field.json", '{"op_type": ' + "[" * 30000 + "]" * 30000 + "}"),
    ):
        (tmp_path / name).write_text(text)
        proc = run_cli(
            "compile", *via, "--cache-dir", str(root), str(tmp_path / name), env=clean_env
        )
        assert proc.returncode == 2, proc.stderr
        _one_line_no_traceback(proc)
        assert f"{name}: JSON nested too deeply" in proc.stderr, proc.stderr


def test_a_huge_sparse_binary_is_a_bad_entry_never_hashed(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    """A member replaces a popular kernel's ``.o`` by a 100 GiB sparse file: each lookup of
    that kernel (every user's compile, the daemon's workers) and ``verify`` hashed it for
    hours. Now a binary over ``entry.MAX_BINARY_BYTES`` is a bad entry (``too_large``):
    verify says so at once and the next compile replaces it."""
    root, chip, kernel = _compiled(tmp_path, clean_env)
    binary = chip / f"{kernel}.o"
    good = binary.read_bytes()
    binary.unlink()
    with open(binary, "wb") as giant:
        giant.truncate(HUGE)
    proc = run_cli("verify", "--json", "--cache-dir", str(root), env=clean_env, timeout=QUICK_S)
    assert proc.returncode == 1, proc.stderr
    kinds = [
        p["kind"]
        for f in json.loads(proc.stdout)["chip_folders"][SOC]["findings"]
        for p in f["problems"]
    ]
    assert kinds == ["too_large"], proc.stdout
    proc = run_cli(
        "compile",
        "--local",
        "--json",
        "--cache-dir",
        str(root),
        str(_request(tmp_path)),
        env=clean_env,
        timeout=QUICK_S,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[0])["status"] == "compiled"
    assert binary.read_bytes() == good


@pytest.mark.parametrize("with_content", [False, True], ids=["empty", "not_empty"])
@pytest.mark.parametrize("lock", ["chip", "entry"])
def test_a_folder_planted_as_a_lock_file_never_fails_the_compile(
    clean_env: dict[str, str], tmp_path: Path, lock: str, with_content: bool
) -> None:
    """``mkdir <kernel>.lock`` (or ``<soc>.chip.lock``) made every compile of that kernel
    (of that chip) fail with ``[Errno 21] Is a directory`` — forever, for every user. Now an
    empty folder there is removed (its name only) and the kernel is cached; a folder with
    something in it stays, and the kernel is compiled outside the cache with one warning
    naming it."""
    root, chip, kernel = _compiled(tmp_path, clean_env)
    planted = (
        chip / f"{kernel}.lock" if lock == "entry" else root / "kernel_cache" / f"{SOC}.chip.lock"
    )
    planted.unlink()
    planted.mkdir()
    if with_content:
        (planted / "notes").write_text("a member's")
    proc = run_cli(
        "compile",
        "--local",
        "--replace",
        "--json",
        "--cache-dir",
        str(root),
        str(_request(tmp_path)),
        env=clean_env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    _one_line_no_traceback(proc)
    outcome = json.loads(proc.stdout.splitlines()[0])
    assert outcome["status"] == "compiled"
    if with_content:
        assert outcome["policy"]["cached"] is False
        assert f"{planted} is a folder where a lock file belongs" in proc.stderr
        assert (planted / "notes").read_text() == "a member's"
    else:
        assert outcome["policy"]["cached"] is True
        assert planted.is_file()


def test_a_folder_planted_as_ges_eviction_lock_skips_only_that_chip_folder(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    """A non-empty folder named ``op_cache_file_del.lock`` stopped the whole ``gc`` and
    ``purge`` (every chip folder) with ``error: Is a directory``. Now that one chip folder
    is skipped with one line (exit 1: something was not done) and the others are processed."""
    root, chip, kernel = _compiled(tmp_path, clean_env)
    other = root / "kernel_cache" / "Ascend310P3"
    other.mkdir()
    (other / "te_x_1.o").write_bytes(b"orphan")
    os.utime(other / "te_x_1.o", (1, 1))  # an old orphan binary: gc reclaims it
    planted = chip / "op_cache_file_del.lock"
    planted.mkdir()
    (planted / "keep").write_text("x")
    proc = run_cli(
        "gc",
        "--local",
        "--ratio",
        "0",
        "--min-age",
        "0",
        "--cache-dir",
        str(root),
        env=clean_env,
        timeout=QUICK_S,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    _one_line_no_traceback(proc)
    assert f"{SOC}: skipped: op_cache_file_del.lock: is a folder" in proc.stdout
    assert not (other / "te_x_1.o").exists()  # the other chip folder was processed
    assert (chip / f"{kernel}.json").exists()  # nothing evicted without GE's lock
    proc = run_cli("purge", "--all", "--yes", "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 1 and f"{SOC}: skipped" in proc.stdout, proc.stdout + proc.stderr
    _one_line_no_traceback(proc)
    assert (chip / f"{kernel}.json").exists() and (planted / "keep").exists()


@pytest.mark.parametrize(
    "line",
    [
        "reconcile_interval_s = 1e308",
        "reconcile_jitter_s = 1e308",
        "idle_timeout_s = inf",
        "idle_timeout_s = 0",
        "heartbeat_timeout_s = inf",
        "workers = 99999999999999999999999999",
        "max_body_bytes = 99999999999999999999",
    ],
)
def test_config_values_that_overflow_are_one_line_exit_2(tmp_path: Path, line: str) -> None:
    """A careless ``[daemon]`` value: ``reconcile_interval_s = 1e308`` stopped ``serve`` with
    ``internal error: OverflowError``; ``idle_timeout_s = inf`` or ``0`` started a daemon
    whose every connection failed (``hung up``); ``workers = 10**26`` made ``serve``
    allocate until the OOM killer came. Now ``config`` and ``serve`` say which value is
    wrong and what is accepted, exit 2, before anything starts."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[daemon]\n{line}\n")
    key = line.split(" = ")[0]
    proc = run_cli("config", "--config", str(cfg), timeout=QUICK_S)
    assert proc.returncode == 2, proc.stderr
    where = re.escape(f"cachemgr: error: config file {cfg}:2: [daemon] {key} = ")
    assert re.fullmatch(rf"{where}.* is invalid; accepted: .+\n", proc.stderr), proc.stderr
    sock = tmp_path / "s" / "cachemgr.sock"
    sock.parent.mkdir()
    proc = run_cli(
        "serve",
        "--allow-root",
        "--config",
        str(cfg),
        "--cache-dir",
        str(tmp_path / "root"),
        "--socket",
        str(sock),
        timeout=QUICK_S,
    )
    assert proc.returncode == 2 and f"[daemon] {key} = " in proc.stderr, proc.stderr
    _one_line_no_traceback(proc)
    assert not sock.exists()


@pytest.mark.parametrize(
    "args",
    [
        ("compile", "--local", "--timeout", "nan"),
        ("compile", "--local", "--timeout", "inf"),
        ("compile", "--local", "--timeout", "1e300"),
        ("status", "--wait", "nan"),
        ("stop", "--wait", "inf"),
    ],
)
def test_seconds_on_the_command_line_are_finite(
    clean_env: dict[str, str], tmp_path: Path, args: tuple[str, ...]
) -> None:
    """``compile --timeout nan`` compiled nothing and ended with ``cannot convert float NaN
    to integer`` (exit 1, after reading the request); ``status --wait nan`` never returned.
    Now each is one usage line, exit 2."""
    extra = (
        [str(_request(tmp_path)), "--cache-dir", str(tmp_path / "root")]
        if args[0] == "compile"
        else ["--socket", str(tmp_path / "none.sock")]
    )
    proc = run_cli(*args, *extra, env=clean_env, timeout=QUICK_S)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "is not a number of seconds" in proc.stderr, proc.stderr
    assert not (tmp_path / "root").exists()


def test_names_a_member_chooses_cannot_forge_lines_or_drive_the_terminal(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    """File names are a member's to choose: ``te_x<ESC>]0;title<BEL><ESC>[2J_...json`` and a
    name with a newline went raw to the operator's terminal through ``ls``, ``verify`` and
    ``gc -v`` (ESC sequences retitle or clear it; a newline forges a ``verify`` line) and to
    the daemon's log. Now they are escaped in text output and logs; ``--json`` keeps the
    exact name."""
    root, chip, _kernel = _compiled(tmp_path, clean_env)
    evil = [b"te_x\x1b]0;pwned\x07\x1b[2J_1", b"te_n\nBAD forged_2", b"te_u\xff\xfe_3"]
    for name in evil:
        with open(os.path.join(os.fsencode(chip), name + b".json"), "wb") as f:
            f.write(b"{}")
        os.utime(os.path.join(os.fsencode(chip), name + b".json"), (1, 1))
    for args in (("ls",), ("verify",), ("-v", "gc", "--local", "--min-age", "0", "--ratio", "0")):
        proc = subprocess.run(
            [sys.executable, "-m", "cachemgr", *args, "--cache-dir", str(root)],
            env=clean_env,
            capture_output=True,
            timeout=QUICK_S,
        )
        out = proc.stdout + proc.stderr
        assert b"\x1b" not in out and b"\x07" not in out and b"\xff" not in out, (args, out)
        assert not re.search(rb"^BAD forged", out, re.M), (args, out)
        assert b"te_x\\x1b]0;pwned\\x07\\x1b[2J_1" in out, (args, out)
        assert b"te_u\\xff\\xfe_3" in out and b"te_n\\nBAD forged_2" in out, (args, out)


def test_a_read_only_root_is_one_clear_line_for_purge_zero_and_a_dry_run(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    """A careless operator on a root remounted read-only (after an I/O error): ``gc
    --dry-run`` (which only reads) failed with ``error: Read-only file system:
    …/op_cache_file_del.lock``, and ``purge`` and ``stats --zero`` with the same raw line.
    Now the dry run shows its plan (exit 0) and the others say what gc says, exit 1;
    nothing changes."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], check=True)
    try:
        root, chip, kernel = _compiled(mnt, clean_env)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        dry = run_cli("gc", "--local", "--dry-run", "--cache-dir", str(root), env=clean_env)
        assert dry.returncode == 0, dry.stderr
        assert f"{SOC}: " in dry.stdout and "would evict 0 entries" in dry.stdout
        for args, tail in (
            (("purge", "--all", "--yes"), "purge: {} nothing was removed"),
            (("stats", "--local", "--zero"), "stats --zero: {} counters unchanged"),
        ):
            proc = run_cli(*args, "--cache-dir", str(root), env=clean_env)
            assert proc.returncode == 1, proc.stderr
            why = f"the cache root {root / 'kernel_cache'} is on a read-only filesystem;"
            assert proc.stderr == f"cachemgr: error: {tail.format(why)}\n", proc.stderr
        assert (chip / f"{kernel}.json").exists()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "giant"])
def test_a_config_file_that_never_ends_is_one_line_exit_2(tmp_path: Path, kind: str) -> None:
    """``--config`` (or ``CACHEMGR_CONFIG``) naming a FIFO hung every command, ``/dev/zero``
    or a sparse giant read until memory ran out. Now the file must be a regular file of at
    most 1 MiB (a link to one is fine): one line naming it, exit 2."""
    path = tmp_path / "c.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as giant:
            giant.truncate(HUGE)
    for args in (("config",), ("stats", "--local", "--cache-dir", str(tmp_path / "r"))):
        proc = run_cli(*args, "--config", str(path), timeout=QUICK_S)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"cachemgr: error: config file {path}: ")
        assert proc.stderr.count("\n") == 1, proc.stderr
    good = tmp_path / "real.toml"
    good.write_text("[daemon]\nworkers = 2\n")
    link = tmp_path / "link.toml"
    link.symlink_to(good)
    proc = run_cli("config", "--config", str(link), timeout=QUICK_S)
    assert proc.returncode == 0 and "daemon.workers = 2" in proc.stdout, proc.stderr


def test_a_kernel_compiled_outside_the_cache_reaches_another_filesystem(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    """A root remounted read-only (or a lock never released) makes a compile run outside the
    cache and hand its kernel to the current directory — which is usually on another
    filesystem than ``$TMPDIR`` (work in ``/home``, ``/tmp`` a tmpfs). The hand-over was an
    ``os.replace``: ``[Errno 18] Invalid cross-device link``, exit 1, the kernel lost. Now it
    is copied across (json last), and the compile succeeds
    (docs/security.md#12-a-read-only-or-full-cache-root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    root_mnt, out_mnt = tmp_path / "root", tmp_path / "work"
    mounted = []
    try:
        for mnt in (root_mnt, out_mnt):
            mnt.mkdir()
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], check=True
            )
            mounted.append(mnt)
        (root_mnt / "kernel_cache").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(root_mnt)], check=True)
        proc = run_cli(
            "compile",
            "--local",
            "--json",
            "--cache-dir",
            str(root_mnt),
            str(_request(tmp_path)),
            env=clean_env,
            cwd=out_mnt,
            timeout=QUICK_S,
        )
        assert proc.returncode == 0, proc.stderr
        _one_line_no_traceback(proc)
        outcome = json.loads(proc.stdout.splitlines()[0])
        assert outcome["status"] == "compiled" and outcome["policy"]["cached"] is False
        kernel = outcome["kernel_name"]
        doc = json.loads((out_mnt / f"{kernel}.json").read_text())
        binary = (out_mnt / f"{kernel}.o").read_bytes()
        assert hashlib.sha256(binary).hexdigest() == doc["sha256"]
        assert sorted(p.name for p in out_mnt.iterdir()) == [f"{kernel}.json", f"{kernel}.o"]
    finally:
        for mnt in mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize(
    ("var", "raw", "value"),
    [
        ("ASCEND_MAX_OP_CACHE_SIZE", "300MB", 300),
        ("ASCEND_MAX_OP_CACHE_SIZE", "1.5", 1),
        ("ASCEND_MAX_OP_CACHE_SIZE", "٣٠٠", 500),  # Arabic-Indic digits: not std::stoi's
        ("ASCEND_MAX_OP_CACHE_SIZE", "2147483647", 500),  # GE: [1, INT_MAX) or -1
        ("ASCEND_REMAIN_CACHE_SIZE_RATIO", "x", 0),
        ("ASCEND_REMAIN_CACHE_SIZE_RATIO", "50%", 50),
    ],
)
def test_env_limits_are_read_as_ge_reads_them(
    clean_env: dict[str, str], tmp_path: Path, var: str, raw: str, value: int
) -> None:
    """A careless ``export ASCEND_MAX_OP_CACHE_SIZE=300MB``: GE reads it with ``std::stoi``
    (300; ``te_cache_space_manager.cc`` ``GetCacheSpaceMaxSizeCfg``) while cachemgr used
    Python's ``int()`` — 500 for ``300MB`` or ``1.5``, but 300 for Arabic-Indic digits that
    GE refuses — and the ratio GE reads with ``std::atoi`` (``x`` is 0). Two evictors on one
    folder then disagreed on its limit. Now cachemgr applies GE's value, and says so in one
    warning line (``config`` exits 2)."""
    proc = run_cli(
        "config", "--json", "--cache-dir", str(tmp_path / "r"), env={**clean_env, var: raw}
    )
    assert proc.returncode == 2, proc.stderr
    key = "max_op_cache_size" if "MAX" in var else "remain_cache_size_ratio"
    assert json.loads(proc.stdout)[key]["value"] == value
    lines = [line for line in proc.stderr.splitlines() if var in line]
    assert len(lines) == 1 and f"{var}={raw!r}" in lines[0], proc.stderr


def _request_with_attrs(tmp_path: Path, attrs_json: str, name: str) -> Path:
    text = _request(tmp_path).read_text()
    path = tmp_path / f"{name}.json"
    path.write_text(text.replace('"attrs": {}', f'"attrs": {attrs_json}'))
    assert path.read_text() != text
    return path


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ('{"a": ' * 40 + "1" + "}" * 40, "attrs nested deeper than 32 levels"),
        ('{"x": [1, 1e999]}', "attrs.x[1]=inf is not a finite number"),
    ],
    ids=["deep", "nested_inf"],
)
def test_attrs_a_kernel_json_cannot_hold_are_refused_before_compiling(
    clean_env: dict[str, str], tmp_path: Path, attrs: str, message: str
) -> None:
    """``attrs`` nested 40 deep compiled, then failed to publish (the entry json is nested
    deeper than ``entry.MAX_JSON_DEPTH``): a compile for nothing, exit 1. An ``inf`` inside a
    list ended in ``cannot serialise the key material``, naming neither file nor field. Now
    both are exit 2 before anything compiles, naming the attribute; 30 levels still compile
    into a valid entry."""
    root = tmp_path / "root"
    bad = _request_with_attrs(tmp_path, attrs, "bad")
    proc = run_cli("compile", "--local", "--cache-dir", str(root), str(bad), env=clean_env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"cachemgr: error: {bad}: {message}\n" or (
        proc.stderr.startswith(f"cachemgr: error: {bad}: attrs.a.a") and message in proc.stderr
    ), proc.stderr
    assert not list(root.glob(f"kernel_cache/{SOC}/*"))  # nothing compiled, nothing stored
    ok = _request_with_attrs(tmp_path, '{"a": ' * 30 + "1" + "}" * 30, "ok")
    proc = run_cli("compile", "--local", "--json", "--cache-dir", str(root), str(ok), env=clean_env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[0])["policy"]["cached"] is True
    assert run_cli("verify", "--cache-dir", str(root), env=clean_env).returncode == 0
