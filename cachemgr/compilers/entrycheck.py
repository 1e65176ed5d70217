"""Why a compiled object has no symbol for the kernel entry, said in the error's first words.

The backends find the kernel by its symbol in the object (:func:`.elf.find_entry_symbol`): an
exported (global or weak) function named ``kernel_entry``. A ``static`` function — a
``static __global__`` CUDA kernel, a ``static`` C function — is local to its file, and an
unused one is removed by the compiler, so the object has no symbol to launch. The error then
names the reason it can see in the sources compiled: the entry declared ``static``, or a
source that exports no function at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

#: The most bytes of one file searched for the entry's declaration.
MAX_SCAN_BYTES = 8 << 20
#: The most files searched (the source and its headers).
MAX_SCAN_FILES = 4096


def compiled_files(source: Path, mirror_root: Path | None) -> list[Path]:
    """The kernel source, then every other file of the build mirror (its headers), sorted;
    at most :data:`MAX_SCAN_FILES`."""
    found = [source]
    if mirror_root is not None:
        others = sorted(p for p in mirror_root.rglob("*") if p.is_file() and p != source)
        found += others[: MAX_SCAN_FILES - 1]
    return found


def missing_entry_reason(entry: str, sources: Iterable[Path], exported: list[str]) -> str | None:
    """The first words of the error for an object without ``entry``: why, as far as the
    ``sources`` compiled (the kernel source first, then its headers) show it; None when they
    show nothing (the plain "not in the object" error stands).

    :param exported: the exported function symbols the object does have.
    """
    declared_static = re.compile(
        rb"\bstatic\b[^;{}()=]*\b" + re.escape(entry.encode()) + rb"\s*\(", re.MULTILINE
    )
    files = list(sources)
    for path in files:
        try:
            with open(path, "rb") as fh:
                text = fh.read(MAX_SCAN_BYTES)
        except OSError:
            continue
        if declared_static.search(text):
            return (
                f"kernel {entry!r} is declared static in {path.name}, so not exported: cachemgr "
                f"needs an exported symbol named {entry!r} in the object, and a static function is "
                "local to its file (an unused one is removed); remove 'static'"
            )
    if not exported:
        name = files[0].name if files else "the source"
        return (
            f"{name} exports no function: cachemgr needs an exported symbol named {entry!r} "
            "in the object (every function there is static or inline, or none is defined); "
            f"define {entry!r} without 'static'"
        )
    return None
