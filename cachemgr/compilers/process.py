"""Running one compiler process: its own process group, a deadline, nothing left behind.

The compiler runs in a process group of its own (``process_group=0``), so it and everything
it spawns (``cc1``, ``as``, ``cicc``, ``ptxas``, a wrapper script's children) share one process
group whose id is the compiler's pid. Not a new session (``setsid``, as before issue 14 item 3):
with the kernel's autogroup scheduling each session is a CPU group of its own, and on the
shared 2-core host a compiler in a fresh one ran 5-8 % slower under load than the same argv
run by ``subprocess.run`` (median paired ratios of 120 interleaved runs); the group is all the
kill needs. Its stdin is ``/dev/null``; a compiler that opened the terminal itself to read
would be stopped (``SIGTTIN``) and killed at its timeout. It holds no capability, though the
daemon may (:mod:`.caps`: the unit's ``CAP_FOWNER``).

On timeout, on any interruption (``KeyboardInterrupt``, a cancelled worker), and after a
normal exit, the whole group gets ``SIGKILL``.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachemgr.compilers import caps
from cachemgr.errors import CompileError

_REAP_TIMEOUT_S = 5.0
_TEXT_LIMIT = 2000
#: The daemon's sandbox and limits (:mod:`.sandbox`), applied to every compiler process of
#: this process once set by :func:`use_sandbox`; None in-process (the caller's own compiles).
_sandbox: Any = None
#: Per thread: are the compiler processes it runs now for the daemon's own user
#: (:func:`for_own_user`)?
_caller = threading.local()


def use_sandbox(box: Any) -> None:
    """Run every later compiler process of this process through ``box.wrap`` (a
    :class:`.sandbox.Sandbox`; None: directly)."""
    global _sandbox
    _sandbox = box


@contextlib.contextmanager
def for_own_user(own: bool) -> Iterator[None]:
    """Within the block, this thread's compiler processes are for the daemon's own user
    (``own``): the sandbox's limits apply, its view (bubblewrap) does not — it hides only
    files that such a caller may read anyway (issue 14 item 3: ~6 ms per compiler
    process). Everyone else's — and any process outside such a block — runs in it (issue 10
    item 5)."""
    old = getattr(_caller, "own", False)
    _caller.own = own
    try:
        yield
    finally:
        _caller.own = old


def own_user() -> bool:
    """True inside :func:`for_own_user` (True) in this thread."""
    return bool(getattr(_caller, "own", False))


@dataclass(frozen=True)
class Outcome:
    """A finished process: ``returncode`` (negative = killed by that signal), its output,
    and its wall time in ``seconds``."""

    returncode: int
    stdout: bytes
    stderr: bytes
    seconds: float

    def message(self) -> str:
        """stderr (or stdout when stderr is empty), decoded and trimmed to ~2000 chars."""
        return trim((self.stderr.strip() or self.stdout).decode("utf-8", "replace"))


def run_in_group(
    argv: list[str],
    timeout_s: float,
    cwd: Path | None,
    what: str,
    env: Mapping[str, str] | None = None,
) -> Outcome:
    """Run ``argv`` in a process group of its own and wait at most ``timeout_s`` seconds.

    :param what: words for the error message, e.g. ``"compiling /x/add.c"``.
    :param env: the process's environment (None: this process's own).
    :raises CompileError: when ``argv[0]`` cannot be started, or on timeout (after the whole
        process group was killed with SIGKILL and the compiler reaped).
    """
    start = time.monotonic()
    box = _sandbox
    namespaces = not own_user()
    run = box.wrap(argv, cwd, namespaces) if box is not None else argv
    viewed = box is not None and box.in_view(namespaces)
    try:
        proc = caps.start(run, cwd, env)
    except OSError as exc:
        raise CompileError(f"cannot run {argv[0]!r} ({what}): {exc}") from exc
    try:
        stdout, stderr = _communicate(proc, timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise CompileError(
            f"{os.path.basename(argv[0])} timed out after {timeout_s:g} s {what}; "
            f"killed its process group {proc.pid}"
        ) from None
    except BaseException:
        kill_group(proc)
        raise
    killpg(proc.pid)  # stragglers that closed their pipes but kept running
    if viewed and cwd is not None:
        box.check_left(cwd, what)  # nothing of it runs now: its pid namespace is gone
    return Outcome(proc.returncode, stdout, stderr, time.monotonic() - start)


def _communicate(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[bytes, bytes]:
    """``proc.communicate(timeout=timeout_s)`` without its polling: the exit is awaited on a
    pidfd in the same ``epoll`` as the pipes. ``Popen.wait`` with a timeout (Python 3.11)
    polls ``waitpid`` with sleeps doubling from 0.5 to 50 ms, and the compiler has usually
    closed its pipes a moment before it exits: under load that cost a median ~10 ms per
    compiler process against ``subprocess.run`` (issue 14 item 3). Falls back to
    ``communicate`` where pidfds are missing (Linux < 5.3).

    :raises subprocess.TimeoutExpired: after ``timeout_s`` seconds (the pipes stay open).
    """
    assert proc.stdout is not None and proc.stderr is not None
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return proc.communicate(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    out, err = proc.stdout.fileno(), proc.stderr.fileno()
    chunks: dict[int, list[bytes]] = {out: [], err: []}
    try:
        with selectors.DefaultSelector() as sel:
            for fd in (out, err, pidfd):
                sel.register(fd, selectors.EVENT_READ)
            waiting = {out, err, pidfd}
            while waiting:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise subprocess.TimeoutExpired(proc.args, timeout_s)
                for key, _ in sel.select(remaining):
                    data = b"" if key.fd == pidfd else os.read(key.fd, 65536)
                    if data:
                        chunks[key.fd].append(data)
                    else:  # end of a pipe, or the process exited
                        sel.unregister(key.fd)
                        waiting.discard(key.fd)
    finally:
        os.close(pidfd)
    proc.wait()  # it has exited: reaped at once
    proc.stdout.close()
    proc.stderr.close()
    return b"".join(chunks[out]), b"".join(chunks[err])


def killpg(pgid: int) -> None:
    """SIGKILL process group ``pgid``; already gone is fine.

    Safe after the leader was reaped: Linux does not hand out a pid still used as a group id.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc``'s whole process group, then reap ``proc``."""
    killpg(proc.pid)
    try:
        proc.communicate(timeout=_REAP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # A member left the group (setsid) and still holds our pipes: stop reading them.
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()
    except ValueError:
        proc.wait()  # pipes already closed by an earlier communicate()


def signal_name(signum: int) -> str:
    """``SIGSEGV`` for 11, or ``signal N`` for an unnamed number."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def trim(text: str) -> str:
    """``text`` stripped and cut to ~2000 chars, saying how much was cut."""
    text = text.strip()
    if len(text) <= _TEXT_LIMIT:
        return text
    return f"{text[:_TEXT_LIMIT]} ... ({len(text) - _TEXT_LIMIT} more chars)"
