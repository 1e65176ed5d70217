"""Real daemons on real sockets: API, client, reload, stop, notify, faults."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cachemgr.client import Client, DaemonError, DaemonUnavailable
from tests.conftest import ROOT, SOC, publish, run_cli
from tests.daemon_util import AS_ROOT, daemon_env, start_daemon, wait_first_scan, wait_for
from tests.shared_util import chip_bytes
from tests.unit_util import unit_umask

REQUESTS = ROOT / "examples" / "requests"


def _raw_http(sock_path: Path, data: bytes, read: bool = True) -> bytes:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(str(sock_path))
    s.sendall(data)
    out = b""
    if read:
        while b"\r\n\r\n" not in out:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        head, _, rest = out.partition(b"\r\n\r\n")
        length = next(
            (
                int(ln.split(b":")[1])
                for ln in head.split(b"\r\n")
                if ln.lower().startswith(b"content-length")
            ),
            0,
        )
        while len(rest) < length:
            rest += s.recv(65536)
        out = head + b"\r\n\r\n" + rest
    s.close()
    return out


def test_health_via_client_and_curl(daemon) -> None:
    health = daemon.client.health()
    assert health["status"] == "ok" and health["pid"] == daemon.proc.pid
    assert oct(daemon.socket_path.stat().st_mode & 0o777) == "0o660"
    curl = shutil.which("curl")
    if curl:
        out = subprocess.run(
            [curl, "-s", "--unix-socket", str(daemon.socket_path), "http://localhost/health"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert json.loads(out.stdout)["pid"] == daemon.proc.pid


@pytest.mark.parametrize("umask", [0o022, unit_umask()], ids=["umask-022", "unit-umask"])
def test_the_sockets_lock_and_pid_files_give_others_nothing(
    tmp_path: Path, cache_root: Path, umask: int
) -> None:
    """``<socket>.pid`` and ``<socket>.lock`` get the folder's file mode whatever the umask
    (``0660``; the unit's folder is ``0750``), as the socket itself: the pid file was ``0644``
    where the unit's ``UMask=0007`` gives every other file of the daemon no bit for others."""
    run = tmp_path / "run"
    run.mkdir(mode=0o750)
    run.chmod(0o750)
    sock = run / "cachemgr.sock"
    d = start_daemon(
        tmp_path, "--socket", str(sock), "--cache-dir", str(cache_root), popen_kw={"umask": umask}
    )
    try:
        modes = {
            p.name: oct(p.stat().st_mode & 0o777)
            for p in (sock, run / "cachemgr.sock.lock", run / "cachemgr.sock.pid")
        }
        assert set(modes.values()) == {"0o660"}, modes
        assert (run / "cachemgr.sock.pid").read_text() == f"{d.proc.pid}\n"
    finally:
        d.stop()


def test_compile_cold_then_warm_and_stats(daemon, cache_root: Path) -> None:
    client = daemon.client
    cold = client.compile_file(REQUESTS / "add_c.json").to_json()
    assert cold["status"] == "compiled", cold
    warm = client.compile_file(REQUESTS / "add_c.json").to_json()
    assert warm["status"] == "hit" and warm["kernel_name"] == cold["kernel_name"]
    chip = cache_root / "kernel_cache" / SOC
    assert (chip / (cold["kernel_name"] + ".json")).exists()
    stats = client.stats().to_json()
    assert stats["hits"] >= 1 and stats["compiles"] >= 1 and stats["misses"] >= 1
    assert SOC in stats["chip_folders"]
    found = client.lookup(SOC, cold["kernel_name"])
    assert found["status"] == "hit"
    assert client.lookup(SOC, "te_none_1")["status"] == "miss"
    metrics = client.request("GET", "/metrics")
    assert "cachemgr_hits_total" in metrics and "cachemgr_chip_used_bytes" in metrics
    # the typed endpoints expect a JSON object: a text answer is a clear error, not a str
    with pytest.raises(DaemonError, match=r"GET /metrics: the daemon answered .*not an object"):
        client._object("GET", "/metrics")


def test_async_compile_job(daemon) -> None:
    client = daemon.client
    sub = client.compile_file(REQUESTS / "softmax_c.json", wait=False)
    job_id = sub["job_id"]
    done = wait_for(
        lambda: (j := client.job(job_id))["state"] in ("done", "failed") and j,
        60,
        "the job to finish",
    )
    assert done["state"] == "done" and done["status"] in ("compiled", "hit")
    with pytest.raises(DaemonError) as info:
        client.job("nope")
    assert info.value.status == 404


def test_config_and_gc(daemon, cache_root: Path) -> None:
    client = daemon.client
    cfg = client.config()
    assert cfg["kernel_cache_dir"]["value"] == str(cache_root / "kernel_cache")
    assert cfg["kernel_cache_dir"]["origin"] == "option"
    chip = cache_root / "kernel_cache" / SOC
    for i in range(4):
        publish(chip, f"te_old_{i}", os.urandom(1000), atime_s=1_000_000 + i)
    report = client.gc(ratio=0, soc=SOC).to_json()
    assert report["chip_folders"][SOC]["evicted_entries"] == 4
    with pytest.raises(DaemonError) as info:
        client.gc(ratio=101)
    assert info.value.status == 400 and "101" in str(info.value)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"POST /compile HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{nope", 400),
        (b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        (b"GET /compile HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        (b"POST /compile HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n", 413),
        (b"POST /lookup HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n[]", 400),
        (b"POST /compile HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 400),
        (b"garbage\r\n\r\n", 400),
    ],
)
def test_bad_http(daemon, raw: bytes, status: int) -> None:
    out = _raw_http(daemon.socket_path, raw)
    assert out.split(b" ")[1] == str(status).encode(), out[:200]
    assert daemon.client.health()["status"] == "ok"  # still serving


@pytest.mark.parametrize("lengths", [["1_0"], ["+2"], ["-1"], ["\u0663"], ["2", "40"]])
def test_content_length_is_digits_and_only_one(daemon, lengths: list[str]) -> None:
    """Framing ``int()`` would accept (``1_0``, ``+2``, an Arabic digit) or two lengths is a
    400 naming Content-Length, never a guess (attack review; RFC 9112 section 6.3)."""
    head = "".join(f"Content-Length: {n}\r\n" for n in lengths).encode()
    out = _raw_http(daemon.socket_path, b"POST /health HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n{}")
    assert out.split(b" ")[1] == b"400" and b"Content-Length" in out, out[:300]
    assert daemon.client.health()["status"] == "ok"


def test_bad_compile_request_is_one_line_400(daemon, tmp_path: Path) -> None:
    bad = json.loads((REQUESTS / "add_c.json").read_text())
    bad["inputs"][0]["dtype"] = "float99"
    with pytest.raises(DaemonError) as info:
        daemon.client.compile(bad, base_dir=REQUESTS)
    assert info.value.status == 400 and "float99" in str(info.value)
    assert "\n" not in str(info.value)


def test_client_disconnect_drops_the_queued_job(tmp_path: Path, cache_root: Path) -> None:
    log = tmp_path / "cc.log"
    slow = tmp_path / "slowcc"
    slow.write_text(
        f'#!/bin/sh\ncase " $* " in *" -c "*) echo "$@" >> {log}; sleep 3;; esac\nexec gcc "$@"\n'
    )
    slow.chmod(0o755)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[compilers]\ncc = "{slow}"\n[daemon]\nworkers = 1\n')
    d = start_daemon(tmp_path, "--cache-dir", str(cache_root), "--config", str(cfg))
    try:
        first = threading.Thread(target=d.client.compile_file, args=(REQUESTS / "add_c.json",))
        first.start()
        wait_for(lambda: log.exists() and "add.c" in log.read_text(), 30, "add.c to compile")
        req = json.loads((REQUESTS / "mul_c.json").read_text())
        body = json.dumps({"request": req, "base_dir": str(REQUESTS)}).encode()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(d.socket_path))
        s.sendall(
            b"POST /compile HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        wait_for(lambda: d.client.stats().to_json()["queue_jobs"] == 2, 30, "mul to be queued")
        s.close()  # the only caller of mul goes away while it waits
        first.join(60)
        wait_for(lambda: d.client.stats().to_json()["queue_jobs"] == 0, 30, "the queue to empty")
        assert "mul.c" not in log.read_text()  # dropped, never compiled
    finally:
        d.stop()


def test_already_running_and_dead_socket(tmp_path: Path, cache_root: Path) -> None:
    env = daemon_env(tmp_path)
    first = start_daemon(tmp_path, "--cache-dir", str(cache_root), env=env)
    try:
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "cachemgr",
                "serve",
                *AS_ROOT,
                "--cache-dir",
                str(cache_root),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode != 0
        assert f"already running, pid {first.proc.pid}" in second.stderr
    finally:
        first.proc.kill()
        first.proc.wait(10)
    assert first.socket_path.exists()  # left behind by the dead daemon
    third = start_daemon(tmp_path, "--cache-dir", str(cache_root), env=env)
    try:
        assert third.client.health()["pid"] == third.proc.pid
    finally:
        assert third.stop() == 0


def test_config_error_at_start_names_the_line(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('jit_compile = "true"\nop_debug_level = = 3\n')
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cachemgr",
            "serve",
            *AS_ROOT,
            "--config",
            str(cfg),
        ],
        env=daemon_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "line 2" in proc.stderr and str(cfg) in proc.stderr
    assert "Traceback" not in proc.stderr


def test_sighup_reload_good_and_bad(tmp_path: Path, cache_root: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'op_compiler_cache_dir = "{cache_root}"\njit_compile = "true"\n')
    d = start_daemon(tmp_path, "--config", str(cfg))
    try:
        assert d.client.config()["jit_compile"]["value"] == "true"
        kc = cache_root / "kernel_cache"
        (kc / "op_cache.ini").write_text(
            "[op_compiler_cache]\nmax_op_cache_size=77\n"
            "remain_cache_size_ratio=60\nadk_version=1\nops_version=1\n"
        )
        cfg.write_text(f'op_compiler_cache_dir = "{cache_root}"\njit_compile = "false"\n')
        d.signal(signal.SIGHUP)
        wait_for(lambda: d.client.config()["jit_compile"]["value"] == "false", 30, "reload")
        assert d.client.config()["max_op_cache_size"]["value"] == 77
        d.wait_notify("RELOADING=1")
        # systemctl status keeps the last STATUS=: what the daemon does, not "reloaded"
        d.wait_notify(f"STATUS=serving {kc} (reloaded at ")
        cfg.write_text("jit_compile = [oops\n")
        d.signal(signal.SIGHUP)
        wait_for(lambda: "reload refused" in d.log(), 30, "the refused reload in the log")
        d.wait_notify(f"STATUS=serving {kc} (reload failed: ")
        assert d.client.config()["jit_compile"]["value"] == "false"  # old config kept
        assert d.client.health()["status"] == "ok"
    finally:
        assert d.stop() == 0


def test_sigterm_finishes_running_compile(tmp_path: Path, cache_root: Path) -> None:
    marker = tmp_path / "started"
    slow = tmp_path / "slowcc"
    slow.write_text(
        f'#!/bin/sh\ncase " $* " in *" -c "*) touch {marker}; sleep 2;; esac\nexec gcc "$@"\n'
    )
    slow.chmod(0o755)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[compilers]\ncc = "{slow}"\n')
    d = start_daemon(tmp_path, "--cache-dir", str(cache_root), "--config", str(cfg))
    result: dict[str, object] = {}

    def compile_it() -> None:
        try:
            result["out"] = d.client.compile_file(REQUESTS / "add_c.json").to_json()
        except Exception as exc:  # reported by the assertion below
            result["err"] = exc

    worker = threading.Thread(target=compile_it)
    worker.start()
    wait_for(marker.exists, 30, "the compiler to start")
    d.signal(signal.SIGTERM)
    worker.join(60)
    assert d.proc.wait(60) == 0
    assert result.get("out", {}).get("status") == "compiled", result  # type: ignore[union-attr]
    d.wait_notify("STOPPING=1")
    assert not d.socket_path.exists()


def test_notify_ready_status_watchdog(tmp_path: Path, cache_root: Path) -> None:
    d = start_daemon(tmp_path, "--cache-dir", str(cache_root), watchdog_usec=200_000)
    try:
        ready = next(m for m in d.read_notify() if "READY=1" in m)
        assert "STATUS=" in ready and f"MAINPID={d.proc.pid}" in ready
        wait_for(
            lambda: sum("WATCHDOG=1" in m for m in d.read_notify(0.05)) >= 3,
            10,
            "three watchdog pings",
        )
    finally:
        d.stop()


def test_counters_survive_restart(tmp_path: Path, cache_root: Path) -> None:
    env = daemon_env(tmp_path)
    d = start_daemon(tmp_path, "--cache-dir", str(cache_root), env=env)
    d.client.compile_file(REQUESTS / "add_c.json")
    d.client.compile_file(REQUESTS / "add_c.json")
    before = d.client.stats().to_json()
    assert d.stop() == 0
    d2 = start_daemon(tmp_path, "--cache-dir", str(cache_root), env=env)
    try:
        after = d2.client.stats().to_json()
        assert after["hits"] == before["hits"] and after["compiles"] == before["compiles"]
    finally:
        d2.stop()


def test_crossing_the_limit_evicts_in_background(tmp_path: Path, cache_root: Path) -> None:
    kc = cache_root / "kernel_cache"
    kc.mkdir(parents=True)
    (kc / "op_cache.ini").write_text(
        "[op_compiler_cache]\nmax_op_cache_size=1\n"
        "remain_cache_size_ratio=50\nadk_version=1\nops_version=1\n"
    )
    cfg = tmp_path / "c.toml"
    cfg.write_text("min_age_s = 0\n[daemon]\nevict_debounce_s = 0.2\n")
    d = start_daemon(tmp_path, "--cache-dir", str(cache_root), "--config", str(cfg))
    try:
        chip = kc / SOC
        for i in range(12):  # 12 × 100 KiB > 1 MiB
            publish(chip, f"te_fill_{i:02d}", os.urandom(100 * 1024), atime_s=1_000_000 + i)

        # files vanish while they are counted: the daemon evicts meanwhile
        wait_for(
            lambda: chip_bytes(chip) <= 512 * 1024, 30, "background eviction to the ratio target"
        )
        assert (chip / "te_fill_11.json").exists() and not (chip / "te_fill_00.json").exists()
        client = d.client  # counted once the eviction run returns, just after its removals
        wait_for(
            lambda: client.stats().to_json()["evicted_entries"] >= 6, 30, "the eviction counted"
        )
    finally:
        d.stop()


def test_client_without_daemon(tmp_path: Path) -> None:
    client = Client(tmp_path / "none.sock", timeout_s=2)
    assert not client.available()
    with pytest.raises(DaemonUnavailable):
        client.health()


def test_hits_served_in_the_client_are_verified_and_counted(daemon, cache_root: Path) -> None:
    client = daemon.client
    cold = client.compile_file(REQUESTS / "add_c.json").to_json()
    assert (cold["status"], cold["via"]) == ("compiled", "daemon")
    warm = client.compile_file(REQUESTS / "add_c.json").to_json()
    assert (warm["status"], warm["via"]) == ("hit", "client")
    assert client.stats().to_json()["hits"] == 1  # reported to the daemon's counters
    remote = (
        Client(daemon.socket_path, local_hits=False).compile_file(REQUESTS / "add_c.json").to_json()
    )
    assert (remote["status"], remote["via"]) == ("hit", "daemon")
    binary = next(Path(f) for f in warm["files"] if f.endswith(".o"))
    binary.write_bytes(b"corrupted on disk")
    again = client.compile_file(REQUESTS / "add_c.json").to_json()
    assert (again["status"], again["via"]) == ("compiled", "daemon")  # never a corrupt hit
    assert binary.read_bytes() != b"corrupted on disk"


def test_cli_routes_to_a_running_daemon(daemon, cache_root: Path, tmp_path: Path) -> None:
    env = {**daemon.env, "CACHEMGR_SOCKET": str(daemon.socket_path)}
    env.pop("NOTIFY_SOCKET", None)
    args = ["--cache-dir", str(cache_root)]
    cold = run_cli("compile", str(REQUESTS / "add_c.json"), "--json", *args, env=env)
    warm = run_cli("compile", str(REQUESTS / "add_c.json"), "--json", *args, env=env)
    assert cold.returncode == 0 and warm.returncode == 0, cold.stderr + warm.stderr
    assert json.loads(cold.stdout)["via"] == "daemon"
    assert (json.loads(warm.stdout)["status"], json.loads(warm.stdout)["via"]) == ("hit", "daemon")
    stats = json.loads(run_cli("stats", "--json", *args, env=env).stdout)
    assert stats["via"] == "daemon" and stats["hits"] == 1 and stats["compiles"] == 1
    assert stats["chip_folders"][SOC]["entries"] == 1
    gc = run_cli("gc", "--ratio", "0", "--min-age", "0", "--json", *args, env=env)
    report = json.loads(gc.stdout)
    assert gc.returncode == 0 and report["via"] == "daemon"
    assert report["chip_folders"][SOC]["evicted_entries"] == 1
    # a named socket (here $CACHEMGR_SOCKET) means that daemon or an error
    other = run_cli("stats", "--json", "--cache-dir", str(tmp_path / "elsewhere"), env=env)
    assert other.returncode == 2 and str(tmp_path / "elsewhere") in other.stderr, other.stderr
    gone = run_cli("stats", "--json", *args, "--socket", str(tmp_path / "no.sock"), env=env)
    assert gone.returncode == 2 and "no.sock" in gone.stderr, gone.stderr
    local = run_cli("stats", "--json", *args, "--local", env=env)
    assert json.loads(local.stdout)["via"] == "local"
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    refused = run_cli("compile", str(bad), *args, env=env)
    assert refused.returncode == 2 and str(bad) in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_tcp_listener_and_configured_body_limit(tmp_path: Path, cache_root: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("0123456789abcdef" * 4 + "\n")
    token_file.chmod(0o600)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[daemon]\nmax_body_bytes = 200\ntcp_token_file = '{token_file}'\n")
    d = start_daemon(
        tmp_path, "--cache-dir", str(cache_root), "--config", str(cfg), "--tcp-port", "0"
    )
    try:
        host, port = d.client.health()["tcp"]
        assert host == "127.0.0.1" and port > 0
        tcp = Client(tcp=(host, port), timeout_s=30, token="0123456789abcdef" * 4)
        assert tcp.health()["pid"] == d.proc.pid
        with pytest.raises(DaemonError) as info:
            tcp.compile_file(REQUESTS / "add_c.json")  # its body is over 200 bytes
        assert info.value.status == 413 and "200-byte limit" in str(info.value)
    finally:
        d.stop()


def test_socket_folder_problems_are_one_line_errors(tmp_path: Path) -> None:
    env = daemon_env(tmp_path)
    env["XDG_RUNTIME_DIR"] = str(tmp_path / "afile")
    (tmp_path / "afile").write_text("not a folder")
    exe = [
        sys.executable,
        "-m",
        "cachemgr",
        "serve",
        *AS_ROOT,
        "--cache-dir",
        str(tmp_path / "c"),
    ]
    proc = subprocess.run(exe, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "$XDG_RUNTIME_DIR" in proc.stderr and "--socket" in proc.stderr
    assert "Traceback" not in proc.stderr
    if os.geteuid() != 0:
        return
    evil = tmp_path / "evil"
    evil.mkdir()
    os.chown(evil, 65534, 65534)
    evil.chmod(0o777)
    proc = subprocess.run(
        [*exe, "--socket", str(evil / "s.sock")],
        env=daemon_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "refusing socket folder" in proc.stderr, proc.stderr
    assert list(evil.iterdir()) == []


def test_the_log_says_nothing_of_modes_on_a_new_cache_and_counts_in_words(
    tmp_path: Path,
) -> None:
    """On a new, empty cache the daemon logged ``group-sharing modes restored on 1 file(s)``
    about the folder it had just made (it adds the setgid bit, nothing was wrong); and a
    one-file request was ``(1 files sent)``. Now: no line for its own new folder, a line
    with the count in words for GE's 0640 files, ``1 file sent``."""
    from tests.compile_util import write_request

    root = tmp_path / "cache"
    d = start_daemon(tmp_path, "--cache-dir", str(root))
    env = {k: v for k, v in d.env.items() if k != "NOTIFY_SOCKET"}
    src = tmp_path / "one.c"
    src.write_text("void add_kernel(float *x) { x[0] = 1.0f; }\n")
    req = write_request(tmp_path, "one", kernel_source=str(src), include_dirs=[])
    try:
        wait_for(lambda: "first scan of" in d.log(), 60, "the first scan")
        done = run_cli("compile", str(req), "--cache-dir", str(root), env=env)
        assert done.returncode == 0, done.stderr
    finally:
        d.stop()
    log = d.log()
    assert "modes restored" not in log, log
    assert "(1 file sent)" in log and "1 files" not in log, log
    chip = root / "kernel_cache" / SOC
    # as GE leaves its files: written fresh at 0640 and renamed in (CopyFileToCacheDir), the
    # group locked out. Not a chmod of the daemon's file: that moves its ctime past its mtime,
    # on a loaded host by more than groupmodes.RENAMED_IN_SLACK_NS (2 s), which reads as a
    # file renamed in from elsewhere: never given back
    for doc in list(chip.iterdir()):
        if doc.suffix in (".json", ".o"):
            ge_tmp = chip / f"{doc.name}.ge-tmp"
            ge_tmp.write_bytes(doc.read_bytes())
            ge_tmp.chmod(0o640)
            ge_tmp.rename(doc)
    again = start_daemon(tmp_path, "--cache-dir", str(root))
    try:
        wait_for(lambda: "modes restored" in again.log(), 60, "the modes restored")
    finally:
        again.stop()
    assert f"{chip}: group-sharing modes restored on 2 files" in again.log(), again.log()


def test_the_toolkit_check_is_logged_once_not_at_every_reconciliation(tmp_path: Path) -> None:
    """Without a toolkit the daemon logged "toolkit version unknown … no toolkit-upgrade
    purge" at start and again at every reconciliation (every 5 min under the unit: a line in
    the journal each time, nothing changed). Now once; two reconciliations are seen to pass
    by the ini edits each one notices."""
    root = tmp_path / "root"
    (root / "kernel_cache" / SOC).mkdir(parents=True)
    cfg = tmp_path / "c.toml"
    cfg.write_text("[daemon]\nreconcile_interval_s = 1\nreconcile_jitter_s = 0\n")
    ini = root / "kernel_cache" / "op_cache.ini"
    d = start_daemon(tmp_path, "--config", str(cfg), "--cache-dir", str(root))
    try:
        wait_first_scan(d)
        for n, size in enumerate((100, 200), 1):  # a reconciliation re-reads a changed ini
            ini.write_text(f"[op_compiler_cache]\nmax_op_cache_size={size}\n")
            wait_for(lambda n=n: d.log().count("changed; re-reading the limits") >= n, 60,
                     f"reconciliation {n}")  # fmt: skip
    finally:
        d.stop()
    said = [ln for ln in d.log().splitlines() if "toolkit version unknown" in ln]
    assert len(said) == 1, said


def test_serve_on_a_socket_path_too_long_for_unix_says_so_in_one_line(tmp_path: Path) -> None:
    """A socket path past the 107 bytes a Unix socket holds: one line naming the path and the
    limit, exit 2 (the bind's own refusal was hidden behind an internal error, exit 1)."""
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    sock = deep / "cachemgr.sock"
    env = daemon_env(tmp_path)
    proc = run_cli(
        "serve", *AS_ROOT, "--cache-dir", str(tmp_path / "cache"), "--socket", str(sock), env=env
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and str(sock) in errors[0] and "at most 107" in errors[0], proc.stderr
    assert "internal error" not in proc.stderr and not sock.exists()
