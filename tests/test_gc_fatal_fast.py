"""gc's plain read of main jsons (``cachemgr/eviction/fatalscan.py``) clears exactly the
entries the full GE-fatal check clears (docs/interop.md#entries-that-abort-ge): no entry
it lets pass is one the full check would remove, for every shape of ``gefatal`` and every
file the careful reader refuses or reads another way — run as root, and as a member whose
``O_NOATIME`` open of another user's json is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.users_util import Runtime, Users, run_python_as

GOOD = {
    "binFileName": "K",
    "binFileSuffix": ".o",
    "kernelName": "K__kernel0",
    "sha256": "0" * 64,
    "headerFileSuffix": ".h",
    "blockDim": 8,
}


#: an array nested deeper than Python's json parser goes (its recursion limit, ~1,000)
_DEEP = b"[" * 1100 + b"]" * 1100


def _with(**changes: object) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


#: kernel → (main json bytes, fatal for GE)
CASES: dict[str, tuple[bytes, bool]] = {
    "te_good": (_with(), False),
    "te_sha_number": (_with(sha256=12345), True),
    "te_kernel_null": (_with(kernelName=None), True),
    "te_name_list": (_with(binFileName=["K"]), True),
    "te_header_number": (_with(headerFileSuffix=1), True),
    "te_list_number": (_with(jsonList=5), True),
    "te_list_null": (_with(jsonList=None), False),
    "te_list_names_sub": (_with(jsonList=[{"jsonFileName": "te_sub_fatal.json"}]), True),
    "te_bom_fatal": (b"\xef\xbb\xbf" + _with(sha256=5), True),
    "te_escaped_key": (
        b'{"binFileName": "K", "binFileSuffix": ".o", "kernelName": 1}'.replace(
            b"kernelName", b"kernel\\u004eame"
        ),
        True,
    ),
    "te_duplicate_key": (_with()[:-1] + b', "sha256": 7}', True),
    "te_nan": (_with()[:-1] + b', "sha256": NaN}', False),  # nlohmann cannot parse it: a miss
    "te_trailing": (_with() + b' {"sha256": 5}', False),  # only the first value is read
    "te_top_array": (b"[" + _with(sha256=5) + b"]", False),
    "te_bad_utf8": (_with(sha256=5)[:-1] + b', "x": "\xff"}', False),
    # GE never reads past the first value: bytes after it that are not UTF-8 change nothing
    "te_then_not_utf8": (_with(sha256=5) + b"\n\xff\xfe", True),
    "te_then_latin1": (_with(sha256=5) + b"\n# caf\xe9", True),
    "te_good_then_not_utf8": (_with() + b"\n\xff", False),
    "te_good_utf8": (_with()[:-1] + ', "note": "caf\u00e9"}'.encode(), False),
    "te_utf8_fatal": (_with(sha256=5)[:-1] + ', "note": "caf\u00e9"}'.encode(), True),
    # deeper than Python's parser goes (nlohmann has no limit): never cleared (rule F0)
    "te_deep": (_with()[:-1] + b', "x": ' + _DEEP + b"}", True),
    "te_deep_fatal": (
        _with(binFileName=1)[:-1] + b', "x": ' + _DEEP + b"}",
        True,
    ),
    "te_deep_pre": (b'{"pattern": "p", "x": ' + _DEEP + b"}", True),
    "te_not_json": (b"{not json", False),
    "te_big": (_with(sha256=5)[:-1] + b', "pad": "' + b"x" * (4 << 20) + b'"}', False),
    "te_pre_number_pre": (json.dumps({"pattern": 3}).encode(), True),
    "te_pre_good_pre": (json.dumps({"pattern": "p", "coreType": "AiCore"}).encode(), False),
}
FATAL = sorted(k for k, (_, fatal) in CASES.items() if fatal)

#: What both checks make of a chip folder: the kernels the full check finds fatal, those
#: the fast pass hands to it, and those the full check finds fatal among them.
_VERDICTS = """
import json, os, sys
from pathlib import Path
from cachemgr.eviction.compact import scan_compact
from cachemgr.eviction.fatal import group_fatal
from cachemgr.eviction.fatalscan import FatalCandidates, PlainJudge
chip = Path(sys.argv[1])
fd = os.open(chip, os.O_RDONLY | os.O_DIRECTORY)
scan = scan_compact(chip, fd)
full = sorted(g.kernel for g in scan.entries.groups() if group_fatal(chip, fd, g))
handed = [g for g in FatalCandidates(scan.entries, fd, 0, None)]
fast = sorted(g.kernel for g in handed if group_fatal(chip, fd, g))
judged = scan_compact(chip, fd, PlainJudge(fd, 0))  # judged as listed, by gc's scan
marked = [g for g in FatalCandidates(judged.entries, fd, 0, None)]
print(json.dumps({
    "full": full, "fast": fast, "handed": sorted(g.kernel for g in handed),
    "by_scan": sorted(g.kernel for g in marked if group_fatal(chip, fd, g)),
    "marked": sorted(g.kernel for g in marked),
}))
"""


def _chip(root: Path) -> Path:
    chip = root / "kernel_cache" / "Ascend910B1"
    chip.mkdir(parents=True)
    for kernel, (raw, _) in CASES.items():
        (chip / f"{kernel}.json").write_bytes(raw)
        (chip / f"{kernel}.o").write_bytes(b"\x7fELF" + kernel.encode())
    sub = json.dumps({"binFileName": 9, "binFileSuffix": ".o"}).encode()
    (chip / "te_sub_fatal.json").write_bytes(sub)  # its own entry too, and fatal
    return chip


def _verdicts(argv: list[str], chip: Path, **kwargs: object) -> dict[str, list[str]]:
    done = subprocess.run([*argv, "-c", _VERDICTS, str(chip)], capture_output=True, text=True,
                          check=False, **kwargs)  # type: ignore[call-overload]  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_plain_read_clears_only_what_the_full_check_clears(tmp_path: Path) -> None:
    chip = _chip(tmp_path)
    got = _verdicts([sys.executable], chip)
    assert got["full"] == sorted([*FATAL, "te_sub_fatal"])
    assert got["fast"] == got["full"] == got["by_scan"]
    # and it does clear: the good entries are not handed to the full check
    for handed in (got["handed"], got["marked"]):
        assert "te_good" not in handed and "te_list_null" not in handed
    assert got["handed"] == got["marked"]


def test_a_members_plain_read_of_another_users_json_leaves_it_to_the_full_check(
    users: Users, other_runtime: Runtime
) -> None:
    """alice may not open bob's jsons with ``O_NOATIME`` (``EPERM``): those go to the full
    check (which reads them, or refuses a read that would change their access time) —
    the same verdicts as the full check over every entry, as alice."""
    base = users.base / "cache"
    chip = _chip(base)
    for path in [base, *base.rglob("*")]:
        os.chown(path, -1 if path.is_dir() else _uid(users.bob), _gid(users.group))
        path.chmod(0o2775 if path.is_dir() else 0o664)
    for path in chip.iterdir():  # relatime would not move these atimes: the full check reads
        ahead = time.time_ns() + 60 * 10**9
        os.utime(path, ns=(ahead, ahead - 120 * 10**9))
    done = run_python_as(users, other_runtime, users.alice, "-c", _VERDICTS, str(chip))
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["full"] == sorted([*FATAL, "te_sub_fatal"])  # read (atimes put back)
    assert got["fast"] == got["full"] == got["by_scan"]
    # every json is bob's: none is read plainly, all go to the full check
    assert set(got["handed"]) >= set(CASES) and got["marked"] == got["handed"]


def _uid(name: str) -> int:
    import pwd

    return pwd.getpwnam(name).pw_uid


def _gid(name: str) -> int:
    import grp

    return grp.getgrnam(name).gr_gid


def test_the_plain_read_takes_only_a_plain_file(tmp_path: Path) -> None:
    """Whatever the careful reader refuses or reads its own way, the plain read leaves to
    it (None), never following a link, never blocking on a FIFO, never reading a byte."""
    from cachemgr.eviction.fatalscan import read_plain

    chip = tmp_path / "chip"
    chip.mkdir()
    (chip / "plain.json").write_bytes(b'{"a": 1}')
    (chip / "target.json").write_bytes(_with(sha256=5))
    (chip / "link.json").symlink_to(chip / "target.json")
    os.link(chip / "target.json", tmp_path / "other-name.json")  # target now has 2 names
    os.mkfifo(chip / "fifo.json")  # no writer: a blocking open would hang here
    (chip / "folder.json").mkdir()
    (chip / "big.json").write_bytes(b" " * 101)
    fd = os.open(chip, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert read_plain(fd, "plain.json") == b'{"a": 1}'
        for name in ("link.json", "target.json", "fifo.json", "folder.json", "gone.json"):
            assert read_plain(fd, name) is None, name
        assert read_plain(fd, "big.json", max_bytes=100) is None
        assert read_plain(fd, "big.json", max_bytes=101) == b" " * 101
    finally:
        os.close(fd)


def test_the_scan_stops_judging_main_jsons_at_the_runs_deadline(tmp_path: Path) -> None:
    """gc's scan judges each main json as it lists it (``PlainJudge``); past the run's
    deadline it reads no more: the rest is left to the full check, which stops at the same
    deadline, so the run ends there (``skipped="deadline"``, nothing evicted, the lock
    released) as it did when only the full pass read them. A run without a deadline then
    does the work. Real 4 MiB jsons (each ~0.3 s of parsing); the deadline is 0.3 s away,
    sixteen of them take seconds."""
    from cachemgr.eviction.collect import SKIP_DEADLINE, gc_chip
    from cachemgr.storage import entry

    chip = tmp_path / "kernel_cache" / "Ascend910B1"
    chip.mkdir(parents=True)
    pad = b"1," * ((entry.MAX_JSON_BYTES - 400) // 2) + b"1"
    kernels = [f"te_big_{n}" for n in range(16)]
    for kernel in kernels:
        raw = _with(binFileName=kernel)[:-1] + b', "pad": [' + pad + b"]}"
        assert len(raw) <= entry.MAX_JSON_BYTES  # read plainly and parsed by the scan
        (chip / f"{kernel}.json").write_bytes(raw)
        (chip / f"{kernel}.o").write_bytes(b"\x7fELF" + kernel.encode())
    everything = sorted(p.name for p in chip.iterdir())

    late = gc_chip(chip, 1, 50, 0, deadline=time.monotonic() + 0.3, ge_fatal_since_ns=0)
    assert late.skipped == SKIP_DEADLINE, late
    assert late.evicted == [] and late.reclaimed.ge_fatal == 0
    assert sorted(p.name for p in chip.iterdir() if p.suffix != ".lock") == everything

    done = gc_chip(chip, 1, 50, 0, ge_fatal_since_ns=0)  # no deadline: the work is done
    assert done.skipped == "" and done.evicted, done
    assert not (chip / f"{done.evicted[0]}.json").exists()
