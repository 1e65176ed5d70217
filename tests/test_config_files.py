"""config/cachemgr.toml documents every setting, and its documented values are accepted."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from cachemgr.compilers import sandbox
from cachemgr.config import options
from cachemgr.config.ini import OpCacheIni
from cachemgr.daemon.config import DaemonConfig
from tests.conftest import ROOT

TOML = ROOT / "config" / "cachemgr.toml"


def _uncommented(tmp_path: Path) -> Path:
    lines = []
    for line in TOML.read_text().splitlines():
        m = re.match(r"^# ([a-z_]+ = .*?)(\s+#.*)?$", line)
        lines.append(m.group(1) if m else line)
    text = "\n".join(lines).replace('"/var/cache/ascend"', f'"{tmp_path}/cache"')
    out = tmp_path / "all.toml"
    out.write_text(text + "\n")
    return out


def test_every_setting_is_documented() -> None:
    text = TOML.read_text()
    for spec in options.OPTIONS:
        assert f"# {spec.name} = " in text, spec.name
    for field in dataclasses.fields(DaemonConfig):
        assert f"# {field.name} = " in text, field.name


def test_documented_values_are_accepted(clean_env: dict[str, str], tmp_path: Path) -> None:
    settings = options.resolve(env=clean_env, config_file=_uncommented(tmp_path))
    assert settings.value("kernel_cache_dir") == tmp_path / "cache" / "kernel_cache"
    assert settings.value("host_id") == "node01"
    cfg = DaemonConfig.from_table(settings.sections["daemon"])
    assert cfg.reconcile_interval_s == 300.0 and cfg.workers == 0
    assert settings.sections["compilers"]["cuda_arch"] == "sm_90"
    assert settings.sections["toolkit"]["adk_version"] == "7.0.0"
    box = sandbox.from_table(settings.sections["sandbox"], [])
    assert box.limits == sandbox.Limits(16384, 1200, 1024)


def test_example_op_cache_ini_is_valid() -> None:
    """The example carries the limits but no toolkit stamps: stale stamps would purge a cache
    or be ignored; ``cachemgr limits set`` writes the installed toolkit's."""
    ini = OpCacheIni.load(ROOT / "config" / "op_cache.ini")
    assert (ini.max_op_cache_size, ini.remain_cache_size_ratio) == (500, 50)
    assert ini.adk_version is None and ini.ops_version is None
    assert all("version stamp" in problem for problem in ini.problems), ini.problems
    assert "cachemgr limits set" in (ROOT / "config" / "op_cache.ini").read_text()


def test_config_shows_what_lock_wait_0_means(tmp_path: Path, clean_env) -> None:
    """``lock_wait_s = 0`` is "automatic" (docs/shared-cache.md: twice the compile timeout plus
    a minute):
    ``config`` says so and how many seconds; ``--json`` keeps the value and adds
    ``effective``; a set value is shown as it is."""
    import json

    from cachemgr.compile.queue import DEFAULT_TIMEOUT_S
    from tests.conftest import run_cli

    cache = str(tmp_path / "cache")
    want = 2 * DEFAULT_TIMEOUT_S + 60
    text = run_cli("config", "--cache-dir", cache, cwd=tmp_path)
    line = next(ln for ln in text.stdout.splitlines() if "daemon.lock_wait_s" in ln)
    assert line == (
        f"(default) daemon.lock_wait_s = 0.0 (automatic: 2 × compile timeout "
        f"{DEFAULT_TIMEOUT_S:g} s + 60 s = {want:g} s)"
    )
    row = json.loads(run_cli("config", "--cache-dir", cache, "--json", cwd=tmp_path).stdout)[
        "daemon.lock_wait_s"
    ]
    assert row["value"] == 0.0 and row["effective"] == want
    conf = tmp_path / "c.toml"
    conf.write_text("[daemon]\nlock_wait_s = 7.5\n")
    set_ = run_cli("config", "--cache-dir", cache, "--config", str(conf), cwd=tmp_path)
    line = next(ln for ln in set_.stdout.splitlines() if "daemon.lock_wait_s" in ln)
    assert line.endswith("daemon.lock_wait_s = 7.5") and "automatic" not in line
