"""Results are typed: one status enum, one result type with
``to_json``/``from_json``, and the effective policy on every compile result — in ``--json``,
in the daemon's log line and in ``GET /jobs/{id}``."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from cachemgr.compile import build
from cachemgr.compile.results import (
    ChipGc,
    ChipStats,
    CompileOutcome,
    GcResult,
    Policy,
    StatsResult,
    Status,
)
from tests.compile_util import SOC, request_data, write_request
from tests.conftest import run_cli
from tests.daemon_util import daemon_env, start_daemon, wait_for


def _compile(tmp_path: Path, req: Path, root: Path, *extra: str) -> dict:
    out = run_cli(
        "compile", str(req), "--local", "--json", "--cache-dir", str(root), *extra,
        env=daemon_env(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[0])


def test_every_local_result_records_the_policy(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    req = write_request(tmp_path / "req", defines={"N": 5151, "B_N": 1})
    first = _compile(tmp_path, req, root)
    assert first["status"] == "compiled"
    assert first["policy"] == {
        "jit_compile": "auto",
        "binary_first": False,
        "cache_mode": "enable",
        "cached": True,
        "why_not_cached": None,
    }
    again = _compile(tmp_path, req, root)
    assert again["status"] == "hit" and again["policy"]["cached"] is True
    off = _compile(tmp_path, req, root, "--mode", "disable", "--out-dir", str(tmp_path / "o"))
    assert off["status"] == "compiled"
    assert off["policy"]["cache_mode"] == "disable" and off["policy"]["cached"] is False
    assert off["policy"]["why_not_cached"] == "op_compiler_cache_mode=disable"
    dbg = _compile(tmp_path, req, root, "--op-debug-level", "1", "--debug-dir", str(tmp_path))
    assert dbg["status"] == "debug" and dbg["policy"]["cached"] is False
    assert dbg["policy"]["why_not_cached"] == "op_debug_level=1 bypasses the cache"
    jit = _compile(tmp_path, req, root, "--jit-compile", "false")
    assert jit["policy"]["jit_compile"] == "false" and jit["policy"]["binary_first"] is True


def test_one_status_enum_and_a_lossless_round_trip() -> None:
    assert build.HIT is Status.HIT and build.FAILED is Status.FAILED
    assert json.dumps(Status.COMPILED) == '"compiled"'
    out = build.CompileOutcome(
        "k",
        Status.COMPILED,
        (Path("/a/k.json"),),
        1.5,
        request="r.json",
        cached=False,
        warning="w",
        coalesced=True,
        policy=Policy("auto", False, "enable", False, "w"),
    )
    back = build.CompileOutcome.from_json(json.loads(json.dumps(out.to_json())))
    assert back == out and isinstance(back.status, Status)


def test_daemon_job_and_log_line_carry_the_policy(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    d = start_daemon(tmp_path, "--cache-dir", str(root))
    try:
        client = d.client
        sub = client.compile(request_data(defines={"N": 5252, "B_N": 1}), wait=False)
        done = wait_for(
            lambda: (j := client.job(sub["job_id"]))["state"] in ("done", "failed") and j,
            60,
            "the job to finish",
        )
        assert done["status"] == "compiled", done
        assert done["policy"]["cache_mode"] == "enable" and done["policy"]["cached"] is True
        wait_for(lambda: "(jit auto, cache enable, cached)" in d.log(), 30, "the log line")
    finally:
        assert d.stop() == 0


# --- one type per kind, round-tripped against a real daemon ---------------


def _same_bytes(data: object, back: object) -> None:
    """``back`` serialises to exactly the bytes of ``data`` (the daemon's own encoding)."""
    assert json.dumps(back, default=str) == json.dumps(data, default=str)


def _missing_header_request(folder: Path) -> dict:
    """A request whose source includes a header that does not exist: its dependency listing
    fails (a ``CompileError`` while it is prepared, before any compile)."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "needs.c"
    source.write_text('#include "not_there.h"\nvoid add_kernel(void) {}\n')
    return request_data(kernel_source=str(source), defines={"N": 1, "B_N": 1})


def test_each_result_type_round_trips_real_daemon_answers(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    d = start_daemon(tmp_path, "--cache-dir", str(root))
    try:
        client = d.client
        data = request_data(defines={"N": 5353, "B_N": 1})
        raw = client.request("POST", "/compile", {"request": data, "base_dir": "/"})
        assert raw["status"] == "compiled" and raw["policy"]["cached"] is True  # real gcc
        outcome = CompileOutcome.from_json(raw)
        assert outcome.status is Status.COMPILED and isinstance(outcome.policy, Policy)
        _same_bytes(raw, outcome.to_json())
        typed = client.compile(data)  # the same kernel again through Client: a typed hit
        assert isinstance(typed, CompileOutcome) and typed.status is Status.HIT
        assert typed.policy == Policy("auto", False, "enable", True, None)
        assert CompileOutcome.from_json(typed.to_json()).to_json() == typed.to_json()

        stats = client.request("GET", "/stats")
        assert stats["compiles"] == 1 and SOC in stats["chip_folders"]
        _same_bytes(stats, StatsResult.from_json(stats).to_json())
        typed_stats = client.stats()
        assert isinstance(typed_stats, StatsResult)
        assert typed_stats.counters["compiles"] == 1 and typed_stats.hits >= 1
        row = typed_stats.chip_folders[SOC]
        assert isinstance(row, ChipStats) and row.entries == 1 and row.counters is not None
        assert typed_stats.daemon["queue"]["running"] == 0

        report = client.request("POST", "/gc", {"ratio": 0, "min_age_s": 0, "dry_run": True})
        assert report["chip_folders"][SOC]["evicted_entries"] == 1
        _same_bytes(report, GcResult.from_json(report).to_json())
        typed_gc = client.gc(ratio=0, min_age_s=0, dry_run=True)
        assert isinstance(typed_gc, GcResult)
        chip = typed_gc.chip_folders[SOC]
        assert isinstance(chip, ChipGc) and chip.dry_run and chip.evicted_entries == 1
        # the dry run counts the header manifest that would go with its last entry
        manifests = list((root / "kernel_cache" / SOC).glob("*.manifest"))
        assert chip.reclaimed.manifests == len(manifests) == 1
        assert chip.reclaimed.bytes == manifests[0].stat().st_size
        assert typed_gc.other_kernel_caches == {}
    finally:
        assert d.stop() == 0


def test_cli_json_of_gc_and_stats_is_the_typed_results_json(tmp_path: Path) -> None:
    """``gc --json`` and ``stats --json`` (here in-process) are :class:`GcResult` and
    :class:`StatsResult` as they print them: parsed and printed again, byte for byte."""
    root = tmp_path / "cache"
    req = write_request(tmp_path / "req", defines={"N": 5454, "B_N": 1})
    _compile(tmp_path, req, root)
    env = daemon_env(tmp_path)
    for command in (["stats"], ["gc", "--dry-run", "--ratio", "0", "--min-age", "0"]):
        out = run_cli(
            *command, "--json", "--local", "--cache-dir", str(root), env=env, cwd=tmp_path
        )
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        kind = StatsResult if command == ["stats"] else GcResult
        typed = kind.from_json(data)
        assert typed.via == "local" and typed.route is not None
        again = json.dumps(typed.to_json(), indent=2, ensure_ascii=False, default=str)
        assert again == out.stdout.rstrip("\n")
    stats = StatsResult.from_json(json.loads(out_of(tmp_path, root, "stats")))
    assert stats.counters["compiles"] == 1 and stats.chip_folders[SOC].entries == 1


def out_of(tmp_path: Path, root: Path, *command: str) -> str:
    out = run_cli(
        *command, "--json", "--local", "--cache-dir", str(root),
        env=daemon_env(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_an_early_failure_carries_its_policy(tmp_path: Path) -> None:
    """A request that fails before it is compiled still answers with a policy: the one
    decided for it when its options could be resolved (a header missing from the dependency
    listing), else every field null and ``why_not_cached`` = ``unresolved: <the error>``
    (a malformed request file) — in ``--json``."""
    env = daemon_env(tmp_path)
    root = tmp_path / "cache"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    needs = tmp_path / "needs.json"
    needs.write_text(json.dumps(_missing_header_request(tmp_path / "src")))
    out = run_cli(
        "compile", str(bad), str(needs), "--local", "--json", "--cache-dir", str(root),
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    first, second = (json.loads(line) for line in out.stdout.splitlines())
    assert first["status"] == "failed" and first["request"] == str(bad)
    assert first["policy"]["jit_compile"] is None and first["policy"]["cache_mode"] is None
    assert first["policy"]["binary_first"] is None and first["policy"]["cached"] is False
    assert first["policy"]["why_not_cached"].startswith("unresolved: ")
    assert "malformed JSON" in first["policy"]["why_not_cached"]
    assert CompileOutcome.from_json(first).policy == Policy.unresolved(first["error"])
    assert second["status"] == "failed" and "not_there.h" in second["error"]
    assert second["policy"]["jit_compile"] == "auto"
    assert second["policy"]["cache_mode"] == "enable" and second["policy"]["cached"] is False
    assert "not_there.h" in second["policy"]["why_not_cached"]


def test_daemon_job_and_log_line_carry_an_early_failures_policy(tmp_path: Path) -> None:
    """A job that fails while the daemon prepares it (its header is missing) has the
    policy in ``GET /jobs/{id}`` and in the daemon's one log line; so does the same failure
    found by ``Client`` in the caller's process."""
    root = tmp_path / "cache"
    d = start_daemon(tmp_path, "--cache-dir", str(root))
    try:
        client = d.client
        data = _missing_header_request(tmp_path / "src")
        body = {"request": data, "base_dir": "/", "wait": False}
        job_id = client.request("POST", "/compile", body)["job_id"]
        done = wait_for(
            lambda: (j := client.job(job_id))["state"] in ("done", "failed") and j,
            60,
            "the job to finish",
        )
        assert done["status"] == "failed" and "not_there.h" in done["error"], done
        policy = done["policy"]
        assert policy["cache_mode"] == "enable" and policy["cached"] is False
        assert policy["why_not_cached"].startswith("the request failed before its compile")
        wait_for(
            lambda: (
                "failed in" in d.log()
                and "(jit auto, cache enable, not cached: the request failed before its compile"
                in d.log()
            ),
            30,
            "the log line with the policy",
        )
        here = client.compile(data)  # the caller's own dependency listing fails first
        assert here.status is Status.FAILED and here.via == "client"
        assert here.policy is not None and here.policy.cache_mode == "enable"
        assert here.policy.cached is False and "not_there.h" in str(here.policy.why_not_cached)
    finally:
        assert d.stop() == 0


# --- one status enum: no status string outside cachemgr/results.py ---------------------------

PACKAGE = Path(__file__).resolve().parents[1] / "cachemgr"
#: Spellings of a status allowed elsewhere, with the reason. The storage layer sits below the
#: compile results and cannot import them: its verified lookup answers ``hit``/``miss``.
ALLOWED = {("store.py", "hit"), ("direct.py", "hit")}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes of a module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            out.add(id(first.value))
    return out


def status_literals(package: Path) -> list[str]:
    """``file:line: 'value'`` for every string constant spelling a :class:`Status` outside
    ``results.py`` (docstrings aside)."""
    values = {s.value for s in Status}
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel.endswith("results.py"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in values
                and id(node) not in docs
                and (path.name, node.value) not in ALLOWED
            ):
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    return found


def test_no_status_string_outside_results(tmp_path: Path) -> None:
    """The package spells no status outside ``results.py``; the check is not vacuous: a
    comparison with ``"compiled"`` is found, a docstring mentioning it is not."""
    assert status_literals(PACKAGE) == []
    from cachemgr import direct
    from cachemgr.storage import store

    assert store.HIT == Status.HIT  # the one allowed spelling is the enum's
    assert direct.HIT == Status.HIT
    (tmp_path / "mod.py").write_text(
        '"""Says "compiled" in its docstring."""\n'
        "def f(out):\n"
        '    """compiled"""\n'
        '    return out.status == "compiled"\n'
    )
    assert status_literals(tmp_path) == ["mod.py:4: 'compiled'"]
