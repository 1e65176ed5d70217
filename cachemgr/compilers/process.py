"""Running one compiler process: its own process group, a deadline, nothing left behind.

The compiler runs in a process group of its own (``process_group=0``), so it and everything
it spawns (``cc1``, ``as``, ``cicc``, ``ptxas``, a wrapper script's children) share one process
group whose id is the compiler's pid. Not a new session (``setsid``, as it once was):
with the kernel's autogroup scheduling each session is a CPU group of its own, and on the
shared 2-core host a compiler in a fresh one ran 5-8 % slower under load than the same argv
run by ``subprocess.run`` (median paired ratios of 120 interleaved runs); the group is all the
kill needs. Its stdin is ``/dev/null``; a compiler that opened the terminal itself to read
would be stopped (``SIGTTIN``) and killed at its timeout. It holds no capability, though the
daemon may (:mod:`.caps`: the unit's ``CAP_FOWNER``).

On timeout, on any interruption (``KeyboardInterrupt``, a cancelled worker), and after a
normal exit, the whole group gets ``SIGKILL``.

While it runs, the caller's thread may do work of its own that needs nothing the compiler
makes (``meanwhile``: a publish's files made ahead, the compiler's identity for the kernel
json): a miss then waits for the longer of the two instead of their sum
(docs/performance.md, *Miss overhead*). An exception from that work stops the compile the
same way (the group killed) and is raised.

What it prints is bounded (docs/security.md#10-streaming-limits-fairness): of each pipe a
caller keeps what its :class:`Keep` says — by default (:data:`DIAGNOSTICS`) the first and the
last 64 KiB, the middle read and dropped, marked ``… N bytes of compiler output left out …``.
A member's source can make gcc print gigabytes of errors (a macro doubling ``1=1;`` twenty
times: 2^19 of them); kept whole they grew the daemon by as much. A caller that parses the
output keeps more, up to a documented cap, and refuses past it (:attr:`Outcome.stdout_dropped`).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachemgr.compilers import caps
from cachemgr.errors import CompileError

_REAP_TIMEOUT_S = 5.0
_TEXT_LIMIT = 2000
_READ_BYTES = 65536
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
    files that such a caller may read anyway (~6 ms per compiler
    process). Everyone else's — and any process outside such a block — runs in it."""
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
class Keep:
    """How much of one pipe's output is kept: its first ``head`` and its last ``tail`` bytes;
    what lies between is read (the process never blocks on a full pipe) and dropped."""

    head: int
    tail: int


#: A compiler's messages: the first and last 64 KiB of each pipe (module docstring).
DIAGNOSTICS = Keep(64 * 1024, 64 * 1024)


def up_to(limit: int) -> Keep:
    """Keep the first ``limit`` bytes and nothing of the end: for output a caller parses
    whole, which refuses it when more came (:attr:`Outcome.stdout_dropped` > 0)."""
    return Keep(limit, 0)


@dataclass(frozen=True)
class Outcome:
    """A finished process: ``returncode`` (negative = killed by that signal), its output
    (what its :class:`Keep` kept: when bytes were dropped, a line in the middle says how
    many), and its wall time in ``seconds``; ``stdout_dropped``/``stderr_dropped`` count
    the bytes left out."""

    returncode: int
    stdout: bytes
    stderr: bytes
    seconds: float
    stdout_dropped: int = 0
    stderr_dropped: int = 0

    def message(self) -> str:
        """stderr (or stdout when stderr is empty), decoded and trimmed to ~2000 chars (the
        count of chars cut includes the bytes dropped)."""
        if self.stderr.strip():
            text, dropped = self.stderr, self.stderr_dropped
        else:
            text, dropped = self.stdout, self.stdout_dropped
        return trim(text.decode("utf-8", "replace"), dropped)


class _Capture:
    """One pipe's output as its :class:`Keep` keeps it (at most ``head + tail`` bytes held)."""

    def __init__(self, keep: Keep) -> None:
        self.keep = keep
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, data: bytes) -> None:
        room = self.keep.head - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        if self.keep.tail <= 0:
            self.dropped += len(data)
            return
        self.tail += data
        over = len(self.tail) - self.keep.tail
        if over > 0:
            del self.tail[:over]
            self.dropped += over

    def value(self) -> bytes:
        if not self.dropped:
            return bytes(self.head + self.tail)
        mark = f"\n… {self.dropped} bytes of compiler output left out …\n"
        return bytes(self.head) + mark.encode() + bytes(self.tail)


