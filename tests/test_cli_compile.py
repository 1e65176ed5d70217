"""``cachemgr compile`` through the real CLI: JSON output, exit codes, modes."""

from __future__ import annotations

import json
from pathlib import Path

from tests.compile_util import REQUESTS, SOC, write_request
from tests.conftest import run_cli


def _compile(tmp_path: Path, *args: str, env=None):
    return run_cli("compile", "--cache-dir", str(tmp_path / "cache"), *args, env=env, cwd=tmp_path)


def _lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_compile_json_then_hit(tmp_path: Path, clean_env) -> None:
    reqs = [str(REQUESTS / "add_c.json"), str(REQUESTS / "softmax_c.json")]
    first = _compile(tmp_path, *reqs, "--json")
    assert first.returncode == 0, first.stderr
    rows = _lines(first.stdout)
    assert [r["status"] for r in rows] == ["compiled", "compiled"]
    for row in rows:
        keys = {
            "request",
            "kernel_name",
            "status",
            "files",
            "seconds",
            "via",
            "route",
            "cached",
            "policy",
        }
        assert set(row) == keys and row["cached"] is True  # stored in the cache
        assert row["via"] == "local"  # no daemon serves this cache
        assert row["seconds"] > 0 and all(Path(f).is_file() for f in row["files"])
        assert Path(row["files"][0]).parent == tmp_path / "cache" / "kernel_cache" / SOC
    again = _compile(tmp_path, *reqs, "--json")
    assert [r["status"] for r in _lines(again.stdout)] == ["hit", "hit"]
    assert [r["kernel_name"] for r in _lines(again.stdout)] == [r["kernel_name"] for r in rows]
    human = _compile(tmp_path, reqs[0])
    assert human.returncode == 0 and human.stdout.startswith("hit ")


def test_a_failed_compile_exits_1_and_shows_the_message(tmp_path: Path, clean_env) -> None:
    bad_src = tmp_path / "bad.c"
    bad_src.write_text('#error "cachemgr-marker-4711"\n')
    bad = write_request(tmp_path, "bad", kernel_source=str(bad_src))
    good = write_request(tmp_path, "good")
    proc = _compile(tmp_path, str(bad), str(good))
    assert proc.returncode == 1
    assert "cachemgr-marker-4711" in proc.stderr and "bad.json" in proc.stderr
    assert "compiled" in proc.stdout, "the other request was still compiled"
    entries = list((tmp_path / "cache" / "kernel_cache" / SOC).glob("*.json"))
    assert len(entries) == 1


def test_an_invalid_request_exits_2_with_one_line(tmp_path: Path, clean_env) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"op_type": "Add",')
    proc = _compile(tmp_path, str(broken))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "broken.json: malformed JSON at line 1" in lines[0]
    assert not (tmp_path / "cache" / "kernel_cache" / SOC).exists()
    as_json = _compile(tmp_path, str(broken), "--json")
    assert as_json.returncode == 2 and _lines(as_json.stdout)[0]["status"] == "failed"


def test_cli_options_override_the_configuration(tmp_path: Path, clean_env) -> None:
    req = str(write_request(tmp_path))
    off = _compile(tmp_path, req, "--mode", "disable", "--out-dir", "out", "--json")
    assert off.returncode == 0, off.stderr
    row = _lines(off.stdout)[0]
    assert row["status"] == "compiled"
    assert all(Path(f).parent == tmp_path / "out" for f in row["files"])
    assert not (tmp_path / "cache" / "kernel_cache" / SOC).exists()
    dbg = _compile(tmp_path, req, "--op-debug-level", "3", "--debug-dir", "dbg", "--json")
    row = _lines(dbg.stdout)[0]
    assert row["status"] == "debug"
    assert all((tmp_path / "dbg" / "kernel_meta") in Path(f).parents for f in row["files"])
    bad = _compile(tmp_path, req, "--op-debug-level", "9")
    assert bad.returncode == 2 and "op_debug_level='9'" in bad.stderr


