"""The cache key (docs/design.md#keys-and-manifests): canonical, and every field that changes the
binary changes it."""

from __future__ import annotations

import copy
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from cachemgr.compile import keys, pipeline
from cachemgr.compile.request import parse_request, resolve_options
from cachemgr.compilers import CompilerIdentity
from tests.compile_util import counting_cc, make_settings, request_data

IDENT = CompilerIdentity("gcc", "/usr/bin/gcc", "gcc (Debian 12.2.0-14) 12.2.0")
FLAGS = ("-x", "c", "-c", "-fPIC", "-O2", "-DN=4096", "/SOURCE", "-o", "/OUT/KERNEL.o")


def _material(tmp_path: Path, clean_env: dict[str, str], **over: Any) -> dict[str, Any]:
    settings = make_settings(tmp_path, clean_env)
    req = parse_request(request_data(**over), tmp_path)
    return keys.key_material(req, resolve_options(req, settings), IDENT, FLAGS, "ab" * 32)


def _set(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    target = data
    for part in path[:-1]:
        target = target.setdefault(part, {}) if isinstance(part, str) else target[part]
    target[path[-1]] = value
    return data


#: (request path, new value): each is a field of docs/design.md#keys-and-manifests reached through a
#: real request.
REQUEST_CHANGES = [
    (("op_type",), "AddV2"),
    (("soc_version",), "Ascend910B2"),
    (("language",), "cpp"),
    (("kernel_entry",), "add_kernel_v2"),
    (("inputs", 0, "shape"), [4095]),
    (("inputs", 1, "shape"), [1, 1]),
    (("inputs", 0, "dtype"), "float16"),
    (("inputs", 0, "format"), "NCHW"),
    (("outputs", 0, "shape"), [-1]),
    (("outputs", 0, "dtype"), "int32"),
    (("outputs", 0, "format"), "NHWC"),
    (("attrs",), {"alpha": 1}),
    (("defines", "N"), 4095),
    (("defines", "DTYPE"), "double"),
    (("options", "deterministic"), True),
    (("options", "precision_mode"), "force_fp32"),
    (("options", "op_debug_level"), 3),
    (("options", "aicore_num"), 20),
    (("options", "vector_core_num"), 40),
    (("options", "deterministic_level"), 1),
    (("options", "op_select_implmode"), "high_precision"),
]


@pytest.mark.parametrize(("path", "value"), REQUEST_CHANGES, ids=lambda v: str(v))
def test_each_request_field_changes_the_key(tmp_path, clean_env, path, value) -> None:
    base = request_data(options={})
    changed = _set(base, path, value)
    k0 = keys.compute_key(_material(tmp_path, clean_env, **base))
    k1 = keys.compute_key(_material(tmp_path, clean_env, **changed))
    assert k0 != k1


@pytest.mark.parametrize(
    "change",
    [
        {"compiler": {"name": "clang"}},
        {"compiler": {"version": "gcc (Debian 12.2.0-15) 12.2.0"}},
        {"compiler": {"flags": [*FLAGS[:4], "-O0", *FLAGS[5:]]}},
        {"source_sha256": "cd" * 32},
    ],
    ids=["compiler-name", "compiler-version", "compiler-flags", "source-content"],
)
def test_compiler_and_source_change_the_key(tmp_path, clean_env, change) -> None:
    material = _material(tmp_path, clean_env)
    changed = copy.deepcopy(material)
    for field, value in change.items():
        if isinstance(value, dict):
            changed[field].update(value)
        else:
            changed[field] = value
    assert keys.compute_key(material) != keys.compute_key(changed)


def test_key_fields_are_all_in_the_material(tmp_path, clean_env) -> None:
    material = _material(tmp_path, clean_env)
    assert set(keys.KEY_FIELDS) <= set(material)


def test_what_does_not_change_the_binary_does_not_change_the_key(tmp_path, clean_env) -> None:
    base = _material(tmp_path, clean_env)
    same = [
        _material(tmp_path, clean_env, options={"jit_compile": "false"}),
        _material(tmp_path, clean_env, options={"op_compiler_cache_mode": "disable"}),
        _material(tmp_path, clean_env, options={"debug_dir": "elsewhere"}),
        _material(tmp_path, clean_env, op_name="add_1"),
    ]
    data = request_data()
    data["inputs"][0]["dtype"] = "float"  # an alias of float32
    same.append(_material(tmp_path, clean_env, **data))
    for material in same:
        assert keys.compute_key(material) == keys.compute_key(base)


def test_canonical_serialisation() -> None:
    a = keys.canonical({"b": 1, "a": {"y": [1, 2], "x": "é"}})
    assert a == '{"a":{"x":"é","y":[1,2]},"b":1}'.encode()
    assert keys.canonical({"a": {"x": "é", "y": [1, 2]}, "b": 1}) == a
    with pytest.raises(Exception, match="serialise"):
        keys.canonical({"x": float("nan")})


def test_kernel_name_shape() -> None:
    key = keys.compute_key({"x": 1})
    assert re.fullmatch(r"[0-9a-f]{64}", key)
    assert keys.kernel_name("SoftmaxV2", key) == f"te_softmaxv2_{key}"


def test_real_prepare_keys_source_compiler_and_debug_flags(tmp_path, clean_env) -> None:
    """Through the real gcc: the source's bytes, the compiler's version and the debug flags."""
    src = tmp_path / "add.c"
    src.write_text(Path(request_data()["kernel_source"]).read_text())
    old = time.time() - 10
    os.utime(src, (old, old))
    compilers = keys.Compilers({})
    settings = make_settings(tmp_path, clean_env)

    def key_of(settings=settings, compilers=compilers, **over: Any) -> str:
        req = parse_request(request_data(kernel_source=str(src), **over), tmp_path)
        return pipeline.prepare(req, settings, compilers, pipeline.JobOptions()).key

    k0 = key_of()
    assert key_of() == k0
    src.write_text(src.read_text() + "\n/* changed */\n")
    os.utime(src, (old + 1, old + 1))
    k1 = key_of()
    assert k1 != k0, "the source digest is part of the key"
    assert key_of(options={"op_debug_level": 2}) != k1, "debug flags are part of the key"
    wrapper = counting_cc(tmp_path / "w", body="")
    (tmp_path / "w" / "cc-gcc").write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "gcc (Patched) 12.2.0-99"; exit 0; fi\n'
        'exec gcc "$@"\n'
    )
    other = make_settings(tmp_path, clean_env, compilers={"cc": str(wrapper)})
    assert key_of(other, keys.Compilers(other.sections["compilers"])) != k1


