"""A request ``cachemgr.Client`` has served as a hit is served again from what its preparation
read, re-checked (cachemgr/localhit.py) — and every change the full preparation would see
still changes the answer: a damaged binary or json, an edited header or source, a file
appearing where the compiler searched in vain, the caller's environment, the request's own
data (changed in place; ``True`` is not ``1``), the folder a relative path names. Real daemon,
real gcc, real files; each test first checks the request was remembered (so the re-checked
path is the one under test), then compares the answer with that of a fresh client, which
prepares in full."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from cachemgr.client import Client, DaemonError
from cachemgr.compile.results import CompileOutcome
from cachemgr.storage import entry
from cachemgr.storage.store import Store
from tests.conftest import publish
from tests.daemon_util import Daemon, start_daemon, wait_for
from tests.proc_util import fd_targets

TENSOR = {"shape": [16], "dtype": "float32", "format": "ND"}
SOURCE = '#include "k.h"\nvoid k_kernel(float *x) { x[0] = V; }\n'


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    old = time.time() - 10  # not "racy": its digest may be remembered per file identity
    os.utime(path, (old, old))
    return path


@pytest.fixture
def daemon(tmp_path: Path, clean_env: dict[str, str]) -> Iterator[Daemon]:
    d = start_daemon(tmp_path, "--cache-dir", str(tmp_path / "cache"))
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    c = Client(daemon.socket_path, timeout_s=120)
    try:
        yield c
    finally:
        c.close()


def _kernel(folder: Path, value: int = 1) -> dict[str, Any]:
    """A kernel whose header ``k.h`` is found in ``inc`` after the source's own folder was
    searched in vain (its manifest names the header and that place)."""
    _write(folder / "inc" / "k.h", f"#define V {value}\n")
    src = _write(folder / "src" / "k.c", SOURCE)
    return {
        "op_type": "Add", "soc_version": "Ascend910B1", "language": "c",
        "kernel_source": str(src), "kernel_entry": "k_kernel",
        "include_dirs": [str(folder / "inc")], "inputs": [TENSOR], "outputs": [TENSOR],
    }  # fmt: skip


def _remembered(client: Client, data: dict[str, Any], base: Path | str = "/") -> CompileOutcome:
    """Compile ``data``, hit it, and check the next hit is served from its remembered plan."""
    first = client.compile(data, base_dir=base)
    assert first.status in ("compiled", "hit"), first
    second = client.compile(data, base_dir=base)
    assert (second.status, second.via) == ("hit", "client"), second
    plans = client._side._plans
    assert plans is not None and plans.again(data, base, *client._side._state(), 0.0)
    third = client.compile(data, base_dir=base)
    assert (third.status, third.via, third.kernel_name) == ("hit", "client", first.kernel_name)
    return third


def _fresh(daemon: Daemon, data: dict[str, Any], base: Path | str = "/") -> CompileOutcome:
    """What a client that remembers nothing answers (the full preparation)."""
    c = Client(daemon.socket_path, timeout_s=120)
    try:
        return c.compile(data, base_dir=base)
    finally:
        c.close()


def _binary(outcome: CompileOutcome) -> Path:
    return next(f for f in outcome.files if f.suffix == ".o")


def _entry_good(outcome: CompileOutcome) -> bool:
    doc = json.loads(next(f for f in outcome.files if f.suffix == ".json").read_bytes())
    return bool(hashlib.sha256(_binary(outcome).read_bytes()).hexdigest() == doc["sha256"])


def test_a_remembered_hit_answers_as_the_full_path(
    client: Client, daemon: Daemon, tmp_path: Path
) -> None:
    data = _kernel(tmp_path)
    again = _remembered(client, data)
    full = _fresh(daemon, data)
    assert (full.status, full.kernel_name, full.files) == ("hit", again.kernel_name, again.files)
    assert again.policy == full.policy and again.note == full.note
    assert _entry_good(again)


def test_a_damaged_binary_is_still_found_bad(client: Client, tmp_path: Path) -> None:
    data = _kernel(tmp_path)
    hit = _remembered(client, data)
    binary = _binary(hit)
    damaged = bytearray(binary.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # same size: only its SHA-256 tells
    binary.write_bytes(bytes(damaged))
    out = client.compile(data, base_dir="/")
    assert out.status == "compiled" and out.kernel_name == hit.kernel_name, out
    assert _entry_good(out)


def test_a_damaged_json_is_still_found_bad(client: Client, tmp_path: Path) -> None:
    data = _kernel(tmp_path)
    hit = _remembered(client, data)
    doc = next(f for f in hit.files if f.suffix == ".json")
    doc.write_bytes(doc.read_bytes()[:-20])  # truncated
    out = client.compile(data, base_dir="/")
    assert out.status == "compiled" and out.kernel_name == hit.kernel_name, out
    assert _entry_good(out)


def test_an_edited_header_gives_its_own_kernel(
    client: Client, daemon: Daemon, tmp_path: Path
) -> None:
    data = _kernel(tmp_path)
    hit = _remembered(client, data)
    _write(tmp_path / "inc" / "k.h", "#define V 2\n")
    _gives_its_own_kernel(client, daemon, data, hit)


def test_a_file_where_the_compiler_searched_in_vain_gives_its_own_kernel(
    client: Client, daemon: Daemon, tmp_path: Path
) -> None:
    data = _kernel(tmp_path)
    hit = _remembered(client, data)
    _write(tmp_path / "src" / "k.h", "#define V 3\n")  # found first now
    _gives_its_own_kernel(client, daemon, data, hit)


def test_an_edited_source_gives_its_own_kernel(client: Client, tmp_path: Path) -> None:
    data = _kernel(tmp_path)
    hit = _remembered(client, data)
    _write(Path(data["kernel_source"]), SOURCE + "int other_symbol;\n")
    out = client.compile(data, base_dir="/")
    assert out.status == "compiled" and out.kernel_name != hit.kernel_name, out


def test_the_callers_environment_is_still_keyed(
    client: Client, daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _kernel(tmp_path)
    hit = _remembered(client, data)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # gcc reads it (__DATE__)
    _gives_its_own_kernel(client, daemon, data, hit)
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    back = client.compile(data, base_dir="/")
    assert (back.status, back.kernel_name) == ("hit", hit.kernel_name)


def test_the_request_changed_in_place_is_a_new_request(
    client: Client, daemon: Daemon, tmp_path: Path
) -> None:
    data = _kernel(tmp_path)
    data["attrs"] = {"alpha": 1}
    hit = _remembered(client, data)
    data["attrs"]["alpha"] = True  # equal to 1 in Python, not in the key's JSON
    _gives_its_own_kernel(client, daemon, data, hit)


def test_a_relative_source_follows_its_base_folder(
    client: Client, daemon: Daemon, tmp_path: Path
) -> None:
    one, two = _kernel(tmp_path / "one", 1), _kernel(tmp_path / "two", 2)
    base = tmp_path / "base"
    base.symlink_to(tmp_path / "one")
    data = {**one, "kernel_source": "src/k.c", "include_dirs": ["inc"]}
    hit = _remembered(client, data, base)
    base.unlink()
    base.symlink_to(tmp_path / "two")  # the same request now names the other folder's files
    out = client.compile(data, base_dir=base)
    assert out.status == "compiled" and out.kernel_name != hit.kernel_name, out
    assert _fresh(daemon, data, base).kernel_name == out.kernel_name
    assert two["kernel_source"] != one["kernel_source"]


# --- the store's side: an entry parsed once per distinct json, every binary hashed each time


def test_a_json_rewritten_in_place_is_judged_by_its_new_bytes(tmp_path: Path) -> None:
    chip = tmp_path / "cache" / "kernel_cache" / "Ascend910B1"
    chip.mkdir(parents=True)
    doc = publish(chip, "te_add_9", b"binary-9")
    assert Store(chip).lookup("te_add_9").hit and Store(chip).lookup("te_add_9").hit
    assert entry._parsed.get(("te_add_9", doc.read_bytes())) is not None  # remembered
    old = json.loads(doc.read_bytes())
    doc.write_text(json.dumps({**old, "sha256": "0" * 64}))  # same inode, another digest
    result = Store(chip).lookup("te_add_9")
    assert not result.hit and result.reason == entry.SHA256_MISMATCH and result.removed
    assert not doc.exists()


def test_every_binary_is_hashed_on_every_hit(tmp_path: Path) -> None:
    chip = tmp_path / "cache" / "kernel_cache" / "Ascend910B1"
    chip.mkdir(parents=True)
    publish(chip, "te_add_8", b"binary-8")
    for _ in range(3):
        assert Store(chip).lookup("te_add_8").hit
    (chip / "te_add_8.o").write_bytes(b"binary-X")  # same size, the json untouched
    result = Store(chip).lookup("te_add_8")
    assert not result.hit and result.reason == entry.SHA256_MISMATCH and result.removed


def test_a_hits_report_answers_what_it_counted(client: Client) -> None:
    # the cache's totals are stats' (reading every chip folder's counters file per report,
    # once a second per client, was the daemon's main cost of local hits)
    assert client.request("POST", "/hits", {"hits": 7}) == {"counted": 7}
    assert client.stats().counters["hits"] == 7


def _gives_its_own_kernel(
    client: Client, daemon: Daemon, data: dict[str, Any], hit: CompileOutcome
) -> None:
    """``data`` compiles now, to another kernel than the remembered ``hit``: the one a
    fresh client's full preparation names."""
    out = client.compile(data, base_dir="/")
    assert out.status == "compiled" and out.kernel_name != hit.kernel_name, out
    assert _fresh(daemon, data).kernel_name == out.kernel_name


