"""CLI start-up: what a ``cachemgr compile`` hit, ``--help`` and ``config``
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
import tempfile
from pathlib import Path
from typing import Any

import click
import pytest

from tests import mount_util
from tests.compile_util import request_data
from tests.daemon_util import daemon_env, start_daemon
from tests.test_ge_interop import fake_toolkit

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
    the commands: each must be its command's ``short_help``."""
    from cachemgr.cli import COMMANDS, SUMMARIES, cli

    ctx = click.Context(cli)
    assert sorted(SUMMARIES) == sorted(COMMANDS)
    for name in COMMANDS:
        real = cli.get_command(ctx, name)
        assert real is not None
        for limit in (45, 60, 10**6):
            lazy = click.Command(name, short_help=SUMMARIES[name]).get_short_help_str(limit)
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

    for name in (*DENIED_LOCAL, *DENIED_STATS, "cachemgr.compile.queue", "cachemgr.config.options"):
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


# --- the console script's fast path (cachemgr.main): the same bytes as click, without it ----

#: The click CLI itself, without the fast path in front (what the console script ran before).
CLICK_ONLY = "import sys; from cachemgr.cli import main; sys.argv[0] = 'cachemgr'; main()"


def both_paths(
    argv: list[str], env: dict[str, str], cwd: Path
) -> tuple[subprocess.CompletedProcess[bytes], subprocess.CompletedProcess[bytes], set[str]]:
    """``argv`` run through ``python -m cachemgr`` (the fast path in front) and through the
    click CLI alone (real processes, bytes as written), and the modules the first imported."""
    fast = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cachemgr", *argv],
        env=env,
        cwd=cwd,
        capture_output=True,
        timeout=120,
    )
    timing = [ln for ln in fast.stderr.split(b"\n") if ln.startswith(b"import time:")]
    names = {ln.decode().rsplit("|", 1)[1].strip() for ln in timing if b"|" in ln}
    fast.stderr = b"".join(ln + b"\n" for ln in fast.stderr.split(b"\n")[:-1] if ln not in timing)
    slow = subprocess.run(
        [sys.executable, "-c", CLICK_ONLY, *argv],
        env=env,
        cwd=cwd,
        capture_output=True,
        timeout=120,
    )
    return fast, slow, names


def assert_same(
    fast: subprocess.CompletedProcess[bytes], slow: subprocess.CompletedProcess[bytes]
) -> None:
    assert (fast.returncode, fast.stdout, fast.stderr) == (
        slow.returncode,
        slow.stdout,
        slow.stderr,
    )


def test_stored_help_is_clicks_live_help() -> None:
    """``cachemgr.helptext`` is click's help of today's CLI: ``scripts/manpages.py`` wrote it,
    and a changed option or summary makes this fail until it is run again."""
    from cachemgr.cli import top_help
    from cachemgr.helptext import TOP

    assert top_help() == TOP, "run scripts/manpages.py: cachemgr/helptext.py is stale"
    assert "Commands:" in TOP and "  compile  " in TOP


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_fast_path_prints_clicks_help_without_click(flag: str, tmp_path: Path) -> None:
    fast, slow, names = both_paths([flag], daemon_env(tmp_path), tmp_path)
    assert fast.returncode == 0 and fast.stdout.startswith(b"Usage: cachemgr [OPTIONS] COMMAND")
    assert_same(fast, slow)
    assert "click" not in names and not any(n.startswith("cachemgr.cli") for n in names), names
    assert denied(names, (*DENIED_LOCAL, "cachemgr.config", "cachemgr.storage")) == []


def test_help_narrower_than_click_renders_goes_to_click(tmp_path: Path) -> None:
    """click wraps help to the terminal (at most 78 columns): narrower, the stored text would
    differ, so click renders it."""
    env = {**daemon_env(tmp_path), "COLUMNS": "60"}
    fast, slow, names = both_paths(["--help"], env, tmp_path)
    assert_same(fast, slow)
    assert "click" in names
    assert max(len(line) for line in fast.stdout.decode().splitlines()) <= 58


def _config_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**daemon_env(tmp_path), **extra}


@pytest.mark.parametrize(
    ("args", "extra_env"),
    [
        ([], {}),
        (["--json"], {}),
        (["--soc", "Ascend910B1", "--host-id", "h1", "--json"], {}),
        (["--cache-dir=CACHE", "--remote", "http://127.0.0.1:9/c", "--remote", "redis://h/0"], {}),
        ([], {"ASCEND_MAX_OP_CACHE_SIZE": "abc"}),  # a fallback: a warning line, exit 2
        (["--remote", "ftp://nowhere"], {}),  # a bad remote spec: one line, exit 2
        ([], {"CACHEMGR_REMOTE_STORAGE": "redis://:s3cret@h:1/0|colour=blue"}),
        (["--cache-dir", "CACHE", "--config", "CONF"], {}),
    ],
    ids=["plain", "json", "soc-host", "remotes", "env-fallback", "bad-remote", "bad-env-remote",
         "config-file"],
)  # fmt: skip
def test_config_fast_path_matches_click(
    args: list[str], extra_env: dict[str, str], tmp_path: Path
) -> None:
    """``cachemgr config`` answered without click writes the same bytes to stdout and stderr
    and exits with the same code as the click command, for the options it knows."""
    conf = tmp_path / "cachemgr.toml"
    conf.write_text('[daemon]\nworkers = 3\n[remote]\nstorage = ["http://127.0.0.1:9/x"]\n')
    cache = tmp_path / "cache"
    argv = ["config", *(a.replace("CACHE", str(cache)).replace("CONF", str(conf)) for a in args)]
    fast, slow, names = both_paths(argv, _config_env(tmp_path, **extra_env), tmp_path)
    assert fast.stdout or fast.stderr
    assert_same(fast, slow)
    assert "click" not in names, "answered by the fast path"
    deny = (*DENIED_LOCAL, "cachemgr.compile", "cachemgr.cli")
    if "--config" in args:  # a config file is TOML
        deny = tuple(d for d in deny if d != "tomllib")
    assert denied(names, deny) == []


