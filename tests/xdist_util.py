"""What the suite's pytest-xdist workers share: a readers-writer lock (one test at a time
where it must be) and values made once per run (:func:`shared_once`).

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
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")


def _lock_folder(config: pytest.Config) -> Path | None:
    """The folder all workers of this run share, or None outside xdist."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return run_folder(config)


def run_folder(config: pytest.Config) -> Path:
    """The folder this run's processes share: the parent of each xdist worker's base temp
    folder (``<run>/popen-gwN``), or the base temp folder itself without xdist."""
    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_once(config: pytest.Config, name: str, make: Callable[[], T]) -> T:
    """``make()``'s JSON-able result, made by the first worker that asks and kept in
    ``<run folder>/<name>.json`` for the others (which wait for it under a lock): a
    module-scoped value stays once per run when the module's tests are spread over workers."""
    path = run_folder(config) / f"{name}.json"
    with _flock(path.with_suffix(".lock"), fcntl.LOCK_EX):
        if path.exists():
            value: T = json.loads(path.read_text())
            return value
        value = make()
        path.write_text(json.dumps(value))
        return value


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
