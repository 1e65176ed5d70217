"""Which kernel cache folder, and why, in one line (docs/design.md#where-the-cache-lives;
``options.kernel_cache_why``).

GE builds ``<op_compiler_cache_dir or ASCEND_CACHE_PATH or $HOME/atc_data>/kernel_cache``
for every source (``cache/te_cache_manager.cc``, ``TeCacheManager::SetCacheDirPath``);
docs/design.md#where-the-cache-lives (the seed) gives ``ASCEND_CACHE_PATH`` a per-host
``kernel_cache_<host id>``. A fresh user saw
``kernel_cache_<host>`` for one source and ``kernel_cache`` for the other with no word why:
``config``, ``ls`` and ``stats`` now say which folder was chosen, from which source, and
where GE's own folder is when it differs. ``ls`` (entries) and ``stats`` (every file, as GE
counts toward the limit) differed without a label: ``ls`` now names both figures. Real users
(root only), real CLI processes, a real daemon.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.conftest import SOC, publish
from tests.test_daemon_resources import _user_daemon
from tests.users_util import Runtime, Users, run_python_as


def _as_bob(
    users: Users, rt: Runtime, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    proc = run_python_as(
        users, rt, users.bob, "-m", "cachemgr", *args,
        env={"CACHEMGR_DAEMON_USER": users.alice, **(env or {})},
    )  # fmt: skip
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return proc


def _shared(users: Users, name: str) -> Path:
    root = users.base / name
    root.mkdir()
    shutil.chown(root, users.alice, users.group)
    root.chmod(0o2775)
    return root


def test_config_ls_stats_say_which_kernel_cache_and_why(
    users: Users, other_runtime: Runtime
) -> None:
    acp = _shared(users, "acp")
    env = {"ASCEND_CACHE_PATH": str(acp)}
    host = "hostA"
    chosen = acp / f"kernel_cache_{host}"
    why_env = (
        f"kernel cache {chosen}: ASCEND_CACHE_PATH={acp} gives kernel_cache_<host id>, "
        f"host_id '{host}' (from option: --host-id)"
    )
    ge_folder = f"GE itself uses {acp / 'kernel_cache'}"
    config = _as_bob(users, other_runtime, "config", "--host-id", host, env=env)
    first = config.stdout.splitlines()[0]
    assert first.startswith(why_env) and ge_folder in first, first
    data = json.loads(
        _as_bob(users, other_runtime, "config", "--json", "--host-id", host, env=env).stdout
    )
    assert "kernel_cache_<host id>" in data["kernel_cache_dir"]["why"]
    ls = _as_bob(users, other_runtime, "ls", "--host-id", host, env=env)
    assert why_env in ls.stderr and ge_folder in ls.stderr, ls.stderr
    stats = _as_bob(users, other_runtime, "stats", "-v", "--local", "--host-id", host, env=env)
    assert "Chosen because:" in stats.stdout and ge_folder in stats.stdout, stats.stdout

    # --cache-dir: <dir>/kernel_cache, GE's folder for that option
    root = _shared(users, "shared")  # the cache _user_daemon serves
    why_opt = (
        f"kernel cache {root / 'kernel_cache'}: op_compiler_cache_dir={root} (from option "
        "--cache-dir) gives <dir>/kernel_cache — the folder GE uses for that option"
    )
    config = _as_bob(users, other_runtime, "config", "--cache-dir", str(root), env=env)
    # ASCEND_CACHE_PATH is set too: the option won, and config says what lost
    lost = f"; passed over: ASCEND_CACHE_PATH={acp} (--cache-dir comes first)"
    assert config.stdout.splitlines()[0] == why_opt + lost, config.stdout

    # ls and stats totals: a chip folder with one entry and bytes that are no entry
    chip = root / "kernel_cache" / SOC
    chip.mkdir(parents=True)
    publish(chip, "te_add_1", b"k" * 1000)
    (chip / "stray.bin").write_bytes(b"s" * 500)  # not an entry: counted by stats, as GE does
    for path in [root / "kernel_cache", chip, *chip.iterdir()]:
        shutil.chown(path, users.alice, users.group)
    entry_bytes = (chip / "te_add_1.json").stat().st_size + 1000
    d = _user_daemon(users, other_runtime, users.alice, "")
    try:
        args = ("--cache-dir", str(root), "--socket", str(d.socket_path))
        stats = json.loads(_as_bob(users, other_runtime, "stats", "--json", *args).stdout)
        assert stats["via"] == "daemon"
        used = stats["chip_folders"][SOC]["bytes"]
        assert used == entry_bytes + 500, (used, entry_bytes)
        text = _as_bob(users, other_runtime, "stats", "-v", *args).stdout
        assert "Chosen because:" in text and "op_compiler_cache_dir=" in text, text
    finally:
        d.stop()
    ls = _as_bob(users, other_runtime, "ls", "--bytes", "--cache-dir", str(root))
    total = ls.stderr.strip().splitlines()[-2]
    assert total == (
        f"1 entry, {entry_bytes} B; the chip folders hold {used} B in all files, as `stats` "
        "shows and the limit counts (500 B not in entries: orphans)"
    ), ls.stderr
    assert ls.stderr.strip().splitlines()[-1] == why_opt