@pytest.mark.parametrize(
    "args",
    [
        ["-v"],  # options it does not know go to click
        ["--json", "--json", "--bogus"],
        ["--soc"],  # a value missing: click's usage error
        ["--soc", "a", "--soc", "b"],  # repeated: click's rule decides
        ["--cache-dir", "--json"],  # a value that looks like an option
        ["--config", "DIR"],  # a folder: click's Path check words it
        ["--config", "BAD"],  # an unreadable config file: click words the error
        ["extra"],
    ],
    ids=["verbose", "unknown", "missing-value", "repeated", "option-value", "config-dir",
         "bad-config", "argument"],
)  # fmt: skip
def test_config_declined_goes_to_click_unchanged(args: list[str], tmp_path: Path) -> None:
    """Whatever the fast path does not plainly know — or fails on — is click's, with the
    original argv, and prints exactly what click alone prints."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon]\nno_such_key = 1\n")
    argv = ["config", *(a.replace("DIR", str(tmp_path)).replace("BAD", str(bad)) for a in args)]
    fast, slow, names = both_paths(argv, daemon_env(tmp_path), tmp_path)
    assert_same(fast, slow)
    assert "click" in names


def test_python_m_and_console_script_enter_the_fast_path() -> None:
    """``python -m cachemgr`` and the installed ``cachemgr`` script both run
    :func:`cachemgr.main.main`."""
    import tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["cachemgr"] == "cachemgr.main:main"
    script = Path(sys.executable).parent / "cachemgr"
    assert "cachemgr.main" in script.read_text()
    out = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "cachemgr" in out.stdout


def _run_closed(argv: list[str], env: dict[str, str], cwd: Path, how: str, click: bool) -> Any:
    """``argv`` with stdout closed (``>&-``) or on a full disk (``>/dev/full``)."""
    run = [sys.executable, "-c", CLICK_ONLY] if click else [sys.executable, "-m", "cachemgr"]
    with open("/dev/full", "wb") as full:
        return subprocess.run(
            [*run, *argv], env=env, cwd=cwd, stdout=full, stderr=subprocess.PIPE,
            preexec_fn=(lambda: os.close(1)) if how == "closed" else None,
            timeout=120, text=True,
        )  # fmt: skip


@pytest.mark.parametrize("argv", [["--help"], ["config"]])
@pytest.mark.parametrize("how", ["closed", "full"])
def test_fast_path_on_a_closed_or_full_stdout_is_one_line_not_a_traceback(
    argv: list[str], how: str, tmp_path: Path
) -> None:
    """Attack review: ``cachemgr --help >&-`` and ``cachemgr config >/dev/full`` printed
    tracebacks from the fast path where click prints nothing or one line."""
    env = daemon_env(tmp_path)
    fast = _run_closed(argv, env, tmp_path, how, click=False)
    assert "Traceback" not in fast.stderr, fast.stderr
    if how == "closed":  # click.echo writes nothing to a closed stdout: neither do we
        slow = _run_closed(argv, env, tmp_path, how, click=True)
        assert (fast.returncode, fast.stderr) == (slow.returncode, slow.stderr)
    else:
        assert fast.returncode == 1
        assert fast.stderr.splitlines()[-1] == "cachemgr: error: No space left on device"
        if argv == ["config"]:  # click says the same (its --help gives a traceback)
            slow = _run_closed(argv, env, tmp_path, how, click=True)
            assert (fast.returncode, fast.stderr) == (slow.returncode, slow.stderr)


@pytest.mark.parametrize("how", ["env", "option"])
def test_config_file_errors_say_where_the_file_came_from(how: str, tmp_path: Path) -> None:
    """A missing (env) or broken (both) config file names its source, as every other bad
    value does — the same bytes with and without click."""
    broken = tmp_path / "broken.toml"
    broken.write_text("x =\n")
    cases = {"env": [("nosuch.toml", "env CACHEMGR_CONFIG"), (str(broken), "env CACHEMGR_CONFIG")],
             "option": [(str(broken), "option --config")]}  # fmt: skip
    for name, origin in cases[how]:
        extra = {"CACHEMGR_CONFIG": name} if how == "env" else {}
        argv = ["config"] if how == "env" else ["config", "--config", name]
        fast, slow, _ = both_paths(argv, _config_env(tmp_path, **extra), tmp_path)
        assert_same(fast, slow)
        line = fast.stderr.decode().strip()
        assert fast.returncode == 2 and line.startswith(f"cachemgr: error: config file {name}")
        assert line.endswith(f"(from {origin})") and "\n" not in line, line


# --- `stats` answered by the fast path: the same bytes as click, and only what it needs ---

#: What ``stats`` from the fast path never imports: click and the CLI, the compile path, the
#: daemon, an HTTP client (it answers only where no daemon may serve the cache).
DENIED_STATS = (
    *(d for d in DENIED_LOCAL if d != "cachemgr.eviction"),  # it counts chip folders as gc
    "click",
    "cachemgr.cli",
    "cachemgr.daemon",
    "cachemgr.compile.queue",
    "cachemgr.compile.pipeline",
    "cachemgr.compile.build",
    "cachemgr.eviction.gc",  # gc itself: stats counts chip folders with usage's chip_row only
    # the eviction and store machinery, the client: a chip folder is counted by
    # cachemgr.eviction.usage, the default socket named by cachemgr.sockpath
    "cachemgr.eviction.purge",
    "cachemgr.eviction.files",
    "cachemgr.eviction.reclaim",
    "cachemgr.storage.store",
    "cachemgr.storage.entry",
    "cachemgr.client",
    "cachemgr.config.configfile",  # the config file's schema: only where there is a file
)
#: What ``stats --config FILE`` may import beyond that: the file is TOML, checked by the schema.
FOR_A_CONFIG_FILE = ("tomllib", "cachemgr.config.configfile")


@pytest.fixture
def stats_cache(hit_setup: tuple[list[str], dict[str, str]], tmp_path: Path) -> Path:
    """The cache root of ``hit_setup``, after a real compile and a real hit: one chip
    folder with an entry, counters of a hit and a miss."""
    argv, env = hit_setup
    again = subprocess.run(
        [sys.executable, "-m", "cachemgr", *argv], env=env, capture_output=True, text=True
    )
    assert json.loads(again.stdout)["status"] == "hit", again.stderr
    return Path(argv[argv.index("--cache-dir") + 1])


def _other_kernel_caches(root: Path, cache: Path) -> dict[str, str]:
    """``ASCEND_CACHE_PATH`` at ``root`` with two per-host kernel caches holding a copy of
    ``cache``'s chip folders (so ``stats`` lists the other one)."""
    for host in ("h1", "h2"):
        shutil.copytree(cache / "kernel_cache", root / f"kernel_cache_{host}", symlinks=True)
    return {"ASCEND_CACHE_PATH": str(root)}


