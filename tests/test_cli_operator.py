"""The operator's CLI: explicit routing between a daemon and this
process, ``limits set``, ``stop``, shell completion and ``-v``/``-q`` after the subcommand —
all through the real CLI in subprocesses, against real daemons on real sockets."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cachemgr.client import Client
from tests.conftest import ROOT, SOC, publish, run_cli
from tests.daemon_util import Daemon, daemon_env, start_daemon
from tests.users_util import Runtime, Users, run_as, user_home

REQUEST = str(ROOT / "examples" / "requests" / "add_c.json")


def _env(d: Daemon) -> dict[str, str]:
    """The daemon's environment (its XDG_RUNTIME_DIR: its socket is the default one)."""
    env = dict(d.env)
    env.pop("NOTIFY_SOCKET", None)
    return env


def _one_line_exit_2(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# -- routing is explicit -----------------------------------------------------------


def test_a_mistyped_socket_is_an_error_not_a_silent_local_run(
    daemon: Daemon, cache_root: Path, tmp_path: Path
) -> None:
    wrong = tmp_path / "typo.sock"
    for cmd in (["stats"], ["gc", "--dry-run"], ["compile", REQUEST]):
        proc = run_cli(
            *cmd, "--cache-dir", str(cache_root), "--socket", str(wrong), env=_env(daemon)
        )
        _one_line_exit_2(proc, str(wrong), "--socket")
    env = {**_env(daemon), "CACHEMGR_SOCKET": str(wrong)}
    proc = run_cli("stats", "--cache-dir", str(cache_root), env=env)
    _one_line_exit_2(proc, "CACHEMGR_SOCKET", str(wrong))
    assert not (cache_root / "kernel_cache" / SOC).exists()  # nothing compiled in-process


def test_a_named_daemon_of_another_cache_is_an_error_naming_both(
    daemon: Daemon, tmp_path: Path, cache_root: Path
) -> None:
    other = tmp_path / "elsewhere"
    proc = run_cli(
        "stats", "--cache-dir", str(other), "--socket", str(daemon.socket_path), env=_env(daemon)
    )
    _one_line_exit_2(proc, str(other / "kernel_cache"), str(cache_root / "kernel_cache"))
    # without a named socket, the default one is used only for the same cache
    proc = run_cli("stats", "--json", "--cache-dir", str(other), env=_env(daemon))
    assert proc.returncode == 0, proc.stderr
    route = json.loads(proc.stdout)["route"]
    assert route["via"] == "local" and str(cache_root / "kernel_cache") in route["reason"]


def test_the_other_cache_error_names_the_option_to_add_and_it_works(
    daemon: Daemon, cache_root: Path, tmp_path: Path
) -> None:
    """A fresh user's ``compile req.json --socket S`` after ``serve --cache-dir D --socket S``:
    the error names the exact option to add (``pass --cache-dir D``), and adding it works."""
    import re
    import shlex

    sock = ["--socket", str(daemon.socket_path)]
    for cmd in (["compile", REQUEST], ["stats"], ["gc", "--dry-run"]):
        proc = run_cli(*cmd, *sock, env=_env(daemon))
        line = _one_line_exit_2(proc, f"pass --cache-dir {cache_root} (", "--local")
        hint = re.search(r"pass (--cache-dir \S+)", line)
        assert hint is not None, line
        fixed = run_cli(*cmd, *sock, *shlex.split(hint.group(1)), env=_env(daemon))
        assert fixed.returncode == 0, (cmd, fixed.stderr)


def test_default_socket_local_flag_and_the_verbose_route_line(
    daemon: Daemon, cache_root: Path
) -> None:
    args = ["--cache-dir", str(cache_root)]
    proc = run_cli("stats", "--json", "-v", *args, env=_env(daemon))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["via"] == "daemon" and data["route"]["socket"] == str(daemon.socket_path)
    routes = [ln for ln in proc.stderr.splitlines() if ln.startswith("cachemgr: route:")]
    assert routes == [
        f"cachemgr: route: daemon at {daemon.socket_path} ({data['route']['reason']})"
    ]
    local = run_cli("compile", REQUEST, "--json", "--local", *args, env=_env(daemon))
    assert local.returncode == 0, local.stderr
    line = json.loads(local.stdout)
    assert (line["status"], line["via"], line["route"]["reason"]) == (
        "compiled",
        "local",
        "--local",
    )
    quiet = run_cli("stats", *args, env=_env(daemon))  # no -v: no route line
    assert "route:" not in quiet.stderr
    both = run_cli("stats", "--local", "--socket", str(daemon.socket_path), *args)
    _one_line_exit_2(both, "--local", "--socket")


def test_routing_does_not_depend_on_option_values(daemon: Daemon, cache_root: Path) -> None:
    """``--timeout 600`` (the default value) and ``--timeout 599`` route the same way."""
    args = ["--cache-dir", str(cache_root), "--json"]
    vias = {}
    for timeout in ("600", "599"):
        proc = run_cli("compile", REQUEST, "--timeout", timeout, *args, env=_env(daemon))
        assert proc.returncode == 0, proc.stderr
        line = json.loads(proc.stdout)
        vias[timeout] = (line["via"], line["route"]["reason"])
    assert vias["600"] == vias["599"] == ("local", "--timeout runs the command in this process")
    plain = json.loads(run_cli("compile", REQUEST, *args, env=_env(daemon)).stdout)
    assert plain["via"] == "daemon"
    named = run_cli(
        "compile", REQUEST, "--workers", "2", "--socket", str(daemon.socket_path), *args,
        env=_env(daemon),
    )  # fmt: skip
    _one_line_exit_2(named, "--workers", str(daemon.socket_path))


# -- limits set, stop, completion, -v/-q after the subcommand -------------------------


def _toolkit(tmp_path: Path, adk: str = "8.0.RC1", ops: str = "8.0.RC1.b") -> dict[str, str]:
    home, opp = tmp_path / "toolkit", tmp_path / "opp"
    (home / "compiler").mkdir(parents=True)
    opp.mkdir()
    (home / "compiler" / "version.info").write_text(f"Version={adk}\n")
    (opp / "version.info").write_text(f"Version={ops}\n")
    return {"ASCEND_HOME_PATH": str(home), "ASCEND_OPP_PATH": str(opp)}


def test_limits_set_writes_a_stamped_ini_that_gc_and_config_use(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "c"
    args = ["--cache-dir", str(root), "--local"]
    env = {**clean_env, **_toolkit(tmp_path)}
    ini = root / "kernel_cache" / "op_cache.ini"
    proc = run_cli("limits", "set", "--max-size", "2000", "--ratio", "80", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    assert ini.read_text() == (
        "[op_compiler_cache]\nadk_version=8.0.RC1\nops_version=8.0.RC1.b\n"
        "max_op_cache_size=2000\nremain_cache_size_ratio=80\n"
    )
    ini.write_text("# kept\n" + ini.read_text() + "other_key=1\n")
    proc = run_cli("limits", "set", "--ratio", "60", *args, env=env)  # the size is kept
    assert proc.returncode == 0, proc.stderr
    text = ini.read_text()
    assert "# kept\n" in text and "other_key=1\n" in text and "max_op_cache_size=2000\n" in text
    assert "remain_cache_size_ratio=60\n" in text
    assert not [p for p in ini.parent.iterdir() if p.name.endswith(".temp")]
    config = json.loads(run_cli("config", "--json", *args[:2], env=env).stdout)
    assert config["max_op_cache_size"]["value"] == 2000
    assert config["max_op_cache_size"]["origin"] == "op_cache.ini"
    gc = json.loads(run_cli("gc", "--json", "--dry-run", *args, env=env).stdout)
    assert gc["toolkit"]["status"] == "match", gc["toolkit"]


def test_limits_show_says_when_there_is_no_ini(clean_env: dict[str, str], tmp_path: Path) -> None:
    """Without an op_cache.ini, ``limits show`` printed ``…/op_cache.ini: adk_version=-,
    ops_version=-`` as if the file existed: it says the file does not exist and what applies;
    with one (``limits set``), its stamps."""
    root = tmp_path / "c"
    ini = root / "kernel_cache" / "op_cache.ini"
    args = ["--cache-dir", str(root)]
    env = {**clean_env, "ASCEND_MAX_OP_CACHE_SIZE": "700"}
    none = run_cli("limits", "show", *args, env=env)
    assert none.returncode == 0, none.stderr
    assert "max_op_cache_size       700 MiB  (env ASCEND_MAX_OP_CACHE_SIZE)" in none.stdout
    last = none.stdout.splitlines()[-1]
    assert last.startswith(f"{ini} does not exist: ") and "ASCEND_MAX_OP_CACHE_SIZE" in last
    assert "defaults" in last and "adk_version" not in none.stdout, none.stdout
    setenv = {**clean_env, **_toolkit(tmp_path)}
    assert run_cli("limits", "set", "--ratio", "60", *args, "--local", env=setenv).returncode == 0
    shown = run_cli("limits", "show", *args, env=setenv)
    assert shown.stdout.splitlines()[-1] == (
        f"{ini}: adk_version=8.0.RC1, ops_version=8.0.RC1.b"
    ), shown.stdout


def test_limits_set_refuses_without_stamps_or_with_bad_values(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "c"
    args = ["--cache-dir", str(root), "--local"]
    proc = run_cli("limits", "set", "--max-size", "2000", *args, env=clean_env)
    _one_line_exit_2(proc, "stamps", "ASCEND_HOME_PATH")
    assert not (root / "kernel_cache" / "op_cache.ini").exists()
    env = {**clean_env, **_toolkit(tmp_path)}
    for option, bad in (("--max-size", "2k"), ("--max-size", "0"), ("--ratio", "101")):
        proc = run_cli("limits", "set", option, bad, *args, env=env)
        _one_line_exit_2(proc, f"{option}={bad!r}", "accepted")
    _one_line_exit_2(run_cli("limits", "set", *args, env=env), "--max-size", "--ratio")
    assert not (root / "kernel_cache" / "op_cache.ini").exists()


def test_limits_set_after_a_toolkit_change_asks_for_gc_first(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "c"
    chip = root / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    publish(chip, "te_add_1", b"kernel")
    (root / "kernel_cache" / "op_cache.ini").write_text(
        "[op_compiler_cache]\nadk_version=7.0\nops_version=7.0\nmax_op_cache_size=500\n"
        "remain_cache_size_ratio=50\n"
    )
    env = {**clean_env, **_toolkit(tmp_path)}
    proc = run_cli("limits", "set", "--max-size", "900", "--cache-dir", str(root), env=env)
    assert proc.returncode == 1 and "cachemgr gc" in proc.stderr, proc.stderr
    assert "adk_version=7.0" in (root / "kernel_cache" / "op_cache.ini").read_text()
    assert (chip / "te_add_1.json").exists()


def test_limits_set_without_an_ini_says_ge_purges_and_how_many_entries(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    """No op_cache.ini: GE's rule (``DelCachedFiles``) purges the chip folders at the next
    CANN start; ``limits set`` says so, with the entries per chip folder, before writing."""
    root = tmp_path / "c"
    for soc, n in ((SOC, 3), ("Ascend310P3", 2)):
        chip = root / "kernel_cache" / soc
        chip.mkdir(parents=True)
        for i in range(n):
            publish(chip, f"te_add_{i}", b"kernel%d" % i)
    env = {**clean_env, **_toolkit(tmp_path)}
    proc = run_cli("limits", "set", "--max-size", "900", "--cache-dir", str(root), env=env)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "op_cache.ini is missing" in proc.stderr and "nothing written" in proc.stderr
    assert "GE's rule purges the chip folders without one" in proc.stderr, proc.stderr
    assert "2 chip folders holding 5 entries here (Ascend310P3 2, Ascend910B1 3)" in proc.stderr
    assert not (root / "kernel_cache" / "op_cache.ini").exists()
    assert len(list((root / "kernel_cache" / SOC).glob("*.json"))) == 3


def test_limits_set_reloads_the_daemon_of_that_cache(tmp_path: Path, cache_root: Path) -> None:
    env = {**daemon_env(tmp_path), **_toolkit(tmp_path)}
    d = start_daemon(tmp_path, "--cache-dir", str(cache_root), env=env)
    try:
        proc = run_cli(
            "limits", "set", "--max-size", "1234", "--ratio", "70", "--cache-dir",
            str(cache_root), env=_env(d),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert f"the daemon at {d.socket_path} reloaded it" in proc.stdout
        assert d.client.config()["max_op_cache_size"]["value"] == 1234
    finally:
        d.stop()


def test_stop_stops_the_daemon_cleanly(tmp_path: Path, cache_root: Path) -> None:
    d = start_daemon(tmp_path, "--cache-dir", str(cache_root))
    try:
        proc = run_cli("stop", "--socket", str(d.socket_path), env=_env(d), timeout=180)
        assert proc.returncode == 0, proc.stderr
        assert f"pid {d.proc.pid} stopped" in proc.stdout
        assert d.proc.wait(timeout=60) == 0
        assert not d.socket_path.exists()
        again = run_cli("stop", "--socket", str(d.socket_path), env=_env(d))
        assert again.returncode == 1 and str(d.socket_path) in again.stderr
    finally:
        if d.proc.poll() is None:
            d.stop()


def test_status_and_stop_take_the_cache_dir_like_every_command(
    tmp_path: Path, cache_root: Path
) -> None:
    """The README says to add ``--cache-dir`` to each command; ``status`` and ``stop`` took
    none (exit 2, 'No such option'). Now they say whether the daemon serves that cache, and
    ``stop`` stops only the daemon of the cache named."""
    d = start_daemon(tmp_path, "--cache-dir", str(cache_root))
    sock = ("--socket", str(d.socket_path))
    other = tmp_path / "other"
    try:
        ours = run_cli("status", *sock, "--cache-dir", str(cache_root), env=_env(d))
        assert ours.returncode == 0, ours.stderr
        assert f"serves {cache_root / 'kernel_cache'}" in ours.stdout
        theirs = run_cli("status", *sock, "--cache-dir", str(other), env=_env(d))
        assert theirs.returncode == 1, (theirs.stdout, theirs.stderr)
        line = theirs.stderr.strip()
        assert "\n" not in line and f"serves {cache_root / 'kernel_cache'}" in line
        assert f"{other / 'kernel_cache'} (from option --cache-dir)" in line
        assert f"pass --cache-dir {cache_root}" in line
        alias = tmp_path / "alias"
        alias.symlink_to(cache_root)  # the same cache by another name: the same answer
        linked = run_cli("status", *sock, "--cache-dir", str(alias), env=_env(d))
        assert linked.returncode == 0, (linked.stdout, linked.stderr)
        assert linked.stderr.strip() == "", linked.stderr
        refused = _one_line_exit_2(
            run_cli("stop", *sock, "--cache-dir", str(other), env=_env(d)), "nothing stopped"
        )
        assert f"serves {cache_root / 'kernel_cache'}" in refused
        assert d.proc.poll() is None and Client(d.socket_path, local_hits=False).available()
        proc = run_cli("stop", *sock, "--cache-dir", str(cache_root), env=_env(d), timeout=180)
        assert proc.returncode == 0, proc.stderr
        assert d.proc.wait(timeout=60) == 0
    finally:
        if d.proc.poll() is None:
            d.stop()


def test_only_the_daemons_own_user_may_stop_it(users: Users, other_runtime: Runtime) -> None:
    home = user_home(users, users.alice)
    env = daemon_env(home)
    for sub in ("home", "run", "state"):
        shutil.chown(home / sub, users.alice)
    env["PYTHONPATH"] = other_runtime.pythonpath
    d = start_daemon(
        home, "--cache-dir", str(home / "cache"), env=env, notify=False,
        python=other_runtime.python, popen_kw=run_as(users.alice, users),
    )  # fmt: skip
    try:
        # root may stop it too, and a group member may not: tests/test_admin_endpoints.py
        assert Client(d.socket_path, local_hits=False, daemon_user=users.alice).available()
        own = subprocess.run(
            [other_runtime.python, "-m", "cachemgr", "stop", "--socket", str(d.socket_path)],
            env=_env(d), capture_output=True, text=True, timeout=180,
            **run_as(users.alice, users),  # type: ignore[arg-type]
        )  # fmt: skip
        assert own.returncode == 0, own.stderr
        assert d.proc.wait(timeout=60) == 0
    finally:
        if d.proc.poll() is None:
            d.stop()


def test_bash_completion_completes_commands_and_options(tmp_path: Path) -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.fail("bash is needed for the completion test")
    script = run_cli("completion", "bash")
    assert script.returncode == 0 and "_CACHEMGR_COMPLETE" in script.stdout, script.stderr
    shim = tmp_path / "bin" / "cachemgr"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m cachemgr "$@"\n')
    shim.chmod(0o755)
    (tmp_path / "c.sh").write_text(script.stdout)
    complete = 'COMPREPLY=(); _cachemgr_completion cachemgr; echo "${COMPREPLY[@]}"; '
    probe = (
        f"source {tmp_path / 'c.sh'}; "
        f"COMP_WORDS=(cachemgr li); COMP_CWORD=1; {complete}"
        f"COMP_WORDS=(cachemgr limits set --ra); COMP_CWORD=3; {complete}"
    )
    env = {**os.environ, "PATH": f"{shim.parent}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([bash, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines() == ["limits", "--ratio"], out.stdout + out.stderr
    for shell in ("zsh", "fish"):
        assert run_cli("completion", shell).returncode == 0
    _one_line_exit_2(run_cli("completion", "tcsh"), "tcsh")


def test_verbose_and_quiet_after_the_subcommand(clean_env: dict[str, str], tmp_path: Path) -> None:
    root = ["--cache-dir", str(tmp_path / "c"), "--local"]
    after = run_cli("stats", *root, "-v", env=clean_env)
    before = run_cli("-v", "stats", *root, env=clean_env)
    assert after.returncode == before.returncode == 0, after.stderr
    assert "cachemgr: route: this process (--local)" in after.stderr
    assert "cachemgr: route: this process (--local)" in before.stderr
    noisy = run_cli("verify", *root[:2], env=clean_env)
    assert "warning: no kernel cache" in noisy.stderr
    quiet = run_cli("verify", *root[:2], "-q", env=clean_env)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert run_cli("config", "-v", env=clean_env).returncode == 0
    assert run_cli("limits", "show", "-q", *root[:2], env=clean_env).returncode == 0
