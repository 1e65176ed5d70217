"""The help (and the man pages made from it) says what the commands do: every exit code a
command's ``--help`` documents (its ``Exit codes:`` paragraph) is produced by a real run of
the case it names, and every numeric range an option's help gives (``0..100``) is the range
the command accepts — both ends taken, one past either end refused with one line naming the
option. A code documented without a case here, or a range without a way to run it, fails."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from cachemgr.cli import COMMANDS
from tests.compile_util import SOC, request_data
from tests.conftest import ROOT, publish, run_cli
from tests.daemon_util import start_daemon
from tests.test_cli_operator import _toolkit
from tests.test_daemon_resources import _user_daemon
from tests.users_util import Runtime, Users, run_python_as

Proc = subprocess.CompletedProcess[str]


def _help(command: tuple[str, ...]) -> str:
    proc = run_cli(*command, "--help")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def documented_exit_codes(help_text: str) -> set[int]:
    """The codes of the ``Exit codes: 0 …; 1 …; 2 ….`` paragraph (empty without one)."""
    text = " ".join(help_text.split())
    if "Exit codes: " not in text:
        return set()
    paragraph = re.split(r"\.(?: |$)", text.split("Exit codes: ", 1)[1], maxsplit=1)[0]
    return {int(code) for code in re.findall(r"(?:^|; )(\d) ", paragraph)}


def documented_ranges(help_text: str) -> dict[str, tuple[int, int]]:
    """``{option: (low, high)}`` for each option whose help row names a range ``LO..HI``."""
    options = help_text.split("Options:", 1)[1]
    rows = re.split(r"\n  (?=-)", options)
    found = {}
    for row in rows:
        name = re.match(r"(?:-\w, )?(--[\w-]+)", row.strip())
        span = re.search(r"(-?\d+)\.\.(\d+)", " ".join(row.split()))
        if name and span:
            found[name.group(1)] = (int(span.group(1)), int(span.group(2)))
    return found


@dataclass
class Site:
    """Folders and an environment for the cases: a cache with one entry (``root``), a
    request for it, a toolkit for ``limits set``."""

    tmp: Path
    env: dict[str, str]
    root: Path
    request: str

    def run(self, *args: str, env: dict[str, str] | None = None) -> Proc:
        return run_cli(*args, env={**self.env, **(env or {})})

    def path(self, name: str) -> str:
        return str(self.tmp / name)

    def write(self, name: str, data: object) -> str:
        (self.tmp / name).write_text(data if isinstance(data, str) else json.dumps(data))
        return self.path(name)


def _bad_compile(site: Site) -> Proc:
    source = site.write("broken.c", "void add_kernel(float *x) { this does not compile }\n")
    req = site.write("broken.json", request_data(kernel_source=source))
    return site.run("compile", "--cache-dir", str(site.root), req)


def _bad_request(site: Site) -> Proc:
    data = request_data()
    data["optype"] = data.pop("op_type")
    return site.run("compile", "--cache-dir", str(site.root), site.write("bad.json", data))


def _stuck_over_limit(site: Site) -> Proc:
    root = site.tmp / "full"
    chip = root / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    for i in range(2):  # 1.2 MiB against a 1 MiB limit, all accessed just now
        publish(chip, f"te_big_{i}", os.urandom(600 * 1024))
    env = {k: v for k, v in site.env.items() if not k.startswith("ASCEND_")}  # no toolkit
    env["ASCEND_MAX_OP_CACHE_SIZE"] = "1"
    return run_cli("gc", "--local", "--cache-dir", str(root), env=env)


def _corrupt_entry(site: Site) -> Proc:
    root = site.tmp / "corrupt"
    chip = root / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    publish(chip, "te_bad_0", b"\x7fELF good")
    (chip / "te_bad_0.o").write_bytes(b"\x7fELF flipped")
    return site.run("verify", "--cache-dir", str(root))


def _limits(site: Site, *args: str) -> Proc:
    return site.run("limits", "set", "--local", "--cache-dir", site.path("lim"), *args)


def _other_toolkit(site: Site) -> Proc:
    root = site.tmp / "upgraded"
    (root / "kernel_cache" / SOC).mkdir(parents=True)
    (root / "kernel_cache" / "op_cache.ini").write_text(
        "[op_compiler_cache]\nmax_op_cache_size=500\nremain_cache_size_ratio=50\n"
        "adk_version=7.0.0\nops_version=7.0.0\n"
    )
    return site.run("limits", "set", "--local", "--cache-dir", str(root), "--max-size", "9")


def _daemon_case(site: Site, *args: str) -> Proc:
    (site.tmp / "d").mkdir()
    d = start_daemon(site.tmp / "d", "--cache-dir", site.path("dc"))
    try:
        return site.run(*args, "--socket", str(d.socket_path), env={"HOME": d.env["HOME"]})
    finally:
        d.stop()


NOBODY = ("--socket", "/nonexistent/cachemgr.sock")


def _linked_socket(site: Site) -> Proc:
    """``status`` at a socket name it does not trust (a symbolic link: not followed)."""
    link = site.tmp / "linked.sock"
    link.symlink_to("/nonexistent/cachemgr.sock")
    return site.run("status", "--socket", str(link))


#: Per command, per documented exit code: a real run that must end with it.
CASES: dict[tuple[str, ...], dict[int, Callable[[Site], Proc]]] = {
    ("compile",): {
        0: lambda s: s.run("compile", "--cache-dir", str(s.root), s.request),
        1: _bad_compile,
        2: _bad_request,
    },
    ("gc",): {
        0: lambda s: s.run("gc", "--dry-run", "--local", "--cache-dir", str(s.root)),
        1: _stuck_over_limit,
        2: lambda s: s.run("gc", "--local", "--cache-dir", str(s.root), "--ratio", "101"),
    },
    ("status",): {
        0: lambda s: _daemon_case(s, "status"),
        1: lambda s: s.run("status", *NOBODY),
        2: _linked_socket,
    },
    ("verify",): {
        0: lambda s: s.run("verify", "--cache-dir", str(s.root)),
        1: _corrupt_entry,
        2: lambda s: s.run("verify", "--cache-dir", str(s.root), "--config", s.path("none.toml")),
    },
    ("config",): {
        0: lambda s: s.run("config", "--cache-dir", str(s.root)),
        2: lambda s: s.run(
            "config", "--cache-dir", str(s.root), env={"ASCEND_MAX_OP_CACHE_SIZE": "8x"}
        ),
    },
    ("limits", "set"): {
        0: lambda s: _limits(s, "--max-size", "10"),
        1: _other_toolkit,
        2: lambda s: _limits(s, "--ratio", "0"),
    },
    # 0 and 2 need a daemon of another user: test_stop_is_for_the_daemons_user_and_root
    ("stop",): {1: lambda s: s.run("stop", *NOBODY, "--wait", "0")},
}
#: Codes checked by a test of their own (they need real users).
ELSEWHERE = {("stop",): {0, 2}}

#: How to run a command with one option's value, when the other options are valid.
RANGED: dict[tuple[str, ...], Callable[[Site, str, str], Proc]] = {
    ("compile",): lambda s, opt, v: s.run("compile", "--cache-dir", str(s.root), opt, v, s.request),
    ("gc",): lambda s, opt, v: s.run(
        "gc", "--dry-run", "--local", "--min-age", "0", "--cache-dir", str(s.root), opt, v
    ),
    ("limits", "set"): lambda s, opt, v: _limits(s, opt, v),
}


def _all_commands() -> list[tuple[str, ...]]:
    return [(n,) for n in sorted(COMMANDS) if n != "limits"] + [
        ("limits", "set"),
        ("limits", "show"),
    ]


@pytest.fixture(scope="module")
def helps() -> dict[tuple[str, ...], str]:
    return {command: _help(command) for command in _all_commands()}


@pytest.fixture
def site(tmp_path: Path, clean_env: dict[str, str]) -> Site:
    env = {**clean_env, **_toolkit(tmp_path)}
    root = tmp_path / "cache"
    req = tmp_path / "req.json"
    req.write_text(json.dumps(request_data(defines={"N": 2408, "B_N": 1})))
    proc = run_cli("compile", "--cache-dir", str(root), str(req), env=env)
    assert proc.returncode == 0, proc.stderr
    return Site(tmp_path, env, root, str(req))


def test_every_documented_exit_code_happens(helps: dict[tuple[str, ...], str], site: Site) -> None:
    documented = {c: documented_exit_codes(text) for c, text in helps.items()}
    documented = {c: codes for c, codes in documented.items() if codes}
    assert set(documented) == set(CASES), "a command documents exit codes no case here runs"
    for command, codes in documented.items():
        cases = set(CASES[command]) | ELSEWHERE.get(command, set())
        assert codes == cases, (command, "documented", codes, "cases", cases)
        for code, case in sorted(CASES[command].items()):
            proc = case(site)
            assert proc.returncode == code, (command, code, proc.stdout, proc.stderr)
            if code == 2:
                assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, (
                    command,
                    proc.stderr,
                )


def test_every_documented_range_is_the_accepted_one(
    helps: dict[tuple[str, ...], str], site: Site
) -> None:
    ranges = {c: documented_ranges(text) for c, text in helps.items()}
    ranges = {c: r for c, r in ranges.items() if r}
    assert set(ranges) == set(RANGED), sorted(ranges)
    assert ranges[("gc",)]["--ratio"] == (0, 100)  # a forced target; 0 keeps nothing old
    assert ranges[("limits", "set")]["--ratio"] == (1, 100)  # GE's remain ratio
    for command, options in ranges.items():
        run = RANGED[command]
        for option, (low, high) in options.items():
            for value in (low, high):
                proc = run(site, option, str(value))
                assert proc.returncode == 0, (command, option, value, proc.stderr)
            for value in (low - 1, high + 1):
                proc = run(site, option, str(value))
                assert proc.returncode == 2, (command, option, value, proc.stdout)
                assert option in proc.stderr and f"{str(value)!r}" in proc.stderr, proc.stderr
                assert proc.stderr.count("\n") == 1, proc.stderr


def test_stop_is_for_the_daemons_user_and_root(users: Users, other_runtime: Runtime) -> None:
    """The docs said only the daemon's own user may stop it; root may too (``--help``,
    docs/commands.md, docs/daemon.md): a group member is refused (exit 2, one line), root
    stops it (exit 0)."""
    text = " ".join(_help(("stop",)).split())
    assert "Only its own user or root may stop it" in text, text
    commands = (ROOT / "docs" / "commands.md").read_text().split("### `cachemgr stop")[1]
    assert "own user and root may" in " ".join(commands.split("###")[0].split()), commands
    daemon = (ROOT / "docs" / "daemon.md").read_text().split("* **Stopping**")[1]
    assert "own uid and root may ask" in " ".join(daemon.split("\n* ")[0].split()), daemon
    d = _user_daemon(users, other_runtime, users.alice, "")
    sock = str(d.socket_path)
    trust = {"CACHEMGR_DAEMON_USER": users.alice}
    try:
        member = run_python_as(
            users, other_runtime, users.bob, "-m", "cachemgr", "stop", "--socket", sock, env=trust
        )
        assert member.returncode == 2, member.stdout + member.stderr
        assert member.stderr.count("\n") == 1 and "only the daemon's user" in member.stderr
        # worded as the CLI's other refusals, not as the endpoint's raw "/stop: only …"
        line = member.stderr.strip()
        assert line.startswith(f"cachemgr: error: stop: refused by the daemon at {sock}: "), line
        assert line.endswith("; nothing stopped") and "/stop" not in line, line
        assert d.proc.poll() is None
        root = run_cli("stop", "--socket", sock, env={**os.environ, **trust})
        assert root.returncode == 0, root.stdout + root.stderr
        assert d.proc.wait(timeout=60) == 0
    finally:
        if d.proc.poll() is None:
            d.stop()


def test_the_help_says_mib_and_where_serve_listens(helps: dict[tuple[str, ...], str]) -> None:
    """``--max-size MB`` beside ``MiB`` everywhere else; ``serve --socket``'s default left
    out ``cachemgr.sock``, ``$CACHEMGR_SOCKET`` and the ``/tmp`` fallback."""
    for command, text in helps.items():
        assert not re.search(r"\bMB\b(?! is a MiB)", text), (command, text)
    assert "--max-size MIB" in helps[("limits", "set")]
    serve = "".join(helps[("serve",)].split())  # click wraps after a hyphen
    for needle in ("$CACHEMGR_SOCKET", "cachemgr.sockin$RUNTIME_DIRECTORY",
                   "$XDG_RUNTIME_DIR/cachemgr", "/tmp/cachemgr-UID"):  # fmt: skip
        assert needle in serve, serve