@pytest.mark.parametrize(
    ("args", "setup"),
    [
        ([], ""),
        (["--json"], ""),
        (["--soc", "Ascend910B1"], ""),
        (["--soc", "Ascend310P3"], ""),  # no such chip folder: a warning
        ([], "env-fallback"),  # a bad env limit: a warning, the fallback limit shown
        ([], "bad-ini"),  # a bad op_cache.ini value: a warning
        (["--config", "CONF"], ""),
        (["--cache-dir", "MISSING"], ""),  # no kernel cache there: a warning
        (["--host-id", "h1"], "ascend-cache-path"),  # the other per-host cache listed too
        (["--host-id", "h1", "--json"], "ascend-cache-path"),
    ],
    ids=["plain", "json", "soc", "no-such-soc", "env-fallback", "bad-ini", "config-file",
         "missing", "other-caches", "other-caches-json"],
)  # fmt: skip
def test_stats_fast_path_matches_click(
    args: list[str], setup: str, stats_cache: Path, tmp_path: Path
) -> None:
    """``cachemgr stats`` answered without click writes the same bytes to stdout and stderr
    and exits with the same code as the click command, on a real cache (a real compile and
    hit), and imports neither click nor the compile path, the daemon or an HTTP client."""
    env = daemon_env(tmp_path)
    conf = tmp_path / "cachemgr.toml"
    conf.write_text("[daemon]\nworkers = 3\n")
    if setup == "env-fallback":
        env["ASCEND_MAX_OP_CACHE_SIZE"] = "abc"
    if setup == "bad-ini":
        (stats_cache / "kernel_cache" / "op_cache.ini").write_text("max_op_cache_size=ten\n")
    cache_args = ["--cache-dir", str(stats_cache)]
    if setup == "ascend-cache-path":
        env.update(_other_kernel_caches(tmp_path / "acp", stats_cache))
        cache_args = []
    if "--cache-dir" in args:
        cache_args = []
    subs = {"CONF": str(conf), "MISSING": str(tmp_path / "missing")}
    argv = ["stats", *cache_args, *(subs.get(a, a) for a in args)]
    fast, slow, names = both_paths(argv, env, tmp_path)
    assert fast.stdout
    assert_same(fast, slow)
    assert "click" not in names, "answered by a fast path"
    assert {"cachemgr.localstats", "cachemgr.quickstats"} & names
    deny = DENIED_STATS
    if "--config" in args:
        deny = tuple(d for d in DENIED_STATS if d not in FOR_A_CONFIG_FILE)
    assert denied(names, deny) == []
    if setup == "ascend-cache-path" and "--json" in args:
        assert list(json.loads(fast.stdout)["other_kernel_caches"]) == [
            str(tmp_path / "acp" / "kernel_cache_h2")
        ]


#: What ``stats`` answered on os alone (:mod:`cachemgr.quickstats`) may import of cachemgr.
QUICK_STATS_MODULES = {
    "cachemgr",
    "cachemgr.__main__",
    "cachemgr.main",
    "cachemgr.constants",
    "cachemgr.quickstats",
    "cachemgr.quickini",
    "cachemgr.direct",
    "cachemgr.sockpath",
    "cachemgr.stats_view",
    "cachemgr.words",
    "cachemgr.config",
    "cachemgr.config.core",
    "cachemgr.storage",
    "cachemgr.storage.chipcount",
    "cachemgr.storage.counterfiles",
    "cachemgr.storage.mountrule",
}
#: The standard library's modules whose import is most of the settings' start-up cost: never
#: imported by the os-only answer.
HEAVY_STDLIB = ("logging", "json", "dataclasses", "datetime", "typing", "inspect", "tomllib")


