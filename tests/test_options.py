"""Options with origins (docs/design.md#options-and-their-origins, #where-the-cache-lives,
#size-limits-and-eviction): precedence, validation, GE's fallbacks."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cachemgr.config import options
from cachemgr.config.ini import OpCacheIni
from cachemgr.errors import ConfigError


def test_defaults_and_home(clean_env: dict[str, str]) -> None:
    s = options.resolve(env=clean_env)
    home = Path(clean_env["HOME"])
    assert s["kernel_cache_dir"].value == home / "atc_data" / "kernel_cache"
    assert s["kernel_cache_dir"].origin == "default"
    assert s.value("op_compiler_cache_mode") == "enable"
    assert (s.value("max_op_cache_size"), s["max_op_cache_size"].origin) == (500, "default")
    assert s.value("remain_cache_size_ratio") == 50
    assert s.value("jit_compile") == "auto" and s.value("op_debug_level") == 0
    assert s.value("kernel_meta_dir") == Path.cwd() / "kernel_meta"
    assert s.value("host_id") == socket.gethostname().split(".")[0]
    assert s.problems == ()
    assert not (home / "atc_data").exists()  # resolving creates nothing


def test_option_beats_env_beats_home(clean_env: dict[str, str], tmp_path: Path) -> None:
    env = {**clean_env, "ASCEND_CACHE_PATH": str(tmp_path / "shared")}
    s = options.resolve(env=env, cli={"host_id": "node7"})
    assert s.value("kernel_cache_dir") == tmp_path / "shared" / "kernel_cache_node7"
    assert (s["kernel_cache_dir"].origin, s["kernel_cache_dir"].source) == (
        "env",
        "ASCEND_CACHE_PATH",
    )
    s = options.resolve(env=env, cli={"op_compiler_cache_dir": str(tmp_path / "opt")})
    assert s.value("kernel_cache_dir") == tmp_path / "opt" / "kernel_cache"
    assert s["kernel_cache_dir"].origin == "option"


def test_host_id_from_env_and_empty(clean_env: dict[str, str], tmp_path: Path) -> None:
    env = {**clean_env, "ASCEND_CACHE_PATH": str(tmp_path), "CACHEMGR_HOST_ID": "h2"}
    s = options.resolve(env=env)
    assert s.value("kernel_cache_dir") == tmp_path / "kernel_cache_h2"
    assert s["host_id"].origin == "env"
    s = options.resolve(env=env, cli={"host_id": ""})
    assert s.value("kernel_cache_dir") == tmp_path / "kernel_cache"  # GE's shared layout


@pytest.mark.parametrize("bad", ["/tmp/a b", "/tmp/a;b", "/tmp/$x", "/tmp/a*b", "rel\\x"])
def test_bad_cache_dir_characters(clean_env: dict[str, str], bad: str) -> None:
    with pytest.raises(ConfigError, match="op_compiler_cache_dir") as info:
        options.resolve(env=clean_env, cli={"op_compiler_cache_dir": bad})
    assert repr(bad) in str(info.value) and "--cache-dir" in str(info.value)


def test_chinese_path_is_accepted(clean_env: dict[str, str], tmp_path: Path) -> None:
    s = options.resolve(env=clean_env, cli={"op_compiler_cache_dir": str(tmp_path / "缓存")})
    assert s.value("kernel_cache_dir") == tmp_path / "缓存" / "kernel_cache"


def test_file_where_folder_expected(clean_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    for value in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        with pytest.raises(ConfigError, match="not a folder"):
            options.resolve(env=clean_env, cli={"op_compiler_cache_dir": str(value)})


@pytest.mark.parametrize("raw", ["abc", "0", "-5", "2147483647"])  # "1.5": GE reads 1
def test_env_max_falls_back_with_warning(clean_env: dict[str, str], raw: str) -> None:
    s = options.resolve(env={**clean_env, "ASCEND_MAX_OP_CACHE_SIZE": raw})
    assert s.value("max_op_cache_size") == 500
    assert any("ASCEND_MAX_OP_CACHE_SIZE" in p and repr(raw) in p for p in s.problems)


def test_env_limits_used_and_ratio_zero_passes(clean_env: dict[str, str]) -> None:
    env = {**clean_env, "ASCEND_MAX_OP_CACHE_SIZE": "-1", "ASCEND_REMAIN_CACHE_SIZE_RATIO": "0"}
    s = options.resolve(env=env)
    assert s.value("max_op_cache_size") == -1 and s["max_op_cache_size"].origin == "env"
    assert s.value("remain_cache_size_ratio") == 0 and s.problems == ()


@pytest.mark.parametrize("raw", ["101", "-1", "4294967397"])  # 2**32 + 101; "x": GE's atoi reads 0
def test_env_ratio_falls_back(clean_env: dict[str, str], raw: str) -> None:
    s = options.resolve(env={**clean_env, "ASCEND_REMAIN_CACHE_SIZE_RATIO": raw})
    assert s.value("remain_cache_size_ratio") == 50 and len(s.problems) == 1


def _ini(tmp_path: Path, max_mb: int, ratio: int) -> Path:
    root = tmp_path / "c"
    path = root / "kernel_cache" / "op_cache.ini"
    path.parent.mkdir(parents=True)
    OpCacheIni.create(path, max_mb, ratio, "7.0.0", "7.0.0")
    return root


def test_ini_wins_over_env_when_both_valid(clean_env: dict[str, str], tmp_path: Path) -> None:
    root = _ini(tmp_path, 2048, 80)
    env = {**clean_env, "ASCEND_MAX_OP_CACHE_SIZE": "100"}
    s = options.resolve(env=env, cli={"op_compiler_cache_dir": str(root)})
    assert (s.value("max_op_cache_size"), s["max_op_cache_size"].origin) == (2048, "op_cache.ini")
    assert s.value("remain_cache_size_ratio") == 80


@pytest.mark.parametrize(
    "ratio_line",
    ["remain_cache_size_ratio=0", "remain_cache_size_ratio=101", "remain_cache_size_ratio=x"],
)
def test_invalid_ini_falls_back_to_env(
    clean_env: dict[str, str], tmp_path: Path, ratio_line: str
) -> None:
    root = tmp_path / "c"
    (root / "kernel_cache").mkdir(parents=True)
    (root / "kernel_cache" / "op_cache.ini").write_text(
        f"[op_compiler_cache]\nmax_op_cache_size=2048\n{ratio_line}\n"
        "adk_version=7.0.0\nops_version=7.0.0\n"
    )
    env = {**clean_env, "ASCEND_MAX_OP_CACHE_SIZE": "100"}
    s = options.resolve(env=env, cli={"op_compiler_cache_dir": str(root)})
    assert (s.value("max_op_cache_size"), s["max_op_cache_size"].origin) == (100, "env")
    assert any(ratio_line.split("=")[1] in p and "op_cache.ini" in p for p in s.problems)


def test_bad_option_values(clean_env: dict[str, str]) -> None:
    for name, value in [
        ("op_compiler_cache_mode", "sometimes"),
        ("jit_compile", "maybe"),
        ("op_debug_level", "5"),
        ("soc_version", "../x"),
    ]:
        with pytest.raises(ConfigError, match=name):
            options.resolve(env=clean_env, cli={name: value})


@pytest.mark.parametrize(
    ("raw", "value"),
    [("2", "auto"), ("1", "true"), ("0", "false"), ("enable", "true"), ("disable", "false")],
)
def test_jit_compile_aliases(clean_env: dict[str, str], raw: str, value: str) -> None:
    assert options.resolve(env=clean_env, cli={"jit_compile": raw}).value("jit_compile") == value


def test_config_file_values_are_option_origin(clean_env: dict[str, str], tmp_path: Path) -> None:
    cfg = tmp_path / "cachemgr.toml"
    cfg.write_text(
        f'op_compiler_cache_dir = "{tmp_path}/fromfile"\njit_compile = "false"\n'
        "[daemon]\nreconcile_interval_s = 300\n"
    )
    s = options.resolve(env=clean_env, config_file=cfg)
    assert s["kernel_cache_dir"].origin == "option" and "config" in s["kernel_cache_dir"].source
    assert s.value("jit_compile") == "false"
    assert s.sections["daemon"]["reconcile_interval_s"] == 300
    cfg.write_text("no_such_option = 1\n")
    with pytest.raises(ConfigError, match="no_such_option"):
        options.resolve(env=clean_env, config_file=cfg)


def test_kernel_meta_base_order(clean_env: dict[str, str], tmp_path: Path) -> None:
    env = {**clean_env, "ASCEND_WORK_PATH": str(tmp_path / "work")}
    assert options.resolve(env=env).value("kernel_meta_dir") == tmp_path / "work" / "kernel_meta"
    s = options.resolve(env=env, cli={"debug_dir": str(tmp_path / "dbg")})
    assert s.value("kernel_meta_dir") == tmp_path / "dbg" / "kernel_meta"