def test_source_digest_is_remembered_only_when_not_racy(tmp_path: Path) -> None:
    src = tmp_path / "k.c"
    src.write_text("int a;\n")
    d0 = keys.source_sha256(src)
    src.write_text("int b;\n")  # same size, same second: must not be served from memory
    assert keys.source_sha256(src) != d0
    assert json.dumps(keys.source_sha256(src))  # plain hex


def test_compilers_pin_the_path_and_notice_a_changed_compiler(tmp_path: Path) -> None:
    fake = tmp_path / "cc"

    def install(version: str) -> None:
        fake.write_text(
            f'#!/bin/sh\nif [ "$1" = "--version" ]; then echo "{version}"; exit 0; fi\n'
            'exec gcc "$@"\n'
        )
        fake.chmod(0o755)

    install("fakecc 1.0")
    compilers = keys.Compilers({"cc": str(fake)})
    assert compilers.identity("c").version == "fakecc 1.0"
    assert compilers.backend("c").config["cc"] == str(fake)
    install("fakecc 2.0 (upgraded)")  # same path, new file: one stat tells
    assert compilers.identity("c").version == "fakecc 2.0 (upgraded)"
    found = keys.Compilers({}).backend("c")
    assert Path(str(found.config["cc"])).is_absolute(), "pinned to the compiler found on PATH"
