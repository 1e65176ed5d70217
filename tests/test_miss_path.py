"""What a miss does around its compiler process, pinned on real compiles.

* a worker reuses the folders of its build folder's mirror tree (no ``mkdir``/``rmdir`` per
  miss) yet a compile only ever sees its own job's folders, and nothing planted survives;
* in-process (``cachemgr compile`` without a daemon, ``CompileQueue``) the compiler gets the
  backend's argv as is — no sandbox, no resource-limit wrapper — in the caller's own user
  namespace;
* through the daemon, a compile for the daemon's own user runs under the ``[sandbox]`` limits
  without the namespaces (they hide only that user's own files), while another user's
  compile still runs in them (``tests/test_deputy.py`` proves they hide the secret).

No timing here: the speed is ``scripts/bench --only compile`` (BENCHMARKS.md).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from cachemgr.compile.queue import CompileQueue
from cachemgr.compile.request import parse_request
from cachemgr.compilers import process
from tests.compile_util import counting_cc, make_settings, scale_request, wait_for
from tests.daemon_util import daemon_env, start_daemon
from tests.users_util import Runtime, Users

KERNEL = "void scale_kernel(float *x) { x[0] *= K; }\n"

#: Run inside each compile (cwd = the worker's build folder): its folders and files.
PROBE = (
    'echo "pwd $PWD" >> {log}; '
    'find .src -type d | sed "s/^/dir /" >> {log}; '
    'find .src ! -type d | sed "s/^/file /" >> {log}; '
    "echo end >> {log}"
)


def _runs(log: Path) -> list[dict[str, list[str]]]:
    """The probe's records, one per compile: ``pwd``, ``dir`` and ``file`` lines."""
    runs: list[dict[str, list[str]]] = []
    current: dict[str, list[str]] = {"pwd": [], "dir": [], "file": []}
    for line in log.read_text().splitlines():
        if line == "end":
            runs.append(current)
            current = {"pwd": [], "dir": [], "file": []}
            continue
        kind, _, rest = line.partition(" ")
        current[kind].append(rest)
    return runs


def _compile(queue: CompileQueue, source: Path, k: int, cwd: Path) -> None:
    data = scale_request(str(source), defines={"K": k})
    out = queue.compile(parse_request(data, cwd))
    assert out.status == "compiled", out


