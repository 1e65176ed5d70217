"""CLI start-up (issue 14 item 1): what a ``cachemgr compile`` hit, ``--help`` and ``config``
import, read from ``python -X importtime`` of real processes (a real compile first, then a
real hit; locally and through a real daemon). Times are never asserted here: the ratios are
``scripts/bench --only startup``'s."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tests.compile_util import request_data
from tests.daemon_util import daemon_env, start_daemon

#: Modules a hit never needs: the daemon's machinery, schema validation, progress bars,
#: metrics, the remote tiers' clients, an HTTP server.
DENIED = (
    "jsonschema",
    "apscheduler",
    "watchdog",
    "tqdm",
    "prometheus_client",
    "http.server",
    "socketserver",
    "requests",
    "redis",
    "urllib3",
    "cachemgr.daemon.service",
    "cachemgr.daemon.server",
    "cachemgr.compile.publisher",
    "cachemgr.remote.tierset",
    "cachemgr.eviction",
    # read only with a config file / for temp names: a hit without a config file needs none
    "tomllib",
    "secrets",
)
#: Without a daemon nothing speaks HTTP, so its client is not imported either.
DENIED_LOCAL = (*DENIED, "http.client", "email", "ssl")


def imported(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[set[str], str]:
    """The modules ``python -X importtime -m cachemgr *argv`` imported, and its stdout.

    :raises AssertionError: the command failed.
    """
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cachemgr", *argv],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return names, proc.stdout


#: Denied packages' modules a hit may import: the typed results re-export the gc result types
#: of ``cachemgr.eviction.report``, whose package ``__init__`` loads nothing else (PEP 562).
ALLOWED = ("cachemgr.eviction", "cachemgr.eviction.report")


def denied(names: set[str], deny: tuple[str, ...]) -> list[str]:
    """The imported modules on the deny-list (a package or any of its submodules), less
    :data:`ALLOWED`."""
    return sorted(
        n for n in names if n not in ALLOWED and any(n == d or n.startswith(d + ".") for d in deny)
    )


@pytest.fixture
def hit_setup(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """A request compiled once (a real gcc compile): the compile argv and an environment
    without a daemon."""
    env = daemon_env(tmp_path)
    req = tmp_path / "req.json"
    req.write_text(json.dumps(request_data()))
    argv = ["compile", "--json", "--cache-dir", str(tmp_path / "cache"), str(req)]
    first = subprocess.run(
        [sys.executable, "-m", "cachemgr", *argv], env=env, capture_output=True, text=True
    )
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["status"] == "compiled"
    return argv, env


def test_local_hit_imports_only_what_a_hit_needs(
    hit_setup: tuple[list[str], dict[str, str]], tmp_path: Path
) -> None:
    argv, env = hit_setup
    names, out = imported(argv, env, tmp_path)
    answer = json.loads(out)
    assert answer["status"] == "hit"
    assert answer["route"]["via"] == "local"
    assert "cachemgr.compile.queue" in names, "the hit ran in this process"
    assert denied(names, DENIED_LOCAL) == []


def test_hit_through_daemon_imports_only_what_a_hit_needs(
    hit_setup: tuple[list[str], dict[str, str]], tmp_path: Path
) -> None:
    argv, env = hit_setup
    cache = argv[argv.index("--cache-dir") + 1]
    daemon = start_daemon(tmp_path, "--cache-dir", cache, env=env)
    try:
        names, out = imported(argv, env, tmp_path)  # the default socket finds the daemon
    finally:
        daemon.stop()
    answer = json.loads(out)
    assert answer["status"] == "hit"
    assert answer["route"]["via"] == "daemon"
    assert "http.client" in names, "the hit went through the daemon"
    assert denied(names, DENIED) == []


@pytest.mark.parametrize(
    ("argv", "unneeded"),
    [
        (["--help"], ("cachemgr.config.options", "cachemgr.config.versions", "cachemgr.client")),
        (["config"], ("cachemgr.compile.queue", "cachemgr.compile.build", "cachemgr.client")),
    ],
    ids=["help", "config"],
)
def test_help_and_config_import_no_other_command(
    argv: list[str], unneeded: tuple[str, ...], tmp_path: Path
) -> None:
    """``--help`` lists the commands without importing them (their modules import the
    settings); ``config`` imports no compile machinery. (``-X importtime`` does not list
    modules loaded by ``importlib.import_module``, as the lazy group loads a command: what
    they import is listed.)"""
    names, out = imported(argv, daemon_env(tmp_path), tmp_path)
    assert out
    assert denied(names, (*DENIED_LOCAL, *unneeded)) == []


def test_help_summaries_are_the_commands_own() -> None:
    """``--help`` lists the summaries of :data:`cachemgr.cli.SUMMARIES` without importing
    the commands: each must be the first sentence of its command's help."""
    from cachemgr.cli import COMMANDS, SUMMARIES, cli

    ctx = click.Context(cli)
    assert sorted(SUMMARIES) == sorted(COMMANDS)
    for name in COMMANDS:
        real = cli.get_command(ctx, name)
        assert real is not None
        for limit in (45, 60, 10**6):
            lazy = click.Command(name, help=SUMMARIES[name]).get_short_help_str(limit)
            assert lazy == real.get_short_help_str(limit), name


