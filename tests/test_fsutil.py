"""Layer 0: fcntl locks (threads and processes), atomic writes, tolerant unlink."""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path

import pytest

from cachemgr.errors import LockBusyError
from cachemgr.storage import fsutil


def _hold(path: str, ready: multiprocessing.Event, done: multiprocessing.Event) -> None:
    lock = fsutil.FcntlLock(Path(path))
    lock.acquire()
    ready.set()
    done.wait(30)
    lock.release()


def test_lock_excludes_another_process(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold, args=(str(tmp_path / "a.lock"), ready, done))
    proc.start()
    try:
        assert ready.wait(30)
        lock = fsutil.FcntlLock(tmp_path / "a.lock")
        assert lock.acquire(blocking=False) is False  # busy is not an error
        with pytest.raises(LockBusyError):
            lock.acquire(timeout_s=0.2)
        done.set()
        assert lock.acquire(timeout_s=30)
        lock.release()
    finally:
        done.set()
        proc.join(30)


def test_threads_exclude_each_other_and_timeouts_leave_the_holder_alone(tmp_path: Path) -> None:
    path = tmp_path / "b.lock"
    holder = fsutil.FcntlLock(path)
    assert holder.acquire()
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            fsutil.FcntlLock(path).acquire(timeout_s=0.1)
        except BaseException as exc:  # recorded for the assertion below
            errors.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], LockBusyError)
    # the timed-out waiter must not have released the holder's thread lock
    assert fsutil.FcntlLock(path).acquire(blocking=False) is False
    holder.release()
    again = fsutil.FcntlLock(path)
    assert again.acquire(blocking=False)
    again.release()


def test_lock_registry_does_not_grow(tmp_path: Path) -> None:
    before = len(fsutil.FcntlLock._slots)
    for i in range(500):
        lock = fsutil.FcntlLock(tmp_path / f"k{i}.lock")
        assert lock.acquire(blocking=False)
        lock.release(unlink=True)
    assert len(fsutil.FcntlLock._slots) == before
    assert list(tmp_path.iterdir()) == []


def test_reaped_lock_file_is_relocked(tmp_path: Path) -> None:
    path = tmp_path / "c.lock"
    first = fsutil.FcntlLock(path)
    assert first.acquire()
    first.release(unlink=True)  # a reaper removed it while held
    second = fsutil.FcntlLock(path)
    assert second.acquire(blocking=False)
    assert path.exists()
    second.release()


def test_atomic_write_leaves_no_temp_on_failure(tmp_path: Path) -> None:
    tmp_path.chmod(0o2755)  # shared on purpose (setgid): others may read what is written
    dest = tmp_path / "x.json"
    fsutil.atomic_write_bytes(dest, b"one")
    assert dest.read_bytes() == b"one" and oct(dest.stat().st_mode & 0o777) == "0o664"
    tmp_path.chmod(0o755)  # no setgid: says nothing of who may read the cache, others get none
    fsutil.atomic_write_bytes(dest, b"one")
    assert oct(dest.stat().st_mode & 0o777) == "0o660"
    with pytest.raises(OSError):
        fsutil.atomic_write_bytes(tmp_path / "missing" / "x.json", b"two")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_safe_unlink_tolerates_gone(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("x")
    assert fsutil.safe_unlink(path) is True
    assert fsutil.safe_unlink(path) is False


def test_read_noatime_keeps_atime(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"data")
    os.utime(path, ns=(1_000_000_000, path.stat().st_mtime_ns))
    assert fsutil.read_bytes_noatime(path) == b"data"
    assert path.stat().st_atime_ns == 1_000_000_000


def test_remove_tree_removes_a_tree_deeper_than_the_recursion_limit(tmp_path: Path) -> None:
    """Attack review: a compiler left folders nested 1500 deep in its build folder;
    ``shutil.rmtree`` (3.11) recursed past Python's limit and raised ``RecursionError``, so
    the folder stayed. The removal goes on without recursion and still follows no link."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("kept")
    top = tmp_path / "deep"
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    os.mkdir("deep", dir_fd=fd)
    cur = os.open("deep", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    for i in range(1500):
        os.mkdir("a", dir_fd=cur)
        if i % 500 == 0:
            os.symlink(str(outside), "link", dir_fd=cur)
            with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=cur), "w") as f:
                f.write("x")
        nxt = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
        os.close(cur)
        cur = nxt
    os.symlink(str(outside), "link", dir_fd=cur)
    os.close(cur)
    os.close(fd)
    assert fsutil.remove_tree(top) is True
    assert not os.path.lexists(top)
    assert (outside / "keep.txt").read_text() == "kept"
