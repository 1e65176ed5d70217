"""Every table of the config file has a schema: bad configs fail ``config``,
``serve`` and a reload alike, with one line naming file, line, key, value and what is
accepted; ``config`` shows every setting of every table; "never evict" reads the same
everywhere."""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path

import pytest

from cachemgr.config import configfile, options
from cachemgr.errors import ConfigError
from tests.conftest import run_cli
from tests.daemon_util import AS_ROOT, daemon_env, start_daemon, wait_for

#: (config text, line of the fault, words the one-line error must contain)
BAD = [
    ("[deamon]\nworkers = 1\n", 2, ["[deamon]", "accepted: [daemon]"]),
    ('[compiler]\ncc = "gcc"\n', 2, ["[compiler]", "[compilers]"]),
    ('[compilers]\nccc = "x"\n', 3, ["'ccc'", "accepted: cc, nvcc"]),
    ('[precompiled]\npaths = "/opt/kernels"\n', 3, ["paths = '/opt/kernels'", "list of paths"]),
    ('[toolkit]\nadk_versoin = "7.0.0"\n', 3, ["'adk_versoin'", "adk_version"]),
    ("[daemon]\nworkers = -3\n", 3, ["workers = -3", "an integer ≥ 0"]),
    ('[daemon]\ntcp_port = "8080"\n', 3, ["tcp_port = '8080'", "an integer 0..65535"]),
    ("[daemon]\ntcp_port = 70000\n", 3, ["tcp_port = 70000", "0..65535"]),
    ("[daemon]\nreap_interval_s = true\n", 3, ["reap_interval_s = True", "a number"]),
    ('[daemon]\nlock_fallback = "maybe"\n', 3, ["'maybe'", "'refuse', 'local'"]),
    ("[sandbox]\nhide = [1]\n", 3, ["hide = [1]", "a list of folders"]),
    ("[sandbox]\ncpu_s = 1.5\n", 3, ["cpu_s = 1.5", "an integer"]),
    ('[compilers]\ncce_flags = { O0 = "-O0" }\n', 3, ["cce_flags", "table of lists"]),
    ("op_debug_level = 9\n", 2, ["op_debug_level = 9", "0..4"]),
    ("op_compiler_cache_dir = 5\n", 2, ["op_compiler_cache_dir = 5", "a string"]),
    ('jit_compiel = "true"\n', 2, ["'jit_compiel'", "jit_compile"]),
]


def _write(tmp_path: Path, text: str) -> Path:
    cfg = tmp_path / "c.toml"
    cfg.write_text("# cachemgr\n" + text)
    return cfg


@pytest.mark.parametrize(("text", "line", "words"), BAD)
def test_bad_config_is_one_line_naming_file_line_key_value(
    tmp_path: Path, text: str, line: int, words: list[str]
) -> None:
    cfg = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        options.resolve(env=daemon_env(tmp_path), config_file=cfg)
    message = str(err.value)
    assert f"{cfg}:{line}:" in message and "\n" not in message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    ("text", "line"), [("[daemon]\nworkers = -3\n", 3), ("[deamon]\nworkers = 1\n", 2)]
)
def test_config_and_serve_fail_alike(tmp_path: Path, text: str, line: int) -> None:
    """``workers = -3`` (and a mistyped table) fails ``config`` exactly as it fails ``serve``."""
    cfg = _write(tmp_path, text)
    env = daemon_env(tmp_path)
    shown = run_cli("config", "--config", str(cfg), env=env)
    served = run_cli("serve", *AS_ROOT, "--config", str(cfg), env=env, timeout=60)
    assert shown.returncode == served.returncode == 2
    assert "Traceback" not in shown.stderr + served.stderr
    error = [ln for ln in shown.stderr.splitlines() if "error" in ln]
    assert len(error) == 1 and f"{cfg}:{line}:" in error[0]
    assert error[0] in served.stderr.splitlines()
    assert shown.stdout == ""


def test_config_shows_every_setting_of_every_table(tmp_path: Path) -> None:
    cfg = _write(tmp_path, '[daemon]\nworkers = 2\n\n[precompiled]\npaths = ["/opt/k"]\n')
    env = daemon_env(tmp_path)
    done = run_cli("config", "--json", "--config", str(cfg), env=env)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    for name, cls in configfile.TABLES.items():
        for f in dataclasses.fields(cls):
            assert f"{name}.{f.name}" in data, f"{name}.{f.name}"
    for spec in options.OPTIONS:
        assert spec.name in data
    assert data["daemon.workers"] == {
        "value": 2,
        "origin": "option",
        "source": f"config {cfg}:3",
    }
    assert data["precompiled.paths"]["value"] == ["/opt/k"]
    assert data["precompiled.paths"]["source"] == f"config {cfg}:6"
    assert data["sandbox.cpu_s"] == {"value": 1200, "origin": "default", "source": ""}
    text = run_cli("config", "--config", str(cfg), env=env)
    assert "(option: config " in text.stdout and "daemon.workers = 2" in text.stdout
    assert "(default) sandbox.namespaces = auto" in text.stdout
    assert f'(option: config {cfg}:6) precompiled.paths = ["/opt/k"]' in text.stdout


