"""The rules as pure functions (docs/design.md#cache-modes, #precompiled-binaries,
#debug-compiles-and-kernel_meta): debug bypass, jit_compile, cache modes."""

from __future__ import annotations

import pytest

from cachemgr.compile.policy import (
    ARTEFACTS,
    CFG_ROWS,
    LEVEL_ROWS,
    DebugConfig,
    binary_first,
    cache_plan,
    debug_plan,
    decide,
    parse_debug_config,
)
from cachemgr.compilers import DEBUG_FLAGS, EMITS
from cachemgr.errors import InvalidInputError

OJ = {"o", "json"}


def test_table_rows_use_known_flags_and_artefacts() -> None:
    for row in (*LEVEL_ROWS.values(), *CFG_ROWS.values()):
        assert row.flags <= DEBUG_FLAGS and row.keep <= ARTEFACTS


@pytest.mark.parametrize(
    ("level", "keep", "flags"),
    [
        (1, OJ | {"cce", "loc"}, {"instrument"}),
        (2, OJ | {"cce", "loc"}, {"instrument", "O0", "g"}),
        (3, OJ, set()),
        (4, OJ | {"cce", "compute"}, set()),
    ],
)
def test_level_rows_of_spec_7(level: int, keep: set[str], flags: set[str]) -> None:
    plan = debug_plan(level, None, "Add")
    assert plan.on and plan.keep == keep and plan.flags == flags
    assert plan.emit == keep & EMITS


def test_level_0_is_not_debug() -> None:
    assert debug_plan(0, None, "Add").on is False


@pytest.mark.parametrize(
    ("option", "keep", "flags"),
    [
        ("oom", OJ, {"oom"}),
        ("dump_bin", OJ, set()),
        ("dump_cce", OJ | {"cce"}, set()),
        ("dump_loc", OJ | {"loc"}, set()),
        ("ccec_O0", OJ, {"O0"}),
        ("ccec_g", OJ, {"g"}),
        ("check_flag", OJ, {"check_flag"}),
    ],
)
def test_cfg_rows_of_spec_7(option: str, keep: set[str], flags: set[str]) -> None:
    cfg = parse_debug_config(f"op_debug_config = {option}\n", "t.cfg")
    plan = debug_plan(0, cfg, "Add")
    assert plan.on and plan.keep == keep and plan.flags == flags


def test_level_and_cfg_combine() -> None:
    cfg = parse_debug_config("op_debug_config=ccec_g,oom", "t.cfg")
    plan = debug_plan(4, cfg, "Add")
    assert plan.keep == OJ | {"cce", "compute"} and plan.flags == {"g", "oom"}


