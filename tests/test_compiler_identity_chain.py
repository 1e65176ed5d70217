"""A compiler's identity covers every file whose change changes what runs
(cachemgr/compilers/stamp.py, docs/compiling.md#the-compiler): a wrapper script on ``PATH``
that runs a toolchain through a link (``exec /opt/tc/current/bin/gcc``, as CANN's
``ascend-toolkit/latest`` or ``update-alternatives`` flip it), and ccache's masquerade link
(``ccbin/gcc -> ccache``) whose real compiler is the next ``gcc`` on ``PATH``. After the link
is flipped from gcc to clang, each route — the direct CLI path, a daemon, a ``Client``'s
remembered hits — gives a miss compiled by clang with clang's identity in its json, and a
compiler that changes between the key and the publish publishes nothing under the old key.
Real gcc and clang, real files, a real daemon."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cachemgr.client import Client
from tests.compile_util import SOC
from tests.daemon_util import Daemon, daemon_env, start_daemon

SOURCE = "void scale_kernel(float *x) { x[0] *= 2.0f; }\n"
TENSOR = {"shape": [16], "dtype": "float32", "format": "ND"}


def _real(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed")
    return os.path.realpath(found)


def _built_by(obj: Path) -> str:
    """``clang`` or ``gcc``: the compiler named in the object's ``.comment`` section."""
    data = obj.read_bytes()
    if b"clang version" in data:
        return "clang"
    if b"GCC: (" in data:
        return "gcc"
    raise AssertionError(f"{obj}: no compiler named in it")


def _entries(chip: Path) -> dict[str, tuple[str, str]]:
    """Each entry of ``chip``: kernel name → (compiler that built its object, its json's
    version line)."""
    out = {}
    for doc_path in sorted(chip.glob("te_scale_*.json")):
        if doc_path.name.endswith(".manifest.json"):
            continue
        doc = json.loads(doc_path.read_text())
        if "compileInfo" not in doc:
            continue
        out[doc_path.stem] = (_built_by(doc_path.with_suffix(".o")), doc["compileInfo"]["version"])
    return out


class Toolchain:
    """``tc/gcc/bin/gcc`` → gcc, ``tc/clang/bin/gcc`` → clang, ``tc/current`` → ``gcc``,
    and ``bin/gcc`` a wrapper script ``exec <tc>/current/bin/gcc "$@"`` (``before`` runs
    first); a project with a request file and a cache."""

    def __init__(self, tmp: Path, before: str = "") -> None:
        self.tc = tmp / "tc"
        for kind, real in (("gcc", _real("gcc")), ("clang", _real("clang"))):
            (self.tc / kind / "bin").mkdir(parents=True)
            (self.tc / kind / "bin" / "gcc").symlink_to(real)
        (self.tc / "current").symlink_to("gcc")
        self.bin = tmp / "bin"
        self.bin.mkdir()
        wrapper = self.bin / "gcc"
        wrapper.write_text(f'#!/bin/sh\n{before}exec {self.tc}/current/bin/gcc "$@"\n')
        wrapper.chmod(0o755)
        self.project = tmp / "proj"
        self.project.mkdir()
        (self.project / "k.c").write_text(SOURCE)
        self.cache = tmp / "cache"
        self.chip = self.cache / "kernel_cache" / SOC

    def flip(self, to: str = "clang") -> None:
        """Point ``tc/current`` at ``to`` (a new link renamed over the old one: ``ln -sfn``)."""
        tmp = self.tc / "current.new"
        tmp.symlink_to(to)
        os.replace(tmp, self.tc / "current")

    def request(self, **over: Any) -> dict[str, Any]:
        return {
            "op_type": "Scale",
            "soc_version": SOC,
            "language": "c",
            "kernel_source": str(self.project / "k.c"),
            "kernel_entry": "scale_kernel",
            "inputs": [TENSOR],
            "outputs": [TENSOR],
            **over,
        }

    def write_request(self, name: str = "req.json", **over: Any) -> str:
        (self.project / name).write_text(json.dumps(self.request(**over)))
        return name