@pytest.mark.parametrize(
    "case",
    [
        "plain",
        "equals",
        "chips",
        "home",
        "acl-env",
        "never-evict",
        "empty-kernel-cache",
        "ge-ini",
        "ini-limits",
    ],
)
def test_stats_on_os_alone_matches_click(case: str, stats_cache: Path, tmp_path: Path) -> None:
    """The operator's usual ``cachemgr stats`` (no daemon, a real cache after a real compile
    and hit; several chip folders; the cache folder from ``$HOME`` or torch_npu's variable; a
    limit from the environment) is answered on os alone (:mod:`cachemgr.quickstats`) with the
    bytes and exit code of the click command, importing neither the settings' modules nor
    logging/json/dataclasses/datetime/typing (the import budget of the os-only answer)."""
    env = daemon_env(tmp_path)
    kcache = stats_cache / "kernel_cache"
    argv = ["stats", "--cache-dir", str(stats_cache)]
    if case == "equals":
        argv = ["stats", f"--cache-dir={stats_cache}"]
    if case == "chips":  # a second chip folder with a copy of the entries, and an empty one
        chip = next(p for p in kcache.iterdir() if p.is_dir())
        shutil.copytree(chip, kcache / "Ascend310P3", symlinks=True)
        (kcache / "Ascend910B4").mkdir()
        (kcache / "not-a-chip.d").mkdir()
    if case == "home":
        home = tmp_path / "home"
        shutil.copytree(stats_cache, home / "atc_data", symlinks=True)
        env["HOME"], argv = str(home), ["stats"]
    if case == "acl-env":
        env["ACL_OP_COMPILER_CACHE_DIR"], argv = str(stats_cache), ["stats"]
    if case == "never-evict":
        env["ASCEND_MAX_OP_CACHE_SIZE"] = "-1"
        env["ASCEND_REMAIN_CACHE_SIZE_RATIO"] = "70"
    if case == "empty-kernel-cache":
        argv = ["stats", "--cache-dir", str(tmp_path / "fresh")]
        (tmp_path / "fresh" / "kernel_cache").mkdir(parents=True)
    if case == "ge-ini":  # as GE writes it at its first compile (CreatOpCacheIniFile)
        (kcache / "op_cache.ini").write_text(
            "[op_compiler_cache]\nadk_version=8.0.RC1\nops_version=8.0.RC1\n"
        )
    if case == "ini-limits":  # with the limits an operator adds
        (kcache / "op_cache.ini").write_text(
            "[op_compiler_cache]\nadk_version=7.0.0\nops_version=7.0.0\n"
            "max_op_cache_size=1\nremain_cache_size_ratio=80\n"
        )
        env["ASCEND_MAX_OP_CACHE_SIZE"] = "900"  # the ini comes first
    fast, slow, names = both_paths(argv, env, tmp_path)
    assert fast.stdout and not fast.stderr
    assert_same(fast, slow)
    assert "cachemgr.quickstats" in names, "answered on os alone"
    ours = {n for n in names if n == "cachemgr" or n.startswith("cachemgr.")}
    assert ours <= QUICK_STATS_MODULES, sorted(ours - QUICK_STATS_MODULES)
    assert [n for n in names if n.split(".")[0] in HEAVY_STDLIB] == []


@pytest.mark.parametrize(
    "case", ["ini", "ascend-cache-path", "host-id-env", "damaged-counters", "linked-chip"]
)  # an ini: the strict reader's warning
def test_stats_not_answered_on_os_alone_goes_on_unchanged(
    case: str, stats_cache: Path, tmp_path: Path
) -> None:
    """What the os-only answer does not cover exactly (an op_cache.ini not in GE's plain form,
    ASCEND_CACHE_PATH,
    a settings variable, a counters file the full reader warns about, a linked chip folder)
    is declined with nothing written: the full path prints exactly what click prints."""
    env = daemon_env(tmp_path)
    kcache = stats_cache / "kernel_cache"
    argv = ["stats", "--cache-dir", str(stats_cache)]
    if case == "ini":  # not GE's plain form (CRLF, a comment): the strict reader words it
        (kcache / "op_cache.ini").write_bytes(
            b"# limits\r\n[op_compiler_cache]\r\nmax_op_cache_size=1000\r\n"
            b"remain_cache_size_ratio=80\r\nadk_version=7.0.0\r\nops_version=7.0.0\r\n"
        )
    if case == "ascend-cache-path":
        env.update(_other_kernel_caches(tmp_path / "acp", stats_cache))
        argv = ["stats"]
    if case == "host-id-env":
        env["CACHEMGR_HOST_ID"] = "../bad"
    if case == "damaged-counters":
        (kcache / "cachemgr_stats_Ascend910B1.json").write_text("{not json")
    if case == "linked-chip":
        chip = next(p for p in kcache.iterdir() if p.is_dir())
        (kcache / "Ascend310P3").symlink_to(chip)
    fast, slow, names = both_paths(argv, env, tmp_path)
    assert_same(fast, slow)
    assert "cachemgr.quickstats" in names, "tried, and declined"


