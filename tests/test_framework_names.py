"""Every framework's name for the cache folder and mode
(docs/configuration.md#every-frameworks-name): torch_npu's ``ACL_OP_COMPILER_CACHE_DIR`` /
``ACL_OP_COMPILER_CACHE_MODE`` in the environment, GE's ``ge.op_compiler_cache_dir`` /
``ge.op_compiler_cache_mode`` in the config file, and which name supplied each value (and
which lost) in ``cachemgr config``."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli


def _config(env: dict[str, str], *args: str) -> dict:
    proc = run_cli("config", "--json", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_torch_npu_environment_resolves_its_folder_and_mode(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    env = {
        **clean_env,
        "ACL_OP_COMPILER_CACHE_DIR": str(tmp_path / "torch"),
        "ACL_OP_COMPILER_CACHE_MODE": "force",
    }
    data = _config(env)
    # ACL hands the variable to GE as its cache dir: <dir>/kernel_cache, not $HOME/atc_data
    assert data["kernel_cache_dir"]["value"] == str(tmp_path / "torch" / "kernel_cache")
    assert (data["kernel_cache_dir"]["origin"], data["kernel_cache_dir"]["source"]) == (
        "env",
        "ACL_OP_COMPILER_CACHE_DIR",
    )
    assert "ACL_OP_COMPILER_CACHE_DIR" in data["kernel_cache_dir"]["why"]
    mode = data["op_compiler_cache_mode"]
    assert (mode["value"], mode["origin"], mode["source"]) == (
        "force",
        "env",
        "ACL_OP_COMPILER_CACHE_MODE",
    )
    # gc acts on that folder too, not on $HOME/atc_data (the build-host report)
    gc = run_cli("gc", "--json", env=env)
    assert gc.returncode == 0, gc.stderr
    assert str(tmp_path / "torch" / "kernel_cache") in gc.stdout
    assert not (Path(clean_env["HOME"]) / "atc_data").exists()


def test_two_names_in_one_environment_the_documented_priority_decides(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    env = {
        **clean_env,
        "ASCEND_CACHE_PATH": str(tmp_path / "shared"),
        "ACL_OP_COMPILER_CACHE_DIR": str(tmp_path / "torch"),
        "ACL_OP_COMPILER_CACHE_MODE": "disable",
    }
    data = _config(env)
    kc = data["kernel_cache_dir"]
    assert kc["value"] == str(tmp_path / "torch" / "kernel_cache")
    assert kc["passed_over"] == [
        f"ASCEND_CACHE_PATH={tmp_path / 'shared'} (ACL_OP_COMPILER_CACHE_DIR comes first)"
    ]
    # an option given to the job (here --cache-dir) comes before both, as torch_npu says of
    # torch_npu_option; and before ACL_OP_COMPILER_CACHE_MODE
    data = _config(env, "--cache-dir", str(tmp_path / "opt"))
    kc = data["kernel_cache_dir"]
    assert kc["value"] == str(tmp_path / "opt" / "kernel_cache") and kc["origin"] == "option"
    assert [p.split("=")[0] for p in kc["passed_over"]] == [
        "ACL_OP_COMPILER_CACHE_DIR",
        "ASCEND_CACHE_PATH",
    ]
    human = run_cli("config", "--cache-dir", str(tmp_path / "opt"), env=env)
    assert f"passed over: ACL_OP_COMPILER_CACHE_DIR={tmp_path / 'torch'}" in human.stdout
    cfg = tmp_path / "c.toml"
    cfg.write_text('op_compiler_cache_mode = "enable"\n')
    mode = _config(env, "--config", str(cfg))["op_compiler_cache_mode"]
    assert mode["value"] == "enable" and mode["origin"] == "option"
    assert mode["passed_over"][0].startswith("ACL_OP_COMPILER_CACHE_MODE=disable")


def test_ge_option_names_in_the_config_file(clean_env: dict[str, str], tmp_path: Path) -> None:
    cfg = tmp_path / "cachemgr.toml"
    for text in (
        f'ge.op_compiler_cache_dir = "{tmp_path}/ge"\nge.op_compiler_cache_mode = "disable"\n',
        f'"ge.op_compiler_cache_dir" = "{tmp_path}/ge"\n"ge.op_compiler_cache_mode" = "disable"\n',
        f'[ge]\nop_compiler_cache_dir = "{tmp_path}/ge"\nop_compiler_cache_mode = "disable"\n',
    ):
        cfg.write_text("# GE's names\n" + text)
        data = _config(clean_env, "--config", str(cfg))
        kc, mode = data["kernel_cache_dir"], data["op_compiler_cache_mode"]
        assert kc["value"] == str(tmp_path / "ge" / "kernel_cache"), text
        assert kc["source"] == f"config {cfg}:{text.count(chr(10), 0, text.index('dir')) + 2}" + (
            " as ge.op_compiler_cache_dir"
        ), (text, kc)
        assert (mode["value"], mode["origin"]) == ("disable", "option")
        assert mode["source"].endswith("as ge.op_compiler_cache_mode"), mode
        assert "ge.op_compiler_cache_dir" not in data and "ge" not in str(
            [k for k in data if k.startswith("ge.")]
        )


def test_ge_names_that_disagree_or_are_unknown_are_one_line(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    cfg = tmp_path / "cachemgr.toml"
    cfg.write_text(
        f'op_compiler_cache_dir = "{tmp_path}/a"\nge.op_compiler_cache_dir = "{tmp_path}/b"\n'
    )
    proc = run_cli("config", "--config", str(cfg), env=clean_env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"{cfg}:2" in lines[0] and "ge.op_compiler_cache_dir" in lines[0]
    assert "op_compiler_cache_dir" in lines[0] and "(line 1)" in lines[0]
    cfg.write_text(
        f'op_compiler_cache_dir = "{tmp_path}/a"\n[ge]\nop_compiler_cache_dir = "{tmp_path}/a"\n'
    )
    assert run_cli("config", "--config", str(cfg), env=clean_env).returncode == 0  # agree
    cfg.write_text('ge.op_debug_level = "1"\n')
    proc = run_cli("config", "--config", str(cfg), env=clean_env)
    assert proc.returncode == 2 and "unknown GE option 'ge.op_debug_level'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    cfg.write_text('ge.op_compiler_cache_mode = "sometimes"\n')
    proc = run_cli("config", "--config", str(cfg), env=clean_env)
    assert proc.returncode == 2 and f"{cfg}:1" in proc.stderr
    assert "ge.op_compiler_cache_mode = 'sometimes' is invalid" in proc.stderr


def test_a_request_from_torch_npu_keeps_the_cache_at_debug_level_3(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    from tests.compile_util import SOC, write_request

    def compile_(req: Path) -> dict:
        proc = run_cli(
            "compile", "--cache-dir", str(tmp_path / "cache"), str(req), "--json",
            "--op-debug-level", "3", "--debug-dir", str(tmp_path / "dbg"),
            env=clean_env, cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.splitlines()[0])

    torch = write_request(tmp_path, "torch", framework="torch_npu")
    first, again = compile_(torch), compile_(torch)
    assert (first["status"], first["cached"], again["status"]) == ("compiled", True, "hit")
    assert Path(first["files"][0]).parent == tmp_path / "cache" / "kernel_cache" / SOC
    tf = compile_(write_request(tmp_path, "tf", framework="tf"))
    assert tf["status"] == "debug"  # the TF adapter's rule: any non-zero level, no cache
    assert (tmp_path / "dbg" / "kernel_meta") in Path(tf["files"][0]).parents
    bad = write_request(tmp_path, "bad", framework="pytorch")
    proc = run_cli("compile", "--cache-dir", str(tmp_path / "cache"), str(bad), env=clean_env)
    assert proc.returncode == 2 and "framework='pytorch': unknown framework" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
