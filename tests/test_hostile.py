"""Regressions from an adversarial review: hostile cache content and input must never cost
a good entry, hang, or end in an internal error."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from tests.conftest import ROOT, SOC, publish, run_cli

REQUEST = ROOT / "examples" / "requests" / "add_c.json"


def _cache(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "c"
    chip = root / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    return root, chip


def test_a_bad_json_naming_other_entries_files_cannot_remove_them(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    root, chip = _cache(tmp_path)
    publish(chip, "te_good_1", b"good binary one")
    publish(chip, "te_good_2", b"good binary two")
    (chip / "te_evil_1.json").write_text(
        json.dumps(
            {
                "binFileName": "te_good_1",
                "binFileSuffix": ".o",
                "kernelName": "x",
                "sha256": "00",
                "jsonList": [{"binType": "AIC", "jsonFileName": "te_good_2.json"}],
            }
        )
    )
    proc = run_cli("verify", "--repair", "--cache-dir", str(root), env=clean_env)
    assert "Traceback" not in proc.stderr
    assert not (chip / "te_evil_1.json").exists()
    for name in ("te_good_1.json", "te_good_1.o", "te_good_2.json", "te_good_2.o"):
        assert (chip / name).exists(), name
    again = run_cli("verify", "--cache-dir", str(root), env=clean_env)
    assert again.returncode == 0, again.stdout


def test_a_symlinked_chip_folder_is_refused(clean_env: dict[str, str], tmp_path: Path) -> None:
    root, _chip = _cache(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "notes.txt").write_text("keep me")
    os.symlink(victim, root / "kernel_cache" / "Ascend910B2")
    proc = run_cli(
        "verify", "--repair", "--soc", "Ascend910B2", "--cache-dir", str(root), env=clean_env
    )
    assert proc.returncode == 2 and "symlink" in proc.stderr, proc.stderr
    request = json.loads(REQUEST.read_text())
    request["soc_version"] = "Ascend910B2"
    request["kernel_source"] = str((REQUEST.parent / request["kernel_source"]).resolve())
    req = tmp_path / "req.json"
    req.write_text(json.dumps(request))
    forced = run_cli(
        "compile", str(req), "--mode", "force", "--cache-dir", str(root), env=clean_env
    )
    assert forced.returncode != 0 and "Traceback" not in forced.stderr
    assert sorted(p.name for p in victim.iterdir()) == ["notes.txt"]


def test_a_fifo_binary_does_not_hang(clean_env: dict[str, str], tmp_path: Path) -> None:
    root, chip = _cache(tmp_path)
    os.mkfifo(chip / "te_fifo_1.o")
    (chip / "te_fifo_1.json").write_text(
        json.dumps(
            {"binFileName": "te_fifo_1", "binFileSuffix": ".o", "kernelName": "k", "sha256": "00"}
        )
    )
    proc = run_cli("verify", "--json", "--cache-dir", str(root), env=clean_env, timeout=60)
    assert proc.returncode == 1
    kinds = {
        p["kind"]
        for f in json.loads(proc.stdout)["chip_folders"][SOC]["findings"]
        for p in f["problems"]
    }
    assert "not_a_file" in kinds
    gc = run_cli(
        "gc", "--ratio", "0", "--min-age", "0", "--cache-dir", str(root), env=clean_env, timeout=60
    )
    assert "Traceback" not in gc.stderr


def test_deep_json_and_nul_suffix_are_bad_entries_not_crashes(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    root, chip = _cache(tmp_path)
    (chip / "te_deep_1.json").write_text("[" * 100000 + "]" * 100000)
    (chip / "te_nul_1.json").write_text(
        json.dumps(
            {
                "binFileName": "te_nul_1",
                "binFileSuffix": ".o\u0000x",
                "kernelName": "k",
                "sha256": "00",
            }
        )
    )
    publish(chip, "te_good_3", b"still here")
    for cmd in (["ls"], ["verify"], ["gc", "--ratio", "0", "--min-age", "0"]):
        proc = run_cli(*cmd, "--cache-dir", str(root), env=clean_env)
        assert proc.returncode in (0, 1), (cmd, proc.stderr)
        assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_long_blank_ini_line_is_linear(clean_env: dict[str, str], tmp_path: Path) -> None:
    root, _chip = _cache(tmp_path)
    (root / "kernel_cache" / "op_cache.ini").write_text(
        "[op_compiler_cache]\nmax_op_cache_size=100\nremain_cache_size_ratio=50\n"
        "adk_version=1\nops_version=1\n" + " " * 200_000 + "x\n"
    )
    proc = run_cli("config", "--cache-dir", str(root), env=clean_env, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_bad_config_and_debug_config_files(clean_env: dict[str, str], tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.toml"
    garbage.write_bytes(bytes(range(128, 256)))
    proc = run_cli("config", "--config", str(garbage), env=clean_env)
    assert proc.returncode == 2 and "not UTF-8" in proc.stderr and "internal" not in proc.stderr
    out = run_cli(
        "compile",
        str(REQUEST),
        "--op-debug-config",
        "/dev/zero",
        "--cache-dir",
        str(tmp_path / "c"),
        env=clean_env,
        timeout=60,
    )
    assert out.returncode == 2 and "/dev/zero" in out.stderr, out.stderr
    newline = run_cli("config", "--cache-dir", str(tmp_path / "nl\n"), env=clean_env)
    assert newline.returncode == 2


def test_chunked_bodies_are_refused(tmp_path: Path) -> None:
    from tests.daemon_util import start_daemon

    d = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "c"))
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(str(d.socket_path))
        body = b'{"dry_run": true, "ratio": 0}'
        s.sendall(
            b"POST /gc HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + f"{len(body):x}\r\n".encode()
            + body
            + b"\r\n0\r\n\r\n"
        )
        reply = s.recv(4096)
        s.close()
        assert reply.split(b" ")[1] == b"411", reply[:100]
    finally:
        d.stop()


def test_repair_goes_on_past_a_file_it_may_not_remove(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    import shutil
    import subprocess

    root, chip = _cache(tmp_path)
    (chip / "te_imm_1.json").write_text("{broken")
    (chip / "te_zzz_1.json").write_text("{broken too")
    chattr = shutil.which("chattr")
    if (
        chattr is None
        or subprocess.run(
            [chattr, "+i", str(chip / "te_imm_1.json")], capture_output=True
        ).returncode
        != 0
    ):
        import pytest

        pytest.skip("chattr +i is not available on this filesystem")
    try:
        proc = run_cli("verify", "--repair", "--cache-dir", str(root), env=clean_env)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "not_removed" in proc.stdout and "Traceback" not in proc.stderr
        assert not (chip / "te_zzz_1.json").exists()  # the run went on
    finally:
        subprocess.run([chattr, "-i", str(chip / "te_imm_1.json")], check=False)