@pytest.mark.parametrize(
    "args",
    [
        ["-v"],
        ["-q"],
        ["--zero"],
        ["--all"],
        ["--local"],
        ["--soc"],  # a value missing: click's usage error
        ["--bogus"],
        ["SOCKET-FILE"],  # a file at the default socket: a daemon may serve it
        ["ENV-SOCKET"],  # $CACHEMGR_SOCKET names a daemon: click routes (an error here)
    ],
)
def test_stats_declined_goes_to_click_unchanged(
    args: list[str], stats_cache: Path, tmp_path: Path
) -> None:
    """What the stats fast path does not answer is click's, with the original argv, and
    prints exactly what click alone prints."""
    env = daemon_env(tmp_path)
    if args == ["SOCKET-FILE"]:
        (tmp_path / "run" / "cachemgr").mkdir(mode=0o700)
        (tmp_path / "run" / "cachemgr" / "cachemgr.sock").write_text("")
        args = []
    if args == ["ENV-SOCKET"]:
        env["CACHEMGR_SOCKET"] = str(tmp_path / "no-daemon.sock")
        args = []
    argv = ["stats", "--cache-dir", str(stats_cache), *args]
    fast, slow, names = both_paths(argv, env, tmp_path)
    assert_same(fast, slow)
    assert "click" in names


# --- `config` answered on os alone (cachemgr.quickconfig): the same bytes, and only os ---

#: What ``config`` answered on os alone (:mod:`cachemgr.quickconfig`) may import of cachemgr.
QUICK_CONFIG_MODULES = {
    "cachemgr",
    "cachemgr.__main__",
    "cachemgr.main",
    "cachemgr.constants",
    "cachemgr.errors",
    "cachemgr.quickconfig",
    "cachemgr.quickini",
    "cachemgr.direct",
    "cachemgr.plainjson",
    "cachemgr.sockpath",
    "cachemgr.config",
    "cachemgr.config.core",
    "cachemgr.config.defaultrows",
    "cachemgr.config.reportorder",
    "cachemgr.config.socs",
    "cachemgr.config.toolkit",
    "cachemgr.storage",
    "cachemgr.storage.exposure",
    "cachemgr.storage.mountrule",
}
#: The most modules the os-only ``config`` may import beyond what the interpreter imports
#: to run ``pass`` (``site``, an editable install's finder…): cachemgr's above, ``runpy`` of
#: ``-m`` and a few of the standard library's cheapest (``_json``, ``pwd``). The full path
#: imports ~70 more (pathlib, re, logging, json, dataclasses, typing, the settings' modules).
QUICK_CONFIG_BUDGET = 21


