"""The one pass over a file's bytes (cachemgr/compile/bytescan.py) answers what each of its
four readers' own searches answered, and a real miss scans each file it reads once."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from cachemgr.compile import bytescan, embedded, inputs, pathkey, volatile
from cachemgr.compile.queue import CompileQueue
from cachemgr.compile.request import parse_request
from tests.compile_util import make_settings, scale_request

#: Each reader's own search, as it was before the one pass (the reference).
NAMES_A_PATH = re.compile(rb"__FILE__|__builtin_FILE\b|\bassert\s*\(")
MACROS = re.compile(rb"__(?:TIMESTAMP|TIME|DATE)__")
MAYBE_EMBEDS = re.compile(rb"incbin|\.include|embed")
WORDS = (b"include", b"import", b"incbin", b"embed", b"%:", b"??=")

SAMPLES = [
    b"",
    b"void k(float *x) { x[0] *= 2; }\n",
    b'#include <string.h>\n#include "k.h"\n',
    b"assert (x);\nstatic_assert(sizeof(int) == 4);\n",
    b"const char *w = __FILE__TIME__;\n",  # overlapping words: both are seen
    b"__DATE____TIME____TIMESTAMP__ __builtin_FILE()\n",
    b'asm(".incbin \\"data.bin\\"");\n',
    b'asm(".include \\"x.s\\"");\n#embed "y"\n',
    b"#inc\\\nlude <x.h>\n",  # a line splice
    b"%:include <x.h>\n??=include <y.h>\n",
    b"// not included: imported? embedded?\n",
    b"int embedded_size; int include_count;\n",
]


@pytest.mark.parametrize("blob", SAMPLES)
def test_one_pass_gives_each_readers_answer(blob: bytes) -> None:
    facts = bytescan.scan(blob)
    assert facts.names_a_path == (NAMES_A_PATH.search(blob) is not None)
    assert set(facts.time_macros) == {m.decode() for m in MACROS.findall(blob)}
    assert facts.embeds == (MAYBE_EMBEDS.search(blob) is not None)
    if not facts.words:  # then neither include check can find anything
        assert not any(w in blob.replace(b"\\\n", b"") for w in WORDS)
    assert pathkey.names_a_path(blob) == facts.names_a_path


def test_overlapping_time_macros_are_all_found() -> None:
    facts = bytescan.scan(b"x = __FILE__TIME__ + __DATE__;")
    assert facts.names_a_path and facts.time_macros == ("__DATE__", "__TIME__")


def test_readers_answer_from_the_one_pass(tmp_path: Path) -> None:
    src = tmp_path / "k.c"
    blob = b'#include "/abs/x.h"\nconst char *t = __TIME__;\nasm(".incbin \\"d.bin\\"");\n'
    src.write_bytes(blob)
    digest = inputs.file_digest(src)
    assert bytescan.remembered(digest) == bytescan.scan(blob)  # hashed: scanned once, kept
    snap = inputs.Snapshot(src, digest, {}, data={str(src): blob})
    assert volatile.time_macros(snap) == {"__TIME__": str(src)}
    assert inputs.may_read_in_place(snap, {})
    assert embedded.uses(blob, digest, str(src)).names == ("d.bin",)
    assert not inputs.reads_only_system_headers(blob, "c", (), {}, digest)
    plain = b"#include <string.h>\nvoid k(void) {}\n"
    assert inputs.reads_only_system_headers(plain, "c", (), {})


def test_a_miss_scans_each_file_it_reads_once(
    tmp_path: Path, clean_env, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "scale.c"
    unique = time.time_ns()  # bytes no earlier test scanned
    src.write_text(
        f'#include "scale.h"\n/* {unique} */ void scale_kernel(float *x) {{ x[0] *= FACTOR; }}\n'
    )
    (tmp_path / "scale.h").write_text(f"#define FACTOR {unique}\n")
    old = time.time() - 10
    for path in (src, tmp_path / "scale.h"):
        os.utime(path, (old, old))
    scanned: list[bytes] = []
    real = bytescan.scan

    def counted(blob: bytes) -> bytescan.Facts:
        scanned.append(blob)
        return real(blob)

    monkeypatch.setattr(bytescan, "scan", counted)  # counts, then runs the real scan
    with CompileQueue(make_settings(tmp_path, clean_env), workers=1) as queue:
        out = queue.compile(parse_request(scale_request(str(src)), tmp_path))
    assert out.status == "compiled", out
    assert sorted(scanned) == sorted([src.read_bytes(), (tmp_path / "scale.h").read_bytes()])
