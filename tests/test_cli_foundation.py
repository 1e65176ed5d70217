"""The real CLI: ``cachemgr config | ls | verify`` and its bad-input contract (exit 2)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import mount_util
from tests.conftest import SOC, publish, publish_mix, run_cli
from tests.test_entry import CF8B, D77A20, D77A21, PRE1, PRE2

CONFIG_KEYS = {
    "op_compiler_cache_mode", "op_compiler_cache_dir", "kernel_cache_dir", "ini_path",
    "max_op_cache_size", "remain_cache_size_ratio", "jit_compile", "op_debug_level",
    "op_debug_config", "kernel_meta_dir",
}  # fmt: skip


def test_config_json_has_every_key_with_origin(clean_env: dict[str, str], tmp_path: Path) -> None:
    proc = run_cli("config", "--json", "--cache-dir", str(tmp_path / "c"), env=clean_env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) >= CONFIG_KEYS
    for key in CONFIG_KEYS:
        assert set(data[key]) >= {"value", "origin"}
        assert data[key]["origin"] in {"option", "op_cache.ini", "env", "default"}
    assert data["kernel_cache_dir"] == {
        "value": str(tmp_path / "c" / "kernel_cache"),
        "origin": "option",
        "source": "--cache-dir",
    } or data["kernel_cache_dir"]["value"] == str(tmp_path / "c" / "kernel_cache")
    assert data["max_op_cache_size"]["value"] == 500
    assert not (tmp_path / "c").exists()


def test_config_text_and_ascend_cache_path(clean_env: dict[str, str], tmp_path: Path) -> None:
    env = {**clean_env, "ASCEND_CACHE_PATH": str(tmp_path / "s")}
    proc = run_cli("config", "--host-id", "b7", env=env)
    assert proc.returncode == 0, proc.stderr
    assert (
        f"(env: ASCEND_CACHE_PATH) kernel_cache_dir = {tmp_path}/s/kernel_cache_b7" in proc.stdout
    )


def _assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("bad", ["a b", "x;rm", "$HOME", "semi;colon"])
def test_bad_cache_dir_is_one_line_exit_2(
    clean_env: dict[str, str], tmp_path: Path, bad: str
) -> None:
    target = str(tmp_path / bad)
    for cmd in ("config", "ls", "verify"):
        proc = run_cli(cmd, "--cache-dir", target, env=clean_env)
        _assert_one_line_error(proc, "op_compiler_cache_dir", repr(target), "option")
    assert sorted(os.listdir(tmp_path)) == ["home"]


@pytest.mark.parametrize(
    "argv",
    [["config"], ["ls"], ["stats"], ["gc"], ["verify"], ["purge", "--all"], ["limits", "show"]],
)
def test_file_where_folder_expected(
    clean_env: dict[str, str], tmp_path: Path, argv: list[str]
) -> None:
    """``--cache-dir FILE`` (or a path under a file) is named as the option's value, by the
    read-only commands too: ``ls``, ``stats`` and ``verify`` blamed
    ``FILE/kernel_cache/op_cache.ini`` ('cannot read op_cache.ini …: Not a directory')."""
    (tmp_path / "f").write_text("x")
    for value, what in ((tmp_path / "f", "is a file"), (tmp_path / "f" / "x", "which is a file")):
        proc = run_cli(*argv, "--cache-dir", str(value), env=clean_env)
        _assert_one_line_error(
            proc, f"op_compiler_cache_dir={value} (from option --cache-dir)", what, "not a folder"
        )
        assert "op_cache.ini" not in proc.stderr


def test_unwritable_root(clean_env: dict[str, str], tmp_path: Path) -> None:
    with mount_util.tmpfs(tmp_path / "ro", "ro,size=1m") as root:
        proc = run_cli("config", "--cache-dir", str(root / "x"), env=clean_env)
        _assert_one_line_error(proc, "not writable", str(root))
        assert os.listdir(root) == []


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("ASCEND_MAX_OP_CACHE_SIZE", "abc"),
        ("ASCEND_MAX_OP_CACHE_SIZE", "0"),
        ("ASCEND_MAX_OP_CACHE_SIZE", "-5"),
    ],
)
def test_env_fallback_is_warned_shown_and_exit_2(
    clean_env: dict[str, str], var: str, value: str
) -> None:
    proc = run_cli("config", "--json", env={**clean_env, var: value})
    assert proc.returncode == 2
    assert f"{var}={value!r}" in proc.stderr and "500" in proc.stderr
    data = json.loads(proc.stdout)
    assert data["max_op_cache_size"]["value"] == 500
    assert data["max_op_cache_size"]["origin"] == "default"


INI_CASES = {
    "ratio0": b"[op_compiler_cache]\nmax_op_cache_size=100\nremain_cache_size_ratio=0\n"
              b"adk_version=1\nops_version=1\n",
    "ratio101": b"[op_compiler_cache]\nmax_op_cache_size=100\nremain_cache_size_ratio=101\n"
                b"adk_version=1\nops_version=1\n",
    "ratio_x": b"[op_compiler_cache]\nmax_op_cache_size=100\nremain_cache_size_ratio=x\n"
               b"adk_version=1\nops_version=1\n",
    "other_section": b"[other]\nmax_op_cache_size=100\nremain_cache_size_ratio=50\n"
                     b"adk_version=1\nops_version=1\n",
    "duplicate": b"[op_compiler_cache]\nmax_op_cache_size=100\nmax_op_cache_size=200\n"
                 b"remain_cache_size_ratio=50\nadk_version=1\nops_version=1\n",
    "bom": b"\xef\xbb\xbf[op_compiler_cache]\nmax_op_cache_size=100\nremain_cache_size_ratio=50\n"
           b"adk_version=1\nops_version=1\n",
    "crlf": b"[op_compiler_cache]\r\nmax_op_cache_size=100\r\nremain_cache_size_ratio=50\r\n"
            b"adk_version=1\r\nops_version=1\r\n",
    "no_stamps": b"[op_compiler_cache]\nmax_op_cache_size=100\nremain_cache_size_ratio=50\n",
}  # fmt: skip


#: Doubtful inis whose limits GE still computes: warned about, applied.
GE_LIMITS = {"crlf": 100, "duplicate": 200}


@pytest.mark.parametrize("case", sorted(INI_CASES))
def test_bad_ini_is_named_and_falls_back(
    clean_env: dict[str, str], tmp_path: Path, case: str
) -> None:
    kc = tmp_path / "c" / "kernel_cache"
    kc.mkdir(parents=True)
    (kc / "op_cache.ini").write_bytes(INI_CASES[case])
    proc = run_cli("config", "--json", "--cache-dir", str(tmp_path / "c"), env=clean_env)
    assert proc.returncode == 2, proc.stderr
    assert str(kc / "op_cache.ini") in proc.stderr and "Traceback" not in proc.stderr
    data = json.loads(proc.stdout)
    if case in GE_LIMITS:  # GE reads these limits: so does cachemgr, with a warning
        assert data["max_op_cache_size"]["origin"] == "op_cache.ini"
        assert data["max_op_cache_size"]["value"] == GE_LIMITS[case]
    else:
        assert data["max_op_cache_size"]["origin"] == "default"
    assert (kc / "op_cache.ini").read_bytes() == INI_CASES[case]  # nothing rewritten


def test_ini_values_shown_with_origin(clean_env: dict[str, str], tmp_path: Path) -> None:
    kc = tmp_path / "c" / "kernel_cache"
    kc.mkdir(parents=True)
    (kc / "op_cache.ini").write_text(
        "[op_compiler_cache]\nmax_op_cache_size=-1\n"
        "remain_cache_size_ratio=80\nadk_version=1\nops_version=1\n"
    )
    proc = run_cli("config", "--json", "--cache-dir", str(tmp_path / "c"), env=clean_env)
    data = json.loads(proc.stdout)
    assert data["max_op_cache_size"] == {
        "value": -1,
        "origin": "op_cache.ini",
        "source": str(kc / "op_cache.ini"),
    }


def _atimes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_atime_ns for p in folder.iterdir()}


def test_verify_fixtures_in_place(clean_env: dict[str, str], fixture_cache: Path) -> None:
    chip = fixture_cache / "kernel_cache" / SOC
    before = _atimes(chip)
    proc = run_cli("verify", "--json", "--cache-dir", str(fixture_cache), env=clean_env)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    findings = {
        f["name"]: {p["kind"] for p in f["problems"]} for f in data["chip_folders"][SOC]["findings"]
    }
    assert findings == {  # the missing .h is optional; GE's _pre.json are good entries
        CF8B: {"sha256_mismatch"},
        D77A20: {"sha256_mismatch"},
        D77A21: {"invalid_json"},
    }
    assert data["bad"] == 3
    text = run_cli("verify", "--cache-dir", str(fixture_cache), env=clean_env)
    assert text.returncode == 1 and f"BAD {SOC}/{D77A21}: invalid_json" in text.stdout
    assert _atimes(chip) == before


def test_ls_fixtures_in_place(clean_env: dict[str, str], fixture_cache: Path) -> None:
    chip = fixture_cache / "kernel_cache" / SOC
    before = _atimes(chip)
    proc = run_cli("ls", "--json", "--cache-dir", str(fixture_cache), env=clean_env)
    assert proc.returncode == 0, proc.stderr
    rows = {r["kernel"]: r for r in json.loads(proc.stdout)}
    assert set(rows) == {CF8B, D77A20, D77A21, PRE1[:-5], PRE2[:-5]}
    assert rows[D77A20]["op_type"] == "Mul" and rows[D77A20]["bytes"] == 608 + 74
    assert rows[D77A20]["parts"] == [D77A20 + ".json", D77A20 + ".o"]
    assert _atimes(chip) == before


def test_verify_repair_on_a_copy(
    clean_env: dict[str, str], fixture_cache: Path, tmp_path: Path
) -> None:
    root = tmp_path / "copy"
    shutil.copytree(fixture_cache / "kernel_cache", root / "kernel_cache")
    for p in (root / "kernel_cache").rglob("*"):
        p.chmod(0o775 if p.is_dir() else 0o664)
    (root / "kernel_cache").chmod(0o775)
    chip = root / "kernel_cache" / SOC
    publish(chip, "te_good_1", b"good binary")
    publish_mix(chip, "te_mix_1", b"c", b"v")
    proc = run_cli("verify", "--repair", "--json", "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["repaired"] == 3
    left = sorted(n for n in os.listdir(chip) if not n.endswith(".lock"))
    assert left == sorted(
        [
            PRE1,  # GE's pre-build entries are entries
            PRE2,
            "te_good_1.json",
            "te_good_1.o",
            "te_mix_1.json",
            "te_mix_1_mix_aic.json",
            "te_mix_1_mix_aic.o",
            "te_mix_1_mix_aiv.json",
            "te_mix_1_mix_aiv.o",
        ]
    )
    again = run_cli("verify", "--cache-dir", str(root), env=clean_env)
    assert again.returncode == 0 and "0 bad" in again.stdout


def test_orphan_binary_reported(clean_env: dict[str, str], tmp_path: Path) -> None:
    chip = tmp_path / "c" / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    (chip / "te_lost_1.o").write_bytes(b"no json")
    proc = run_cli("verify", "--json", "--cache-dir", str(tmp_path / "c"), env=clean_env)
    assert proc.returncode == 1
    finding = json.loads(proc.stdout)["chip_folders"][SOC]["findings"][0]
    assert finding["problems"][0]["kind"] == "orphan_binary"


def test_empty_cache_is_fine(clean_env: dict[str, str], tmp_path: Path) -> None:
    for cmd in ("ls", "verify"):
        proc = run_cli(cmd, "--cache-dir", str(tmp_path / "none"), env=clean_env)
        assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "none").exists()


def test_a_ratio_typo_says_what_ge_and_cachemgr_will_keep(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    """``ASCEND_REMAIN_CACHE_SIZE_RATIO=abc`` is 0 for GE (``std::atoi``) and so for cachemgr
    (two evictors on one folder agree); the warning says what that means (fresh-user find:
    it said only "write 0")."""
    env = {**clean_env, "ASCEND_REMAIN_CACHE_SIZE_RATIO": "abc"}
    proc = run_cli("gc", "--dry-run", "--cache-dir", str(tmp_path / "c"), env=env)
    assert proc.returncode == 0, proc.stderr
    assert "ASCEND_REMAIN_CACHE_SIZE_RATIO='abc' (from env)" in proc.stderr
    assert "an eviction keeps 0 % of the limit" in proc.stderr, proc.stderr
    assert "set ASCEND_REMAIN_CACHE_SIZE_RATIO to the integer you mean" in proc.stderr
    data = json.loads(
        run_cli("config", "--json", "--cache-dir", str(tmp_path / "c"), env=env).stdout
    )
    assert data["remain_cache_size_ratio"]["value"] == 0


def test_usage_errors_point_at_the_subcommands_help(tmp_path: Path, clean_env) -> None:
    # an option missing its value is raised by click without a context: it still names `gc`
    for argv in (["gc", "--ratio"], ["gc", "--ratoi"], ["config", "--config"]):
        proc = run_cli(*argv, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().endswith(f"(see `cachemgr {argv[0]} --help`)"), proc.stderr
    top = run_cli("--bogus", cwd=tmp_path)
    assert top.returncode == 2 and top.stderr.strip().endswith("(see `cachemgr --help`)")


def test_a_mistyped_command_gets_the_closest_one_suggested(tmp_path: Path) -> None:
    """``cachemgr stast`` said only ``No such command 'stast'.``; a mistyped option already
    got click's ``Did you mean``. One line, exit 2, the top-level help named."""
    for typed, meant in (("stast", "stats"), ("comple", "compile"), ("limits shwo", "show")):
        proc = run_cli(*typed.split(), cwd=tmp_path)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert f"Did you mean {meant!r}?" in proc.stderr, proc.stderr
    far = run_cli("xyzzy", cwd=tmp_path)
    assert far.returncode == 2 and "Did you mean" not in far.stderr, far.stderr
    assert far.stderr.strip().endswith("(see `cachemgr --help`)"), far.stderr