def started_with(env: dict[str, str], cwd: Path) -> set[str]:
    """The modules ``python -X importtime -c pass`` imports with ``env``: the interpreter's
    own start-up, which no command of ours can avoid."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return {ln.rsplit("|", 1)[1].strip() for ln in proc.stderr.splitlines() if "|" in ln}


#: What the README's ``/etc/profile.d/cachemgr.sh`` sets for a member, but the config file.
MEMBER_ENV = {"CACHEMGR_SOCKET": "/run/cachemgr/cachemgr.sock", "CACHEMGR_DAEMON_USER": "cachemgr"}


def _config_case(case: str, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of one real set-up of ``cachemgr config`` (real folders,
    files and modes under ``tmp_path``)."""
    env = daemon_env(tmp_path)
    root = tmp_path / "cache"
    kcache = root / "kernel_cache"
    (kcache / "Ascend910B1").mkdir(parents=True)
    argv = ["config", "--cache-dir", str(root)]
    acp = tmp_path / "acp"
    for name in ("kernel_cache", "kernel_cache_h1", "kernel_cache_h2", "kernel_cache_x y"):
        (acp / name).mkdir(parents=True)
    (acp / "kernel_cache_link").symlink_to(acp / "kernel_cache")
    ge_ini = "[op_compiler_cache]\nadk_version=8.0.RC1\nops_version=8.0.RC1\n"
    setups: dict[str, Any] = {
        "plain": {},
        "json": {"args": ["--json"]},
        "equals": {"argv": ["config", f"--cache-dir={root}"]},
        "relative": {"argv": ["config", "--cache-dir", "cache"]},
        "missing-root": {"argv": ["config", "--cache-dir", str(tmp_path / "new" / "deeper")]},
        "home": {"argv": ["config"]},
        "no-home": {"argv": ["config"], "unset": "HOME"},  # the password file's home
        "home-json": {"argv": ["config", "--json"]},
        "acl-env": {"argv": ["config"], "env": {"ACL_OP_COMPILER_CACHE_DIR": str(root)}},
        "acl-over-acp": {"argv": ["config", "--json"],
                         "env": {"ACL_OP_COMPILER_CACHE_DIR": str(root),
                                 "ASCEND_CACHE_PATH": str(acp)}},
        "option-over-both": {"env": {"ACL_OP_COMPILER_CACHE_DIR": str(acp),
                                     "ASCEND_CACHE_PATH": str(acp)}},
        "option-over-both-json": {"args": ["--json"],
                                  "env": {"ACL_OP_COMPILER_CACHE_DIR": str(acp),
                                          "ASCEND_CACHE_PATH": str(acp)}},
        "acp-host-option": {"argv": ["config", "--host-id", "h1"],
                            "env": {"ASCEND_CACHE_PATH": str(acp)}},
        "acp-host-env": {"argv": ["config", "--json"],
                         "env": {"ASCEND_CACHE_PATH": str(acp), "CACHEMGR_HOST_ID": "h2"}},
        "acp-host-empty": {"argv": ["config"],
                           "env": {"ASCEND_CACHE_PATH": str(acp), "CACHEMGR_HOST_ID": ""}},
        "acp-default-host": {"argv": ["config", "--json"], "env": {"ASCEND_CACHE_PATH": str(acp)}},
        "host-over-env": {"args": ["--host-id", "me", "--json"],
                          "env": {"CACHEMGR_HOST_ID": "env"}},
        "host-odd-text": {"args": ["--host-id", "a b/c"]},  # only ASCEND_CACHE_PATH checks it
        "mode-env": {"env": {"ACL_OP_COMPILER_CACHE_MODE": " Force "}},
        "soc": {"args": ["--soc", "Ascend310P3", "--json"]},
        "soc-folder-only": {"args": ["--soc", "Ascend999X"], "mkdir": "Ascend999X"},
        "env-limits": {"env": {"ASCEND_MAX_OP_CACHE_SIZE": "1000",
                               "ASCEND_REMAIN_CACHE_SIZE_RATIO": "70"}},
        "never-evict": {"args": ["--json"], "env": {"ASCEND_MAX_OP_CACHE_SIZE": "-1"}},
        "env-fallback": {"env": {"ASCEND_MAX_OP_CACHE_SIZE": "abc"}},  # a warning, exit 2
        "env-not-plain": {"args": ["--json"], "env": {"ASCEND_MAX_OP_CACHE_SIZE": "300MB",
                                                      "ASCEND_REMAIN_CACHE_SIZE_RATIO": "x"}},
        "ge-ini": {"ini": ge_ini, "env": {"ASCEND_MAX_OP_CACHE_SIZE": "900"}},
        "ini-limits": {"args": ["--json"], "env": {"ASCEND_MAX_OP_CACHE_SIZE": "900"},
                       "ini": ge_ini + "max_op_cache_size=2000\nremain_cache_size_ratio=80\n"},
        "work-path": {"env": {"ASCEND_WORK_PATH": str(tmp_path / "work")}},
        "chinese-path": {"argv": ["config", "--cache-dir", str(tmp_path / "缓存")]},
        "chinese-path-json": {"argv": ["config", "--json", "--cache-dir", str(tmp_path / "缓存")]},
        "open-to-others": {"mode": 0o2775},  # the outsiders' warning line
        "linked-kernel-cache": {"link": True, "ini": ge_ini + "max_op_cache_size=10\n"
                                "remain_cache_size_ratio=60\n"},  # read through the link
        "toolkit-old": {"toolkit": "old"},  # GE's library in compiler/lib64, behind `latest`
        "toolkit-new-json": {"toolkit": "new", "args": ["--json"]},  # cann/<arch>-linux
        "toolkit-home-only": {"env": {"ASCEND_HOME_PATH": str(tmp_path / "home"),
                                      "ASCEND_TOOLKIT_HOME": str(tmp_path / "tk")},
                              "version": "tk/compiler/version.info"},
        "toolkit-missing": {"env": {"ASCEND_HOME_PATH": str(tmp_path / "nothing"),
                                    "ASCEND_OPP_PATH": " \t"}},
        "member-env": {"env": MEMBER_ENV},  # /etc/profile.d/cachemgr.sh but the config file
        "member-env-json": {"args": ["--json"], "env": MEMBER_ENV},
        "systemd-runtime": {"env": {"RUNTIME_DIRECTORY": "/run/cachemgr:/run/other"}},
    }  # fmt: skip
    setup = setups[case]
    argv = [*setup.get("argv", argv), *setup.get("args", [])]
    env.update(setup.get("env", {}))
    env.pop(setup.get("unset", ""), None)
    if case.startswith("home"):
        shutil.copytree(root, Path(env["HOME"]) / "atc_data", symlinks=True)
    if "mkdir" in setup:
        (kcache / setup["mkdir"]).mkdir()
    if setup.get("link"):
        shutil.move(kcache, tmp_path / "elsewhere")
        kcache.symlink_to(tmp_path / "elsewhere")
    if "ini" in setup:
        (kcache / "op_cache.ini").write_text(setup["ini"])
    if "mode" in setup:
        root.chmod(setup["mode"])
    if "toolkit" in setup:
        env.update(fake_toolkit(tmp_path / "Ascend", "8.5.0", "8.5.1", setup["toolkit"]))
    if "version" in setup:
        (tmp_path / setup["version"]).parent.mkdir(parents=True)
        (tmp_path / setup["version"]).write_text("# CANN\nVersion = 8.0.RC2\n")
    return argv, env


#: Every set-up :func:`test_config_on_os_alone_matches_click` runs.
CONFIG_CASES = [
    "plain", "json", "equals", "relative", "missing-root", "home", "home-json", "acl-env",
    "acl-over-acp", "option-over-both", "option-over-both-json", "acp-host-option",
    "acp-host-env", "acp-host-empty", "acp-default-host", "host-over-env", "host-odd-text",
    "mode-env", "soc", "soc-folder-only", "env-limits", "never-evict", "env-fallback",
    "env-not-plain", "ge-ini", "ini-limits", "work-path", "chinese-path", "chinese-path-json",
    "open-to-others", "no-home", "linked-kernel-cache", "toolkit-old", "toolkit-new-json",
    "toolkit-home-only", "toolkit-missing", "member-env", "member-env-json", "systemd-runtime",
]  # fmt: skip


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_config_on_os_alone_matches_click(case: str, tmp_path: Path) -> None:
    """``cachemgr config`` (text and ``--json``) on real set-ups — the cache folder from the
    option, ``$HOME``, torch_npu's variable or ``ASCEND_CACHE_PATH`` (other governed kernel
    caches, the host id from the option, the env or empty), names passed over, the cache
    mode, a chip, limits from the env (good, bad, not plain: warnings and exit 2) or GE's
    ini, ``ASCEND_WORK_PATH``, Chinese characters, a root open to others, the installed
    toolkit's versions (GE's library in either layout, the home's files, none) — is answered on
    os alone (:mod:`cachemgr.quickconfig`) with the bytes and exit code of the click
    command, importing no settings module, none of logging/json/dataclasses/typing…, and
    no more modules than its budget."""
    base = tmp_path
    if case == "open-to-others":  # every folder above it open to others too: not pytest's
        base = Path(tempfile.mkdtemp(prefix="cachemgr-open-"))
        base.chmod(0o755)
    try:
        argv, env = _config_case(case, base)
        fast, slow, names = both_paths(argv, env, base)
    finally:
        if base != tmp_path:
            shutil.rmtree(base)
    assert fast.stdout
    assert_same(fast, slow)
    assert "cachemgr.quickconfig" in names, "answered on os alone"
    if case == "open-to-others":
        assert b"is readable by every local user (mode 2775)" in fast.stderr
    ours = {n for n in names if n == "cachemgr" or n.startswith("cachemgr.")}
    assert ours <= QUICK_CONFIG_MODULES, sorted(ours - QUICK_CONFIG_MODULES)
    more = names - started_with(env, tmp_path)
    assert [n for n in more if n.split(".")[0] in (*HEAVY_STDLIB, "pathlib", "re")] == []
    assert len(more) <= QUICK_CONFIG_BUDGET, sorted(more)