def _cli(env: dict[str, str], cwd: Path, *argv: str) -> tuple[str, str, dict[str, Any]]:
    """``python -X importtime -m cachemgr compile --json ARGV``: (path that answered:
    ``direct`` when click was never imported, else ``full``; stderr without import lines;
    the answer)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cachemgr", "compile", "--json", *argv],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )
    lines = proc.stderr.splitlines()
    imported = {ln.rsplit("|", 1)[1].strip() for ln in lines if ln.startswith("import time:")}
    path = "full" if "click" in imported else "direct"
    err = "\n".join(ln for ln in lines if not ln.startswith("import time:"))
    assert proc.returncode == 0, proc.stdout + err
    return path, err, json.loads(proc.stdout)


def _env(tmp: Path, first: Path, **extra: str) -> dict[str, str]:
    env = daemon_env(tmp)
    env["XDG_CACHE_HOME"] = str(tmp / "xdg-cache")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PATH"] = f"{first}:{env.get('PATH', os.defpath)}"
    env.update(extra)
    return env


def _clang_miss(answer: dict[str, Any], chip: Path) -> None:
    """``answer`` is a miss compiled and cached by clang, its json saying clang."""
    assert answer["status"] == "compiled", answer
    built, version = _entries(chip)[answer["kernel_name"]]
    assert built == "clang" and "clang" in version, (built, version)


def test_direct_cli_hit_behind_a_wrapper_is_a_clang_miss_after_the_link_flips(
    tmp_path: Path,
) -> None:
    tc = Toolchain(tmp_path)
    env = _env(tmp_path, tc.bin)
    argv = ("--cache-dir", str(tc.cache), tc.write_request())
    statuses = [_cli(env, tc.project, *argv) for _ in range(3)]
    assert [(p, a["status"]) for p, _, a in statuses] == [
        ("full", "compiled"),
        ("full", "hit"),
        ("direct", "hit"),
    ]
    tc.flip()
    _, _, answer = _cli(env, tc.project, *argv)
    _clang_miss(answer, tc.chip)
    assert _cli(env, tc.project, *argv)[2]["status"] == "hit"  # keyed by clang now


@pytest.fixture
def toolchain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Toolchain:
    tc = Toolchain(tmp_path)
    monkeypatch.setenv("PATH", f"{tc.bin}:{os.environ.get('PATH', os.defpath)}")
    for key in list(os.environ):
        if key.startswith(("ASCEND_", "CACHEMGR_")) or key == "XDG_CACHE_HOME":
            monkeypatch.delenv(key)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return tc


@pytest.fixture
def daemon(tmp_path: Path, toolchain: Toolchain) -> Iterator[Daemon]:
    d = start_daemon(
        tmp_path, "--cache-dir", str(toolchain.cache), env=_env(tmp_path, toolchain.bin)
    )
    try:
        yield d
    finally:
        d.stop()


def test_daemon_behind_a_wrapper_compiles_with_clang_after_the_link_flips(
    tmp_path: Path, toolchain: Toolchain, daemon: Daemon
) -> None:
    env = _env(tmp_path, toolchain.bin)
    name = toolchain.write_request()
    other = toolchain.write_request("req2.json", defines={"B": 1})
    argv = ("--cache-dir", str(toolchain.cache))
    # a hit writes a direct memo: removed before each run, so the daemon answers each
    answers = []
    for _ in range(2):
        shutil.rmtree(tmp_path / "xdg-cache" / "cachemgr" / "direct", ignore_errors=True)
        answers.append(_cli(env, toolchain.project, *argv, name)[2])
    assert [a["status"] for a in answers] == ["compiled", "hit"]
    assert answers[1]["route"]["via"] == "daemon", answers[1]
    toolchain.flip()
    shutil.rmtree(tmp_path / "xdg-cache" / "cachemgr" / "direct", ignore_errors=True)
    _, _, answer = _cli(env, toolchain.project, *argv, name)
    assert answer["route"]["via"] == "daemon"
    _clang_miss(answer, toolchain.chip)
    _, _, answer = _cli(env, toolchain.project, *argv, other)  # a new request: clang's
    _clang_miss(answer, toolchain.chip)
    assert all(built in version for built, version in _entries(toolchain.chip).values())


def test_client_remembered_hit_behind_a_wrapper_is_a_clang_miss_after_the_link_flips(
    toolchain: Toolchain, daemon: Daemon
) -> None:
    client = Client(daemon.socket_path, timeout_s=120)
    try:
        request = toolchain.request()
        vias = [(o.status, o.via) for o in (client.compile(request) for _ in range(3))]
        assert vias[0][0] == "compiled" and vias[2] == ("hit", "client"), vias
        toolchain.flip()
        outcome = client.compile(request)
    finally:
        client.close()
    assert outcome.status == "compiled", outcome
    built, version = _entries(toolchain.chip)[outcome.kernel_name]
    assert built == "clang" and "clang" in version, (built, version)


def test_ccache_masquerade_is_identified_by_the_compiler_ccache_runs(tmp_path: Path) -> None:
    ccache = shutil.which("ccache")
    if ccache is None:
        subprocess.run(["apt-get", "install", "-y", "-q", "ccache"], capture_output=True)
        ccache = shutil.which("ccache")
    if ccache is None:
        pytest.skip("ccache is not installed and `apt-get install -y ccache` did not install it")
    ccbin, real = tmp_path / "ccbin", tmp_path / "real"
    ccbin.mkdir()
    real.mkdir()
    (ccbin / "gcc").symlink_to(ccache)  # ccache's masquerade set-up
    (real / "gcc").symlink_to(_real("gcc"))
    project = tmp_path / "proj"
    project.mkdir()
    (project / "k.c").write_text(SOURCE)
    tc = Toolchain.__new__(Toolchain)
    tc.project, tc.cache = project, tmp_path / "cache"
    tc.chip = tc.cache / "kernel_cache" / SOC
    env = _env(tmp_path, ccbin, CCACHE_DIR=str(tmp_path / "ccache-dir"))
    env["PATH"] = f"{ccbin}:{real}:{env['PATH']}"
    argv = ("--cache-dir", str(tc.cache))
    name, other = tc.write_request(), tc.write_request("req2.json", defines={"B": 1})
    answers = [_cli(env, project, *argv, name) for _ in range(3)]
    assert [(p, a["status"]) for p, _, a in answers][2] == ("direct", "hit"), answers
    assert _entries(tc.chip)[answers[0][2]["kernel_name"]][0] == "gcc"
    (real / "gcc").unlink()
    (real / "gcc").symlink_to(_real("clang"))
    _, _, answer = _cli(env, project, *argv, name)  # the memo is declined too
    _clang_miss(answer, tc.chip)
    shutil.rmtree(tmp_path / "xdg-cache" / "cachemgr" / "direct")
    _, _, answer = _cli(env, project, *argv, other)  # the full path, compilers.json read
    _clang_miss(answer, tc.chip)


def test_a_compiler_changed_between_key_and_publish_publishes_nothing_under_the_old_key(
    tmp_path: Path,
) -> None:
    flag = tmp_path / "flip-now"
    # the wrapper flips the toolchain to clang as the compile itself starts: the key was
    # computed with gcc's identity, the object is clang's
    before = (
        f'case " $* " in *" -c "*) if [ -e {flag} ]; then rm -f {flag}; '
        f"ln -sfn clang {tmp_path}/tc/current; fi ;; esac\n"
    )
    tc = Toolchain(tmp_path, before)
    env = _env(tmp_path, tc.bin)
    argv = ("--cache-dir", str(tc.cache), tc.write_request())
    flag.touch()
    _, err, answer = _cli(env, tc.project, *argv)
    assert not flag.exists(), "the wrapper did not flip the link"
    assert answer["status"] == "compiled" and "changed while it compiled" in err, (answer, err)
    assert _entries(tc.chip) == {}, "published under the key of the compiler that did not run"
    _, _, answer = _cli(env, tc.project, *argv)
    _clang_miss(answer, tc.chip)
    assert _cli(env, tc.project, *argv)[2]["status"] == "hit"
