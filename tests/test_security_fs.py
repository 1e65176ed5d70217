"""docs/security.md#filesystem-nothing-outside-the-cache-is-ever-touched (its sections
1-4): planted links, special files, an unreadable op_cache.ini and unbounded values, each run
the way a hostile member of the sharing group would run it — as a real Unix user where the
attack needs one (``tests/users_util.py``; root only, skipped with the reason otherwise).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cachemgr.client import Client
from cachemgr.compile import kernel_meta
from cachemgr.constants import short_host
from tests.conftest import ROOT, SOC, publish, run_cli
from tests.daemon_util import Daemon, daemon_env, start_daemon, wait_first_scan, wait_for
from tests.proc_util import fd_targets
from tests.shared_util import kernel_request
from tests.users_util import Runtime, Users, run_as, user_home

HOUR_AGO = time.time() - 3 * 3600


# --- helpers --------------------------------------------------------------------------------


def _shared_root(users: Users) -> Path:
    """The shared root of docs/shared-cache.md: root:<group>, 2775."""
    root = users.base / "shared"
    root.mkdir()
    shutil.chown(root, "root", users.group)
    root.chmod(0o2775)
    return root


def _toolkit(base: Path) -> dict[str, str]:
    """A world-readable toolkit whose versions are known (so an unstamped cache is purged)."""
    home = base / "toolkit"
    for sub, version in (("compiler", "7.0.0"), ("opp", "7.0.1")):
        (home / sub).mkdir(parents=True)
        (home / sub / "version.info").write_text(f"Version={version}\n")
    for path in [base / "toolkit", *home.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return {"ASCEND_HOME_PATH": str(home), "ASCEND_OPP_PATH": str(home / "opp")}


def _env(rt: Runtime, home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_", "CACHEMGR_"))}
    env.update(PYTHONPATH=rt.pythonpath, HOME=str(home), **(extra or {}))
    return env


def _as(
    users: Users, name: str, rt: Runtime, *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``cachemgr ARGS`` as user ``name`` (a member of the group unless carol)."""
    return subprocess.run(
        [rt.python, "-m", "cachemgr", *args],
        env=env,
        cwd=env["HOME"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **run_as(name, users),  # type: ignore[arg-type]
    )


def _as_shell(users: Users, name: str, script: str) -> None:
    """Run a shell ``script`` as user ``name`` (the attacker's hands)."""
    done = subprocess.run(
        ["sh", "-c", script],
        capture_output=True,
        text=True,
        check=False,
        **run_as(name, users),  # type: ignore[arg-type]
    )
    assert done.returncode == 0, (script, done.stderr)


def _snapshot(folder: Path) -> dict[str, Any]:
    """Everything about a folder tree that an attack could change: names, types, modes,
    owners, link counts, contents and modification times (lstat: links are not followed)."""
    out: dict[str, Any] = {}
    for path in sorted([folder, *folder.rglob("*")]):
        st = os.lstat(path)
        data = path.read_bytes() if stat.S_ISREG(st.st_mode) else None
        out[str(path.relative_to(folder))] = (
            stat.filemode(st.st_mode),
            st.st_uid,
            st.st_nlink if not stat.S_ISDIR(st.st_mode) else None,
            st.st_mtime_ns if not stat.S_ISDIR(st.st_mode) else None,
            data,
        )
    return out


def _victim(users: Users, owner: str) -> Path:
    """``owner``'s private folder with files that look like cache leftovers: an old binary
    without json, an old temp file, a lock file, notes — in a folder named like a chip."""
    home = users.base / owner
    if not home.exists():
        user_home(users, owner)
    work = home / "work"
    chip_like = work / SOC
    chip_like.mkdir(parents=True)
    (chip_like / "notes.txt").write_text("my notes")
    (chip_like / "model.o").write_bytes(b"\x7fELF my model")
    (chip_like / "run.lock").write_text("")
    (chip_like / "draft.temp").write_text("half written")
    (work / "plan.txt").write_text("keep")
    for path in [work, *work.rglob("*")]:
        if not path.is_dir():
            os.utime(path, (HOUR_AGO, HOUR_AGO))
        shutil.chown(path, owner, users.group)
        path.chmod(0o700 if path.is_dir() else 0o600)
    return work


def _planted_kernel_cache_link(users: Users) -> tuple[Path, Path, Path]:
    """The shared root, alice's private folder, and ``kernel_cache``: bob, a member, has
    replaced it (the root is group-writable) by a link to that folder."""
    root = _shared_root(users)
    victim = _victim(users, users.alice)
    link = root / "kernel_cache"
    _as_shell(users, users.bob, f"ln -s {victim} {link}")
    return root, victim, link


def _request_file(folder: Path, rt: Runtime, n: int, **options: Any) -> Path:
    data = kernel_request(n, **options)
    data["kernel_source"] = str(rt.kernels / "c" / "add.c")
    path = folder / f"req{n}.json"
    path.write_text(json.dumps(data))
    path.chmod(0o644)
    return path


def _one_line_naming(stderr: str, *needles: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    hits = [line for line in lines if all(n in line for n in needles)]
    assert hits, f"no line names {needles}: {stderr!r}"


# --- security.md 1: no link is followed at any step -----------------------------------------------


def test_gc_purge_verify_and_compile_never_reach_through_a_planted_kernel_cache_link(
    users: Users, other_runtime: Runtime
) -> None:
    root, victim, link = _planted_kernel_cache_link(users)
    before = _snapshot(victim)
    # alice's own commands run against the link bob planted
    home = users.base / users.alice
    env = _env(other_runtime, home, _toolkit(users.base))
    request = _request_file(users.base, other_runtime, 1)
    for args in (
        ["gc"],
        ["gc", "--ratio", "0", "--min-age", "0"],
        ["purge", "--all", "--yes"],
        ["verify", "--repair"],
        ["stats"],
        ["compile", str(request)],
    ):
        proc = _as(users, users.alice, other_runtime, *args, "--cache-dir", str(root), env=env)
        expected = {1, 2} if args[0] == "compile" else {2}  # a failed compile exits 1
        assert proc.returncode in expected, (args, proc.stdout, proc.stderr)
        _one_line_naming(proc.stderr, str(link), "symbolic link")
        assert _snapshot(victim) == before, args
    assert os.readlink(link) == str(victim)


def test_the_daemon_start_reclaims_nothing_through_a_planted_kernel_cache_link(
    users: Users, other_runtime: Runtime
) -> None:
    root, victim, link = _planted_kernel_cache_link(users)
    before = _snapshot(victim)
    home = users.base / users.alice
    env = daemon_env(home)
    for sub in ("home", "run", "state"):
        shutil.chown(home / sub, users.alice)
    env.update(PYTHONPATH=other_runtime.pythonpath, **_toolkit(users.base))
    daemon = start_daemon(
        home,
        "--cache-dir",
        str(root),
        env=env,
        notify=False,
        wait_ready=False,
        python=other_runtime.python,
        popen_kw=run_as(users.alice, users),
    )
    try:
        code = daemon.proc.wait(timeout=120)
    finally:
        if daemon.proc.poll() is None:
            daemon.stop()
    assert code == 2, daemon.log()
    _one_line_naming(daemon.log(), str(link), "symbolic link")
    assert _snapshot(victim) == before


def _hold_lock(path: Path) -> subprocess.Popen[str]:
    """A process that holds an fcntl lock on ``path`` until its stdin closes."""
    code = (
        "import fcntl, os, sys\n"
        f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT, 0o664)\n"
        "fcntl.lockf(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _has_open(pid: int, folder: Path) -> bool:
    return str(folder) in fd_targets(pid)


def test_a_kernel_cache_swapped_for_a_link_during_a_purge_cannot_redirect_it(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    chip = root / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    publish(chip, "te_mine_1", b"one")
    publish(chip, "te_mine_2", b"two")
    victim = tmp_path / "victim"
    (victim / SOC).mkdir(parents=True)
    publish(victim / SOC, "te_theirs_1", b"theirs")  # a whole entry, by its names
    (victim / SOC / "precious.lock").write_text("")
    (victim / SOC / "loose.o").write_bytes(b"loose")
    before = _snapshot(victim)
    holder = _hold_lock(chip / "op_cache_file_del.lock")  # a gc runs: purge waits for it
    purge = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cachemgr",
            "purge",
            "--soc",
            SOC,
            "--yes",
            "--cache-dir",
            str(root),
        ],
        env=clean_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _has_open(purge.pid, chip), 60, "purge to open the chip folder")
        # the attack, mid-operation: the checked folder moves away, a link takes its name
        os.rename(root / "kernel_cache", root / "moved")
        os.symlink(victim, root / "kernel_cache")
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    _out, err = purge.communicate(timeout=120)
    assert "Traceback" not in err, err
    assert _snapshot(victim) == before
    left = sorted(p.name for p in (root / "moved" / SOC).iterdir())
    # purged where it began (lock files stay: a GE process may hold one)
    assert not [n for n in left if n.endswith((".json", ".o"))], left


def test_a_compile_creates_nothing_through_a_linked_chip_folder(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    (root / "kernel_cache").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    os.symlink(victim, root / "kernel_cache" / SOC)
    data = kernel_request(3)
    data["kernel_source"] = str(ROOT / "examples" / "kernels" / "c" / "add.c")
    req = tmp_path / "req.json"
    req.write_text(json.dumps(data))
    proc = run_cli("compile", str(req), "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 2, proc.stderr
    _one_line_naming(proc.stderr, str(root / "kernel_cache" / SOC), "symlink")
    assert list(victim.iterdir()) == []


def test_kernel_meta_reaping_never_follows_a_link(tmp_path: Path) -> None:
    """``kernel_meta`` (the daemon reaps dead processes' folders in it) replaced by a link to
    a folder holding a dead process's folder: nothing there is removed."""
    work = tmp_path / "work"
    work.mkdir()
    elsewhere = tmp_path / "elsewhere"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = short_host()
    folder = elsewhere / f"{host}_{dead.pid}"
    folder.mkdir(parents=True)
    owner = {"host": host, "pid": dead.pid, "start": "1"}
    (folder / kernel_meta.OWNER_FILE).write_text(json.dumps(owner))
    (folder / "results.o").write_bytes(b"someone's results")
    (folder / ".build-te_x-1").mkdir()  # what a dead compile leaves: reaped in kernel_meta
    (folder / ".build-te_x-1" / "te_x.o").write_bytes(b"partial")
    before = _snapshot(elsewhere)
    os.symlink(elsewhere, work / "kernel_meta")
    assert kernel_meta.reap_orphans(work / "kernel_meta") == []
    assert _snapshot(elsewhere) == before
    os.unlink(work / "kernel_meta")  # a real kernel_meta is still reaped
    (work / "kernel_meta").mkdir()
    shutil.copytree(folder, work / "kernel_meta" / folder.name)
    build = work / "kernel_meta" / folder.name / ".build-te_x-1"
    assert kernel_meta.reap_orphans(work / "kernel_meta") == [build]
    assert not build.exists() and (build.parent / "results.o").exists()


# --- security.md 2: a planted special file affects that one item only -----------------------------


def _compile_json(users: Users, rt: Runtime, env: dict[str, str], root: Path, *args: str) -> Any:
    proc = _as(
        users, users.alice, rt, "compile", "--json", *args, "--cache-dir", str(root), env=env
    )
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    return json.loads(proc.stdout.splitlines()[-1])


def test_a_symlinked_entry_lock_does_not_block_its_kernel_and_is_never_followed(
    users: Users, other_runtime: Runtime
) -> None:
    root = _shared_root(users)
    home = user_home(users, users.alice)
    env = _env(other_runtime, home)
    private = home / "private"
    private.mkdir()
    secret = private / "secret.txt"
    secret.write_text("alice only")
    for path in (private, secret):
        shutil.chown(path, users.alice)
        path.chmod(0o700 if path.is_dir() else 0o600)
    before = _snapshot(private)
    request = _request_file(users.base, other_runtime, 4)
    first = _compile_json(users, other_runtime, env, root, str(request))
    kernel, chip = first["kernel_name"], root / "kernel_cache" / SOC
    lock = chip / f"{kernel}.lock"
    _as_shell(users, users.bob, f"rm -f {lock} && ln -s {secret} {lock}")
    # --replace takes the entry lock: today it never gets it
    again = _compile_json(users, other_runtime, env, root, "--replace", str(request))
    assert again["status"] == "compiled"
    assert not lock.is_symlink()
    _as_shell(users, users.bob, f"rm -f {lock} && ln -s {secret} {lock}")
    repaired = _as(
        users, users.alice, other_runtime, "verify", "--repair", "--cache-dir", str(root), env=env
    )
    assert "Traceback" not in repaired.stderr
    assert not lock.is_symlink(), repaired.stdout
    assert (chip / f"{kernel}.json").exists()  # the entry itself is good and stays
    assert _snapshot(private) == before


def test_planted_fifos_sockets_links_and_hard_links_affect_only_their_item(
    users: Users, other_runtime: Runtime
) -> None:
    root = _shared_root(users)
    home = user_home(users, users.alice)
    env = _env(other_runtime, home)
    team = home / "team"
    team.mkdir()
    shared_doc = team / "team.txt"  # alice's file the group may edit, so bob may link it
    shared_doc.write_text("team notes")
    for path in (team, shared_doc):
        shutil.chown(path, users.alice, users.group)
        path.chmod(0o750 if path.is_dir() else 0o660)
    requests = [_request_file(users.base, other_runtime, n) for n in (5, 6)]
    kernels = [
        _compile_json(users, other_runtime, env, root, str(r))["kernel_name"] for r in requests
    ]
    chip = root / "kernel_cache" / SOC
    before = _snapshot(shared_doc.parent)
    bind = "import socket; socket.socket(socket.AF_UNIX).bind('te_sock_1.o')"
    _as_shell(
        users,
        users.bob,
        f"cd {chip} && mkfifo te_fifo_1.json && ln -s {shared_doc} te_link_1.json"
        f" && rm -f {kernels[1]}.lock && ln {shared_doc} {kernels[1]}.lock"
        f" && ln {shared_doc} te_hard_1.json"
        f' && {other_runtime.python} -c "{bind}"',
    )
    assert stat.S_ISSOCK(os.lstat(chip / "te_sock_1.o").st_mode)
    if True:
        # the daemon-free paths: a compile that takes the (hard-linked) lock, verify, gc
        again = _compile_json(users, other_runtime, env, root, "--replace", str(requests[1]))
        assert again["status"] == "compiled"
        verify = _as(
            users,
            users.alice,
            other_runtime,
            "verify",
            "--json",
            "--cache-dir",
            str(root),
            env=env,
            timeout=60,
        )
        assert verify.returncode == 1 and "Traceback" not in verify.stderr
        found = json.loads(verify.stdout)["chip_folders"][SOC]
        assert found["checked"] >= 2
        names = {f["name"] for f in found["findings"]}
        assert {"te_fifo_1.json", "te_link_1.json", "te_hard_1.json"} <= names, names
        gc = _as(
            users, users.alice, other_runtime, "gc", "--cache-dir", str(root), env=env, timeout=60
        )
        assert gc.returncode == 0 and "Traceback" not in gc.stderr, gc.stderr
        repair = _as(
            users,
            users.alice,
            other_runtime,
            "verify",
            "--repair",
            "--cache-dir",
            str(root),
            env=env,
            timeout=60,
        )
        assert repair.returncode == 0, (repair.stdout, repair.stderr)
    left = {p.name for p in chip.iterdir()}
    assert not left & {"te_fifo_1.json", "te_link_1.json", "te_hard_1.json", "te_sock_1.o"}
    for kernel in kernels:  # the good entries were processed and kept
        assert f"{kernel}.json" in left and f"{kernel}.o" in left
    after = _snapshot(shared_doc.parent)
    assert after == before  # never chmod-ed, written or followed (link counts back to 1)


# --- security.md 3: an unreadable op_cache.ini ----------------------------------------------------


def _alice_daemon(
    home: Path, root: Path, users: Users, rt: Runtime, env: dict[str, str] | None = None
) -> Daemon:
    """A daemon run by alice on ``root``, its home ``home/d`` (her own), ``env`` added."""
    daemon_home = home / "d"
    daemon_home.mkdir()
    denv = daemon_env(daemon_home)
    for sub in [daemon_home, *daemon_home.iterdir()]:
        shutil.chown(sub, users.alice)
    denv.update(PYTHONPATH=rt.pythonpath, **(env or {}))
    return start_daemon(
        daemon_home,
        "--cache-dir",
        str(root),
        env=denv,
        notify=False,
        python=rt.python,
        popen_kw=run_as(users.alice, users),
    )


def test_an_unreadable_ini_is_warned_about_once_and_never_stops_or_purges(
    users: Users, other_runtime: Runtime
) -> None:
    root = _shared_root(users)
    home = user_home(users, users.alice)
    env = _env(other_runtime, home, _toolkit(users.base))
    request = _request_file(users.base, other_runtime, 7)
    kernel = _compile_json(users, other_runtime, env, root, str(request))["kernel_name"]
    entry_json = root / "kernel_cache" / SOC / f"{kernel}.json"
    ini = root / "kernel_cache" / "op_cache.ini"
    # bob writes the ini only he may read (stamps of another toolkit: a purge, were it read)
    _as_shell(
        users,
        users.bob,
        f"rm -f {ini} && umask 077 && printf '[op_compiler_cache]\\nmax_op_cache_size=1\\n"
        f"remain_cache_size_ratio=10\\nadk_version=1\\nops_version=1\\n' > {ini}",
    )
    assert stat.S_IMODE(ini.stat().st_mode) == 0o600
    ini_before = ini.read_bytes()
    for args in (["gc"], ["stats"], ["ls"], ["compile", str(request)]):
        proc = _as(users, users.alice, other_runtime, *args, "--cache-dir", str(root), env=env)
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
        _one_line_naming(proc.stderr, str(ini), users.bob, "-rw-------")
        assert entry_json.exists(), args  # never purged for it
    config = _as(
        users, users.alice, other_runtime, "config", "--json", "--cache-dir", str(root), env=env
    )
    assert "Traceback" not in config.stderr
    limits = {k: v for k, v in json.loads(config.stdout).items() if "cache_size" in k}
    assert {v["origin"] for v in limits.values()} == {"default"}, limits
    daemon = _alice_daemon(home, root, users, other_runtime, _toolkit_env_of(env))
    try:
        client = Client(
            daemon.socket_path, timeout_s=120, local_hits=False, daemon_user=users.alice
        )
        for _ in range(3):
            assert client.compile_file(str(request)).to_json()["status"] in ("hit", "compiled")
        client.gc()
        client.stats()
    finally:
        daemon.stop()
    log = daemon.log()
    warned = [ln for ln in log.splitlines() if "WARNING" in ln and f"{ini} is not readable" in ln]
    assert len(warned) == 1 and users.bob in warned[0] and "-rw-------" in warned[0], log
    assert entry_json.exists()
    assert ini.read_bytes() == ini_before


@pytest.mark.parametrize("kind", ["fifo", "symlink", "folder"])
def test_a_planted_ini_is_an_invalid_ini_not_a_stop(
    kind: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    chip = root / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    publish(chip, "te_kept_1", b"kept")
    ini = root / "kernel_cache" / "op_cache.ini"
    outside = tmp_path / "outside.ini"
    outside.write_text("[op_compiler_cache]\nmax_op_cache_size=1\nremain_cache_size_ratio=1\n")
    {
        "fifo": lambda: os.mkfifo(ini),
        "symlink": lambda: ini.symlink_to(outside),
        "folder": ini.mkdir,
    }[kind]()
    env = {**clean_env, **_toolkit(tmp_path)}
    for args in (["gc"], ["stats"], ["verify"]):
        proc = run_cli(*args, "--cache-dir", str(root), env=env, timeout=60)
        assert proc.returncode == 0, (args, proc.stderr)
        _one_line_naming(proc.stderr, str(ini))
    assert (chip / "te_kept_1.json").exists()  # never purged for it
    assert outside.read_text().startswith("[op_compiler_cache]")


def _toolkit_env_of(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("ASCEND_")}


# --- security.md 4: bounded values in cache files -------------------------------------------------

HOSTILE = {
    "digits": None,  # written out by hand: Python refuses to make such an int
    "size": lambda good: {**good, "pad": "x" * (6 << 20)},
    "nesting": lambda good: {**good, "compileInfo": _nest(200)},
    "deep": None,  # 100,000 levels: the parser itself gives up
}


def _nest(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": [value]}
    return value


def _write_hostile(path: Path, kind: str) -> None:
    if kind == "deep":
        path.write_text('{"a":' * 100000 + "1" + "}" * 100000)
        return
    good = json.loads(path.read_text())
    if kind == "digits":  # json.dumps itself refuses such an int: write the digits out
        text = json.dumps({**good, "blockDim": 0}).replace(
            '"blockDim": 0', '"blockDim": ' + "9" * 5000
        )
        path.write_text(text)
        return
    path.write_text(json.dumps(HOSTILE[kind](good)))


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_unbounded_values_make_an_entry_bad_never_an_internal_error(
    kind: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    data = kernel_request(8)
    data["kernel_source"] = str(ROOT / "examples" / "kernels" / "c" / "add.c")
    req = tmp_path / "req.json"
    req.write_text(json.dumps(data))

    def compile_(*extra: str) -> dict[str, Any]:
        proc = run_cli(
            "compile", "--json", *extra, str(req), "--cache-dir", str(root), env=clean_env
        )
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        return json.loads(proc.stdout.splitlines()[-1])

    kernel = compile_()["kernel_name"]
    entry_json = root / "kernel_cache" / SOC / f"{kernel}.json"
    _write_hostile(entry_json, kind)
    verify = run_cli("verify", "--json", "--cache-dir", str(root), env=clean_env)
    assert verify.returncode == 1 and "Traceback" not in verify.stderr, verify.stderr
    findings = json.loads(verify.stdout)["chip_folders"][SOC]["findings"]
    assert [f["name"] for f in findings] == [kernel]
    assert compile_()["status"] == "compiled"  # the bad entry gave way to a fresh one
    _write_hostile(entry_json, kind)
    assert compile_("--mode", "force")["status"] == "compiled"
    _write_hostile(entry_json, kind)
    env = daemon_env(tmp_path)
    daemon = start_daemon(tmp_path, "--cache-dir", str(root), env=env)
    try:
        found = daemon.client.lookup(SOC, kernel)
        assert found["status"] == "miss" and found["removed_bad_entry"], found
        assert daemon.client.compile_file(str(req)).to_json()["status"] == "compiled"
    finally:
        daemon.stop()
    _write_hostile(entry_json, kind)
    repair = run_cli("verify", "--repair", "--cache-dir", str(root), env=clean_env)
    assert repair.returncode == 0 and not entry_json.exists(), repair.stdout


def test_verify_by_another_member_leaves_a_fresh_header_manifest_alone(
    users: Users, other_runtime: Runtime
) -> None:
    """Outside review (atk): bob compiles (his header manifest is fresh: never read since
    written); alice's ``verify`` on a relatime mount may not read it — the read would move
    its access time, which only bob could put back — so it was reported
    ``bad_manifest`` (exit 1) and ``verify --repair`` deleted bob's valid manifest. Now it is
    ``not_checked`` like another member's entry, and stays."""
    root = _shared_root(users)
    bob_home, alice_home = user_home(users, users.bob), user_home(users, users.alice)
    request = _request_file(users.base, other_runtime, 7)
    done = _as(
        users,
        users.bob,
        other_runtime,
        "compile",
        "--local",
        "--cache-dir",
        str(root),
        str(request),
        env=_env(other_runtime, bob_home),
    )
    assert done.returncode == 0, done.stderr
    chip = root / "kernel_cache" / SOC
    manifests = sorted(chip.glob("*.manifest"))
    assert len(manifests) == 1 and manifests[0].stat().st_uid != os.getuid()
    st = manifests[0].stat()
    if st.st_atime_ns > st.st_mtime_ns:
        pytest.skip("the manifest was read since written; nothing to protect here")
    for args in (("verify",), ("verify", "--repair")):
        proc = _as(
            users,
            users.alice,
            other_runtime,
            *args,
            "--json",
            "--cache-dir",
            str(root),
            env=_env(other_runtime, alice_home),
        )
        report = json.loads(proc.stdout)
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        assert report["chip_folders"][SOC]["findings"] == [], proc.stdout
        assert manifests[0].name in report["chip_folders"][SOC]["not_checked"]
    assert manifests[0].exists()
    assert manifests[0].stat().st_atime_ns == st.st_atime_ns  # never read by alice


# --- security.md 3b: a member's private chip folder (attack review) -------------------------------


def _two_chip_folders(users: Users, root: Path) -> dict[str, list[Path]]:
    """Alice's shared cache with old entries in two chip folders (group-shared, as
    docs/shared-cache.md sets it up); the kernel → json path of each."""
    kc = root / "kernel_cache"
    made: dict[str, list[Path]] = {}
    for soc in (SOC, "Ascend310P3"):
        made[soc] = [
            publish(kc / soc, f"te_add_{soc}_{i:02d}", os.urandom(2048), HOUR_AGO) for i in range(3)
        ]
    for path in [kc, *(p for soc in made for p in [kc / soc, *(kc / soc).iterdir()])]:
        shutil.chown(path, users.alice, users.group)
        path.chmod(0o2775 if path == kc else 0o2770 if path.is_dir() else 0o660)
    return made


@pytest.mark.parametrize("mode", ["700", "755"])
def test_a_members_private_chip_folder_is_skipped_with_one_warning_never_a_stop(
    mode: str, users: Users, other_runtime: Runtime
) -> None:
    root = _shared_root(users)
    made = _two_chip_folders(users, root)
    private = root / "kernel_cache" / "AAAbob"  # sorts first: it used to stop every run
    _as_shell(users, users.bob, f"mkdir -m {mode} {private}")
    home = user_home(users, users.alice)
    env = _env(other_runtime, home)
    look = stat.filemode(private.stat().st_mode)  # setgid from the root: drwx--S---

    # cachemgr gc: the other chip folders are collected; exit 1 (partial), one line on bob's
    gc = _as(users, users.alice, other_runtime, "gc", "--ratio", "0", "--min-age", "0",
             "--cache-dir", str(root), env=env)  # fmt: skip
    assert gc.returncode == 1, (gc.stdout, gc.stderr)
    _one_line_naming(gc.stdout + gc.stderr, str(private), users.bob, look)
    said = [ln for ln in gc.stderr.splitlines() if str(private) in ln]
    assert len(said) == 1 and f"chip folder {private.name} skipped (denied): " in said[0], said
    assert "not removed (permission)" not in gc.stderr, gc.stderr  # a folder, not a file
    assert not any(p.exists() for paths in made.values() for p in paths), gc.stdout
    made = _two_chip_folders(users, root)
    # ls, verify, stats, purge: the other chip folders done, one line naming bob's folder
    for args in (["ls"], ["verify"], ["stats"], ["purge", "--all", "--yes"]):
        proc = _as(users, users.alice, other_runtime, *args, "--cache-dir", str(root), env=env)
        assert proc.returncode in (0, 1), (args, proc.stdout, proc.stderr)
        if mode == "700" or args[0] == "purge":  # 755: readable, so listed (and empty)
            _one_line_naming(proc.stdout + proc.stderr, str(private), users.bob, look)
        if args == ["ls"]:
            assert all(p.stem in proc.stdout for paths in made.values() for p in paths)
    assert not any(p.exists() for paths in made.values() for p in paths)  # purged
    made = _two_chip_folders(users, root)

    # the daemon starts (it refused: exit 2), its first scan completes, /gc collects the rest
    daemon = _alice_daemon(home, root, users, other_runtime)
    try:
        client = Client(
            daemon.socket_path, timeout_s=120, local_hits=False, daemon_user=users.alice
        )
        wait_first_scan(daemon)
        scan = client.health()["scan"]
        assert (
            scan["state"] == "done" and scan["chip_folders_done"] == scan["chip_folders_total"] == 3
        ), scan
        report = client.gc(ratio=0, min_age_s=0)
        assert report.chip_folders["AAAbob"].skipped
        assert report.chip_folders["AAAbob"].denied
        for soc, paths in made.items():
            assert report.chip_folders[soc].evicted_entries == len(paths), report.to_json()
            assert not any(p.exists() for p in paths)
        # the watch check retries the folder every 2 s (watch_check_interval_s): two more
        # rounds at least, then bob opens it to the group: one warning, then one "again"
        time.sleep(4.5)
        if mode == "700":
            _as_shell(users, users.bob, f"chgrp {users.group} {private} && chmod 2770 {private}")
            wait_for(lambda: "can be scanned again" in daemon.log(), 30, "the scan of AAAbob")
    finally:
        daemon.stop()
    log = daemon.log()
    warned = [ln for ln in log.splitlines() if "WARNING" in ln and str(private) in ln]
    skipped = [ln for ln in warned if "is skipped" in ln or "never evicted" in ln]
    assert len(skipped) == 1 and users.bob in skipped[0] and look in skipped[0], log
    if mode == "700":
        assert len(warned) == 2 and "can be scanned again" in warned[1], log
    else:  # readable: served (its entries are counted), never evicted
        assert len(warned) == 1, log
    assert "Traceback" not in log