def test_config_shows_the_socket_and_the_daemon_user_a_member_set(tmp_path: Path) -> None:
    """The README's member sets ``CACHEMGR_SOCKET`` and ``CACHEMGR_DAEMON_USER``: ``config``
    shows both with origin ``env`` (it showed neither, and ``daemon.user`` as an empty
    default), on os alone and through the config file (the full path) alike; the config
    file's ``[daemon] user`` wins over the variable, which is shown passed over — as the
    client trusts them (``sockcheck.trusted_uids``)."""
    argv, env = _config_case("member-env", tmp_path)
    fast, slow, names = both_paths(argv, env, tmp_path)
    assert_same(fast, slow)
    assert "cachemgr.quickconfig" in names and "cachemgr.config.options" not in names
    lines = fast.stdout.decode().splitlines()
    assert "(env: CACHEMGR_SOCKET) socket = /run/cachemgr/cachemgr.sock" in lines, lines
    assert "(env: CACHEMGR_DAEMON_USER) daemon.user = cachemgr" in lines, lines
    as_json, _, _ = both_paths([*argv, "--json"], env, tmp_path)
    row = {"value": "cachemgr", "origin": "env", "source": "CACHEMGR_DAEMON_USER"}
    assert json.loads(as_json.stdout)["daemon.user"] == row
    conf = tmp_path / "cachemgr.toml"
    conf.write_text('[daemon]\nuser = "svc"\n')
    env["CACHEMGR_CONFIG"] = str(conf)  # the full path's turn
    fast, slow, names = both_paths(argv, env, tmp_path)
    assert_same(fast, slow)
    assert "cachemgr.config.options" in names
    lines = fast.stdout.decode().splitlines()
    at = lines.index(f"(option: config {conf}:2) daemon.user = svc")
    passed = "CACHEMGR_DAEMON_USER=cachemgr (the config file's [daemon] user comes first)"
    assert lines[at + 1] == f"    passed over: {passed}", lines[at : at + 2]
    assert "(env: CACHEMGR_SOCKET) socket = /run/cachemgr/cachemgr.sock" in lines, lines
    del env["CACHEMGR_SOCKET"]
    fast, slow, _ = both_paths(argv, env, tmp_path)  # the default socket, named where from
    assert_same(fast, slow)
    shown = f"(env: XDG_RUNTIME_DIR) socket = {env['XDG_RUNTIME_DIR']}/cachemgr/cachemgr.sock"
    assert shown in fast.stdout.decode().splitlines()


