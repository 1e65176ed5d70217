"""Source line → binary address maps (the ``*_loc.json`` of
docs/design.md#debug-compiles-and-kernel_meta), from DWARF line tables.

The map is read from the ``.debug_line`` section of the binary just produced, decoded by GNU
``readelf --debug-dump=decodedline`` (binutils ships wherever gcc does; it decodes host objects
and NVIDIA cubins alike, and applies the relocations of a relocatable ``.o``). Addresses are
byte offsets into the text section of each line sequence (for a cubin: the kernel's own
``.text.<kernel>`` section); ``sequence`` numbers the DWARF sequences so offsets that restart at
0 in another section stay distinguishable.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from cachemgr.compilers import process
from cachemgr.errors import CompileError

#: One decoded row: ``<file> <line> <address> [view] [x]``.
_ROW = re.compile(r"^(?P<file>\S.*?)\s+(?P<line>\d+)\s+(?P<addr>0x[0-9a-fA-F]+|\d+)(?:\s.*)?$")
#: End of a sequence: ``<file> - <address>``.
_END = re.compile(r"^\S.*?\s+-\s+(0x[0-9a-fA-F]+|\d+)\s*$")
_READELF_TIMEOUT_S = 60.0
#: The most bytes of ``readelf`` output parsed into a line map (8 MiB: ~100 000 rows, some
#: 130 MB at the peak of parsing and writing them); past it the map is refused. The binary
#: is the caller's making (inline assembly can write any ``.debug_line``), and the whole
#: output is parsed, so it cannot be elided like a compiler's messages
#: (docs/security.md#10-streaming-limits-fairness).
MAX_READELF_BYTES = 8 * 1024 * 1024


def readelf_path(config_value: object = None) -> str:
    """Path of ``readelf`` (``config_value`` if given, else from PATH).

    :raises CompileError: naming readelf when it is not installed.
    """
    name = str(config_value or "readelf")
    found = shutil.which(name)
    if not found:
        raise CompileError(f"readelf not found ({name!r}); it is needed to emit *_loc.json")
    return found


def decode_lines(binary: Path, readelf: str) -> list[dict[str, object]]:
    """Return the line table of ``binary`` as ``[{file, line, address, sequence}]`` rows.

    ``line`` is 1-based, ``address`` an int byte offset (see module docstring).

    readelf parses an object whose sections the caller's source may write (inline assembly)
    and follows its ``.gnu_debuglink`` to any path: it runs like a compiler process, in the
    sandbox's view and limits (:func:`.process.run_in_group`, working in the binary's
    folder), never as the daemon outside them (attack review after the allow-list view).

    :raises CompileError: when readelf fails, prints more than :data:`MAX_READELF_BYTES`,
        or the binary has no line information (compile with the backend's line-info flag).
    """
    argv = [readelf, "-W", "--debug-dump=decodedline", binary.name]
    what = f"reading {binary.name}"
    keep = process.up_to(MAX_READELF_BYTES)
    out = process.run_in_group(argv, _READELF_TIMEOUT_S, binary.parent, what, keep_stdout=keep)
    if out.returncode != 0:
        raise CompileError(f"readelf failed on {binary}: {out.message()[:500]}")
    if out.stdout_dropped:
        raise CompileError(
            f"the line table of {binary.name} is over {MAX_READELF_BYTES} bytes as readelf "
            "prints it; no *_loc.json is written for it (compile without emit loc)"
        )
    rows = parse_decodedline(out.stdout.decode("utf-8", "replace"))
    if not rows:
        raise CompileError(f"{binary} has no debug line information; cannot write *_loc.json")
    return rows


def loc_document(
    bin_name: str, bin_suffix: str, kernel_name: str, source: Path, rows: list[dict[str, object]]
) -> dict[str, object]:
    """The ``*_loc.json`` document: which binary and kernel, the source, and the line rows."""
    return {
        "binFileName": bin_name,
        "binFileSuffix": bin_suffix,
        "kernelName": kernel_name,
        "source": str(source),
        "tool": "readelf --debug-dump=decodedline",
        "lines": rows,
    }


def parse_decodedline(text: str) -> list[dict[str, object]]:
    """Parse ``readelf --debug-dump=decodedline`` output into rows (see :func:`decode_lines`).

    ``file`` is the file's name without its folder, whatever the compiler wrote: gcc's
    DWARF names a file relative to its directory entry (readelf prints ``add.c``), clang's
    DWARF 5 by the path it was given (``/abs/path/add.c``, which for a compile through the
    daemon is a private build folder's copy). One form for both, and no private path."""
    rows: list[dict[str, object]] = []
    sequence = 0
    for line in text.splitlines():
        if _END.match(line):
            sequence += 1
            continue
        m = _ROW.match(line)
        if m:
            rows.append(
                {
                    "file": m["file"].rsplit("/", 1)[-1],
                    "line": int(m["line"]),
                    "address": _to_int(m["addr"]),
                    "sequence": sequence,
                }
            )
    return rows


def _to_int(text: str) -> int:
    return int(text, 16) if text.startswith("0x") else int(text)
