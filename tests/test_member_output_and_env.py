"""A member's compile cannot grow the daemon with output, nor run a program through gcc's
``GCC_COMPARE_DEBUG`` (docs/security.md#10-streaming-limits-fairness,
docs/security.md#5-callers-are-identified-the-daemon-reads-nothing-for-them).

The daemon runs as the unit runs it (:func:`tests.test_service_sandbox._unit_daemon`: a
dedicated user of the sharing group, the unit's capability sets), the member (bob) is another
user of that group, compiling through the real client on the group socket.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachemgr.compilers import lineinfo, process
from cachemgr.errors import CompileError
from tests.compile_util import scale_request
from tests.daemon_util import Daemon
from tests.test_deputy import CLIENT
from tests.test_service_sandbox import KERNEL, _unit_daemon
from tests.users_util import Runtime, Users, run_as

#: Each level doubles the errors gcc prints for ``f``: 2^(DEPTH-1) of them, each with a note
#: per level of macro expansion (~0.5 GB of stderr at 16).
DEPTH = 16
#: How much the daemon's peak resident size may grow over a compile of this flood (bytes).
GROWTH_BYTES = 200 * 1024 * 1024


def _client(
    users: Users, rt: Runtime, folder: Path, sock: str, req: dict, env: dict[str, str]
) -> dict:
    """Compile ``req`` as bob through the daemon on ``sock``; the client's answer."""
    out = subprocess.run(
        [rt.python, "-c", CLIENT, sock, json.dumps(req), str(folder)],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": rt.pythonpath, "HOME": str(folder),
             "CACHEMGR_DAEMON_USER": users.alice, **env},
        cwd=folder, capture_output=True, text=True, timeout=300, check=False,
        **run_as(users.bob, users),  # type: ignore[arg-type]
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def _source(users: Users, folder: Path, name: str, text: str) -> Path:
    src = folder / name
    src.write_text(text)
    src.chmod(0o644)
    shutil.chown(src, users.bob)
    return src


def _peak_bytes(pid: int) -> int:
    """VmHWM of process ``pid``: its peak resident size, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


@pytest.fixture
def gcc_daemon(users: Users, other_runtime: Runtime) -> Iterator[tuple[Daemon, Path, str]]:
    """The unit's daemon compiling with gcc: ``(daemon, bob's folder, its socket)``; stopped
    after the test."""
    daemon, bob = _unit_daemon(users, other_runtime, '[compilers]\ncc = "/usr/bin/gcc"\n')
    try:
        yield daemon, bob, str(daemon.socket_path)
    finally:
        daemon.stop()


def test_a_members_error_flood_leaves_the_daemon_small(
    users: Users, other_runtime: Runtime, gcc_daemon: tuple[Daemon, Path, str]
) -> None:
    rt, (daemon, bob, sock) = other_runtime, gcc_daemon
    warm = _source(users, bob, "k.c", KERNEL)
    first = _client(users, rt, bob, sock, scale_request(str(warm), defines={"K": 1}), {})
    assert "error" not in first, first
    idle = _peak_bytes(daemon.proc.pid)
    flood = KERNEL + "#define A0 1=1;\n"
    flood += "".join(f"#define A{i} A{i - 1} A{i - 1}\n" for i in range(1, DEPTH + 1))
    flood += f"void f(void){{ A{DEPTH} }}\n"
    src = _source(users, bob, "flood.c", flood)
    answer = _client(users, rt, bob, sock, scale_request(str(src), defines={"K": 2}), {})
    grown = _peak_bytes(daemon.proc.pid) - idle
    assert grown <= GROWTH_BYTES, f"the daemon grew by {grown} bytes"
    text = json.dumps(answer)
    assert answer.get("status") == "failed", text[:2000]
    assert "lvalue required" in text or "error:" in text, text[:2000]
    assert len(text) <= 8 * 1024, f"the answer is {len(text)} bytes"


#: A GCC_COMPARE_DEBUG that gcc takes as switches: its wrapper prints MARK42 and fails.
PROBE = "-wrapper /bin/sh,-c,echo${IFS}MARK$((6*7))>&2;exit${IFS}1"


def test_gcc_compare_debug_switches_are_refused_through_the_daemon(
    users: Users, other_runtime: Runtime, gcc_daemon: tuple[Daemon, Path, str]
) -> None:
    rt, (_, bob, sock) = other_runtime, gcc_daemon
    src = _source(users, bob, "k.c", KERNEL)
    req = scale_request(str(src), defines={"K": 7})
    refused = _client(users, rt, bob, sock, req, {"GCC_COMPARE_DEBUG": PROBE})
    error = str(refused.get("error", ""))
    assert "MARK42" not in json.dumps(refused), refused  # the wrapper never ran
    assert refused.get("status_code") == 400, refused
    assert "GCC_COMPARE_DEBUG" in error and "\n" not in error, error
    plain = scale_request(str(src), defines={"K": 8})
    done = _client(users, rt, bob, sock, plain, {"GCC_COMPARE_DEBUG": "1"})
    assert "error" not in done, done
    bad_epoch = _client(users, rt, bob, sock, req, {"SOURCE_DATE_EPOCH": "-1 week"})
    assert bad_epoch.get("status_code") == 400, bad_epoch
    assert "SOURCE_DATE_EPOCH" in str(bad_epoch.get("error")), bad_epoch


def test_a_pipe_keeps_its_head_and_tail_and_says_how_much_was_left_out() -> None:
    script = "import sys; sys.stdout.write('H' * 100000 + 'M' * 5000000 + 'T' * 100000)"
    out = process.run_in_group([sys.executable, "-c", script], 60, None, "printing")
    head, tail = process.DIAGNOSTICS.head, process.DIAGNOSTICS.tail
    left = 5200000 - head - tail
    assert out.returncode == 0
    assert out.stdout_dropped == left
    assert out.stdout.startswith(b"H" * head) and out.stdout.endswith(b"T" * tail)
    assert f"… {left} bytes of compiler output left out …".encode() in out.stdout
    assert len(out.stdout) < head + tail + 100
    assert out.message().endswith(f"({len(out.stdout.decode().strip()) - 2000 + left} more chars)")


def test_a_line_table_over_the_cap_is_refused_in_one_line(tmp_path: Path) -> None:
    readelf = tmp_path / "readelf"
    size = lineinfo.MAX_READELF_BYTES + 1
    readelf.write_text(f"#!/bin/sh\nhead -c {size} /dev/zero | tr '\\0' 'a'\n")
    readelf.chmod(0o755)
    binary = tmp_path / "k.o"
    binary.write_bytes(b"")
    with pytest.raises(CompileError, match="over 8388608 bytes") as err:
        lineinfo.decode_lines(binary, str(readelf))
    assert "\n" not in str(err.value)
