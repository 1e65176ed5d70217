"""Constants are defined once: MiB, never-evict, the version, the host name."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import socket
import subprocess
import sys
from pathlib import Path

import cachemgr
from cachemgr.compile import kernel_meta
from cachemgr.constants import MIB, NEVER_EVICT, VERSION, short_host
from cachemgr.storage import fsutil

PACKAGE = Path(cachemgr.__file__).resolve().parent
ONCE = {"MIB", "NEVER_EVICT", "VERSION", "__version__"}


def _definitions(path: Path) -> list[str]:
    """Top-level names of ONCE bound by a value (not by an import) in ``path``, and each
    read of the host name (``socket.gethostname``, ``os.uname().nodename``)."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        found += [t.id for t in targets if isinstance(t, ast.Name) and t.id in ONCE]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("gethostname", "nodename"):
            found.append("gethostname")
    return found


def test_each_constant_is_defined_in_constants_only() -> None:
    where = {
        str(path.relative_to(PACKAGE)): names
        for path in sorted(PACKAGE.rglob("*.py"))
        if (names := _definitions(path))
    }
    assert where == {"constants.py": ["VERSION", "MIB", "NEVER_EVICT", "gethostname"]}


def test_values_and_one_version_everywhere() -> None:
    assert MIB == 1_048_576 and NEVER_EVICT == -1  # GE: SIZE_MB_UNIT, max_op_cache_size -1
    assert cachemgr.__version__ == VERSION == importlib.metadata.version("cachemgr")
    out = subprocess.run(
        [sys.executable, "-m", "cachemgr", "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert VERSION in out


def test_short_host_names_kernel_meta_and_temp_files(tmp_path: Path) -> None:
    host = socket.gethostname().split(".")[0] or "host"
    assert short_host() == host
    assert kernel_meta.folder_name() == f"{host}_{os.getpid()}"
    assert fsutil.temp_path(tmp_path / "k.o").name.startswith(f"k.o.{host}.{os.getpid()}.")
