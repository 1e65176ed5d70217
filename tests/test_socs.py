"""Chip names are checked: a ``soc_version`` CANN does not accept never
starts a second chip folder — not from the CLI, not through the daemon — and the error names
the closest real name and the accepted list."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachemgr.client import Client
from cachemgr.config import socs
from cachemgr.errors import CacheMgrError
from tests.compile_util import write_request
from tests.conftest import SOC, publish, run_cli
from tests.daemon_util import start_daemon


@pytest.mark.parametrize(("bad", "near"), [("ascend910b1", "Ascend910B1"), ("Ascend999", None)])
def test_compile_refuses_an_unknown_chip_and_creates_no_folder(
    clean_env: dict[str, str], tmp_path: Path, bad: str, near: str | None
) -> None:
    root = tmp_path / "c"
    req = write_request(tmp_path, soc_version=bad)
    proc = run_cli("compile", str(req), "--local", "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"soc_version={bad!r}" in lines[0] and str(req) in lines[0]
    assert "accepted: " in lines[0] and "Ascend910B1" in lines[0] and "Ascend310P3" in lines[0]
    assert (f"did you mean {near!r}" in lines[0]) == (near is not None)
    kcache = root / "kernel_cache"
    assert not kcache.exists() or [p.name for p in kcache.iterdir() if p.is_dir()] == []
    good = run_cli(
        "compile", str(write_request(tmp_path, "ok", soc_version=SOC)), "--local",
        "--cache-dir", str(root), env=clean_env,
    )  # fmt: skip
    assert good.returncode == 0, good.stderr
    assert sorted(p.name for p in kcache.iterdir() if p.is_dir()) == [SOC]


def test_the_daemon_refuses_an_unknown_chip(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    d = start_daemon(tmp_path, "--cache-dir", str(root))
    try:
        data = json.loads(write_request(tmp_path, soc_version="ascend910b1").read_text())
        data["kernel_source"] = str((tmp_path / data["kernel_source"]).resolve())
        with pytest.raises(CacheMgrError) as info:
            Client(d.socket_path, local_hits=False).compile(data, base_dir=tmp_path)
        assert info.value.exit_code == 2 and "Ascend910B1" in str(info.value)
        assert not (root / "kernel_cache" / "ascend910b1").exists()
    finally:
        d.stop()


def test_soc_option_is_checked_but_an_existing_chip_folder_is_governed(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "c"
    proc = run_cli("ls", "--soc", "Ascend999", "--cache-dir", str(root), env=clean_env)
    assert proc.returncode == 2 and "soc_version='Ascend999' (from option --soc)" in proc.stderr
    newer = root / "kernel_cache" / "Ascend950PR_9599"  # written by a newer CANN
    newer.mkdir(parents=True)
    publish(newer, "te_add_1", b"kernel")
    ok = run_cli("ls", "--json", "--soc", newer.name, "--cache-dir", str(root), env=clean_env)
    assert ok.returncode == 0, ok.stderr
    assert [row["kernel"] for row in json.loads(ok.stdout)] == ["te_add_1"]


def test_every_name_of_the_table_passes_and_case_matters() -> None:
    for name in socs.KNOWN_SOC_VERSIONS:
        assert socs.check_soc_version(name, "test") == name
    with pytest.raises(CacheMgrError, match="did you mean 'Ascend310P3'"):
        socs.check_soc_version("ASCEND310P3", "test")
