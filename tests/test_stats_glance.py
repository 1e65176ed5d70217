"""``cachemgr stats`` at a glance, like ``ccache -s`` (docs/commands.md#what-stats-counts):
a real cache with local and remote hits, misses, a precompiled answer and evictions — the
default report is short, splits the hits, hides zero counters and shows sizes in KiB/MiB;
``-v`` shows every counter; ``--json`` keeps its keys and raw values."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.compile_util import SOC, counting_cc, request_data
from tests.conftest import run_cli
from tests.daemon_util import wait_for
from tests.remote_util import RedisServer, keys_toml

#: ``stats --json``'s keys before the hits were split: every counter, the chip folders and
#: the CLI's additions (a local run adds no daemon figures).
KNOWN_JSON_KEYS = {
    "hits", "misses", "compiles", "coalesced", "binaries", "debug_compiles", "failures",
    "uncached", "evicted_entries", "evicted_bytes", "no_space", "chip_folders", "via", "route",
    "other_kernel_caches", "kernel_cache_dir", "limits",
}  # fmt: skip
_DYNAMIC = {
    "inputs": [
        {"shape": [-1], "dtype": "float32", "format": "ND"},
        {"shape": [1], "dtype": "float32", "format": "ND"},
    ],
    "outputs": [{"shape": [-1], "dtype": "float32", "format": "ND"}],
    "options": {"jit_compile": "false"},
}


def _write(path: Path, data: dict[str, object]) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def _ok(*args: str, env: dict[str, str]) -> str:
    proc = run_cli(*args, env=env)
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return proc.stdout


def _package(tmp_path: Path, cfg: Path, env: dict[str, str]) -> tuple[Path, str]:
    """A precompiled package holding a dynamic Add compiled in a scratch cache."""
    req = _write(tmp_path / "dyn.json", request_data(defines={"N": 2402, "B_N": 1}, **_DYNAMIC))
    scratch = str(tmp_path / "scratch")
    _ok("compile", "--config", str(cfg), "--cache-dir", scratch, req, env=env)
    pkg = tmp_path / "pkg"
    _ok("pack", "--all", "--out", str(pkg), "--cache-dir", scratch, env=env)
    return pkg, req


def test_stats_at_a_glance_and_in_full(
    redis_server: RedisServer, tmp_path: Path, clean_env: dict[str, str]
) -> None:
    cc = counting_cc(tmp_path / "cc")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[compilers]\ncc = "{cc}"\n[remote]\n' + keys_toml(tmp_path))
    remote = ("--remote", redis_server.url + "|name=r")
    shared = _write(tmp_path / "shared.json", request_data(defines={"N": 2401, "B_N": 1}))
    mine = _write(tmp_path / "mine.json", request_data(defines={"N": 2403, "B_N": 1}))
    pkg, dyn = _package(tmp_path, cfg, clean_env)
    site_a, root = str(tmp_path / "a"), tmp_path / "b"
    base = ("--config", str(cfg), "--cache-dir", str(root))
    _ok("compile", "--config", str(cfg), "--cache-dir", site_a, *remote, shared, env=clean_env)
    wait_for(lambda: redis_server.client().dbsize() > 0, 30, "site a's upload")
    _ok("compile", *base, *remote, shared, env=clean_env)  # a remote hit
    _ok("compile", *base, shared, env=clean_env)  # a local hit
    _ok("compile", *base, mine, env=clean_env)  # a miss, compiled
    _ok("compile", *base, "--binaries", str(pkg), dyn, env=clean_env)  # precompiled
    # evict everything, then compile again: the chip folder has a fill to show
    _ok("gc", *base, "--local", "--ratio", "0", "--min-age", "0", env=clean_env)
    _ok("compile", *base, mine, env=clean_env)

    glance = _ok("stats", *base, env=clean_env).splitlines()
    full = _ok("stats", "-v", *base, env=clean_env).splitlines()
    data = json.loads(_ok("stats", "--json", *base, env=clean_env))

    assert len(glance) <= 10, glance
    text = "\n".join(glance)
    assert f"Kernel cache:  {root / 'kernel_cache'} (via local)" in glance, text
    assert "Hits:          2 / 5 (40.00 %): 1 local, 1 remote" in glance, text
    assert "Misses:        3 / 5 (60.00 %): 1 answered by a precompiled binary" in glance, text
    assert "Compiles:      2" in glance, text
    evicted = next(ln for ln in glance if ln.startswith("Evicted:"))
    assert re.fullmatch(r"Evicted: +2 entries, \d+\.\d KiB", evicted), evicted
    chip = next(ln for ln in glance if ln.startswith(f"{SOC}:"))
    assert re.search(r"1 entry, [\d.]+ KiB of 500\.0 MiB \(0\.0 % full\) \[-{10}\]", chip), chip
    assert not re.search(r"(?<![\d./])0(?![\d.%])", text.replace(str(tmp_path), "")), text
    assert "Chosen because" not in text and "oldest access" not in text, text

    labels = {ln.split(":", 1)[0] for ln in full}
    for label in ("Chosen because", "Binaries", "Coalesced", "Debug compiles", "Failures",
                  "No space", "Uncached", "Hits from remote", "Evicted entries"):  # fmt: skip
        assert label in labels, full
    assert "Failures:          0" in full and "Binaries:          1" in full, full
    assert re.search(r"Evicted bytes: +\d+\.\d KiB$", "\n".join(full), re.M), full
    assert "oldest access" in next(ln for ln in full if ln.startswith(f"{SOC}:"))

    assert set(data) >= KNOWN_JSON_KEYS, sorted(set(data))
    assert (data["hits"], data["misses"], data["compiles"], data["binaries"]) == (2, 3, 2, 1)
    assert data["hits_from_remote"] == 1 and data["evicted_entries"] == 2
    assert isinstance(data["evicted_bytes"], int) and data["evicted_bytes"] > 1024
    assert data["chip_folders"][SOC]["entries"] == 1


def test_a_precompiled_answer_on_a_fresh_cache_is_counted(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """A compile answered by a precompiled binary makes no chip folder; on a cache that did
    not exist its count was lost (``Binaries: 0``) with a warning that the counters could
    not be saved. The counters' folder is made: ``binaries`` is 1, no warning."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    pkg, dyn = _package(tmp_path, cfg, clean_env)
    root = tmp_path / "fresh"
    proc = run_cli("compile", "--cache-dir", str(root), "--binaries", str(pkg), dyn, env=clean_env)
    assert proc.returncode == 0 and proc.stdout.startswith("binary "), proc.stdout + proc.stderr
    assert "counters" not in proc.stderr, proc.stderr
    assert not (root / "kernel_cache" / SOC).exists()  # still no chip folder
    data = json.loads(_ok("stats", "--json", "--cache-dir", str(root), env=clean_env))
    assert (data["binaries"], data["misses"], data["hits"]) == (1, 1, 0), data
    glance = _ok("stats", "--cache-dir", str(root), env=clean_env)
    assert "1 answered by a precompiled binary" in glance, glance


def test_a_damaged_counters_file_is_one_warning(tmp_path: Path, clean_env: dict[str, str]) -> None:
    """A member may leave anything under a counters file's name (here: not json); ``stats``
    ignores it with one warning line (it read every file twice, so said it twice), and
    counts the other chip folder's file."""
    kcache = tmp_path / "root" / "kernel_cache"
    (kcache / SOC).mkdir(parents=True)
    (kcache / "Ascend310P3").mkdir()
    (kcache / f"cachemgr_stats_{SOC}.json").write_text("not json")
    (kcache / "cachemgr_stats_Ascend310P3.json").write_text('{"hits": 3, "misses": 1}')
    for args in ((), ("--json",)):
        proc = run_cli("stats", "--cache-dir", str(kcache.parent), *args, env=clean_env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.count("counters file") == 1, proc.stderr
        assert "3" in proc.stdout, proc.stdout