def test_cfg_grammar() -> None:
    text = "# seed example, comments and blanks are fine\n\n  op_debug_config = ccec_g , oom \n"
    assert parse_debug_config(text, "t.cfg") == DebugConfig(
        frozenset({"ccec_g", "oom"}), None, "t.cfg"
    )
    cfg = parse_debug_config(
        "op_debug_config=dump_cce\nop_debug_list=GatherV2,opType::ReduceSum", "t"
    )
    assert cfg.op_list == ("GatherV2", "opType::ReduceSum")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("op_debug_config = ccec_O0,ccec_g,oom", "ccec_O0 and oom cannot be combined"),
        ("op_debug_config = dump_all", "unknown option 'dump_all'"),
        ("op_debug_config = ", "no option"),
        ("op_debug_list = Add", "has no 'op_debug_config"),
        ("op_debug_config = oom\nop_debug_config = dump_bin", "given twice"),
        ("op_debug_config = oom\nenable_dump = 1", "'enable_dump = 1' is not"),
        ("op_debug_config = oom\nop_debug_list = ,", "op_debug_list is empty"),
        ("oom", "'oom' is not"),
    ],
)
def test_bad_cfg_is_one_clear_line(text: str, expected: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        parse_debug_config(text, "/root/test0.cfg")
    message = str(info.value)
    assert expected in message and "/root/test0.cfg" in message and "\n" not in message


def test_op_debug_list_limits_the_cfg_to_listed_ops() -> None:
    cfg = parse_debug_config("op_debug_config=oom\nop_debug_list=add_1,OpType::MatMul", "t")
    assert debug_plan(0, cfg, "MatMul").on
    assert debug_plan(0, cfg, "Add", op_name="add_1").on
    assert not debug_plan(0, cfg, "Add", op_name="add_2").on
    assert not debug_plan(0, cfg, "Add").on  # a bare entry names an operator, not a type
    assert debug_plan(2, cfg, "Add").on  # a level applies to every op
    assert debug_plan(2, cfg, "Add").flags == {"instrument", "O0", "g"}  # without the cfg's


@pytest.mark.parametrize("mode", ["enable", "disable", "force"])
def test_debug_bypasses_the_cache_in_every_mode(mode: str) -> None:
    plan = cache_plan(mode, debug_on=True)
    assert not plan.read and not plan.write and not plan.clear_first


def test_cache_modes() -> None:
    assert cache_plan("enable", False) == cache_plan("enable", False)
    enable, disable, force = (cache_plan(m, False) for m in ("enable", "disable", "force"))
    assert (enable.read, enable.write, enable.clear_first) == (True, True, False)
    assert (disable.read, disable.write) == (False, False)
    assert (force.read, force.write, force.clear_first) == (True, True, True)
    replace = cache_plan("force", False, replace=True)
    assert (replace.read, replace.write, replace.replace, replace.clear_first) == (
        False,
        True,
        True,
        False,
    )
    assert not cache_plan("disable", False, replace=True).write


@pytest.mark.parametrize(
    ("jit", "dynamic", "first"),
    [
        ("true", False, False),
        ("true", True, False),
        ("false", False, True),
        ("false", True, True),
        ("auto", False, False),
        ("auto", True, True),
    ],
)
def test_jit_compile(jit: str, dynamic: bool, first: bool) -> None:
    assert binary_first(jit, dynamic) is first


def test_decide_puts_debug_first() -> None:
    common = {"op_type": "Add", "op_name": None, "dynamic": True, "cfg": None}
    d = decide(mode="force", jit_compile="false", level=1, **common)
    assert d.debug.on and not d.binary_first and not d.cache.read and not d.cache.clear_first
    d = decide(mode="force", jit_compile="false", level=0, **common)
    assert not d.debug.on and d.binary_first and d.cache.clear_first


def test_invalid_values_raise() -> None:
    with pytest.raises(InvalidInputError, match="op_debug_level=5"):
        debug_plan(5, None, "Add")
    with pytest.raises(InvalidInputError, match="jit_compile='2'"):
        binary_first("2", False)
    with pytest.raises(InvalidInputError, match="op_compiler_cache_mode='on'"):
        cache_plan("on", False)


#: Per framework and op_debug_level: does the cache stay on
#: (docs/compiling.md#debug-options-and-the-cache-per-framework)? torch_npu: "ACL_OP_DEBUG_LEVEL 0
#: or 3"; the TF adapter, GE and ATC: "op_debug_level non-zero: the cache is not used".
DEBUG_RULES = {
    "tf": {0: True, 1: False, 2: False, 3: False, 4: False},
    "ge": {0: True, 1: False, 2: False, 3: False, 4: False},
    "atc": {0: True, 1: False, 2: False, 3: False, 4: False},
    "torch_npu": {0: True, 1: False, 2: False, 3: True, 4: False},
}


@pytest.mark.parametrize(
    ("framework", "level", "cached"),
    [(fw, lvl, on) for fw, row in DEBUG_RULES.items() for lvl, on in row.items()],
)
@pytest.mark.parametrize("mode", ["enable", "force"])
def test_each_frameworks_debug_rule(framework: str, level: int, cached: bool, mode: str) -> None:
    d = decide(
        mode=mode,
        jit_compile="auto",
        level=level,
        cfg=None,
        op_type="Add",
        op_name=None,
        dynamic=False,
        framework=framework,
    )
    assert (d.cache.read, d.cache.write) == (cached, cached), (framework, level)
    assert d.debug.on is not cached
    # the level's artefacts and flags, as its row of the table gives them
    # (docs/design.md#debug-compiles-and-kernel_meta)
    if not cached:
        assert d.debug.keep == LEVEL_ROWS[level].keep and d.debug.flags == LEVEL_ROWS[level].flags


def test_a_cfg_turns_the_cache_off_for_torch_npu_too_and_the_default_is_tf() -> None:
    cfg = DebugConfig(frozenset({"dump_cce"}))
    d = decide(
        mode="enable", jit_compile="auto", level=3, cfg=cfg, op_type="Add", op_name=None,
        dynamic=False, framework="torch_npu",
    )  # fmt: skip
    assert d.debug.on and not d.cache.read and "cce" in d.debug.keep
    plain = decide(
        mode="enable", jit_compile="auto", level=3, cfg=None, op_type="Add", op_name=None,
        dynamic=False,
    )  # fmt: skip
    assert plain.debug.on and not plain.cache.write  # the seed's TF adapter rule
    with pytest.raises(InvalidInputError, match="framework='pytorch' is unknown"):
        debug_plan(0, None, "Add", framework="pytorch")
