"""Tests of cachemgr.config.ini: CANN's op_cache.ini (docs/design.md#size-limits-and-eviction,
[GE]). Real files in tmp_path."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachemgr.config import ini
from cachemgr.config.ini import INI_NAME, SECTION, IniLimits, OpCacheIni
from cachemgr.errors import ConfigError
from tests import ge_twin
from tests.users_util import run_python_as

GOOD = (
    b"[op_compiler_cache]\n"
    b"adk_version=7.0.0\n"
    b"ops_version=7.0.1\n"
    b"max_op_cache_size=500\n"
    b"remain_cache_size_ratio=80\n"
)


def write(tmp_path: Path, data: bytes | str) -> Path:
    path = tmp_path / INI_NAME
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def load(tmp_path: Path, data: bytes | str) -> OpCacheIni:
    return OpCacheIni.load(write(tmp_path, data))


def only_problem(cfg: OpCacheIni) -> str:
    assert len(cfg.problems) == 1, cfg.problems
    return cfg.problems[0]


def temps(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.temp"))


# -- reading ----------------------------------------------------------------------------


def test_missing_file_has_nothing_and_no_problems(tmp_path: Path) -> None:
    cfg = OpCacheIni.load(tmp_path / INI_NAME)
    assert not cfg.exists
    assert cfg.problems == []
    assert (cfg.max_op_cache_size, cfg.remain_cache_size_ratio) == (None, None)
    assert (cfg.adk_version, cfg.ops_version) == (None, None)
    assert cfg.limits() is None


def test_valid_file_gives_limits(tmp_path: Path) -> None:
    cfg = load(tmp_path, GOOD)
    assert cfg.exists
    assert cfg.problems == []
    assert cfg.limits() == IniLimits(max_op_cache_size=500, remain_cache_size_ratio=80)
    assert (cfg.adk_version, cfg.ops_version) == ("7.0.0", "7.0.1")


def test_file_as_ge_creates_it_is_valid_but_sets_no_limits(tmp_path: Path) -> None:
    # GE's CreatOpCacheIniFile writes the section and the stamps only: fall back, no problem.
    cfg = load(tmp_path, "[op_compiler_cache]\nadk_version=7.0.0\nops_version=7.0.0\n")
    assert cfg.problems == []
    assert cfg.limits() is None


def test_minus_one_means_never_evict(tmp_path: Path) -> None:
    cfg = load(tmp_path, GOOD.replace(b"=500", b"=-1"))
    assert cfg.problems == []
    assert cfg.limits() == IniLimits(-1, 80)


@pytest.mark.parametrize("max_mb", ["1", "2147483647"])
def test_max_range_ends_are_valid(tmp_path: Path, max_mb: str) -> None:
    cfg = load(tmp_path, GOOD.replace(b"=500", b"=" + max_mb.encode()))
    assert cfg.limits() == IniLimits(int(max_mb), 80)


@pytest.mark.parametrize("ratio", ["1", "100"])
def test_ratio_range_ends_are_valid(tmp_path: Path, ratio: str) -> None:
    cfg = load(tmp_path, GOOD.replace(b"=80", b"=" + ratio.encode()))
    assert cfg.limits() == IniLimits(500, int(ratio))


def test_whitespace_around_equals_and_comments_are_allowed(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        "# made by hand\n"
        "; old style comment\n"
        "\n"
        "[ op_compiler_cache ]  \n"
        "  adk_version = 7.0.0\n"
        "ops_version\t=\t7.0.1  \n"
        "   # indented comment\n"
        "max_op_cache_size =500\n"
        "remain_cache_size_ratio= 80\n"
        "other_key = kept, unknown to GE\n",
    )
    assert cfg.problems == []
    assert cfg.limits() == IniLimits(500, 80)
    assert cfg.adk_version == "7.0.0"


@pytest.mark.parametrize(
    ("raw", "why", "ge_max"),
    [
        ("abc", "is not an integer", None),
        ("0", "is outside", None),
        ("-5", "is outside", None),
        ("1.5", "is not an integer", 1),  # std::stoi stops at the "."
        ("2147483648", "is outside", None),  # std::out_of_range
        ("9" * 50, "is outside", None),
        ("+5", "is not an integer", 5),
        ("500 # MB", "is not an integer", 500),
    ],
)
def test_bad_max_is_a_problem_naming_value_line_and_range(
    tmp_path: Path, raw: str, why: str, ge_max: int | None
) -> None:
    path = write(tmp_path, GOOD.replace(b"=500", b"=" + raw.encode()))
    cfg = OpCacheIni.load(path)
    assert cfg.max_op_cache_size is None
    assert cfg.remain_cache_size_ratio == 80
    # the limits GE computes for the same file: warned about, but applied
    assert cfg.limits() == (None if ge_max is None else IniLimits(ge_max, 80))
    msg = cfg.problems[0]
    assert len(cfg.problems) == (1 if ge_max is None else 2)
    assert msg.startswith(f"op_cache.ini {path}:4: max_op_cache_size={raw} {why}")
    assert "-1 or 1..2147483647" in msg


@pytest.mark.parametrize(
    ("raw", "why"),
    [("0", "is outside"), ("101", "is outside"), ("-1", "is outside"), ("x", "is not an integer")],
)
def test_bad_ratio_is_a_problem(tmp_path: Path, raw: str, why: str) -> None:
    path = write(tmp_path, GOOD.replace(b"=80", b"=" + raw.encode()))
    cfg = OpCacheIni.load(path)
    assert cfg.remain_cache_size_ratio is None
    assert cfg.limits() is None
    msg = only_problem(cfg)
    assert msg.startswith(f"op_cache.ini {path}:5: remain_cache_size_ratio={raw} {why}")
    assert "1..100" in msg


def test_ratio_message_matches_the_documented_shape(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace(b"=80", b"=0"))
    assert OpCacheIni.load(path).problems == [
        f"op_cache.ini {path}:5: remain_cache_size_ratio=0 is outside 1..100"
    ]


def test_empty_value_is_a_problem(tmp_path: Path) -> None:
    cfg = load(tmp_path, GOOD.replace(b"=500", b"="))
    assert "max_op_cache_size= is empty" in only_problem(cfg)
    assert cfg.limits() is None


def test_only_one_limit_set_is_a_problem(tmp_path: Path) -> None:
    cfg = load(tmp_path, GOOD.replace(b"remain_cache_size_ratio=80\n", b""))
    msg = only_problem(cfg)
    assert ":4: max_op_cache_size is set but remain_cache_size_ratio is not" in msg
    assert cfg.max_op_cache_size == 500
    assert cfg.limits() is None


def test_keys_under_another_section_name_that_section(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[op_compiler_cache]\nadk_version=1\nops_version=1\n"
        "[opcompiler_cache]\nmax_op_cache_size=500\nremain_cache_size_ratio=80\n",
    )
    cfg = OpCacheIni.load(path)
    assert cfg.problems == [
        f"op_cache.ini {path}:5: max_op_cache_size is under [opcompiler_cache]; "
        "GE reads it only under [op_compiler_cache]",
        f"op_cache.ini {path}:6: remain_cache_size_ratio is under [opcompiler_cache]; "
        "GE reads it only under [op_compiler_cache]",
    ]
    assert cfg.max_op_cache_size is None
    assert cfg.limits() is None


def test_no_section_at_all_names_the_sections_found(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace(b"[op_compiler_cache]", b"[OP_COMPILER_CACHE]"))
    cfg = OpCacheIni.load(path)
    assert (
        f"op_cache.ini {path}: has no [op_compiler_cache] section (found: [OP_COMPILER_CACHE])"
        in (cfg.problems)
    )
    assert any("is under [OP_COMPILER_CACHE]" in p for p in cfg.problems)
    assert cfg.limits() is None


def test_keys_outside_any_section(tmp_path: Path) -> None:
    cfg = load(tmp_path, GOOD.replace(b"[op_compiler_cache]\n", b""))
    assert any(":1: adk_version is outside any section" in p for p in cfg.problems)
    assert any("(found: no section header at all)" in p for p in cfg.problems)
    assert cfg.limits() is None


def test_empty_file_is_a_problem(tmp_path: Path) -> None:
    cfg = load(tmp_path, b"")
    assert cfg.exists
    assert "has no [op_compiler_cache] section" in only_problem(cfg)


def test_duplicate_key_names_both_lines(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + b"max_op_cache_size=600\n")
    cfg = OpCacheIni.load(path)
    assert only_problem(cfg) == (
        f"op_cache.ini {path}:6: max_op_cache_size is set twice, at lines 4 and 6; "
        "GE uses the last one"
    )
    assert cfg.max_op_cache_size == 600  # GE's multimap: the last one wins
    assert cfg.limits() == IniLimits(600, 80)


def test_duplicate_section_is_a_problem(tmp_path: Path) -> None:
    cfg = load(tmp_path, GOOD + b"[op_compiler_cache]\n")
    assert ":6: [op_compiler_cache] appears again (first at line 1)" in only_problem(cfg)
    assert cfg.limits() == IniLimits(500, 80)  # an empty repeated section changes nothing


def test_utf8_bom_is_a_problem(tmp_path: Path) -> None:
    path = write(tmp_path, b"\xef\xbb\xbf" + GOOD)
    cfg = OpCacheIni.load(path)
    assert cfg.problems[0].startswith(f"op_cache.ini {path}:1: starts with a UTF-8 byte-order")
    assert cfg.max_op_cache_size == 500  # still read, just not trusted
    assert cfg.limits() is None  # GE misses the header after the BOM: it ignores the file
    assert cfg.ge.stamps is None


def test_crlf_is_a_problem(tmp_path: Path) -> None:
    cfg = load(tmp_path, GOOD.replace(b"\n", b"\r\n"))
    assert ":1: has CRLF line ends (5 lines, first at line 1)" in only_problem(cfg)
    assert cfg.limits() == IniLimits(500, 80)  # std::stoi ignores the trailing CR
    assert cfg.ge.stamps == ("7.0.0\r", "7.0.1\r")  # but GE keeps it in the stamps


def test_missing_stamps_are_problems(tmp_path: Path) -> None:
    path = write(
        tmp_path, GOOD.replace(b"adk_version=7.0.0\n", b"").replace(b"ops_version=", b"x=")
    )
    cfg = OpCacheIni.load(path)
    assert cfg.problems == [
        f"op_cache.ini {path}:1: [op_compiler_cache] has no adk_version= version stamp; "
        "GE ignores an ini without adk_version and ops_version",
        f"op_cache.ini {path}:1: [op_compiler_cache] has no ops_version= version stamp; "
        "GE ignores an ini without adk_version and ops_version",
    ]
    assert (cfg.max_op_cache_size, cfg.remain_cache_size_ratio) == (500, 80)
    assert cfg.limits() is None


def test_empty_stamp_is_a_problem(tmp_path: Path) -> None:
    cfg = load(tmp_path, GOOD.replace(b"ops_version=7.0.1", b"ops_version = "))
    assert ":3: ops_version= is empty" in only_problem(cfg)
    assert cfg.ops_version is None
    assert cfg.limits() is None


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("just words", "is not 'key = value', a '#' comment or a [section] header"),
        ("= 5", "is not 'key = value'"),
        ("[op_compiler_cache", "is not a valid [section] header"),
        ("[a] trailing", "is not a valid [section] header"),
        ("  [other]", "is indented; GE sees only headers in column 1"),
    ],
)
def test_line_that_is_not_key_value_comment_or_header(tmp_path: Path, line: str, why: str) -> None:
    cfg = load(tmp_path, GOOD + line.encode() + b"\n")
    msg = only_problem(cfg)
    assert ":6: " in msg
    assert why in msg
    assert cfg.limits() == IniLimits(500, 80)  # GE skips such a line


@pytest.mark.parametrize(
    "key", ["MAX_OP_CACHE_SIZE", "Max_Op_Cache_Size", "ascend_max_op_cache_size"]
)
def test_keys_are_case_sensitive_and_unprefixed(tmp_path: Path, key: str) -> None:
    # The TF-adapter page writes ascend_max_op_cache_size; GE reads max_op_cache_size.
    cfg = load(tmp_path, GOOD.replace(b"max_op_cache_size", key.encode()))
    assert any(
        f"{key} is not a key GE reads; did you mean max_op_cache_size?" in p for p in cfg.problems
    )
    assert cfg.max_op_cache_size is None
    assert cfg.limits() is None


def test_bytes_that_are_not_utf8_are_a_problem(tmp_path: Path) -> None:
    cfg = load(tmp_path, GOOD + b"# caf\xe9\n")
    assert ":6: is not valid UTF-8" in only_problem(cfg)


def test_last_line_without_newline_is_read(tmp_path: Path) -> None:
    assert load(tmp_path, GOOD.rstrip(b"\n")).limits() == IniLimits(500, 80)


def test_folder_is_a_config_error_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / INI_NAME
    path.mkdir()
    with pytest.raises(ConfigError, match=re.escape(f"{path} is a folder")):
        OpCacheIni.load(path)


def test_symlink_is_refused(tmp_path: Path) -> None:
    target = write(tmp_path, GOOD).rename(tmp_path / "elsewhere.ini")
    (tmp_path / INI_NAME).symlink_to(target)
    with pytest.raises(ConfigError, match="is a symlink"):
        OpCacheIni.load(tmp_path / INI_NAME)


def test_unreadable_path_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "kernel_cache").write_text("a file where a folder should be")
    path = tmp_path / "kernel_cache" / INI_NAME
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        OpCacheIni.load(path)


# -- writing ----------------------------------------------------------------------------


def test_set_changes_value_in_place_keeping_spacing_and_every_other_byte(tmp_path: Path) -> None:
    original = (
        "# header comment\n"
        "[other]\n"
        "x = 1\n"
        "\n"
        "[op_compiler_cache]\n"
        "adk_version=7.0.0\n"
        "ops_version=7.0.0\n"
        "max_op_cache_size  =  500   \n"
        "# a comment inside\n"
        "remain_cache_size_ratio=80\n"
        "\n"
        "# about the next section\n"
        "[tail]\n"
        "y=2"
    )
    path = write(tmp_path, original)
    cfg = OpCacheIni.load(path)
    cfg.set("max_op_cache_size", 2048)
    cfg.save()
    assert path.read_text() == original.replace("  500   ", "  2048   ")
    assert OpCacheIni.load(path).limits() == IniLimits(2048, 80)


def test_a_stamp_is_written_the_way_ge_writes_it(tmp_path: Path) -> None:
    """GE restamps only ``adk_version=``/``ops_version=`` lines from column 1
    (``GetNewVersionString``); cachemgr writes a stamp line so, whatever it was."""
    path = write(
        tmp_path,
        "[op_compiler_cache]\n  adk_version = 7.0\nops_version\t=7.0\r\nops_version=7.0\n"
        "max_op_cache_size = 500\n",
    )
    cfg = OpCacheIni.load(path)
    assert cfg.stamp_lines_ge_cannot_rewrite() == [2, 3]
    cfg.set("adk_version", "8.0")
    cfg.set("ops_version", "8.0")
    cfg.save()
    assert path.read_text() == (
        "[op_compiler_cache]\nadk_version=8.0\nops_version=8.0\nops_version=8.0\n"
        "max_op_cache_size = 500\n"
    )
    assert OpCacheIni.load(path).stamp_lines_ge_cannot_rewrite() == []


def test_set_adds_missing_key_after_the_sections_last_key(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[op_compiler_cache]\nadk_version=1\nops_version=1\n\n# next\n[other]\nz=1\n",
    )
    cfg = OpCacheIni.load(path)
    cfg.set("max_op_cache_size", -1)
    cfg.set("remain_cache_size_ratio", "60")
    assert cfg.limits() == IniLimits(-1, 60)  # in memory before save
    cfg.save()
    assert path.read_text() == (
        "[op_compiler_cache]\nadk_version=1\nops_version=1\n"
        "max_op_cache_size=-1\nremain_cache_size_ratio=60\n"
        "\n# next\n[other]\nz=1\n"
    )


def test_set_into_empty_section_goes_right_after_header(tmp_path: Path) -> None:
    path = write(tmp_path, "# c\n[op_compiler_cache]\n\n[other]\n")
    cfg = OpCacheIni.load(path)
    cfg.set("adk_version", "1")
    cfg.save()
    assert path.read_text() == "# c\n[op_compiler_cache]\nadk_version=1\n\n[other]\n"


def test_save_adds_section_when_missing(tmp_path: Path) -> None:
    path = write(tmp_path, "# only a comment\n[other]\nk=v")  # no final newline
    cfg = OpCacheIni.load(path)
    cfg.set("adk_version", "1")
    cfg.save()
    assert (
        path.read_text() == "# only a comment\n[other]\nk=v\n[op_compiler_cache]\nadk_version=1\n"
    )


def test_save_without_set_still_adds_the_section(tmp_path: Path) -> None:
    path = write(tmp_path, "[other]\n")
    OpCacheIni.load(path).save()
    assert path.read_text() == "[other]\n[op_compiler_cache]\n"


def test_save_creates_missing_file(tmp_path: Path) -> None:
    path = tmp_path / INI_NAME
    cfg = OpCacheIni.load(path)
    cfg.set("max_op_cache_size", 100)
    assert not cfg.exists
    cfg.save()
    assert cfg.exists
    assert path.read_text() == "[op_compiler_cache]\nmax_op_cache_size=100\n"


def test_save_keeps_bom_and_crlf_of_untouched_lines(tmp_path: Path) -> None:
    original = b"\xef\xbb\xbf" + GOOD.replace(b"\n", b"\r\n") + b"# tail\r\n"
    path = write(tmp_path, original)
    cfg = OpCacheIni.load(path)
    cfg.set("remain_cache_size_ratio", 90)
    cfg.save()
    assert path.read_bytes() == original.replace(b"ratio=80", b"ratio=90")
    again = OpCacheIni.load(path)
    assert again.remain_cache_size_ratio == 90
    assert again.limits() is None  # still BOM + CRLF: still a problem, not normalised


def test_new_line_in_crlf_file_uses_crlf(tmp_path: Path) -> None:
    path = write(tmp_path, b"[op_compiler_cache]\r\nadk_version=1\r\n")
    cfg = OpCacheIni.load(path)
    cfg.set("ops_version", "2")
    cfg.save()
    assert path.read_bytes() == b"[op_compiler_cache]\r\nadk_version=1\r\nops_version=2\r\n"


def test_save_keeps_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    original = GOOD + b"# caf\xe9 \xff\n"
    path = write(tmp_path, original)
    cfg = OpCacheIni.load(path)
    cfg.set("max_op_cache_size", 1)
    cfg.save()
    assert path.read_bytes() == original.replace(b"=500", b"=1")


def test_set_changes_every_duplicate(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + b"max_op_cache_size = 600\n")
    cfg = OpCacheIni.load(path)
    cfg.set("max_op_cache_size", 700)
    cfg.save()
    assert path.read_bytes() == GOOD.replace(b"=500", b"=700") + b"max_op_cache_size = 700\n"
    assert OpCacheIni.load(path).max_op_cache_size == 700


def test_save_without_changes_keeps_file_identical(tmp_path: Path) -> None:
    original = b"\xef\xbb\xbf# x\r\n" + GOOD + b"garbage line"
    path = write(tmp_path, original)
    inode = path.stat().st_ino
    OpCacheIni.load(path).save()
    assert path.read_bytes() == original
    assert path.stat().st_ino == inode  # nothing to write: not rewritten


def test_save_merges_with_a_change_made_on_disk_since_load(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    cfg = OpCacheIni.load(path)
    cfg.set("remain_cache_size_ratio", 70)
    # GE updates the stamps after a toolkit upgrade meanwhile:
    path.write_bytes(GOOD.replace(b"7.0.", b"8.0.") + b"# new comment\n")
    cfg.save()
    assert path.read_bytes() == GOOD.replace(b"7.0.", b"8.0.").replace(b"=80", b"=70") + (
        b"# new comment\n"
    )
    assert cfg.adk_version == "8.0.0"
    assert cfg.limits() == IniLimits(500, 70)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("max_op_cache_size", 0, "max_op_cache_size=0 is outside -1 or 1..2147483647"),
        ("max_op_cache_size", "1.5", "is not an integer"),
        ("remain_cache_size_ratio", 101, "remain_cache_size_ratio=101 is outside 1..100"),
        ("remain_cache_size_ratio", True, "must be a string or an integer"),
        ("adk_version", " ", "must not be empty"),
        ("ops_version", "1\n[x]", "spans lines"),
        ("MAX_OP_CACHE_SIZE", 5, "the key is max_op_cache_size"),
        ("a=b", 5, "is not a valid key"),
        ("[x]", 5, "is not a valid key"),
        ("", 5, "is not a valid key"),
    ],
)
def test_set_rejects_bad_input_and_changes_nothing(
    tmp_path: Path, key: str, value: object, match: str
) -> None:
    path = write(tmp_path, GOOD)
    cfg = OpCacheIni.load(path)
    with pytest.raises(ConfigError, match=re.escape(match)):
        cfg.set(key, value)  # type: ignore[arg-type]
    cfg.save()
    assert path.read_bytes() == GOOD
    assert cfg.limits() == IniLimits(500, 80)


def test_set_writes_canonical_integers(tmp_path: Path) -> None:
    path = tmp_path / INI_NAME
    cfg = OpCacheIni.load(path)
    cfg.set("max_op_cache_size", " 0500 ")
    cfg.save()
    assert path.read_text() == "[op_compiler_cache]\nmax_op_cache_size=500\n"


def test_create_new_file_as_ge_writes_it(tmp_path: Path) -> None:
    path = tmp_path / INI_NAME
    cfg = OpCacheIni.create(path, 500, 80, "7.0.0", "7.0.1")
    assert path.read_bytes() == GOOD
    assert cfg.limits() == IniLimits(500, 80)
    assert OpCacheIni.load(path).limits() == IniLimits(500, 80)
    assert temps(tmp_path) == []


def test_create_on_existing_file_keeps_other_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "# keep me\n[op_compiler_cache]\nadk_version=6\nfoo=bar\n[x]\ny=1\n")
    OpCacheIni.create(path, -1, 50, "7", "7")
    assert path.read_text() == (
        "# keep me\n[op_compiler_cache]\nadk_version=7\nfoo=bar\n"
        "ops_version=7\nmax_op_cache_size=-1\nremain_cache_size_ratio=50\n[x]\ny=1\n"
    )


def test_create_with_invalid_value_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / INI_NAME
    with pytest.raises(ConfigError, match=re.escape("remain_cache_size_ratio=0 is outside 1..100")):
        OpCacheIni.create(path, 500, 0, "7", "7")
    assert not path.exists()


# -- atomicity ----------------------------------------------------------------------------


def test_save_leaves_no_temp_file(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    cfg = OpCacheIni.load(path)
    for value in range(1, 20):
        cfg.set("max_op_cache_size", value)
        cfg.save()
    assert temps(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [INI_NAME]


def test_save_into_a_path_whose_parent_is_a_file_fails_cleanly(tmp_path: Path) -> None:
    (tmp_path / "kernel_cache").write_text("not a folder")
    cfg = OpCacheIni(tmp_path / "kernel_cache" / INI_NAME, None)  # as if loaded, then moved
    cfg.set("max_op_cache_size", 5)
    with pytest.raises((OSError, ConfigError)):
        cfg.save()
    assert (tmp_path / "kernel_cache").read_text() == "not a folder"
    assert temps(tmp_path) == []


def test_failed_write_leaves_original_unchanged(tmp_path: Path) -> None:
    # Runs as root in CI, so a read-only folder would not stop the write. RLIMIT_FSIZE does:
    # the temp file cannot grow past the limit (EFBIG), in a child process to spare pytest.
    original = GOOD + b"# short\n"
    path = write(tmp_path, original)
    script = textwrap.dedent(
        f"""
        import resource, signal, sys
        from pathlib import Path
        from cachemgr.config.ini import OpCacheIni
        cfg = OpCacheIni.load(Path({str(path)!r}))
        cfg.set("padding", "x" * 100_000)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
        try:
            cfg.save()
        except OSError as exc:
            print("failed:", exc.errno)
            sys.exit(0)
        sys.exit(3)
        """
    )
    repo = Path(ini.__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(repo)},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "failed: 27" in done.stdout  # EFBIG
    assert path.read_bytes() == original
    assert temps(tmp_path) == []


def test_read_only_folder_keeps_original(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Saving into a folder the user cannot write: one CachePermissionError, the original
    kept, no temp left. Root writes anywhere, so as root the save runs as another user
    (a real one, with a Python it may run)."""
    if os.geteuid() != 0:
        path = write(tmp_path, GOOD)
        cfg = OpCacheIni.load(path)
        cfg.set("max_op_cache_size", 1)
        tmp_path.chmod(0o555)
        try:
            with pytest.raises(ini.CachePermissionError):
                cfg.save()
        finally:
            tmp_path.chmod(0o755)
        folder = tmp_path
    else:
        users = request.getfixturevalue("users")
        rt = request.getfixturevalue("other_runtime")
        folder = users.base / "ro"
        folder.mkdir()
        path = write(folder, GOOD)
        for item in (folder, path):
            shutil.chown(item, users.carol)
        folder.chmod(0o555)
        script = (
            "from cachemgr.config import ini\n"
            f"cfg = ini.OpCacheIni.load({str(path)!r})\n"
            "cfg.set('max_op_cache_size', 1)\n"
            "try:\n    cfg.save()\nexcept ini.CachePermissionError:\n    print('refused')\n"
        )
        done = run_python_as(users, rt, users.carol, "-c", script)
        assert done.stdout.strip() == "refused", done.stdout + done.stderr
    assert path.read_bytes() == GOOD
    assert temps(folder) == []