def _declined_case(case: str, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """A set-up the os-only ``config`` does not answer (the full path words it, or reads what
    only it reads)."""
    argv, env = _config_case("plain", tmp_path)
    kcache = tmp_path / "cache" / "kernel_cache"
    conf = tmp_path / "cachemgr.toml"
    conf.write_text("[daemon]\nworkers = 3\n")
    (tmp_path / "afile").write_text("")
    setups: dict[str, Any] = {
        "bad-mode": {"env": {"ACL_OP_COMPILER_CACHE_MODE": "sometimes"}},
        "bad-host-acp": {"argv": ["config", "--host-id", ".."],
                         "env": {"ASCEND_CACHE_PATH": str(tmp_path / "acp")}},
        "unknown-soc": {"args": ["--soc", "Ascend999"]},
        "lower-case-soc": {"args": ["--soc", "ascend910b1"]},
        "soc-linked-kernel-cache": {"args": ["--soc", "Ascend910B1"], "link": True},
        "path-with-space": {"argv": ["config", "--cache-dir", str(tmp_path / "a b")]},
        "root-is-a-file": {"argv": ["config", "--cache-dir", str(tmp_path / "afile")]},
        "under-a-file": {"argv": ["config", "--cache-dir", str(tmp_path / "afile" / "x")]},
        "pseudo-fs": {"argv": ["config", "--cache-dir", "/proc/self"]},
        "ini-crlf": {"ini": b"[op_compiler_cache]\r\nadk_version=1\r\nops_version=1\r\n"},
        "ini-comment": {"ini": b"# mine\n[op_compiler_cache]\nmax_op_cache_size=10\n"},
        "ini-bad-value": {"ini": b"max_op_cache_size=ten\n"},
        "ini-folder": {"ini": None},
        "ini-link": {"ini": "link"},
        "config-option": {"args": ["--config", str(conf)]},
        "config-env": {"env": {"CACHEMGR_CONFIG": str(conf)}},
        "remote-option": {"args": ["--remote", "http://127.0.0.1:9/c"]},
        "remote-env": {"env": {"CACHEMGR_REMOTE_STORAGE": "redis://:s3cret@h:1/0"}},
        "empty-home": {"argv": ["config"], "env": {"HOME": ""}},
        "bad-work-path": {"env": {"ASCEND_WORK_PATH": str(tmp_path / "w w")}},
        "latin-1-stdout": {"env": {"PYTHONIOENCODING": "latin-1"}},
        "control-in-env": {"args": ["--host-id", "h1"], "env": {"CACHEMGR_HOST_ID": "a\x1bb"}},
    }  # fmt: skip
    setup = setups[case]
    argv = [*setup.get("argv", argv), *setup.get("args", [])]
    env.update(setup.get("env", {}))
    if setup.get("link"):
        shutil.move(kcache, tmp_path / "elsewhere")
        kcache.symlink_to(tmp_path / "elsewhere")
    if "ini" in setup:
        ini, data = kcache / "op_cache.ini", setup["ini"]
        if data is None:
            ini.mkdir()
        elif data == "link":
            (tmp_path / "real.ini").write_text(
                "[op_compiler_cache]\nadk_version=1\nops_version=1\n"
            )
            ini.symlink_to(tmp_path / "real.ini")
        else:
            ini.write_bytes(data)
    return argv, env


@pytest.mark.parametrize(
    "case",
    [
        "bad-mode", "bad-host-acp", "unknown-soc", "lower-case-soc", "soc-linked-kernel-cache",
        "path-with-space", "root-is-a-file", "under-a-file", "pseudo-fs", "ini-crlf",
        "ini-comment", "ini-bad-value", "ini-folder", "ini-link", "config-option",
        "config-env", "remote-option", "remote-env", "empty-home",
        "bad-work-path", "latin-1-stdout", "control-in-env",
    ],
)  # fmt: skip
def test_config_not_answered_on_os_alone_goes_on_unchanged(case: str, tmp_path: Path) -> None:
    """What the os-only ``config`` cannot answer exactly — a value the full resolution
    refuses (a bad cache mode, host id, chip, path or work path), a root that is a file or
    on a pseudo filesystem, an ``op_cache.ini`` not in GE's plain form (or a folder, or a
    link), a config file, remote tiers, a stream that is not UTF-8, a control character —
    is declined with nothing written: what is printed, and the exit code, are exactly the
    click command's."""
    argv, env = _declined_case(case, tmp_path)
    fast, slow, names = both_paths(argv, env, tmp_path)
    assert_same(fast, slow)
    assert "cachemgr.quickconfig" in names, "tried"
    if case == "empty-home" and os.access("/", os.W_OK):  # root's "/" root: answered there
        return
    assert {"cachemgr.config.options", "click"} & names, "and declined"


def test_config_on_a_read_only_root_goes_on_unchanged(tmp_path: Path) -> None:
    """A root on a filesystem remounted read-only (a real tmpfs): the full path decides
    (it serves it, as the read-only root rule says), with the same bytes as click."""
    with mount_util.tmpfs(tmp_path / "mnt", "size=4m,mode=0755") as mnt:
        (mnt / "kernel_cache").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        argv = ["config", "--cache-dir", str(mnt)]
        fast, slow, names = both_paths(argv, daemon_env(tmp_path), tmp_path)
    assert fast.returncode == 0, fast.stderr
    assert_same(fast, slow)
    assert "cachemgr.quickconfig" in names, "tried"
    assert "cachemgr.config.options" in names, "and declined to the full path"


def test_quick_config_tables_are_the_full_schemas() -> None:
    """The os-only ``config``'s tables are the full path's: every top-level option in
    ``options.OPTIONS``' order with its default and env var, the command line's flags,
    the cache modes (so neither can change without the other)."""
    from cachemgr import quickconfig
    from cachemgr.config import options

    assert list(quickconfig.TOP_OPTIONS) == [(s.name, s.default, s.env) for s in options.OPTIONS]
    for name, flag in quickconfig.CLI_FLAGS.items():
        assert options.CLI_FLAGS.get(name, f"--{name.replace('_', '-')}") == flag
    assert quickconfig.CACHE_MODES == options.CACHE_MODES
    assert options.ACL_CACHE_MODE in {var for _, _, var in quickconfig.TOP_OPTIONS}


def test_a_newline_in_the_socket_variable_stays_in_its_row(tmp_path: Path) -> None:
    """``CACHEMGR_SOCKET`` with a newline printed as two lines, and the second could pass
    for a row of its own (``(option) daemon.user = root``): the row is one line, the newline
    escaped as every name the CLI prints is (``console.printable``); the os-only path declines
    it to the full one; ``--json`` keeps the exact value."""
    argv, env = _config_case("member-env", tmp_path)
    env["CACHEMGR_SOCKET"] = "/x\n(option) daemon.user = root"
    fast, slow, names = both_paths(argv, env, tmp_path)
    assert_same(fast, slow)
    assert "cachemgr.config.options" in names  # the full path answered
    lines = fast.stdout.decode().splitlines()
    row = "(env: CACHEMGR_SOCKET) socket = /x\\n(option) daemon.user = root"
    assert row in lines, lines
    assert "(option) daemon.user = root" not in lines, lines
    as_json, _, _ = both_paths([*argv, "--json"], env, tmp_path)
    assert json.loads(as_json.stdout)["socket"]["value"] == env["CACHEMGR_SOCKET"]