def run_in_group(
    argv: list[str],
    timeout_s: float,
    cwd: Path | None,
    what: str,
    env: Mapping[str, str] | None = None,
    keep_stdout: Keep = DIAGNOSTICS,
    keep_stderr: Keep = DIAGNOSTICS,
    meanwhile: Callable[[], object] | None = None,
) -> Outcome:
    """Run ``argv`` in a process group of its own and wait at most ``timeout_s`` seconds.

    :param what: words for the error message, e.g. ``"compiling /x/add.c"``.
    :param env: the process's environment (None: this process's own).
    :param keep_stdout: how much of its stdout is kept (bytes; module docstring).
    :param keep_stderr: how much of its stderr is kept.
    :param meanwhile: called once the process has started, before its output is read (the
        caller's own work while it runs; module docstring). Its time counts in ``timeout_s``.
    :raises CompileError: when ``argv[0]`` cannot be started, or on timeout (after the whole
        process group was killed with SIGKILL and the compiler reaped).
    :raises BaseException: what ``meanwhile`` raised (after the group was killed).
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
        if meanwhile is not None:
            meanwhile()
        left = max(timeout_s - (time.monotonic() - start), 0.0)
        out, err = _communicate(proc, left, _Capture(keep_stdout), _Capture(keep_stderr))
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
    seconds = time.monotonic() - start
    return Outcome(proc.returncode, out.value(), err.value(), seconds, out.dropped, err.dropped)


def _communicate(
    proc: subprocess.Popen[bytes], timeout_s: float, out: _Capture, err: _Capture
) -> tuple[_Capture, _Capture]:
    """Read ``proc``'s stdout into ``out`` and its stderr into ``err`` until both end and it
    exits, at most ``timeout_s`` seconds. Not ``proc.communicate``: that keeps every byte
    (module docstring), and polls for the exit — ``Popen.wait`` with a timeout (Python 3.11)
    polls ``waitpid`` with sleeps doubling from 0.5 to 50 ms, and the compiler has usually
    closed its pipes a moment before it exits: under load that cost a median ~10 ms per
    compiler process against ``subprocess.run``. Here the exit is awaited on a pidfd in the
    same ``epoll`` as the pipes; where pidfds are missing (Linux < 5.3), by ``wait`` once
    both pipes ended.

    :raises subprocess.TimeoutExpired: after ``timeout_s`` seconds (the pipes stay open).
    """
    assert proc.stdout is not None and proc.stderr is not None
    deadline = time.monotonic() + timeout_s
    try:
        pidfd: int | None = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = None
    captures = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    try:
        with selectors.DefaultSelector() as sel:
            waiting = set(captures) | ({pidfd} if pidfd is not None else set())
            for fd in waiting:
                sel.register(fd, selectors.EVENT_READ)
            while waiting:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise subprocess.TimeoutExpired(proc.args, timeout_s)
                for key, _ in sel.select(remaining):
                    data = b"" if key.fd == pidfd else os.read(key.fd, _READ_BYTES)
                    if data:
                        captures[key.fd].add(data)
                    else:  # end of a pipe, or the process exited
                        sel.unregister(key.fd)
                        waiting.discard(key.fd)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    if pidfd is not None:
        proc.wait()  # it has exited: reaped at once
    else:
        proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
    proc.stdout.close()
    proc.stderr.close()
    return out, err


def killpg(pgid: int) -> None:
    """SIGKILL process group ``pgid``; already gone is fine.

    Safe after the leader was reaped: Linux does not hand out a pid still used as a group id.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc``'s whole process group, then reap ``proc``. Its pipes are closed
    unread: a process that left the group (``setsid``) and kept writing would otherwise
    be read, and kept, without bound."""
    killpg(proc.pid)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    try:
        proc.wait(timeout=_REAP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()  # the leader moved to another process group
        proc.wait()


def signal_name(signum: int) -> str:
    """``SIGSEGV`` for 11, or ``signal N`` for an unnamed number."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def trim(text: str, dropped: int = 0) -> str:
    """``text`` stripped and cut to ~2000 chars, saying how much was cut (with ``dropped``,
    the bytes of output already left out before)."""
    text = text.strip()
    if len(text) <= _TEXT_LIMIT and not dropped:
        return text
    more = max(len(text) - _TEXT_LIMIT, 0) + dropped
    return f"{text[:_TEXT_LIMIT]} ... ({more} more chars)"