# -- property: set() + save() + load() changes only the keys set -------------------------

_TEXT = st.text(
    alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\r\n"),
    max_size=20,
)
_OTHER_KEY = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True).filter(
    lambda k: ini._near_miss(k) is None and k not in ini._KNOWN_KEYS
)
_OTHER_SECTION = st.from_regex(r"[A-Za-z0-9_.-]{1,15}", fullmatch=True).filter(
    lambda s: s != SECTION
)
_LINE = st.one_of(
    _TEXT.map(lambda t: "#" + t),
    _TEXT.map(lambda t: "; " + t),
    st.sampled_from(["", "  ", "\t"]),
    _OTHER_SECTION.map(lambda s: f"[{s}]"),
)
_SPACE = st.sampled_from(["", " ", "  ", "\t"])


@st.composite
def _ini_file(draw: st.DrawFn) -> tuple[bytes, bool, bool]:
    """An ini with arbitrary other lines; returns (bytes, has BOM, has CRLF)."""
    before = draw(st.lists(_LINE, max_size=6))
    with_section = draw(st.booleans())
    body: list[str] = []
    if with_section:
        body.append(f"[{SECTION}]")
        keys = draw(st.lists(_OTHER_KEY, unique=True, max_size=4))
        for key in keys:
            body.append(f"{key}{draw(_SPACE)}={draw(_SPACE)}{draw(_TEXT)}".rstrip(" \t"))
            body.extend(draw(st.lists(_LINE.filter(lambda x: not x.startswith("[")), max_size=2)))
        for ours in ("max_op_cache_size", "remain_cache_size_ratio", "adk_version", "ops_version"):
            if draw(st.booleans()):  # an old value of one of ours, anywhere in the section
                at = draw(st.integers(1, len(body)))
                body.insert(at, f"{ours}{draw(_SPACE)}={draw(_SPACE)}{draw(_TEXT)}")
    after = draw(st.lists(_LINE, max_size=6))
    lines = before + body + after
    crlf = draw(st.booleans()) and bool(lines)
    bom = draw(st.booleans())
    ends = ["\r\n" if crlf and draw(st.booleans()) else "\n" for _ in lines]
    crlf = "\r\n" in ends
    last_end = draw(st.booleans())
    text = "".join(line + end for line, end in zip(lines, ends, strict=True))
    if lines and not last_end:
        text = text[: -len(ends[-1])]
        crlf = "\r\n" in ends[:-1]
    data = text.encode()
    return (b"\xef\xbb\xbf" + data if bom else data), bom, crlf


