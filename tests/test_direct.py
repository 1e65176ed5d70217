"""Direct mode (:mod:`cachemgr.direct`): a ``cachemgr compile`` hit answered from its memo
by real ``python -m cachemgr`` processes, against the full click path on the same requests
— output, exit code, counters, access times — and every change that makes the full path
answer otherwise making the direct path hand over to it. Which path answered is read from
``python -X importtime``: the direct path never imports click."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.compile_util import SOC
from tests.daemon_util import daemon_env, start_daemon

#: The only cachemgr modules a direct hit may import; and modules it must never import.
DIRECT_MODULES = {"cachemgr", "cachemgr.main", "cachemgr.direct", "cachemgr.constants"}
NEVER = ("click", "dataclasses", "logging", "pathlib", "typing", "http", "email", "inspect")

SOURCE = '#include "k.h"\nvoid scale_kernel(float *x) { x[0] *= SCALE; }\n'


class Run:
    """One ``python -m cachemgr`` process: exit code, stdout, stderr (import lines removed)
    and the modules it imported."""

    def __init__(self, proc: subprocess.CompletedProcess[str]) -> None:
        self.code = proc.returncode
        self.out = proc.stdout
        lines = proc.stderr.splitlines(keepends=True)
        self.err = "".join(line for line in lines if not line.startswith("import time:"))
        self.modules = {
            line.rsplit("|", 1)[1].strip()
            for line in lines
            if line.startswith("import time:") and "|" in line
        }

    @property
    def direct(self) -> bool:
        """Answered by the direct path (no click imported)."""
        return "click" not in self.modules

    def status(self) -> str:
        """The report's status (``hit``, ``compiled``…): the first word, or ``--json``'s."""
        if self.out.startswith("{"):
            return str(json.loads(self.out)["status"])
        return self.out.split()[0] if self.out else ""


def scale_request(include_dirs: list[str], **over: object) -> dict[str, object]:
    """The request of :data:`SOURCE` as ``k.c`` (paths relative to the request's folder)."""
    return {
        "op_type": "Scale",
        "soc_version": SOC,
        "language": "c",
        "kernel_source": "k.c",
        "kernel_entry": "scale_kernel",
        "inputs": [{"shape": [16], "dtype": "float32", "format": "ND"}],
        "outputs": [{"shape": [16], "dtype": "float32", "format": "ND"}],
        "include_dirs": include_dirs,
        **over,
    }


def write_scale_project(project: Path) -> Path:
    """``project`` with ``k.c`` (:data:`SOURCE`), ``inc/k.h`` and ``req.json`` naming them;
    returns the request file."""
    (project / "inc").mkdir(parents=True)
    (project / "inc" / "k.h").write_text("#define SCALE 2.0f\n")
    (project / "k.c").write_text(SOURCE)
    (project / "req.json").write_text(json.dumps(scale_request(["inc"])))
    return project / "req.json"


class Kit:
    """A project (source, header found in the second of two include folders), a request
    file, a cache and an environment of the test's own."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.env = daemon_env(tmp)
        self.env["XDG_CACHE_HOME"] = str(tmp / "xdg-cache")
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)
        self.bin = tmp / "bin"  # first on PATH, empty: a compiler put there comes first
        self.bin.mkdir()
        self.env["PATH"] = f"{self.bin}:{self.env.get('PATH', os.defpath)}"
        self.project = tmp / "proj"
        for sub in ("inc_first", "inc"):
            (self.project / sub).mkdir(parents=True)
        (self.project / "inc" / "k.h").write_text("#define SCALE 2.0f\n")
        (self.project / "k.c").write_text(SOURCE)
        self.request = self.project / "req.json"
        self.write_request()
        self.cache = tmp / "cache"
        self.chip = self.cache / "kernel_cache" / SOC
        self.argv = ["compile", "--cache-dir", str(self.cache), "req.json"]

    def write_request(self, **over: object) -> None:
        """The request file (relative paths: relative to its folder)."""
        self.request.write_text(json.dumps(scale_request(["inc_first", "inc"], **over)))

    def run(self, *extra: str, argv: list[str] | None = None, **env: str) -> Run:
        """``python -X importtime -m cachemgr ARGV`` in the project folder."""
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "cachemgr", *(argv or self.argv), *extra],
            env={**self.env, **env},
            cwd=self.project,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return Run(proc)

    def memos(self) -> list[Path]:
        """The memo files written so far."""
        folder = self.tmp / "xdg-cache" / "cachemgr" / "direct"
        return sorted(folder.glob("*.memo")) if folder.is_dir() else []

    def hits(self) -> int:
        """The ``hits`` counter of the chip folder's stats file."""
        path = self.cache / "kernel_cache" / f"cachemgr_stats_{SOC}.json"
        return int(json.loads(path.read_text()).get("hits", 0))

    def primed(self, *extra: str) -> Run:
        """Compile, hit through the full path (it writes the memo), hit through the direct
        path; returns the direct hit."""
        first = self.run(*extra)
        assert first.code == 0 and first.status() == "compiled", first.out + first.err
        full = self.run(*extra)
        assert full.code == 0 and full.status() == "hit" and not full.direct, full.err
        assert self.memos(), "the full hit wrote no memo"
        lean = self.run(*extra)
        assert lean.code == 0 and lean.direct, lean.err
        return lean


def _no_seconds(text: str) -> str:
    """The output with the seconds taken out (the one thing two runs may differ in)."""
    text = re.sub(r"  \d+\.\d{3}s  ", "  S  ", text)
    return re.sub(r'"seconds": [0-9.e-]+', '"seconds": S', text)


@pytest.mark.parametrize("extra", [(), ("--json",)], ids=["text", "json"])
def test_direct_hit_says_and_does_what_the_full_hit_does(tmp_path: Path, extra: tuple[str]) -> None:
    kit = Kit(tmp_path)
    kit.primed(*extra)
    hits = kit.hits()
    parts = sorted(p for p in kit.chip.glob("te_scale_*") if p.suffix != ".lock")
    for part in parts:  # access times a day old: a hit sets them to now
        st = part.stat()
        os.utime(part, ns=(st.st_atime_ns - 86400 * 10**9, st.st_mtime_ns))
    before = {p: p.stat() for p in parts}
    lean = kit.run(*extra)
    assert lean.direct and lean.code == 0 and lean.err == ""
    assert kit.hits() == hits + 1
    for part, st in before.items():
        now = part.stat()
        assert now.st_atime_ns > st.st_atime_ns, f"{part.name}: access time not set"
        assert now.st_mtime_ns == st.st_mtime_ns and now.st_mode == st.st_mode
    shutil.rmtree(kit.memos()[0].parent)  # no memo: the full path answers the same request
    full = kit.run(*extra)
    assert not full.direct and full.code == 0 and full.err == ""
    assert _no_seconds(lean.out) == _no_seconds(full.out)
    assert kit.hits() == hits + 2
    if extra:
        answer = json.loads(lean.out)
        assert answer["status"] == "hit" and answer["route"]["via"] == "local"
        assert sorted(answer["files"]) == [str(p) for p in parts]


def test_direct_hit_imports_only_its_own_modules(tmp_path: Path) -> None:
    kit = Kit(tmp_path)
    lean = kit.primed()
    ours = {m for m in lean.modules if m == "cachemgr" or m.startswith("cachemgr.")}
    assert ours <= DIRECT_MODULES, sorted(ours - DIRECT_MODULES)
    # what the interpreter imports before any of cachemgr's code (an editable install's
    # finder imports pathlib) is not the hit's
    floor = Run(
        subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "pass"],
            env=kit.env,
            capture_output=True,
            text=True,
            check=True,
        )
    ).modules
    mine = lean.modules - floor
    assert sorted(m for m in mine if any(m == n or m.startswith(n + ".") for n in NEVER)) == []


