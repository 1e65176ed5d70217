"""Verified store (docs/design.md#writing-and-reading-an-entry): lookup, publish, removal of bad
entries, no partial entry."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cachemgr.errors import InvalidInputError
from cachemgr.storage import entry
from cachemgr.storage.store import ABSENT, EXISTS, PUBLISHED, Store
from tests.conftest import kernel_json, publish, publish_mix


def test_publish_then_hit_sets_atime_keeps_mtime(chip: Path) -> None:
    publish(chip, "te_add_1", b"binary-1", atime_s=1_000_000)
    mtime = (chip / "te_add_1.o").stat().st_mtime_ns
    # the hit sets the filesystem's now (UTIME_NOW): the kernel's coarse clock, up to a tick
    # behind time.time_ns()
    before = time.clock_gettime_ns(getattr(time, "CLOCK_REALTIME_COARSE", 5))
    result = Store(chip).lookup("te_add_1")
    assert result.hit and result.reason == ""
    assert {p.name for p in result.files} == {"te_add_1.json", "te_add_1.o"}
    for name in ("te_add_1.json", "te_add_1.o"):
        st_ = (chip / name).stat()
        assert st_.st_atime_ns >= before
    assert (chip / "te_add_1.o").stat().st_mtime_ns == mtime


def test_lookup_without_touch_keeps_atime(chip: Path) -> None:
    publish(chip, "te_add_2", b"b", atime_s=1_000_000)
    assert Store(chip).lookup("te_add_2", touch=False).hit
    assert (chip / "te_add_2.json").stat().st_atime_ns == 1_000_000 * 10**9


def test_absent_is_a_miss(chip: Path) -> None:
    result = Store(chip).lookup("te_none_1")
    assert not result.hit and result.reason == ABSENT


@pytest.mark.parametrize("damage", ["flip", "truncate_json", "drop_binary", "not_object"])
def test_bad_entry_is_a_miss_and_removed(chip: Path, damage: str) -> None:
    publish(chip, "te_bad_1", b"good binary")
    if damage == "flip":
        (chip / "te_bad_1.o").write_bytes(b"evil binary")
    elif damage == "truncate_json":
        raw = (chip / "te_bad_1.json").read_bytes()
        (chip / "te_bad_1.json").write_bytes(raw[: len(raw) // 2])
    elif damage == "drop_binary":
        os.unlink(chip / "te_bad_1.o")
    else:
        (chip / "te_bad_1.json").write_text("[1]")
    result = Store(chip).lookup("te_bad_1")
    assert not result.hit and result.removed
    assert result.reason in {
        entry.SHA256_MISMATCH,
        entry.UNREADABLE_JSON,
        entry.MISSING_BINARY,
        entry.INVALID_JSON,
    }
    assert not (chip / "te_bad_1.json").exists() and not (chip / "te_bad_1.o").exists()
    # the recompiled result can take its place
    publish(chip, "te_bad_1", b"fresh binary")
    assert Store(chip).lookup("te_bad_1").hit


def test_mix_entry_hit_and_removed_whole(chip: Path) -> None:
    publish_mix(chip, "te_mm_1", b"aic", b"aiv")
    assert Store(chip).lookup("te_mm_1").hit
    (chip / "te_mm_1_mix_aiv.o").write_bytes(b"corrupt")
    result = Store(chip).lookup("te_mm_1")
    assert not result.hit and result.removed
    assert sorted(os.listdir(chip)) == ["te_mm_1.lock"]


def test_existing_good_entry_is_not_rewritten(chip: Path) -> None:
    publish(chip, "te_add_3", b"bin")
    inode = (chip / "te_add_3.o").stat().st_ino
    again = Store(chip).publish("te_add_3", {"te_add_3.o": b"bin"}, kernel_json("te_add_3", b"bin"))
    assert again.status == EXISTS
    assert (chip / "te_add_3.o").stat().st_ino == inode


def test_unknown_fields_survive_publish(chip: Path) -> None:
    doc = kernel_json("te_add_4", b"x", compileInfo={"vars": {"_ub_size": 11}}, KBHit=False)
    Store(chip).publish("te_add_4", {"te_add_4.o": b"x"}, doc)
    stored = json.loads((chip / "te_add_4.json").read_text())
    assert stored["compileInfo"] == {"vars": {"_ub_size": 11}} and stored["KBHit"] is False


def test_a_kernel_json_is_written_as_ge_writes_it(chip: Path) -> None:
    """The entry's json is ``json.dumps(indent=4)`` (GE's format), UTF-8, one newline after:
    nested fields, non-ASCII text, floats and a value that is not plain JSON data alike."""
    extra = {"vars": {"缓存": [1.5, -0.0, True, None, "é\n"]}, "ids": (1, 2), "t": {}}
    for kernel, more in (("te_fmt_1", extra), ("te_fmt_2", {"byId": {7: "seven"}})):
        doc = kernel_json(kernel, b"x", compileInfo=more)
        Store(chip).publish(kernel, {f"{kernel}.o": b"x"}, doc)
        want = json.dumps(doc, indent=4, ensure_ascii=False) + "\n"
        assert (chip / f"{kernel}.json").read_bytes() == want.encode("utf-8")


@pytest.mark.parametrize(
    ("kernel", "files", "doc"),
    [
        ("te_x_1", {"te_x_1.o": b"a"}, kernel_json("te_x_1", b"b")),  # sha mismatch
        ("te_x_2", {}, kernel_json("te_x_2", b"a")),  # binary not given
        ("../te_x_3", {"te_x_3.o": b"a"}, kernel_json("te_x_3", b"a")),  # bad kernel name
        ("te_x_4", {"../x.o": b"a"}, kernel_json("te_x_4", b"a")),  # bad file name
        ("te_x_5", {"te_x_5.o": b"a"}, {**kernel_json("te_x_5", b"a"), "binFileName": "../x"}),
    ],
)
def test_publish_rejects_bad_input_and_writes_nothing(
    chip: Path, kernel: str, files: dict[str, bytes], doc: dict[str, object]
) -> None:
    with pytest.raises(InvalidInputError):
        Store(chip).publish(kernel, files, doc)
    assert os.listdir(chip) == []


def _publish_worker(chip: str, kernel: str, data: bytes, queue: multiprocessing.Queue) -> None:
    store = Store(Path(chip))
    queue.put(store.publish(kernel, {kernel + ".o": data}, kernel_json(kernel, data)).status)


def test_concurrent_publishers_write_once(chip: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue = ctx.Queue()
    data = os.urandom(256 * 1024)
    procs = [
        ctx.Process(target=_publish_worker, args=(str(chip), "te_par_1", data, queue))
        for _ in range(6)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    statuses = sorted(queue.get(timeout=10) for _ in procs)
    assert statuses.count(PUBLISHED) == 1 and statuses.count(EXISTS) == 5
    assert not [n for n in os.listdir(chip) if n.endswith(".temp")]
    assert Store(chip).lookup("te_par_1").hit


def _churn(chip: str, stop: multiprocessing.Event, deadline_s: float) -> None:
    store = Store(Path(chip))
    deadline = time.monotonic() + deadline_s
    i = 0
    while not stop.is_set() and time.monotonic() < deadline:
        data = os.urandom(64 * 1024) + i.to_bytes(4, "big")
        store.publish("te_churn_1", {"te_churn_1.o": data}, kernel_json("te_churn_1", data))
        store.remove("te_churn_1")
        i += 1


def test_reader_never_sees_a_partial_entry(chip: Path) -> None:
    """A writer publishes and removes one entry in a loop; the reader must only ever get
    a verified hit or a miss for an entry that is absent or vanished while read — until it
    has seen enough hits (bounded by a deadline, so a starved CI machine just takes longer)."""
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    writer = ctx.Process(target=_churn, args=(str(chip), stop, 120.0))
    writer.start()
    store = Store(chip)
    hits, misses = 0, 0
    deadline = time.monotonic() + 120
    try:
        while (hits < 20 or misses < 20) and time.monotonic() < deadline and writer.is_alive():
            result = store.lookup("te_churn_1", touch=False)
            if result.hit:
                hits += 1
            else:
                misses += 1
                # the only acceptable misses: absent, or the entry vanished while we read it
                assert result.reason in {ABSENT, entry.MISSING_BINARY}, result
                assert not result.removed, result  # a complete entry is never judged bad
    finally:
        stop.set()
        writer.join(30)
    assert writer.exitcode == 0
    assert hits >= 20 and misses >= 20, (hits, misses)


# --- property: no sequence of publish / lookup / corrupt / verify yields a bad hit -------------

KERNELS = st.sampled_from(["te_p_1", "te_p_2", "te_p_3"])
DAMAGES = st.sampled_from(
    [
        "flip",
        "truncate_bin",
        "drop_bin",
        "truncate_json",
        "drop_sub",
        "partial_publish",
        "empty_json",
    ]
)


class StoreMachine(RuleBasedStateMachine):
    """Model: ``published[k]`` is the bytes of every file of k's last complete publish. The
    invariant: a hit serves exactly those bytes, and an entry whose files are all intact is
    never reported bad or turned into a miss."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.tmp = tempfile.TemporaryDirectory()
        self.chip = Path(self.tmp.name) / "Ascend910B1"
        self.chip.mkdir()
        self.store = Store(self.chip, lock_timeout_s=10)
        self.published: dict[str, dict[str, bytes]] = {}

    def teardown(self) -> None:
        self.tmp.cleanup()

    def _record(self, kernel: str, names: list[str]) -> None:
        self.published[kernel] = {n: (self.chip / n).read_bytes() for n in names}

    def _intact(self, kernel: str) -> bool:
        files = self.published.get(kernel)
        if not files:
            return False
        for name, data in files.items():
            path = self.chip / name
            if not path.is_file() or path.read_bytes() != data:
                return False
        return True

    @rule(kernel=KERNELS, data=st.binary(min_size=1, max_size=64), mix=st.booleans())
    def publish(self, kernel: str, data: bytes, mix: bool) -> None:
        if mix:
            publish_mix(self.chip, kernel, data, data[::-1] + b"v")
            doc = json.loads((self.chip / (kernel + ".json")).read_text())
            subs = [item["jsonFileName"] for item in doc.get("jsonList", [])]
            names = [kernel + ".json", *subs, *(n[:-5] + ".o" for n in subs)]
            if not subs:
                names.append(kernel + ".o")
        else:
            result = self.store.publish(kernel, {kernel + ".o": data}, kernel_json(kernel, data))
            names = [p.name for p in result.files]
        self._record(kernel, names)

    @rule(kernel=KERNELS, damage=DAMAGES)
    def corrupt(self, kernel: str, damage: str) -> None:
        main = self.chip / (kernel + ".json")
        bins = self._entry_binaries(kernel)
        if damage == "partial_publish":
            if not main.exists():
                (self.chip / (kernel + ".o")).write_bytes(b"orphan")
                (self.chip / (kernel + ".json.h.1.x.temp")).write_text("{}")
            return
        if not main.exists():
            return
        if damage == "flip" and bins:
            raw = bins[0].read_bytes()  # empty after an earlier truncate: flipping adds a byte
            bins[0].write_bytes(bytes([raw[0] ^ 1]) + raw[1:] if raw else b"\x01")
        elif damage == "truncate_bin" and bins:
            bins[0].write_bytes(bins[0].read_bytes()[:-1])
        elif damage == "drop_bin" and bins:
            bins[0].unlink()
        elif damage == "truncate_json":
            main.write_bytes(main.read_bytes()[:10])
        elif damage == "drop_sub":
            for sub in self.chip.glob(kernel + "_mix_*.json"):
                sub.unlink()
                break
        elif damage == "empty_json":
            main.write_bytes(b"")

    def _entry_binaries(self, kernel: str) -> list[Path]:
        """The binaries the entry really names (a loose ``<kernel>.o`` beside a mix entry is
        an orphan, not part of it)."""
        try:
            doc = json.loads((self.chip / (kernel + ".json")).read_text())
        except (OSError, ValueError):
            return []
        if isinstance(doc, dict) and "jsonList" in doc:
            return sorted(self.chip.glob(kernel + "_mix_*.o"))
        return [p for p in [self.chip / (kernel + ".o")] if p.exists()]

    @rule(kernel=KERNELS)
    def lookup(self, kernel: str) -> None:
        intact = self._intact(kernel)
        result = self.store.lookup(kernel)
        if result.hit:
            files = self.published.get(kernel, {})
            for path in result.files:
                assert files.get(path.name) == path.read_bytes(), (
                    f"served {path.name} not as published"
                )
        else:
            assert not intact, f"an intact entry {kernel} was a miss: {result}"

    @rule(repair=st.booleans())
    def verify(self, repair: bool) -> None:
        intact = {k for k in self.published if self._intact(k)}
        report = self.store.verify_all(repair=repair)
        bad = {f.name for f in report.findings if f.kind == "entry"}
        assert not bad & intact

    @invariant()
    def no_temp_from_store(self) -> None:
        temps = [
            p for p in self.chip.iterdir() if p.name.endswith(".temp") and ".h.1.x." not in p.name
        ]
        assert temps == []


StoreMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStoreProperty = StoreMachine.TestCase


def test_what_is_written_under_a_held_lock_goes_into_the_folder_the_lock_is_in(
    chip: Path,
) -> None:
    """The lookup, publish and header manifest under an entry lock work in the chip folder
    that lock was taken in (its descriptor, held with the lock), never in another folder
    found at the same path meanwhile, where the lock is not held: a CANN process writing the
    same kernel there would take its own ``.lock`` and race with this publish."""
    from cachemgr.storage import manifest

    store = Store(chip)
    kernel = "te_add_held"
    held = store.hold(kernel)
    moved = chip.with_name(chip.name + "-moved")
    os.rename(chip, moved)  # the folder the lock lives in is renamed aside...
    chip.mkdir()  # ...and another one made at its path
    where = manifest.path_of(chip, "add", "base")
    try:
        assert not store.lookup(kernel, held=held).hit
        binary = b"held binary"
        doc = kernel_json(kernel, binary)
        done = store.publish(kernel, {kernel + ".o": binary}, doc, held=held)
        assert done.status == PUBLISHED
        assert list(chip.iterdir()) == []  # nothing where the lock is not held
        assert Store(moved).lookup(kernel, touch=False).hit
        manifest.record(where, kernel, {"/src/h.h": "0" * 64}, dir_fd=held.dir_fd)
    finally:
        held.release()
    assert held.dir_fd is None  # the folder is closed with the lock
    names = sorted(p.name for p in moved.iterdir())
    assert names == sorted([kernel + ".json", kernel + ".o", kernel + ".lock", where.name])
    assert list(chip.iterdir()) == []
