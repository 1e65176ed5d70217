"""Entry model (docs/design.md#files-of-an-entry): name grouping, parsing, verification — on CANN's
real files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cachemgr.errors import InvalidEntryError
from cachemgr.storage import entry
from tests.conftest import SOC, kernel_json, publish, publish_mix

CF8B = "te_Mul_cf8bca71d603c5a259847f46639e214579ce2d71b2b25f0b45680b0ec3680a79"
D77A20 = "te_Mul_d77a6f72c3a58aecb67c9c35cb75aee7371d2c724a75539f9500b8e97f7dab20"
D77A21 = "te_Mul_d77a6f72c3a58aecb67c9c35cb75aee7371d2c724a75539f9500b8e97f7dab21"
PRE1 = "te_Mul_cd58ce363a48125986d4fd8ef5c8df0e4f0d554e9fc856072d28d6799222c408_pre.json"
PRE2 = "te_Mul_d766670d14bc2159becf2a85582b438f5d207e620e750307dd596f40fc18f623_pre.json"


def kinds(problems: list[entry.Problem]) -> set[str]:
    return {p.kind for p in problems}


def test_fixture_chip_groups_by_name(fixture_cache: Path) -> None:
    chip = fixture_cache / "kernel_cache" / SOC
    scan = entry.scan_chip(chip)
    pres = {PRE1[: -len(".json")], PRE2[: -len(".json")]}
    assert set(scan.entries) == {CF8B, D77A20, D77A21} | pres  # GE's pre-build entries count
    assert set(scan.entries[CF8B].files) == {CF8B + ".json", CF8B + ".o"}
    assert set(scan.entries[D77A21].files) == {D77A21 + ".json"}
    assert scan.entries[D77A21].resolved is False  # no binary by name: json must be read
    assert scan.orphans == {}
    assert scan.used_bytes == sum(p.stat().st_size for p in chip.iterdir())


def test_fixture_entries_classified(fixture_cache: Path) -> None:
    chip = fixture_cache / "kernel_cache" / SOC
    before = {p.name: p.stat().st_atime_ns for p in chip.iterdir()}
    _, cf8b = entry.check_entry(chip, CF8B)
    assert kinds(cf8b) == {entry.SHA256_MISMATCH}  # bad sha; its missing .h is optional
    desc, d20 = entry.check_entry(chip, D77A20)
    assert kinds(d20) == {entry.SHA256_MISMATCH}
    assert desc is not None and desc.data["blockDim"] == 6 and desc.data["memoryStamping"] == []
    assert desc.data["KBHit"] is False  # unknown fields kept as they are
    _, d21 = entry.check_entry(chip, D77A21)
    assert kinds(d21) == {entry.INVALID_JSON} and "binFileName" in d21[0].detail
    after = {p.name: p.stat().st_atime_ns for p in chip.iterdir()}
    assert before == after  # reading does not change access times


def test_fixture_mix_kernel_from_kernel_meta(fixture_cache: Path) -> None:
    meta = fixture_cache / "kernel_meta"
    scan = entry.scan_chip(meta)
    assert set(scan.entries) == {"matmul_add"}
    assert set(scan.entries["matmul_add"].files) == {
        "matmul_add.json",
        "matmul_add_mix_aic.json",
        "matmul_add_mix_aic.txt",
        "matmul_add_mix_aiv.json",
        "matmul_add_mix_aiv.txt",
    }
    desc, problems = entry.check_entry(meta, "matmul_add")
    assert desc is not None
    assert [b.bin_name for b in desc.binaries] == [
        "matmul_add_mix_aic.txt",
        "matmul_add_mix_aiv.txt",
    ]
    assert kinds(problems) == {entry.SHA256_MISMATCH}
    assert len(problems) == 2


def test_good_entries_verify(chip: Path) -> None:
    publish(chip, "te_add_1", b"\x7fELF add")
    publish_mix(chip, "te_mm_2", b"aic bytes", b"aiv bytes")
    for kernel in ("te_add_1", "te_mm_2"):
        desc, problems = entry.check_entry(chip, kernel)
        assert problems == [] and desc is not None
    scan = entry.scan_chip(chip)
    assert set(scan.entries) == {"te_add_1", "te_mm_2"}
    assert len(scan.entries["te_mm_2"].files) == 5


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b'{"binFileName": "x", "binFil', entry.UNREADABLE_JSON),  # truncated
        (b"[1, 2, 3]", entry.INVALID_JSON),  # not an object
        (b"\xff\xfe{}", entry.UNREADABLE_JSON),  # not UTF-8
        (
            b'{"binFileName": "../x", "binFileSuffix": ".o", "kernelName": "k", "sha256": "0"}',
            entry.BAD_NAME,
        ),
        (
            b'{"binFileName": "a/b", "binFileSuffix": ".o", "kernelName": "k", "sha256": "0"}',
            entry.BAD_NAME,
        ),
        (b'{"jsonList": [{"binType": "AIC", "jsonFileName": "../../etc/passwd"}]}', entry.BAD_NAME),
    ],
)
def test_bad_json_is_classified(chip: Path, content: bytes, reason: str) -> None:
    (chip / "te_bad_1.json").write_bytes(content)
    with pytest.raises(InvalidEntryError) as info:
        entry.parse_entry(chip, "te_bad_1")
    assert info.value.reason == reason


def test_missing_sub_json_is_missing_subpart(chip: Path) -> None:
    publish_mix(chip, "te_mm_3", b"aic", b"aiv")
    os.unlink(chip / "te_mm_3_mix_aiv.json")
    _, problems = entry.check_entry(chip, "te_mm_3")
    assert kinds(problems) == {entry.MISSING_SUBPART}


def test_missing_sub_binary_is_missing_subpart(chip: Path) -> None:
    publish_mix(chip, "te_mm_4", b"aic", b"aiv")
    os.unlink(chip / "te_mm_4_mix_aic.o")
    _, problems = entry.check_entry(chip, "te_mm_4")
    assert kinds(problems) == {entry.MISSING_SUBPART}


def test_binary_named_differently_is_resolved_by_json(chip: Path) -> None:
    data = b"other-name binary"
    (chip / "blob_77.o").write_bytes(data)
    doc = kernel_json("blob_77", data)
    (chip / "te_odd_5.json").write_text(json.dumps(doc))
    scan = entry.scan_chip(chip)
    assert "blob_77.o" in scan.orphans and not scan.entries["te_odd_5"].resolved
    entry.resolve_group(scan, scan.entries["te_odd_5"])
    assert "blob_77.o" in scan.entries["te_odd_5"].files and "blob_77.o" not in scan.orphans


def test_scan_never_follows_symlinks(chip: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.o"
    outside.write_bytes(b"secret")
    os.symlink(outside, chip / "te_link_1.o")
    (chip / "te_dir_1.json").mkdir()
    scan = entry.scan_chip(chip)
    assert "te_link_1.o" in scan.odd and "te_dir_1.json" in scan.odd
    assert scan.used_bytes == 0


def test_temps_and_locks_are_not_entries(chip: Path) -> None:
    publish(chip, "te_add_9", b"bin")
    (chip / "te_add_9.o.host.1.ab.temp").write_bytes(b"partial")
    (chip / "te_gone_1.lock").write_bytes(b"")
    scan = entry.scan_chip(chip)
    assert set(scan.temps) == {"te_add_9.o.host.1.ab.temp"}
    assert set(scan.locks) == {"te_add_9.lock", "te_gone_1.lock"}
    assert set(scan.entries) == {"te_add_9"}


def test_missing_chip_folder_scans_empty(tmp_path: Path) -> None:
    scan = entry.scan_chip(tmp_path / "nope")
    assert scan.entries == {} and scan.used_bytes == 0