def _edit_header(kit: Kit) -> None:
    (kit.project / "inc" / "k.h").write_text("#define SCALE 3.0f\n")


def _header_earlier(kit: Kit) -> None:
    (kit.project / "inc_first" / "k.h").write_text("#define SCALE 4.0f\n")


def _compiler_first_on_path(kit: Kit) -> None:
    gcc = shutil.which("gcc")
    assert gcc is not None
    wrapper = kit.bin / "gcc"
    wrapper.write_text(f'#!/bin/sh\nexec {gcc} "$@"\n')
    wrapper.chmod(0o755)


def _corrupt_binary(kit: Kit) -> None:
    (binary,) = kit.chip.glob("te_scale_*.o")
    data = bytearray(binary.read_bytes())
    data[-1] ^= 0xFF
    binary.write_bytes(bytes(data))


def _remove_entry(kit: Kit) -> None:
    for part in kit.chip.glob("te_scale_*"):
        part.unlink()


def _edit_request(kit: Kit) -> None:
    kit.write_request(defines={"EXTRA": 1})


def _edit_ini(kit: Kit) -> None:
    (kit.cache / "kernel_cache" / "op_cache.ini").write_text(
        "[op_compiler_cache]\nmax_op_cache_size=400\n"
    )


def _plant_socket(kit: Kit) -> None:
    import socket

    path = Path(kit.env["XDG_RUNTIME_DIR"]) / "cachemgr" / "cachemgr.sock"
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()  # a socket nobody listens on: the full path asks, finds no daemon, runs here