def test_a_worker_keeps_its_mirror_folders_but_a_compile_sees_only_its_own(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    one, two = tmp_path / "proj" / "one" / "k.c", tmp_path / "other" / "two" / "k.c"
    for src in (one, two):
        src.parent.mkdir(parents=True)
        src.write_text(KERNEL)
    log = tmp_path / "probe.log"
    cc = counting_cc(tmp_path / "cc", body=PROBE.format(log=log))
    settings = make_settings(tmp_path, clean_env, compilers={"cc": str(cc)})
    with CompileQueue(settings, workers=1) as queue:
        _compile(queue, one, 2, tmp_path)
        build = Path(_runs(log)[0]["pwd"][0])
        kept = build / ".src" / str(one.parent).lstrip("/")
        # after the answer the worker empties its build folder: files go, folders stay
        wait_for(lambda: kept.is_dir() and not any(kept.iterdir()), what="an emptied mirror")
        # something planted there meanwhile does not reach the next compile
        (kept / "planted.h").write_text("#error planted\n")
        os.symlink("/etc", kept / "link")
        os.mkdir(build / ".src" / "stray")
        _compile(queue, one, 3, tmp_path)
        _compile(queue, two, 4, tmp_path)
    first, second, third = _runs(log)
    mirror_one = f".src/{str(one.parent).lstrip('/')}"
    mirror_two = f".src/{str(two.parent).lstrip('/')}"
    assert first["file"] == second["file"] == [f"{mirror_one}/k.c"]
    assert third["file"] == [f"{mirror_two}/k.c"]
    assert mirror_one in second["dir"] and ".src/stray" not in second["dir"]
    # the third job's compile sees no folder of the first two (no other caller's paths)
    assert not [d for d in third["dir"] if "proj" in d or "stray" in d], third["dir"]
    assert mirror_two in third["dir"]


def test_in_process_the_compiler_gets_its_argv_as_is(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    src = tmp_path / "k.c"
    src.write_text(KERNEL)
    log = tmp_path / "ns.log"
    body = f"readlink /proc/self/ns/user /proc/self/ns/mnt >> {log}; ulimit -v >> {log}"
    cc = counting_cc(tmp_path / "cc", body=body)
    settings = make_settings(tmp_path, clean_env, compilers={"cc": str(cc)})
    with CompileQueue(settings, workers=1) as queue:
        _compile(queue, src, 2, tmp_path)
    user_ns, mnt_ns, address_space = log.read_text().split()
    assert user_ns == os.readlink("/proc/self/ns/user")
    assert mnt_ns == os.readlink("/proc/self/ns/mnt")
    assert address_space == "unlimited" or int(address_space) > 0
    lines = (tmp_path / "cc" / "calls.log").read_text().splitlines()
    assert len(lines) == 1
    argv = lines[0].split()[1:]  # "<pid> <argv...>" of the wrapper, i.e. what the queue ran
    assert argv[:4] == ["-x", "c", "-c", "-fPIC"], argv
    assert "-MD" not in argv and "-MF" not in argv  # no dependency file for this source


def _ns_probe(folder: Path) -> tuple[Path, Path]:
    """A wrapper gcc that logs, per compile, its user namespace and ``ulimit -v`` (KiB)."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o777)
    log = folder / "ns.log"
    body = f"echo $(readlink /proc/self/ns/user) $(ulimit -v) >> {log}"
    cc = counting_cc(folder / "cc", body=body)
    (folder / "cc").chmod(0o777)
    return cc, log


def test_the_daemons_own_user_compiles_under_the_limits_without_namespaces(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    from cachemgr.client import Client

    cc, log = _ns_probe(tmp_path / "probe")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[compilers]\ncc = "{cc}"\n[sandbox]\naddress_space_mb = 8192\n')
    src = tmp_path / "k.c"
    src.write_text(KERNEL)
    req = tmp_path / "req.json"
    req.write_text(json.dumps(scale_request(str(src), defines={"K": 2})))
    args = ("--cache-dir", str(tmp_path / "cache"), "--config", str(cfg))
    daemon = start_daemon(tmp_path, *args, env=daemon_env(tmp_path))
    try:
        out = Client(daemon.socket_path, timeout_s=120).compile_file(req).to_json()
        assert out["status"] == "compiled", out
        namespace = os.readlink(f"/proc/{daemon.proc.pid}/ns/user")
        # the sandbox works here (else the test would prove nothing): it is the caller's
        assert "other users' compiles run in an allow-list view" in daemon.log()
    finally:
        daemon.stop()
    assert log.read_text().split() == [namespace, str(8192 * 1024)]


def test_another_users_compile_runs_in_the_view_under_the_limits(
    users: Users, other_runtime: Runtime
) -> None:
    """Another user's compile runs in bubblewrap's allow-list view: the compiler's ``/``
    holds the system folders and an empty ``/tmp`` with its build folder, nothing of the
    host's home, work or ``/proc`` folders; and under the limits. The wrapper compiler
    reports what it sees by failing with it (nothing it writes outlives the view)."""
    from tests.test_deputy import CLIENT, _as_bob, _setup

    folder = users.base / "probe"
    body = 'echo "view: $(ls -A / | tr "\\n" " ")limit: $(ulimit -v) cwd: $(pwd)" >&2; exit 1'
    cc = counting_cc(folder, body=body)
    folder.chmod(0o755)
    config = f'[compilers]\ncc = "{cc}"\n[sandbox]\naddress_space_mb = 8192\n'
    daemon, _, _, bob = _setup(users, other_runtime, config)
    try:
        src = bob / "k.c"
        src.write_text(KERNEL)
        src.chmod(0o644)
        req = json.dumps(scale_request(str(src), defines={"K": 5}))
        out = _as_bob(users, other_runtime, bob, CLIENT, str(daemon.socket_path), req, str(bob))
    finally:
        daemon.stop()
    assert out["status"] == "failed", out
    line = out["error"].split("view: ", 1)[-1]  # after "cc-gcc failed (exit 1) compiling …: "
    seen = set(line.split("limit: ")[0].split())
    assert seen <= {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "dev", "tmp"}
    assert {"usr", "tmp", "dev"} <= seen, line
    assert f"limit: {8192 * 1024} " in line, line
    assert "cachemgr-build-" in line.split("cwd: ")[1], line


def test_the_compiler_has_a_group_of_its_own_in_the_callers_session(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """Its own process group (the kill takes everything it spawned), not its own session
    (a session is a CPU group of its own under autogroup scheduling)."""
    src = tmp_path / "k.c"
    src.write_text(KERNEL)
    log = tmp_path / "ids.log"
    cc = counting_cc(tmp_path / "cc", body=f"echo $$ $(cut -d' ' -f5,6 /proc/$$/stat) >> {log}")
    settings = make_settings(tmp_path, clean_env, compilers={"cc": str(cc)})
    with CompileQueue(settings, workers=1) as queue:
        _compile(queue, src, 2, tmp_path)
    pid, pgrp, session = log.read_text().split()
    assert pgrp == pid, "the compiler leads a process group of its own"
    assert int(session) == os.getsid(0), "the compiler stays in the caller's session"


def test_the_exit_is_awaited_without_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiler that closes its pipes, then exits a moment later: its output and status
    come back, and the wait for its exit sleeps in no polling loop (``Popen.wait`` with a
    timeout polls ``waitpid`` with sleeps of 0.5-50 ms)."""
    sleeps: list[float] = []
    real_sleep = subprocess.time.sleep  # type: ignore[attr-defined]

    def counting_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(subprocess.time, "sleep", counting_sleep)  # type: ignore[attr-defined]
    script = "echo out; echo err >&2; exec >&- 2>&-; sleep 0.3; exit 3"
    out = process.run_in_group(["/bin/sh", "-c", script], 30.0, None, "testing")
    assert (out.returncode, out.stdout, out.stderr) == (3, b"out\n", b"err\n")
    assert sleeps == []


def test_a_cached_miss_writes_its_json_once_into_the_chip_folder(
    tmp_path: Path, clean_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel json goes from the backend to the publish in memory: no temp file, rename,
    read back and unlink in the build folder. A compile outside the cache still writes it."""
    from cachemgr.storage import atomic, fsutil

    written: list[Path] = []
    real_write_temp = fsutil.write_temp

    def recording(dest: Path, *args: object, **kw: object) -> Path:
        written.append(Path(dest))
        return real_write_temp(dest, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(fsutil, "write_temp", recording)  # the store's calls
    monkeypatch.setattr(atomic, "write_temp", recording)  # atomic_write_bytes's own
    src = tmp_path / "k.c"
    src.write_text(KERNEL)
    settings = make_settings(tmp_path, clean_env)
    with CompileQueue(settings, workers=1, output_dir=tmp_path / "out") as queue:
        data = scale_request(str(src), defines={"K": 2})
        out = queue.compile(parse_request(data, tmp_path))
        assert out.status == "compiled" and out.cached, out
        jsons = [p for p in written if p.name.startswith("te_") and p.suffix == ".json"]
        (doc,) = [f for f in out.files if f.suffix == ".json"]
        assert jsons == [doc], jsons  # the chip folder's, and nothing else
        assert json.loads(doc.read_bytes())["supportInfo"]["opType"] == "Scale"
        written.clear()
        data = scale_request(
            str(src), defines={"K": 3}, options={"op_compiler_cache_mode": "disable"}
        )
        out = queue.compile(parse_request(data, tmp_path))
        assert out.status == "compiled" and not out.cached, out
        assert [f.parent for f in out.files] == [tmp_path / "out"] * 2
        assert any(p.suffix == ".json" for p in written)