_OURS = re.compile(
    rb"^[ \t]*"
    rb"(max_op_cache_size|remain_cache_size_ratio|adk_version|ops_version)[ \t]*="
)


def _others(data: bytes, added_header: bool) -> list[tuple[bytes, bytes]]:
    """(content, line end) of every line that is not one of ours (the BOM is checked apart)."""
    data = data.removeprefix(b"\xef\xbb\xbf")
    pairs = [(m.group(1), m.group(2)) for m in re.finditer(rb"([^\n]*?)(\r\n|\n|$)", data)]
    if pairs and pairs[-1] == (b"", b""):
        pairs.pop()
    pairs = [p for p in pairs if not _OURS.match(p[0])]
    if added_header:
        pairs = [p for p in pairs if p[0] != f"[{SECTION}]".encode()]
    return pairs


def _same_lines(before: list[tuple[bytes, bytes]], after: list[tuple[bytes, bytes]]) -> bool:
    """Equal line by line; only a last line that had no line end may have gained one."""
    if len(before) != len(after):
        return False
    for i, (old, new) in enumerate(zip(before, after, strict=True)):
        last_without_end = i == len(before) - 1 and old[1] == b""
        if old[0] != new[0] or (old[1] != new[1] and not last_without_end):
            return False
    return True


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    made=_ini_file(),
    max_mb=st.one_of(st.just(-1), st.integers(1, 2**31 - 1)),
    ratio=st.integers(1, 100),
    stamp=st.from_regex(r"[0-9][0-9.A-Za-z_-]{0,10}", fullmatch=True),
)
def test_set_save_load_changes_only_the_keys_set(
    tmp_path_factory: pytest.TempPathFactory,
    made: tuple[bytes, bool, bool],
    max_mb: int,
    ratio: int,
    stamp: str,
) -> None:
    data, bom, _crlf = made
    folder = tmp_path_factory.mktemp("prop")
    path = write(folder, data)
    had_section = OpCacheIni.load(path)._scan_result.headers != []
    cfg = OpCacheIni.load(path)
    cfg.set("max_op_cache_size", max_mb)
    cfg.set("remain_cache_size_ratio", ratio)
    cfg.set("adk_version", stamp)
    cfg.set("ops_version", stamp)
    cfg.save()

    again = OpCacheIni.load(path)
    assert (again.max_op_cache_size, again.remain_cache_size_ratio) == (max_mb, ratio)
    assert (again.adk_version, again.ops_version) == (stamp, stamp)
    saved = path.read_bytes()
    assert saved.startswith(b"\xef\xbb\xbf") == bom
    assert _same_lines(_others(data, False), _others(saved, not had_section))
    used, _, ge_limits = ge_twin.read_ini(saved)  # what GE computes, by the GE twin
    assert again.limits() == (IniLimits(*ge_limits) if ge_limits else None)
    assert (again.ge.stamps is not None) == used
    assert temps(folder) == []
