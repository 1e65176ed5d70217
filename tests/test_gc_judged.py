"""gc reads again only the main jsons that may have changed since a previous gc judged them
(``cachemgr/eviction/judged.py``, docs/eviction.md#cost) — on real files, with the record in
the suite's private ``$XDG_CACHE_HOME``: a json this user alone can write, unchanged, is not
read; a json others may write, a json rewritten, or a record in a folder others may write
are read or ignored as without a record."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cachemgr.eviction import DryRun, fatalscan, gc_chip
from cachemgr.eviction.judged import record_dir
from tests.conftest import publish

DAY_NS = 86400 * 10**9


@contextmanager
def _reads() -> Iterator[list[str]]:
    """The names :func:`cachemgr.eviction.fatalscan.read_plain` reads in this thread inside
    the block (a profile hook sees each call)."""
    names: list[str] = []
    code = fatalscan.read_plain.__code__

    def hook(frame: object, event: str, arg: object) -> None:
        if event == "call" and getattr(frame, "f_code", None) is code:
            names.append(str(frame.f_locals["name"]))  # type: ignore[attr-defined]

    sys.setprofile(hook)
    try:
        yield names
    finally:
        sys.setprofile(None)


def _entries(chip: Path, n: int) -> list[str]:
    """``n`` good entries written a day ago (their last write long over), their main jsons
    ``0640``: only their owner may write them."""
    kernels = [f"te_judged_{i}" for i in range(n)]
    for kernel in kernels:
        publish(chip, kernel, os.urandom(512))
        path = chip / f"{kernel}.json"
        path.chmod(0o640)
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - DAY_NS))
    return kernels


def _dry(chip: Path) -> list[str]:
    """The main jsons a gc dry run reads."""
    with _reads() as names:
        gc_chip(chip, 100, 50, dry_run=DryRun.YES)
    return sorted(names)


def test_a_second_gc_reads_only_what_others_may_have_changed(chip: Path) -> None:
    kernels = _entries(chip, 4)
    (chip / f"{kernels[1]}.json").chmod(0o660)  # a member may write it in place
    assert _dry(chip) == sorted(f"{k}.json" for k in kernels)
    assert _dry(chip) == [f"{kernels[1]}.json"]


def test_a_json_rewritten_since_is_read_and_judged_again(chip: Path) -> None:
    kernels = _entries(chip, 3)
    _dry(chip)
    path = chip / f"{kernels[2]}.json"
    desc = json.loads(path.read_bytes())
    path.write_text(json.dumps({**desc, "sha256": 12345}))  # in place: GE aborts on it
    with _reads() as names:
        report = gc_chip(chip, 100, 50)
    assert names == [path.name]
    assert report.reclaimed.ge_fatal == 1 and not path.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_another_users_json_is_read_at_every_gc(chip: Path) -> None:
    kernels = _entries(chip, 2)
    os.chown(chip / f"{kernels[0]}.json", 4242, 4242)  # its owner may set any time back
    _dry(chip)
    assert _dry(chip) == [f"{kernels[0]}.json"]


def test_a_record_others_may_write_is_ignored(chip: Path) -> None:
    kernels = _entries(chip, 2)
    _dry(chip)
    record_dir().chmod(0o777)  # anyone could have put keys there
    try:
        assert _dry(chip) == sorted(f"{k}.json" for k in kernels)
    finally:
        record_dir().chmod(0o700)
