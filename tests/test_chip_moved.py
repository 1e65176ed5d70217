"""A miss whose chip folder is renamed away (and a new one made at its path) while it holds the
entry lock: the entry lands in the moved folder (published through the lock's descriptor),
so the result must not name cache paths that are not there. It is delivered as a publish
that did not land: ``compiled``, not cached, the files in the output folder, one warning.
Before: status ``compiled``, exit 0, ``files`` that did not exist."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.test_direct import Kit


def test_a_chip_folder_moved_during_the_miss_is_not_reported_as_the_cache(
    tmp_path: Path,
) -> None:
    kit = Kit(tmp_path)
    kit.chip.mkdir(parents=True)
    moved = kit.chip.with_name("moved")
    gcc = shutil.which("gcc")
    assert gcc is not None
    # the compile (``-c``; not the identity probes) runs under the entry lock: it moves the
    # chip folder away and makes a new one at its path
    move = f'[ -d "{moved}" ] || {{ mv "{kit.chip}" "{moved}" && mkdir "{kit.chip}"; }}'
    (kit.bin / "gcc").write_text(
        f'#!/bin/sh\ncase " $* " in *" -c "*) {move} ;; esac\nexec {gcc} "$@"\n'
    )
    (kit.bin / "gcc").chmod(0o755)
    out = kit.project / "out"
    done = subprocess.run(
        [sys.executable, "-m", "cachemgr", *kit.argv, "--json", "--out-dir", str(out)],
        env={**kit.env, "CACHEMGR_DIRECT": "0"},
        cwd=kit.project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert moved.is_dir(), "the compiler wrapper did not run"
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["status"] == "compiled" and doc["cached"] is False, doc
    assert doc["files"] and all(os.path.isfile(f) for f in doc["files"]), doc["files"]
    assert all(Path(f).parent == out for f in doc["files"]), doc["files"]
    assert done.stderr.count("not cached: its chip folder was moved away") == 1, done.stderr