def test_compile_errors_name_the_users_paths_not_the_build_folder(
    tmp_path: Path, clean_env
) -> None:
    # preprocesses fine (the header scan passes), so gcc fails in the real compile, which
    # reads a mirror in a private build folder that is gone after the run
    bad_src = tmp_path / "work" / "bad.c"
    bad_src.parent.mkdir()
    bad_src.write_text("int add_kernel(void) { return undeclared_4711; }\n")
    bad = write_request(tmp_path, "bad", kernel_source=str(bad_src))
    proc = _compile(tmp_path, str(bad))
    assert proc.returncode == 1 and "undeclared_4711" in proc.stderr, proc.stderr
    assert "cachemgr-build-" not in proc.stderr and "/.src/" not in proc.stderr, proc.stderr
    assert f"compiling {bad_src}:" in proc.stderr and f"{bad_src}:1:" in proc.stderr
    wrong = write_request(tmp_path, "wrong", kernel_entry="nope_4711")
    proc = _compile(tmp_path, str(wrong))
    assert proc.returncode == 1 and "'nope_4711' is not in" in proc.stderr, proc.stderr
    assert "cachemgr-build-" not in proc.stderr, proc.stderr
    assert "the build output of kernel " in proc.stderr, proc.stderr


def test_text_output_has_a_line_per_request_failed_ones_too(tmp_path: Path, clean_env) -> None:
    """docs/commands.md: compile prints ``status kernel seconds files`` per request — a failed
    one too (``failed``, its kernel or else its request file, seconds), in process and through
    a daemon; the error stays one line on stderr."""
    from tests.daemon_util import start_daemon

    bad_src = tmp_path / "bad.c"
    bad_src.write_text('#error "cachemgr-marker-4712"\n')
    bad = write_request(tmp_path, "bad", kernel_source=str(bad_src))
    broken = tmp_path / "broken.json"
    broken.write_text('{"op_type": "Add",')
    good = write_request(tmp_path, "good")
    reqs = [str(bad), str(broken), str(good)]
    daemon = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "cache"))
    try:
        env = {k: v for k, v in daemon.env.items() if k != "NOTIFY_SOCKET"}
        runs = {
            "local": _compile(tmp_path, *reqs, "--local"),
            "daemon": _compile(tmp_path, *reqs, "--socket", str(daemon.socket_path), env=env),
        }
    finally:
        daemon.stop()
    for via, proc in runs.items():
        assert proc.returncode == 1, (via, proc.stdout, proc.stderr)
        rows = [line.split() for line in proc.stdout.splitlines()]
        assert [r[0] for r in rows[:2]] == ["failed", "failed"], (via, proc.stdout)
        assert len(rows) == 3 and rows[2][0] in ("compiled", "hit"), (via, proc.stdout)
        assert rows[1][1] == str(broken), (via, rows)  # no kernel name: the request file
        assert rows[0][1].startswith("te_add_"), (via, rows)  # its kernel name
        for row in rows[:2]:
            assert row[2].endswith("s") and float(row[2][:-1]) >= 0, (via, row)
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("cachemgr: error:")]
        assert len(errors) == 2 and "bad.json" in errors[0], (via, proc.stderr)
        assert "broken.json" in errors[1] and "cachemgr-marker-4712" in proc.stderr, via


def test_an_unknown_option_value_lists_each_accepted_value_once(tmp_path: Path, clean_env) -> None:
    """``options.jit_compile='maybe'`` listed ``auto, true, false, 2, 1, 0, enable, disable,
    True, False, 0, 1, 2``: the schema's true/"true" and 1/"1" are one value to a user."""
    req = write_request(tmp_path, "maybe", options={"jit_compile": "maybe"})
    proc = _compile(tmp_path, str(req))
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    accepted = line.split("(accepted: ", 1)[1].rstrip(")").split(", ")
    assert accepted == ["auto", "true", "false", "2", "1", "0", "enable", "disable"], line


def test_a_bad_workers_value_is_worded_like_every_other_bad_value(
    tmp_path: Path, clean_env
) -> None:
    """``--workers 0`` gave click's ``0 is not in the range 1<=x<=1024``; the house style
    (``gc --ratio``) names the option, its value, where it came from and what is accepted."""
    req = str(write_request(tmp_path))
    for bad in ("0", "x", "1025"):
        proc = _compile(tmp_path, req, "--workers", bad)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0] == (
            f"cachemgr: error: --workers={bad!r} (from option) is invalid; "
            "accepted: an integer 1..1024"
        ), lines
    assert not (tmp_path / "cache").exists()  # refused before anything was compiled
    good = _compile(tmp_path, req, "--workers", "2", "--json")
    assert good.returncode == 0 and _lines(good.stdout)[0]["status"] == "compiled", good.stderr