@pytest.mark.parametrize(
    ("argv", "option", "value"),
    [
        (["gc", "--ratio", "--cache-dir", "D"], "--ratio", "--cache-dir"),
        (["ls", "--cache-dir", "--json"], "--cache-dir", "--json"),
        (["config", "--cache-dir", "--json"], "--cache-dir", "--json"),
        (["limits", "set", "--max-size", "--json"], "--max-size", "--json"),
    ],
)
def test_an_option_given_an_option_name_as_its_value_is_named(
    tmp_path: Path, clean_env: dict[str, str], argv: list[str], option: str, value: str
) -> None:
    """``gc --ratio --cache-dir D`` used to blame ``D`` as an unexpected extra argument (click
    took ``--cache-dir`` as the ratio); ``ls --cache-dir --json`` listed a folder named
    ``--json``. Now one line names the option and the option name it got as its value."""
    proc = run_cli(*argv, env=clean_env, cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"{option} got '{value}' (an option name) as its value" in lines[0], lines[0]
    command = " ".join(argv[:2] if argv[0] == "limits" else argv[:1])
    assert lines[0].endswith(f"(see `cachemgr {command} --help`)"), lines[0]
    assert "extra argument" not in lines[0]
    assert sorted(os.listdir(tmp_path)) == ["home"]  # no folder named '--json'
