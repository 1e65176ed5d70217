"""One test at a time where it must be: a readers-writer lock across pytest-xdist workers.

Most tests run side by side (``scripts/test`` passes ``-n``); a test marked ``serial``
measures something other tests' load would distort (a CPU share, a latency bound, a
memory peak) and runs while no other test does. The lock is two ``flock`` files in the
folder the run's workers share (the parent of each worker's base temp folder):

* ``turnstile``: taken exclusively to get in. A serial test keeps it until it ends, so no
  new test starts meanwhile; any other test lets go of it as soon as it holds ``tests``.
  Without it a steady stream of shared holders could keep a serial test waiting for good.
* ``tests``: shared by a running test, exclusive for a serial one (which waits for the
  tests already running to end).

Neither lock is held while waiting for the other the wrong way round, so no two workers
wait for each other. Outside xdist (one process) nothing is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest


def _lock_folder(config: pytest.Config) -> Path | None:
    """The folder all workers of this run share, or None outside xdist."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
    return factory.getbasetemp().parent  # <run>/popen-gwN → <run>


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, mode)  # blocks until granted
        yield
    finally:
        os.close(fd)  # releases it


@contextlib.contextmanager
def gate(config: pytest.Config, exclusive: bool) -> Iterator[None]:
    """Hold the run's lock for one test: shared, or ``exclusive`` (no other test runs)."""
    folder = _lock_folder(config)
    if folder is None:
        yield
        return
    turnstile, tests = folder / "serial-turnstile.lock", folder / "serial-tests.lock"
    if exclusive:
        with _flock(turnstile, fcntl.LOCK_EX), _flock(tests, fcntl.LOCK_EX):
            yield
        return
    with contextlib.ExitStack() as stack:
        with _flock(turnstile, fcntl.LOCK_EX):
            stack.enter_context(_flock(tests, fcntl.LOCK_SH))
        yield
