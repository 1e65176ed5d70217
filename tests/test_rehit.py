"""An entry checked again with what its last hit found (cachemgr/storage/rehit.py): the same
answer as :meth:`Store.lookup` while the entry is as it was, None — and then the full lookup
judges it — for every change a lookup sees: a binary or json of other bytes, a hard link, a
link, a FIFO, the optional header come or gone; access times set as a hit sets them. Real
files in a real chip folder."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachemgr.storage import rehit
from cachemgr.storage.safedir import SafeDir
from cachemgr.storage.store import Store
from tests.conftest import kernel_json, publish, publish_mix

KERNEL = "te_add_7"


@pytest.fixture
def chip(tmp_path: Path) -> Path:
    folder = tmp_path / "cache" / "kernel_cache" / "Ascend910B1"
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def fd(chip: Path) -> Iterator[int]:
    with SafeDir.open_chip(chip) as folder:
        yield folder.fd


def _known(chip: Path, fd: int, kernel: str = KERNEL) -> rehit.Known:
    result = Store(chip, dir_fd=fd).lookup(kernel)
    assert result.hit
    known = rehit.known(result, fd)
    assert known is not None and rehit.again(known, fd) == result.files
    return known


def test_an_unchanged_entry_answers_as_its_lookup_and_takes_the_access_times(
    chip: Path, fd: int
) -> None:
    publish(chip, KERNEL, b"binary-7", atime_s=1_000_000_000)
    known = _known(chip, fd)
    for f in known.files:
        os.utime(f, ns=(1_000_000_000 * 10**9, os.stat(f).st_mtime_ns))
    mtimes = [os.stat(f).st_mtime_ns for f in known.files]
    assert rehit.again(known, fd) == known.files
    assert all(os.stat(f).st_atime > time.time() - 3600 for f in known.files)
    assert [os.stat(f).st_mtime_ns for f in known.files] == mtimes


def _other_binary(chip: Path) -> None:
    (chip / f"{KERNEL}.o").write_bytes(b"binary-X")  # the same size, the json untouched


def _other_json(chip: Path) -> None:
    doc = chip / f"{KERNEL}.json"
    doc.write_text(json.dumps({**json.loads(doc.read_bytes()), "blockDim": 9}))


def _hard_link(chip: Path) -> None:
    os.link(chip / f"{KERNEL}.o", chip / "elsewhere.o")


def _symlink(chip: Path) -> None:
    target = chip / f"{KERNEL}.o"
    target.rename(chip / "real.o")
    target.symlink_to("real.o")


def _fifo(chip: Path) -> None:
    target = chip / f"{KERNEL}.json"
    target.unlink()
    os.mkfifo(target)


def _empty(chip: Path) -> None:
    (chip / f"{KERNEL}.o").write_bytes(b"")


@pytest.mark.parametrize(
    ("change", "still_good"),
    [
        (_other_binary, False),
        (_other_json, True),  # another good json: parsed again, a hit of its own
        (_hard_link, False),
        (_symlink, False),
        (_fifo, False),
        (_empty, False),
    ],
)
def test_every_change_a_lookup_sees_is_not_answered_again(
    chip: Path, fd: int, change: object, still_good: bool
) -> None:
    publish(chip, KERNEL, b"binary-7")
    known = _known(chip, fd)
    change(chip)  # type: ignore[operator]
    assert rehit.again(known, fd) is None
    assert Store(chip, dir_fd=fd).lookup(KERNEL).hit is still_good  # the full lookup judges


def test_the_optional_header_come_or_gone_is_the_full_lookups_to_answer(
    chip: Path, fd: int
) -> None:
    binary = b"binary-7"
    doc = kernel_json(KERNEL, binary, headerFileSuffix=".h")
    Store(chip).publish(KERNEL, {KERNEL + ".o": binary}, doc)
    without = _known(chip, fd)
    (chip / f"{KERNEL}.h").write_text("// header\n")
    assert rehit.again(without, fd) is None
    result = Store(chip, dir_fd=fd).lookup(KERNEL)
    assert result.hit and chip / f"{KERNEL}.h" in result.files
    with_header = _known(chip, fd)
    (chip / f"{KERNEL}.h").unlink()
    assert rehit.again(with_header, fd) is None


def test_an_entry_with_sub_jsons_is_never_kept(chip: Path, fd: int) -> None:
    publish_mix(chip, KERNEL, b"aic-bytes", b"aiv-bytes")
    result = Store(chip, dir_fd=fd).lookup(KERNEL)
    assert result.hit and result.desc is not None and result.desc.sub_jsons
    assert rehit.known(result, fd) is None


def test_a_binary_of_a_chunk_or_more_is_checked_by_the_chunked_reader(chip: Path, fd: int) -> None:
    big = bytearray(os.urandom(2 << 20))  # over READ_CHUNK_BYTES: never read whole at once
    publish(chip, KERNEL, bytes(big))
    known = _known(chip, fd)
    assert rehit.again(known, fd) == known.files
    big[-1] ^= 0xFF  # the last byte: in the second chunk
    (chip / f"{KERNEL}.o").write_bytes(bytes(big))
    assert rehit.again(known, fd) is None