def test_the_example_config_passes_the_schema_whole(clean_env: dict[str, str]) -> None:
    """Every key documented in config/cachemgr.toml is a key of the schema."""
    from tests.test_config_files import TOML

    known = {(n, f.name) for n, c in configfile.TABLES.items() for f in dataclasses.fields(c)}
    known |= {("", spec.name) for spec in options.OPTIONS}
    table = ""
    for line in TOML.read_text().splitlines():
        if line.startswith("["):
            table = line.strip("[]")
        elif line.startswith("# ") and " = " in line and line[2].islower():
            key = line[2:].split(" = ")[0]
            if key.isidentifier():
                assert (table, key) in known, (table, key)


def test_reload_with_errors_keeps_the_old_config_and_says_why(
    tmp_path: Path, cache_root: Path
) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'op_compiler_cache_dir = "{cache_root}"\njit_compile = "false"\n')
    d = start_daemon(tmp_path, "--config", str(cfg))
    try:
        assert d.client.config()["jit_compile"]["value"] == "false"
        cfg.write_text(
            f'op_compiler_cache_dir = "{cache_root}"\njit_compile = "true"\n[deamon]\nworkers = 1\n'
        )
        d.signal(signal.SIGHUP)
        wait_for(lambda: "reload refused" in d.log(), 30, "the refused reload in the log")
        refused = [ln for ln in d.log().splitlines() if "reload refused" in ln]
        assert f"{cfg}:3: unknown table [deamon]" in refused[0]
        assert d.client.config()["jit_compile"]["value"] == "false"  # old config kept
        assert "configuration reloaded" not in d.log()
    finally:
        assert d.stop() == 0


@pytest.fixture
def cache_root(tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    root.mkdir()
    return root


def test_never_evict_reads_the_same_everywhere(tmp_path: Path, cache_root: Path) -> None:
    """``max_op_cache_size = -1``: ``never_evict`` true and the byte limit null in ``stats``,
    ``gc`` and ``config``-side JSON; ``cachemgr_never_evict 1`` and no byte limit in
    ``/metrics`` (one value, :class:`options.CacheLimits`)."""
    kc = cache_root / "kernel_cache"
    (kc / "Ascend910B1").mkdir(parents=True)
    (kc / "op_cache.ini").write_text(
        "[op_compiler_cache]\nmax_op_cache_size=-1\nremain_cache_size_ratio=50\n"
        "adk_version=1\nops_version=1\n"
    )
    env = daemon_env(tmp_path)
    local = ["--local", "--cache-dir", str(cache_root), "--json"]
    stats = json.loads(run_cli("stats", *local, env=env).stdout)
    gc = json.loads(run_cli("gc", *local, env=env).stdout)
    for data in (stats, gc):
        assert data["limits"]["never_evict"] is True and data["limits"]["max_bytes"] is None
    assert stats["chip_folders"]["Ascend910B1"]["never_evict"] is True
    assert stats["chip_folders"]["Ascend910B1"]["limit_bytes"] is None
    d = start_daemon(tmp_path, "--cache-dir", str(cache_root), env=env)
    try:
        metrics = d.client.request("GET", "/metrics")
        assert "\ncachemgr_never_evict 1.0" in metrics
        assert "cachemgr_chip_limit_bytes" not in metrics
        via = json.loads(
            run_cli("stats", "--socket", str(d.socket_path), *local[1:], env=env).stdout
        )
        assert via["limits"]["never_evict"] is True
    finally:
        assert d.stop() == 0
    limits = options.resolve(env=env, cli={"op_compiler_cache_dir": str(cache_root)}).limits
    assert (limits.never_evict, limits.max_bytes, limits.target_bytes) == (True, None, None)


def test_one_model_for_the_daemon_table() -> None:
    """The daemon reads the schema's model, not a second copy of its keys."""
    from cachemgr.daemon import config

    assert config.DaemonConfig is configfile.DaemonConfig
    assert configfile.TABLES["daemon"] is configfile.DaemonConfig
