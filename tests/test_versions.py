"""Toolkit upgrades (docs/design.md#size-limits-and-eviction): version.info read GE's way; every
chip folder purged on a change."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachemgr.config import layout
from cachemgr.config.ini import OpCacheIni
from cachemgr.config.toolkit import read_version_info
from cachemgr.config.versions import (
    Found,
    Installed,
    VersionStatus,
    installed_versions,
    sync_toolkit,
)
from cachemgr.errors import ConfigError
from cachemgr.eviction import purge_chip
from tests.test_eviction import kernels, make_entry

CHIPS = ("Ascend310P3", "Ascend910B1")
INI_TEXT = (
    "# written by GE, then by hand\n"
    "[op_compiler_cache]\n"
    "adk_version=7.0.RC1\n"
    "ops_version=7.0.RC1\n"
    "max_op_cache_size=500\n"
    "remain_cache_size_ratio=80\n"
    "\n"
    "[other]\n"  # sorts after [op_compiler_cache]: GE still uses the ini (std::map order)
    "note = keep me\n"
)


def version_info(folder: Path, version: str, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "version.info"
    path.write_text(f"# CANN\n{extra}Version={version}\nversion_dir=8.0.0\ntimestamp=1\n")
    return path


def toolkit_env(tmp_path: Path, adk: str, ops: str) -> dict[str, str]:
    home = tmp_path / "Ascend" / "latest"
    version_info(home / "compiler", adk)
    version_info(home / "opp", ops)
    return {"ASCEND_HOME_PATH": str(home), "ASCEND_OPP_PATH": str(home / "opp")}


@pytest.fixture
def cache(tmp_path: Path) -> layout.CacheLayout:
    """A kernel cache with two chip folders of 3 entries each and a stamped ini."""
    kc = tmp_path / "cache" / "kernel_cache"
    for chip in CHIPS:
        for i in range(3):
            make_entry(kc / chip, f"te_{chip}_{i}", 4096, 1_000_000_000 + i)
    (kc / "op_cache.ini").write_text(INI_TEXT)
    return layout.CacheLayout(kc)


def test_read_version_info_the_way_ge_does(tmp_path: Path) -> None:
    path = tmp_path / "version.info"
    path.write_text("#Version=0.0\n\nversion_dir=8.0.0\n  Version =  7.6.0.1.220  \nVersion=9\n")
    assert read_version_info(str(path)) == "7.6.0.1.220"  # first exact key, blanks trimmed
    path.write_text("version=8.0.RC1\nversion_dir=8.0.0\n")
    assert read_version_info(str(path)) is None  # keys are case-sensitive, as in GE
    assert read_version_info(str(tmp_path / "missing")) is None
    assert read_version_info(str(tmp_path)) is None  # a folder is not a version file


def test_installed_versions_from_env_and_config(tmp_path: Path) -> None:
    env = toolkit_env(tmp_path, "7.0.RC1", "7.0.RC2")
    found = installed_versions(env)
    assert (found.adk.value, found.ops.value) == ("7.0.RC1", "7.0.RC2")
    assert found.adk.source.endswith("compiler/version.info")
    # ASCEND_TOOLKIT_HOME is the fallback, and the plain version.info under it too
    other = tmp_path / "toolkit"
    version_info(other, "8.0.0")
    found = installed_versions({"ASCEND_TOOLKIT_HOME": str(other), **{"ASCEND_OPP_PATH": ""}})
    assert found.adk.value == "8.0.0" and found.ops.value is None and not found.complete
    sections = {"toolkit": {"adk_version": "X1", "ops_version": "Y1"}}
    found = installed_versions(env, sections)
    assert (found.adk.value, found.ops.value) == ("X1", "Y1")
    assert found.adk.source == "config [toolkit] adk_version"
    with pytest.raises(ConfigError, match=r"\[toolkit\] ops_version=3"):
        installed_versions(env, {"toolkit": {"ops_version": 3}})


def test_upgrade_purges_every_chip_folder_and_restamps(
    cache: layout.CacheLayout, tmp_path: Path
) -> None:
    installed = installed_versions(toolkit_env(tmp_path, "8.0.RC1", "8.0.RC1"))
    check = sync_toolkit(cache, installed, purge_chip)
    assert check.status is VersionStatus.UPGRADED and check.restamped
    assert len(check.purged) == 2
    for chip in CHIPS:
        assert kernels(cache.kernel_cache_dir / chip) == set()
    text = (cache.ini_path).read_text()
    assert text == INI_TEXT.replace("7.0.RC1", "8.0.RC1")  # only the stamps changed
    again = sync_toolkit(cache, installed, purge_chip)
    assert again.status is VersionStatus.MATCH and not again.purged


def test_matching_stamps_leave_the_cache_alone(cache: layout.CacheLayout, tmp_path: Path) -> None:
    installed = installed_versions(toolkit_env(tmp_path, "7.0.RC1", "7.0.RC1"))
    check = sync_toolkit(cache, installed, purge_chip)
    assert check.status is VersionStatus.MATCH and not check.restamped
    assert all(len(kernels(cache.kernel_cache_dir / c)) == 3 for c in CHIPS)


def test_no_toolkit_leaves_the_cache_alone_and_says_so(cache: layout.CacheLayout) -> None:
    check = sync_toolkit(cache, installed_versions({}), purge_chip)
    assert check.status is VersionStatus.NO_TOOLKIT
    assert "no toolkit-upgrade purge" in check.detail and "ASCEND_HOME_PATH" in check.detail
    assert "left alone" not in check.detail  # read as "gc did nothing"
    assert all(len(kernels(cache.kernel_cache_dir / c)) == 3 for c in CHIPS)
    assert cache.ini_path.read_text() == INI_TEXT


def test_missing_ini_is_purged_and_created(cache: layout.CacheLayout) -> None:
    cache.ini_path.unlink()  # GE itself purges when the ini is missing
    installed = Installed(Found("7.0.RC1", "test"), Found("7.0.RC2", "test"))
    check = sync_toolkit(cache, installed, purge_chip, dry_run=True)
    assert check.status is VersionStatus.NO_INI and "would purge 2" in check.detail
    assert all(len(kernels(cache.kernel_cache_dir / c)) == 3 for c in CHIPS)
    check = sync_toolkit(cache, installed, purge_chip)
    assert check.restamped and all(not kernels(cache.kernel_cache_dir / c) for c in CHIPS)
    assert check.purged_entries == 6 and "reason: no_ini" in check.detail
    ini = OpCacheIni.load(cache.ini_path)
    assert (ini.adk_version, ini.ops_version) == ("7.0.RC1", "7.0.RC2")
    assert not ini.problems


def test_no_kernel_cache_yet(tmp_path: Path) -> None:
    installed = Installed(Found("1", "t"), Found("2", "t"))
    cache = layout.CacheLayout(tmp_path / "nothing" / "kernel_cache")
    check = sync_toolkit(cache, installed, purge_chip)
    assert check.status is VersionStatus.NO_CACHE and not cache.kernel_cache_dir.exists()