def test_no_daemon_socket_means_no_http_client(tmp_path: Path) -> None:
    """The default route checks for the socket file before it builds a client."""
    env = daemon_env(tmp_path)
    names, _ = imported(["config", "--cache-dir", str(tmp_path / "c")], env, tmp_path)
    assert not os.path.exists(Path(env["XDG_RUNTIME_DIR"]) / "cachemgr" / "cachemgr.sock")
    assert "http.client" not in names


def test_hit_runs_no_process(hit_setup: tuple[list[str], dict[str, str]], tmp_path: Path) -> None:
    """The compiler's version line is remembered across processes (keyed by the executable's
    inode, size and mtime, like ccache's ``compiler_check = mtime``): a CLI hit execs
    nothing, not even ``gcc --version``."""
    argv, env = hit_setup
    strace = shutil.which("strace")
    assert strace, "strace is needed (scripts/test installs it)"
    log = tmp_path / "exec.strace"
    traced = [strace, "-f", "-qq", "-e", "trace=execve", "-o", str(log)]
    proc = subprocess.run(
        [*traced, sys.executable, "-m", "cachemgr", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["status"] == "hit"
    execs = [line for line in log.read_text().splitlines() if "execve(" in line]
    assert len(execs) == 1, execs  # the interpreter itself


def test_deny_list_names_real_modules() -> None:
    """A renamed module would make the deny-list pass without checking anything."""
    import importlib.util

    for name in (*DENIED_LOCAL, "cachemgr.compile.queue", "cachemgr.config.options"):
        assert importlib.util.find_spec(name) is not None, name


def test_eviction_package_loads_its_names_on_use() -> None:
    """``cachemgr.eviction`` is lazy (a hit imports its ``report`` only): every public name
    still resolves to its module's object, and nothing else does."""
    import cachemgr.eviction as eviction

    assert sorted(eviction.__all__) == sorted(eviction._WHERE)
    for name in eviction.__all__:
        module = importlib.import_module(eviction._WHERE[name])
        assert getattr(eviction, name) is getattr(module, name), name
    with pytest.raises(AttributeError):
        _ = eviction.no_such_name  # type: ignore[attr-defined]


def test_hit_through_daemon_asks_for_config_once(
    hit_setup: tuple[list[str], dict[str, str]], tmp_path: Path
) -> None:
    """Routing checks which cache the daemon serves, then the compile prepares the request
    with the daemon's settings: one ``GET /config`` serves both (the client remembers the
    answer). Counted on the wire: every request the CLI writes to the daemon's socket."""
    argv, env = hit_setup
    strace = shutil.which("strace")
    assert strace, "strace is needed (scripts/test installs it)"
    cache = argv[argv.index("--cache-dir") + 1]
    daemon = start_daemon(tmp_path, "--cache-dir", cache, env=env)
    log = tmp_path / "send.strace"
    traced = [strace, "-f", "-qq", "-s", "64", "-e", "trace=sendto,sendmsg,write", "-o", str(log)]
    try:
        proc = subprocess.run(
            [*traced, sys.executable, "-m", "cachemgr", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        daemon.stop()
    assert proc.returncode == 0, proc.stderr[-2000:]
    answer = json.loads(proc.stdout)
    assert (answer["status"], answer["route"]["via"]) == ("hit", "daemon")
    sent = [line for line in log.read_text().splitlines() if '"GET /' in line or '"POST /' in line]
    assert sent, "the CLI's requests are in the trace"
    assert len([line for line in sent if '"GET /config' in line]) == 1, sent
