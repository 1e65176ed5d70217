"""Shared test fixtures: a clean environment, real chip folders, the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from cachemgr.storage import entry
from cachemgr.storage.store import Store
from tests.daemon_util import Daemon, start_daemon
from tests.remote_util import nginx_server, redis_server, webdav_server  # noqa: F401 - fixtures
from tests.xdist_util import gate

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def _private_user_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite's ``$XDG_CACHE_HOME``: a session tmp folder, inherited by every daemon and CLI
    the tests start, so nothing the product remembers per user (compilers' version lines,
    the lock probe, the local fallback cache) lands in the real ``~/.cache/cachemgr``."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


#: Fixtures shared by many test modules: real Unix users (``users``, ``other_runtime``).
pytest_plugins = ["tests.users_util"]


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--soak``: also run the long soak tests; without it they are skipped."""
    parser.addoption(
        "--soak", action="store_true", default=False, help="also run the long soak tests"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``soak`` unless ``--soak`` was given."""
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="soak test: run with --soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Under pytest-xdist, a test marked ``serial`` runs alone: every test takes the
    :func:`tests.xdist_util.gate` around its setup, call and teardown (shared; exclusive for
    ``serial``). Without xdist, one test runs at a time anyway and no lock is taken."""
    with gate(item.config, exclusive=item.get_closest_marker("serial") is not None):
        return (yield)


#: CANN-format fixtures, read in place (never copied into the project).
#: Real entries as CANN GE wrote them (a copy of the project's ``shared/fixtures/cann-ge``,
#: kept in the repository so the cross-checks against GE's own files run in a fresh clone).
FIXTURES = ROOT / "tests" / "data" / "cann-ge"
SOC = "Ascend910B1"


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An environment without ASCEND_*/CACHEMGR_* variables and with HOME in tmp_path."""
    for key in list(os.environ):
        if key.startswith(("ASCEND_", "CACHEMGR_")) or key == "XDG_CACHE_HOME":
            monkeypatch.delenv(key)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    return dict(os.environ)


@pytest.fixture
def cache_root(tmp_path: Path) -> Path:
    """The cache root ``<tmp>/cache`` (not made: the daemon or the test makes it)."""
    return tmp_path / "cache"


@pytest.fixture
def daemon(tmp_path: Path, cache_root: Path) -> Iterator[Daemon]:
    """A real ``cachemgr serve`` on ``cache_root`` (ready), stopped after the test."""
    d = start_daemon(tmp_path, "--cache-dir", str(cache_root))
    yield d
    d.stop()


@pytest.fixture
def chip(tmp_path: Path) -> Path:
    """An empty chip folder ``<tmp>/cache/kernel_cache/Ascend910B1``."""
    path = tmp_path / "cache" / "kernel_cache" / SOC
    path.mkdir(parents=True)
    return path


def kernel_json(kernel: str, binary: bytes, **extra: object) -> dict[str, object]:
    """A CANN-shaped main json for a single-binary kernel."""
    return {
        "binFileName": kernel,
        "binFileSuffix": ".o",
        "kernelName": kernel + "__kernel0",
        "sha256": entry.sha256_hex(binary),
        "blockDim": 8,
        "magic": "RT_DEV_BINARY_MAGIC_ELF_AIVEC",
        **extra,
    }


def publish(chip: Path, kernel: str, binary: bytes, atime_s: float | None = None) -> Path:
    """Publish a good single-binary entry; optionally set its access time (seconds)."""
    Store(chip).publish(kernel, {kernel + ".o": binary}, kernel_json(kernel, binary))
    if atime_s is not None:
        for name in (kernel + ".json", kernel + ".o"):
            st = os.stat(chip / name)
            os.utime(chip / name, ns=(int(atime_s * 1e9), st.st_mtime_ns))
    return chip / (kernel + ".json")


def publish_mix(chip: Path, kernel: str, aic: bytes, aiv: bytes) -> None:
    """Publish a good mix entry: main json with jsonList, two sub-jsons, two binaries."""
    files: dict[str, bytes] = {}
    json_list = []
    for kind, data in (("aic", aic), ("aiv", aiv)):
        sub = f"{kernel}_mix_{kind}"
        files[sub + ".o"] = data
        files[sub + ".json"] = json.dumps(kernel_json(sub, data)).encode()
        json_list.append({"binType": kind.upper(), "jsonFileName": sub + ".json"})
    main = {"coreType": "MixAICore", "blockDim": 32, "jsonList": json_list}
    Store(chip).publish(kernel, files, main)


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    input: str | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run the real ``cachemgr`` CLI in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "cachemgr", *args],
        env=env if env is not None else dict(os.environ),
        cwd=cwd,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def fixture_cache() -> Iterator[Path]:
    """The CANN fixture root (contains kernel_cache/Ascend910B1), read in place."""
    if not (FIXTURES / "kernel_cache" / SOC).is_dir():
        pytest.skip(f"CANN fixtures not found at {FIXTURES}")
    yield FIXTURES
