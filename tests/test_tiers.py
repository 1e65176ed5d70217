"""The storage-tier interface over the local CANN-format store: an explicit
handle for a held entry lock, events as objects, the local store as a :class:`Tier`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cachemgr.errors import InvalidInputError, NoSpaceError
from cachemgr.storage import entry
from cachemgr.storage.events import Events, NoSpaceEvent
from cachemgr.storage.store import Store
from cachemgr.storage.tiers import EntryFiles, LocalTier, Tier
from tests.conftest import SOC, kernel_json, publish

PROBE = """
import sys
from pathlib import Path
from cachemgr.storage.fsutil import FcntlLock
lock = FcntlLock(Path(sys.argv[1]))
got = lock.acquire(blocking=False)
print("free" if got else "held")
"""


def _lock_state(lock_path: Path) -> str:
    """Whether another process can take ``lock_path`` now (a real fcntl probe)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(lock_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def test_publish_and_remove_under_an_explicit_held_lock(chip: Path) -> None:
    store = Store(chip, lock_timeout_s=2)
    data = os.urandom(512)
    hold = store.hold("te_held")
    try:
        # the held handle is used, not a second lock (that would wait for ourselves)
        result = store.publish(
            "te_held", {"te_held.o": data}, kernel_json("te_held", data), held=hold
        )
        assert result.status == "published"
        assert store.lookup("te_held", held=hold).hit
        assert _lock_state(store.lock_path("te_held")) == "held"  # still ours after publish
        assert "te_held.json" in store.remove("te_held", held=hold)
        assert _lock_state(store.lock_path("te_held")) == "held"
    finally:
        hold.release()
    assert _lock_state(store.lock_path("te_held")) == "free"
    assert not (chip / "te_held.o").exists()


def test_a_held_lock_of_another_kernel_is_refused(chip: Path) -> None:
    store = Store(chip)
    with store.hold("te_a") as hold, pytest.raises(ValueError, match="te_a"):
        store.remove("te_b", held=hold)


def test_events_reach_subscribers_and_a_failing_handler_is_contained(tmp_path: Path) -> None:
    sink = Events()
    seen: list[NoSpaceEvent] = []

    def broken(_: NoSpaceEvent) -> None:
        raise RuntimeError("handler bug")

    sink.subscribe(NoSpaceEvent, broken)
    sink.subscribe(NoSpaceEvent, seen.append)
    sink.emit(NoSpaceEvent(tmp_path, 7))
    sink.emit("another kind of event")  # no handler: nothing happens
    sink.unsubscribe(NoSpaceEvent, seen.append)
    sink.emit(NoSpaceEvent(tmp_path, 8))
    assert seen == [NoSpaceEvent(tmp_path, 7)]
    assert not isinstance(NoSpaceError("x", "y", 1), NoSpaceEvent)


def test_local_tier_moves_an_entry_between_two_roots(tmp_path: Path) -> None:
    site_a = LocalTier(tmp_path / "a" / "kernel_cache")
    site_b = LocalTier(tmp_path / "b" / "kernel_cache")
    assert isinstance(site_a, Tier) and isinstance(site_b, Tier)
    data = os.urandom(4096)
    (tmp_path / "a" / "kernel_cache" / SOC).mkdir(parents=True)
    publish(tmp_path / "a" / "kernel_cache" / SOC, "te_move", data)
    got = site_a.fetch(SOC, "te_move")
    assert got is not None and got.files["te_move.o"] == data and got.size > len(data)
    assert site_b.fetch(SOC, "te_move") is None and not site_b.lookup(SOC, "te_move")
    assert site_b.put(got) is True
    assert site_b.lookup(SOC, "te_move")
    assert site_b.put(got) is False  # a good entry is there: not rewritten
    stat = site_b.stat()
    assert stat.entries == 1 and stat.bytes == got.size and stat.state == "ok"
    assert site_b.remove(SOC, "te_move") and not site_b.lookup(SOC, "te_move")


def test_local_tier_put_rejects_a_tampered_entry_and_writes_nothing(tmp_path: Path) -> None:
    tier = LocalTier(tmp_path / "kernel_cache")
    data = os.urandom(1024)
    doc = kernel_json("te_bad", data)
    raw = json.dumps(doc).encode()
    flipped = bytes([data[0] ^ 1]) + data[1:]
    bad = [
        EntryFiles(SOC, "te_bad", {"te_bad.json": raw, "te_bad.o": flipped}),
        EntryFiles(SOC, "te_bad", {"te_bad.o": data}),  # no main json
        EntryFiles(SOC, "te_bad", {"te_bad.json": b"{not json", "te_bad.o": data}),
        EntryFiles(SOC, "te_bad", {"te_bad.json": raw, "te_bad.o": data, "../x.o": b"1"}),
        EntryFiles("../up", "te_bad", {"te_bad.json": raw, "te_bad.o": data}),
    ]
    for item in bad:
        with pytest.raises(InvalidInputError):
            tier.put(item)
    chip = tmp_path / "kernel_cache" / SOC
    assert not chip.exists() or not [n for n in os.listdir(chip) if not n.endswith(".lock")]
    assert not (tmp_path / "x.o").exists() and not (tmp_path / "up").exists()
    assert entry.sha256_hex(data) == doc["sha256"]
    assert tier.put(EntryFiles(SOC, "te_bad", {"te_bad.json": raw, "te_bad.o": data}))


# --- one removal routine, one factory ------------------------------------


def _deletions(chip: Path, remove: object, expected: int) -> list[str]:
    """The names removed from ``chip`` while ``remove()`` runs, in the order the kernel
    reported them (a real inotify watch)."""
    import threading

    from watchdog.events import FileDeletedEvent, FileSystemEventHandler
    from watchdog.observers import Observer

    from tests.daemon_util import wait_for

    seen: list[str] = []
    lock = threading.Lock()

    class Handler(FileSystemEventHandler):
        def on_deleted(self, event: object) -> None:
            name = Path(str(event.src_path)).name  # type: ignore[attr-defined]
            if not name.endswith((".lock", ".temp")):
                with lock:
                    seen.append(name)

    observer = Observer()
    observer.schedule(Handler(), str(chip), event_filter=[FileDeletedEvent])
    observer.start()
    try:
        remove()  # type: ignore[operator]
        wait_for(lambda: len(seen) >= expected, 30, "the deletions to be reported")
    finally:
        observer.stop()
        observer.join(10)
    return seen


def _entry_with_header(chip: Path, kernel: str) -> None:
    binary = os.urandom(1000)
    doc = kernel_json(kernel, binary, headerFileSuffix=".h")
    Store(chip).publish(kernel, {f"{kernel}.o": binary, f"{kernel}.h": b"/* h */"}, doc)


def test_store_and_eviction_remove_in_the_one_order(tmp_path: Path) -> None:
    """The store's removal and eviction's go through one routine: the same entry (json,
    binary, header) leaves in the same order — json first — whichever removes it."""
    from cachemgr import eviction

    chip = tmp_path / "kernel_cache" / SOC
    _entry_with_header(chip, "te_ord_a")
    _entry_with_header(chip, "te_ord_b")
    by_store = _deletions(chip, lambda: Store(chip).remove("te_ord_a"), 3)
    os.utime(chip / "te_ord_b.json", (1, 1))
    by_eviction = _deletions(
        chip, lambda: eviction.gc_chip(chip, 1, 0, 0.0, force_ratio=True, clock_skew_s=None), 3
    )
    assert by_store == ["te_ord_a.json", "te_ord_a.h", "te_ord_a.o"], by_store
    assert [n.replace("_b", "_a") for n in by_eviction] == by_store, by_eviction


def test_stores_are_made_in_one_place() -> None:
    """Every :class:`Store` of the package comes from ``tiers.chip_store`` (the factory the
    tier set uses): no module builds one itself."""
    import ast

    import cachemgr

    package = Path(cachemgr.__file__).parent
    builders = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                if name == "Store":
                    builders.append(f"{path.relative_to(package)}:{node.lineno}")
    assert len(builders) == 1 and builders[0].startswith("storage/tiers.py:"), builders