# --- the remembered hit's own steps: few syscalls, the same defences


HIT_UNDER_STRACE = """
import json, os, sys
from cachemgr.client import Client
data = json.loads(sys.argv[2])
c = Client(sys.argv[1], timeout_s=120)
c.compile(data, base_dir="/")  # compiled by the daemon
for _ in range(3):
    assert c.compile(data, base_dir="/").via == "client"
os.write(2, b"<hit>")
out = c.compile(data, base_dir="/")
os.write(2, b"</hit>")
assert (out.status, out.via) == ("hit", "client"), out
print(json.dumps([str(f) for f in out.files]))
c.close()
"""


def _not_racy(*paths: Path) -> None:
    """Wait until the files' digests may be remembered (changed over ``RACY_S`` ago)."""
    from cachemgr.compile.inputs import RACY_S

    def settled() -> bool:
        newest = max(max(p.stat().st_mtime, p.stat().st_ctime) for p in paths)
        return time.time() - newest > RACY_S

    wait_for(settled, timeout_s=30, what="the inputs to be older than RACY_S")


def test_a_remembered_hit_makes_only_its_checks_syscalls(daemon: Daemon, tmp_path: Path) -> None:
    # the stats of the compiler, the source, the chip folder's path (two: the folder kept
    # open is still the one walked), the manifest, the header and the place searched in
    # vain; each entry file opened, checked, read and closed; two atimes set. Nothing else:
    # no folder opened again, no general reader's last empty read (22 calls before).
    data = _kernel(tmp_path)
    _not_racy(Path(data["kernel_source"]), tmp_path / "inc" / "k.h")
    log = tmp_path / "strace.log"
    out = subprocess.run(
        ["strace", "-f", "-qq", "-s", "256", "-o", str(log), sys.executable, "-c",
         HIT_UNDER_STRACE, str(daemon.socket_path), json.dumps(data)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    files = json.loads(out.stdout)
    text = log.read_text()
    calls = text[text.index("<hit>") : text.index("</hit>")].splitlines()[1:-1]
    names = [c.split("(", 1)[0].split()[-1] for c in calls]
    opened = [c for c in calls if "openat(" in c]
    assert len(opened) == 2 and all("O_DIRECTORY" not in c for c in opened), calls
    assert sorted(c.split('"')[1] for c in opened) == sorted(Path(f).name for f in files)
    assert names.count("utimensat") == 2 and names.count("read") == 2, calls
    assert len(calls) == 17, calls


def test_a_chip_folder_kept_open_is_not_used_once_its_path_leads_elsewhere(
    client: Client, daemon: Daemon, tmp_path: Path
) -> None:
    data = _kernel(tmp_path)
    hit = _remembered(client, data)
    chip = _binary(hit).parent
    moved = chip.with_name("moved")
    chip.rename(moved)  # the open folder keeps its entries: they must not be served
    chip.mkdir()
    out = client.compile(data, base_dir="/")
    assert out.status == "compiled" and out.kernel_name == hit.kernel_name, out
    assert _binary(out).parent == chip and _entry_good(out)


@pytest.mark.parametrize("where", ["kernel_cache", "chip"])
def test_a_link_put_on_the_way_to_a_kept_folder_is_refused_as_by_the_walk(
    client: Client, daemon: Daemon, tmp_path: Path, where: str
) -> None:
    data = _kernel(tmp_path)
    hit = _remembered(client, data)
    chip = _binary(hit).parent
    folder = chip.parent if where == "kernel_cache" else chip
    real = folder.with_name(folder.name + ".real")
    folder.rename(real)
    folder.symlink_to(real.name)  # the same folders, now through a link
    with pytest.raises(DaemonError, match=r"is a (symbolic link|symlink)") as kept:
        client.compile(data, base_dir="/")  # not served from the folder kept open
    with pytest.raises(DaemonError) as fresh:
        _fresh(daemon, data)
    assert str(kept.value) == str(fresh.value)


def test_a_remembered_hit_sets_the_access_times(client: Client, tmp_path: Path) -> None:
    hit = _remembered(client, _kernel(tmp_path))
    for f in hit.files:
        os.utime(f, (1_000_000_000, os.stat(f).st_mtime))
    before = [os.stat(f).st_mtime_ns for f in hit.files]
    again = client.compile(_kernel(tmp_path), base_dir="/")
    assert (again.status, again.via, again.files) == ("hit", "client", hit.files)
    assert all(os.stat(f).st_atime > time.time() - 3600 for f in hit.files)
    assert [os.stat(f).st_mtime_ns for f in hit.files] == before


@pytest.mark.parametrize("change", ["header", "searched in vain", "source"])
def test_inputs_remembered_by_their_status_still_give_their_own_kernel(
    client: Client, daemon: Daemon, tmp_path: Path, change: str
) -> None:
    # once the inputs' digests are remembered (not "racy"), a hit checks them by status
    # and the manifest by its status: every change still gives its own kernel
    data = _kernel(tmp_path)
    _not_racy(Path(data["kernel_source"]), tmp_path / "inc" / "k.h")
    hit = _remembered(client, data)
    plans = client._side._plans
    assert plans is not None
    seen = next(iter(plans._plans.values())).seen
    assert len(seen.files) == 2 and seen.manifest is not None and seen.known is not None
    if change == "header":
        _write(tmp_path / "inc" / "k.h", "#define V 2\n")  # the same size
    elif change == "searched in vain":
        _write(tmp_path / "src" / "k.h", "#define V 3\n")  # found first now
    else:
        _write(Path(data["kernel_source"]), SOURCE.replace("x[0]", "x[1]"))  # the same size
    _gives_its_own_kernel(client, daemon, data, hit)


def _open_on(folder: Path) -> list[str]:
    """This process's descriptors open on ``folder`` (their targets)."""
    return [target for target in fd_targets() if target == str(folder)]


def test_threads_share_one_kept_chip_folder_and_close_gives_it_back(
    client: Client, tmp_path: Path
) -> None:
    data = _kernel(tmp_path)
    chip = _binary(_remembered(client, data)).parent
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda _: client.compile(data, base_dir="/"), range(200)))
    assert all((o.status, o.via) == ("hit", "client") for o in outs)
    assert len(_open_on(chip)) == 1
    client.close()
    assert _open_on(chip) == []
