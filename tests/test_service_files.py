"""The systemd unit and the OpenAPI description shipped in the repo are valid."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    unit = (ROOT / "systemd" / "cachemgr.service").read_text()
    for needle in (
        "Type=notify",
        "WatchdogSec=",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ReadWritePaths=",
        "PrivateTmp=yes",
        "RuntimeDirectory=cachemgr",
        "StateDirectory=cachemgr",
    ):
        assert needle in unit, needle
    exe = shutil.which("cachemgr") or str(Path(sys.executable).parent / "cachemgr")
    local = tmp_path / "cachemgr.service"
    local.write_text(unit.replace("/usr/local/bin/cachemgr", exe))
    proc = subprocess.run(
        [analyze, "verify", str(local)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_openapi_is_valid_and_matches_routes() -> None:
    validator = pytest.importorskip("openapi_spec_validator")
    spec = json.loads((ROOT / "docs" / "openapi.json").read_text())
    validator.validate(spec)
    documented = set(spec["paths"])
    assert documented == {
        "/health",
        "/metrics",
        "/config",
        "/stats",
        "/gc",
        "/lookup",
        "/compile",
        "/compile/if-config",
        "/jobs/{job_id}",
        "/reload",
        "/hits",
        "/stats/zero",
        "/stop",
    }