def _shared_memo(kit: Kit) -> None:
    for memo in kit.memos():
        memo.chmod(0o666)  # another user could have written it: never read


def _memo_link(kit: Kit) -> None:
    (memo,) = kit.memos()
    target = memo.with_suffix(".target")
    memo.rename(target)
    memo.symlink_to(target)


def _memo_folder_of_another_user(kit: Kit) -> None:
    (memo,) = kit.memos()
    os.chown(memo.parent, 65534, 65534)  # nobody's folder: its memos are not ours to trust
    os.chown(memo, 65534, 65534)


#: (how the world changes, extra argv, extra environment, the full path's status then).
CHANGES: dict[str, tuple[Callable[[Kit], None] | None, tuple[str, ...], dict[str, str], str]] = {
    "header edited": (_edit_header, (), {}, "compiled"),
    "header created earlier in the search path": (_header_earlier, (), {}, "compiled"),
    "CPATH set": (None, (), {"CPATH": "/nonexistent-include"}, "compiled"),
    "compiler put first on PATH": (_compiler_first_on_path, (), {}, "compiled"),
    "mode force": (None, ("--mode", "force"), {}, "compiled"),
    "op_debug_level set": (None, ("--op-debug-level", "1"), {}, "debug"),
    "entry corrupted": (_corrupt_binary, (), {}, "compiled"),
    "entry removed": (_remove_entry, (), {}, "compiled"),
    "request edited": (_edit_request, (), {}, "compiled"),
    "op_cache.ini changed": (_edit_ini, (), {}, "hit"),
    "a socket at the default path": (_plant_socket, (), {}, "hit"),
    "memo writable by others": (_shared_memo, (), {}, "hit"),
    "memo is a link": (_memo_link, (), {}, "hit"),
    "memo folder of another user": (_memo_folder_of_another_user, (), {}, "hit"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_every_change_the_full_path_sees_hands_over_to_it(tmp_path: Path, change: str) -> None:
    kit = Kit(tmp_path)
    kit.primed()
    how, extra, env, status = CHANGES[change]
    if how is not None:
        how(kit)
    after = kit.run(*extra, **env)
    assert not after.direct, f"{change}: answered from the memo"
    assert after.status() == status, after.out + after.err
    assert after.code == 0, after.err


def test_config_file_changed_hands_over(tmp_path: Path) -> None:
    kit = Kit(tmp_path)
    config = tmp_path / "cachemgr.toml"
    config.write_text("# nothing set\n")
    kit.primed("--config", str(config))
    config.write_text('op_compiler_cache_mode = "force"\n')
    after = kit.run("--config", str(config))
    assert not after.direct and after.status() == "compiled", after.out + after.err


def test_compiler_replaced_in_place_hands_over(tmp_path: Path) -> None:
    kit = Kit(tmp_path)
    _compiler_first_on_path(kit)
    kit.primed()
    gcc = shutil.which("gcc", path=kit.env["PATH"].split(":", 1)[1])
    (kit.bin / "gcc").write_text(f'#!/bin/sh\n# another build\nexec {gcc} "$@"\n')
    after = kit.run()
    assert not after.direct and after.status() == "compiled", after.out + after.err


def test_memos_are_not_cache_files(tmp_path: Path) -> None:
    """Memos live outside the cache: ``verify`` finds nothing of theirs, and an entry
    evicted under one (``purge``) is a hand-over, not an orphan."""
    kit = Kit(tmp_path)
    kit.primed()
    verify = kit.run(argv=["verify", "--cache-dir", str(kit.cache)])
    assert verify.code == 0, verify.out + verify.err
    assert not list(kit.cache.rglob("*direct*"))
    purge = kit.run(argv=["purge", "--cache-dir", str(kit.cache), "--all", "--yes"])
    assert purge.code == 0, purge.out + purge.err
    after = kit.run()
    assert not after.direct and after.status() == "compiled"
    again = kit.run(argv=["verify", "--cache-dir", str(kit.cache)])
    assert again.code == 0, again.out + again.err


def test_a_running_daemon_gets_the_request(tmp_path: Path) -> None:
    """With a daemon on the default socket the memo of a local run is not used: the daemon
    answers, as it would without a memo."""
    kit = Kit(tmp_path)
    kit.primed("--json")
    daemon = start_daemon(tmp_path, "--cache-dir", str(kit.cache), env=kit.env)
    try:
        via = kit.run("--json")
    finally:
        daemon.stop()
    assert json.loads(via.out)["route"]["via"] == "daemon"


class DaemonKit(Kit):
    """A :class:`Kit` whose cache a real daemon on the default socket serves."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.daemon = start_daemon(tmp, "--cache-dir", str(self.cache), env=self.env)

    def daemon_counts(self) -> tuple[int, int]:
        """The daemon's ``hits`` and ``misses`` (its own counters, flushed or not)."""
        stats = self.daemon.client.stats()
        return stats.counters["hits"], stats.counters["misses"]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[DaemonKit]:
    kit = DaemonKit(tmp_path)
    try:
        yield kit
    finally:
        kit.daemon.stop()


#: What a direct hit through the daemon may import beyond the local one's: the wire.
DAEMON_MODULES = DIRECT_MODULES | {"cachemgr.directwire"}


@pytest.mark.parametrize("extra", [(), ("--json",)], ids=["text", "json"])
def test_direct_hit_through_the_daemon_says_and_counts_what_the_full_hit_does(
    served: DaemonKit, extra: tuple[str]
) -> None:
    lean = served.primed(*extra)
    assert lean.status() == "hit"
    ours = {m for m in lean.modules if m == "cachemgr" or m.startswith("cachemgr.")}
    assert ours <= DAEMON_MODULES, sorted(ours - DAEMON_MODULES)
    assert not [m for m in lean.modules if m.split(".")[0] in ("click", "http", "email")]
    hits, misses = served.daemon_counts()
    again = served.run(*extra)
    assert again.direct and again.code == 0 and again.err == ""
    assert served.daemon_counts() == (hits + 1, misses), "one request, one hit"
    shutil.rmtree(served.memos()[0].parent)
    full = served.run(*extra)
    assert not full.direct and full.code == 0 and full.err == ""
    assert served.daemon_counts() == (hits + 2, misses)
    assert _no_seconds(again.out) == _no_seconds(full.out)
    if extra:
        assert json.loads(again.out)["route"]["via"] == "daemon"


def test_daemon_answering_otherwise_is_reported_by_the_full_path(served: DaemonKit) -> None:
    """The entry corrupted behind the memo: the request is sent once, the daemon compiles,
    and the full path's code reports its answer."""
    served.primed()
    _corrupt_binary(served)
    hits, misses = served.daemon_counts()
    after = served.run()
    assert after.code == 0 and after.status() == "compiled", after.out + after.err
    assert served.daemon_counts() == (hits, misses + 1), "sent once"


@pytest.mark.parametrize("change", ["header edited", "request edited", "CPATH set"])
def test_changes_hand_over_through_the_daemon_too(served: DaemonKit, change: str) -> None:
    served.primed()
    how, extra, env, status = CHANGES[change]
    if how is not None:
        how(served)
    after = served.run(*extra, **env)
    assert not after.direct and after.status() == status, after.out + after.err


def test_daemon_gone_hands_over(served: DaemonKit) -> None:
    served.primed()
    served.daemon.stop()
    after = served.run()
    assert not after.direct and after.status() == "hit", after.out + after.err
    assert "route" not in after.err


def test_stats_files_are_read_and_written_in_the_counters_own_form(tmp_path: Path) -> None:
    """The direct path parses and writes a stats file without json: what
    :class:`cachemgr.storage.counters.CacheCounters` writes reads back the same, and its own
    bytes come out of :func:`cachemgr.direct.dump_counts`; any other form is declined."""
    from cachemgr import direct
    from cachemgr.storage.counters import CacheCounters, stats_file

    kcache = tmp_path / "cache" / "kernel_cache"
    kcache.mkdir(parents=True)
    counters = CacheCounters(kcache)
    for name, amount in (("hits", 3), ("misses", 1), ("evicted_bytes", 2**40)):
        counters.add(name, amount, SOC)
    assert counters.flush()
    raw = stats_file(kcache, SOC).read_bytes()
    parsed = direct.parse_counts(raw)
    assert parsed == {"hits": 3, "misses": 1, "evicted_bytes": 2**40}
    assert direct.dump_counts(parsed) == raw
    for odd in (b'{"hits": 1,"misses": 2}', b'{"hits": 1.0}', b'{"b": 1, "a": 2}', b"[]"):
        assert direct.parse_counts(odd) is None, odd


def _releases(kit: Kit, how: str) -> list[str]:
    """Two releases of the project under ``kit.tmp/rel`` whose request files are the same
    bytes and whose header differs (``SCALE`` 2 in ``r1``, 5 in ``r2``), and the argv
    reaching ``r1``'s request through a link: the folder ``current -> r1`` (``how`` =
    ``folder``) or the request file ``req.json -> r1/req.json`` (``file``)."""
    rel = kit.tmp / "rel"
    for name, scale in (("r1", "2.0f"), ("r2", "5.0f")):
        shutil.copytree(kit.project, rel / name)
        (rel / name / "inc" / "k.h").write_text(f"#define SCALE {scale}\n")
    if how == "folder":
        (rel / "current").symlink_to("r1")
        request = rel / "current" / "req.json"
    else:
        (rel / "req.json").symlink_to("r1/req.json")
        request = rel / "req.json"
    return ["compile", "--cache-dir", str(kit.cache), str(request)]


def _flip(kit: Kit, how: str) -> None:
    """Point the link of :func:`_releases` at ``r2`` (atomically, as ``ln -sfn`` does)."""
    rel = kit.tmp / "rel"
    link, target = (rel / "current", "r2") if how == "folder" else (rel / "req.json", "r2/req.json")
    tmp = rel / ".flip"
    tmp.symlink_to(target)
    tmp.rename(link)


def _primed_argv(kit: Kit, argv: list[str]) -> Run:
    """:meth:`Kit.primed` for another ``argv``."""
    first = kit.run(argv=argv)
    assert first.code == 0 and first.status() == "compiled", first.out + first.err
    full = kit.run(argv=argv)
    assert full.status() == "hit" and not full.direct and kit.memos(), full.out + full.err
    lean = kit.run(argv=argv)
    assert lean.code == 0 and lean.direct and lean.status() == "hit", lean.out + lean.err
    return lean


def _kernel(run: Run) -> str:
    """The kernel name of a text report (``hit te_scale_…  0.001s …``)."""
    return run.out.split()[1]


@pytest.mark.parametrize("how", ["folder", "file"])
def test_request_reached_through_a_flipped_link_hands_over(tmp_path: Path, how: str) -> None:
    """The base folder of a request is its real path's folder: a link on the way pointed
    elsewhere (same request bytes, another header behind it) is the full path's, which
    compiles the other release's kernel — and says what a run without memos says."""
    kit = Kit(tmp_path)
    argv = _releases(kit, how)
    before = _primed_argv(kit, argv)
    _flip(kit, how)
    after = kit.run(argv=argv)
    assert not after.direct, "answered the old release's kernel from the memo"
    assert after.code == 0 and after.status() == "compiled", after.out + after.err
    assert _kernel(after) != _kernel(before)
    again = kit.run(argv=argv)  # the full path hits r2's kernel and memos it: direct next
    shutil.rmtree(kit.memos()[0].parent)
    full = kit.run(argv=argv)
    assert not full.direct and _no_seconds(again.out) == _no_seconds(full.out)


def test_request_reached_through_a_flipped_link_hands_over_through_the_daemon(
    served: DaemonKit,
) -> None:
    """As above through a running daemon: the direct path must not send the old release's
    source for the new one."""
    argv = _releases(served, "folder")
    before = _primed_argv(served, argv)
    _flip(served, "folder")
    hits, misses = served.daemon_counts()
    after = served.run(argv=argv)
    assert not after.direct, "sent the old release's source from the memo"
    assert after.code == 0 and after.status() == "compiled", after.out + after.err
    assert _kernel(after) != _kernel(before)
    assert served.daemon_counts() == (hits, misses + 1)


def _rewriting_compiler(kit: Kit, path: Path, content: str) -> Path:
    """A ``gcc`` first on ``PATH`` that, the first time it runs once the returned trigger
    file exists, rewrites ``path`` with ``content`` (atomically, as a generator does) and
    then runs gcc: a rewrite in the middle of a run, at the moment the run identifies its
    compiler (after it parsed its request and settings, before it writes its memo)."""
    gcc = shutil.which("gcc")
    assert gcc is not None
    trigger = kit.tmp / "rewrite-now"
    new = kit.tmp / "rewrite.content"
    new.write_text(content)
    (kit.bin / "gcc").write_text(
        "#!/bin/sh\n"
        f'if [ -e "{trigger}" ]; then rm -f "{trigger}"; cp "{new}" "{path}.t" && '
        f'mv "{path}.t" "{path}"; fi\n'
        f'exec {gcc} "$@"\n'
    )
    (kit.bin / "gcc").chmod(0o755)
    return trigger


def _identity_forgotten(kit: Kit) -> None:
    """No compiler identity remembered on disk: the next run runs the compiler to learn it."""
    (kit.tmp / "xdg-cache" / "cachemgr" / "compilers.json").unlink()


def test_request_rewritten_during_the_run_is_not_tied_to_its_hit(tmp_path: Path) -> None:
    """The memo binds the hit to the request bytes the run parsed: a request rewritten
    while the run went on (here when the compiler is identified) gives no memo that
    answers the old request's kernel for the new bytes."""
    kit = Kit(tmp_path)
    data = json.loads(kit.request.read_text())
    rewritten = json.dumps({**data, "defines": {"VARIANT": 2}})
    trigger = _rewriting_compiler(kit, kit.request, rewritten)
    first = kit.run()
    assert first.status() == "compiled", first.out + first.err
    _identity_forgotten(kit)
    trigger.write_text("")
    hit = kit.run()  # parses the old request, hits, and the request is rewritten meanwhile
    assert hit.status() == "hit" and not hit.direct, hit.out + hit.err
    assert not trigger.exists() and kit.request.read_text() == rewritten
    after = kit.run()
    assert not after.direct, "the old request's hit answered for the rewritten request"
    assert after.code == 0 and after.status() == "compiled", after.out + after.err
    assert _kernel(after) != _kernel(hit)


def test_config_rewritten_during_the_run_is_not_tied_to_its_hit(tmp_path: Path) -> None:
    """As above for the ``--config`` file: switched to ``disable`` while a hit ran under
    the old one, it gets no direct hit."""
    kit = Kit(tmp_path)
    config = tmp_path / "cachemgr.toml"
    config.write_text("# cache on\n")
    trigger = _rewriting_compiler(kit, config, 'op_compiler_cache_mode = "disable"\n')
    first = kit.run("--config", str(config))
    assert first.status() == "compiled", first.out + first.err
    _identity_forgotten(kit)
    trigger.write_text("")
    hit = kit.run("--config", str(config))
    assert hit.status() == "hit" and not hit.direct, hit.out + hit.err
    assert not trigger.exists() and "disable" in config.read_text()
    after = kit.run("--config", str(config))
    assert not after.direct, "a hit answered under a config that disables the cache"
    assert after.code == 0 and after.status() != "hit", after.out + after.err


def test_ini_rewritten_during_the_run_is_not_tied_to_its_hit(tmp_path: Path) -> None:
    """As above for ``op_cache.ini``: one that became doubtful while a hit ran under the
    old one is the full path's, which warns about it."""
    kit = Kit(tmp_path)
    ini = kit.cache / "kernel_cache" / "op_cache.ini"
    trigger = _rewriting_compiler(kit, ini, "[op_compiler_cache]\nmax_op_cache_size=lots\n")
    first = kit.run()
    assert first.status() == "compiled", first.out + first.err
    _identity_forgotten(kit)
    trigger.write_text("")
    hit = kit.run()
    assert hit.status() == "hit" and not hit.direct and hit.err == "", hit.out + hit.err
    assert not trigger.exists() and "lots" in ini.read_text()
    after = kit.run()
    assert not after.direct, "a hit answered without the doubtful ini's warning"
    assert after.status() == "hit" and "max_op_cache_size" in after.err, after.out + after.err


@pytest.mark.parametrize(("folder", "want"), [(0o755, 0o660), (0o2775, 0o664)])
def test_direct_hit_writes_the_stats_file_with_the_full_paths_mode(
    tmp_path: Path, folder: int, want: int
) -> None:
    """Others may read the stats file only in a setgid kernel cache folder that lets them
    (the rule of :func:`cachemgr.storage.modes.file_mode_in`), on both paths."""
    kit = Kit(tmp_path)
    kit.primed()
    kcache = kit.cache / "kernel_cache"
    kcache.chmod(folder)  # the memo records the folder's mode: a new one is written
    shutil.rmtree(kit.memos()[0].parent)
    stats = kcache / f"cachemgr_stats_{SOC}.json"
    full = kit.run()
    assert not full.direct and full.status() == "hit", full.out + full.err
    assert stats.stat().st_mode & 0o7777 == want
    stats.chmod(0o600)  # rewritten by the direct hit: its mode is the hit's
    lean = kit.run()
    assert lean.direct and lean.status() == "hit", lean.out + lean.err
    assert stats.stat().st_mode & 0o7777 == want


def test_memo_temp_files_left_by_a_killed_writer_are_pruned(tmp_path: Path) -> None:
    """A memo write killed between its temp file and the rename leaves a ``*.temp``; the
    next memo written removes it (and any temp older than an hour), never a live writer's."""
    from cachemgr.constants import short_host

    kit = Kit(tmp_path)
    kit.primed()
    (memo,) = kit.memos()
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = memo.parent / f"{memo.name}.{short_host()}.{gone.pid}.0badf00d.temp"
    old = memo.parent / f"{memo.name}.otherhost.1.deadbeef.temp"
    live = memo.parent / f"{memo.name}.{short_host()}.{os.getpid()}.cafecafe.temp"
    for temp in (dead, old, live):
        temp.write_bytes(b"half a memo")
    os.utime(old, (0, 0))
    memo.unlink()
    full = kit.run()  # a full hit: it writes the memo again
    assert not full.direct and full.status() == "hit" and kit.memos(), full.out + full.err
    assert not dead.exists() and not old.exists()
    assert live.exists()
