"""Precompiled packages in CANN's layout (docs/design.md#precompiled-binaries): pack from the cache,
look up, jit_compile."""

from __future__ import annotations

import json
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cachemgr.compile import precompiled
from cachemgr.compile.queue import CompileQueue
from cachemgr.errors import InvalidInputError
from tests.compile_util import SOC, make_settings, request
from tests.conftest import publish, run_cli


def test_names() -> None:
    assert precompiled.soc_dirs("Ascend910B1") == ["ascend910b", "ascend910b1"]
    assert precompiled.soc_dirs("Ascend310P3") == ["ascend310p", "ascend310p3"]
    assert precompiled.soc_dirs("Ascend910_9391") == ["ascend910_9391"]
    assert precompiled.op_file("SoftmaxV2") == "softmax_v2"
    assert precompiled.op_file("MatMul") == "mat_mul"
    assert precompiled.op_file("AddCustom") == "add_custom"


@pytest.mark.parametrize(
    ("pattern", "shape", "ok"),
    [
        ([-2], [3, 4], True),
        ([-2], [-2], True),
        ([-1, 4], [3, 4], True),
        ([-1, 4], [-1, 4], True),
        ([-1, 4], [3, 5], False),
        ([3, 4], [3, 4], True),
        ([3, 4], [-1, 4], False),
        ([3], [3, 1], False),
        ([-1, -1], [-2], False),
    ],
)
def test_shape_matches(pattern: list[int], shape: list[int], ok: bool) -> None:
    assert precompiled.shape_matches(pattern, shape) is ok


def _dynamic(tmp_path: Path, name: str = "dyn", **over: object):
    data = {
        "inputs": [
            {"shape": [-1], "dtype": "float32", "format": "ND"},
            {"shape": [1], "dtype": "float32", "format": "ND"},
        ],
        "outputs": [{"shape": [-1], "dtype": "float32", "format": "ND"}],
        **over,
    }
    return request(tmp_path, name, **data)


@pytest.fixture
def package(tmp_path: Path, clean_env) -> tuple[Path, dict[str, str]]:
    """A package packed from two real cache entries: a dynamic and a static Add."""
    settings = make_settings(tmp_path, clean_env)
    with CompileQueue(settings, workers=2) as q:
        dyn = q.compile(_dynamic(tmp_path, options={"jit_compile": "true"}))
        static = q.compile(request(tmp_path, "static"))
    assert (dyn.status, static.status) == ("compiled", "compiled")
    chip = tmp_path / "cache" / "kernel_cache" / SOC
    written = precompiled.pack(chip, [dyn.kernel_name, static.kernel_name], tmp_path / "pkg")
    assert len(written) == 5  # 2 x (json + binary) + one config
    return tmp_path / "pkg", {"dyn": dyn.kernel_name, "static": static.kernel_name}


def test_pack_writes_canns_layout(package) -> None:
    root, kernels = package
    config = json.loads((root / "config" / "ascend910b" / "add.json").read_text())
    items = config["binList"]
    assert len(items) == 2
    dyn = next(i for i in items if i["opMode"] == "dynamic")
    assert dyn["staticKey"] in kernels["dyn"]
    assert dyn["inputs"][0] == {
        "index": 0,
        "paramType": "required",
        "shape": [-1],
        "dtype": "float32",
        "format": "ND",
    }
    assert dyn["deterministic"] == "false" and dyn["attrs"] == []
    rel = dyn["binInfo"]["jsonFilePath"]
    assert rel.startswith("ascend910b/add/Add_") and rel.endswith(".json")
    doc = json.loads((root / rel).read_text())
    assert doc["binFileName"] == Path(rel).stem and doc["filePath"] == rel
    binary = root / Path(rel).with_suffix(".o")
    assert stat.S_IMODE(binary.stat().st_mode) == 0o444
    assert doc["kernelName"] == "add_kernel"


@pytest.mark.parametrize(
    ("jit", "which", "status"),
    [
        ("false", "dyn", "binary"),
        ("auto", "dyn", "binary"),
        ("true", "dyn", "compiled"),
        ("false", "static", "binary"),
        ("auto", "static", "compiled"),
    ],
)
def test_jit_compile_and_packages(tmp_path, clean_env, package, jit, which, status) -> None:
    root, _ = package
    settings = make_settings(tmp_path / "fresh", clean_env)
    req = _dynamic if which == "dyn" else request
    with CompileQueue(settings, workers=1, binary_dirs=[root]) as q:
        outcome = q.compile(req(tmp_path, f"{which}-{jit}", options={"jit_compile": jit}))
    assert outcome.status == status, outcome.error
    if status == "binary":
        assert all(root in f.parents for f in outcome.files)
        assert not (tmp_path / "fresh" / "cache" / "kernel_cache" / SOC).exists()


def _edit_items(root: Path, edit: Callable[[dict[str, Any]], object]) -> None:
    """Apply ``edit`` to every ``binList`` item of the package's configs under ``root``."""
    for config in (root / "config").rglob("*.json"):
        config.chmod(0o644)
        doc = json.loads(config.read_text())
        for item in doc["binList"]:
            edit(item)
        config.write_text(json.dumps(doc))


def test_signature_match_and_misses(tmp_path, clean_env, package) -> None:
    """Items without a staticKey (CANN's own packages) match by CANN's binList signature."""
    root, _ = package
    _edit_items(root, lambda item: item.pop("staticKey"))
    settings = make_settings(tmp_path / "fresh", clean_env, jit_compile="false")
    with CompileQueue(settings, workers=1, binary_dirs=[root]) as q:
        other_key = q.compile(_dynamic(tmp_path, "k", defines={"N": 4096, "B_N": 1, "X": 1}))
        other_dtype = q.compile(
            _dynamic(
                tmp_path,
                "d",
                outputs=[{"shape": [-1], "dtype": "float16", "format": "ND"}],
            )
        )
        with_attr = q.compile(_dynamic(tmp_path, "a", attrs={"alpha": 2}))
        deterministic = q.compile(_dynamic(tmp_path, "det", options={"deterministic": 1}))
    assert other_key.status == "binary", "CANN's item: matched by signature"
    assert other_dtype.status == "compiled" and with_attr.status == "compiled"
    assert deterministic.status == "compiled"


def test_a_package_item_with_a_non_string_dtype_is_no_match(tmp_path, clean_env, package) -> None:
    """A package's config is untrusted input: ``"dtype": ["float32"]`` (a list: unhashable)
    made the signature match raise TypeError; it is an item that matches nothing."""
    root, _ = package

    def list_dtype(item: dict[str, Any]) -> None:
        item.pop("staticKey")
        item["inputs"][0]["dtype"] = ["float32"]

    _edit_items(root, list_dtype)
    settings = make_settings(tmp_path / "fresh", clean_env, jit_compile="false")
    with CompileQueue(settings, workers=1, binary_dirs=[root]) as q:
        outcome = q.compile(_dynamic(tmp_path, "k"))
    assert outcome.status == "compiled", outcome.error


def test_a_deeply_nested_package_config_is_an_unreadable_one(tmp_path, clean_env, package) -> None:
    """A package's config is untrusted input: ``[[[…]]]`` made the parser raise
    ``RecursionError``, not handled, so every lookup of every compile failed with it; it is
    an unreadable config (one warning) and the kernel compiles."""
    root, _ = package
    for config in (root / "config").rglob("*.json"):
        config.chmod(0o644)
        config.write_text("[" * 30000 + "]" * 30000)
    settings = make_settings(tmp_path / "fresh", clean_env, jit_compile="false")
    with CompileQueue(settings, workers=1, binary_dirs=[root]) as q:
        outcome = q.compile(_dynamic(tmp_path, "k"))
    assert outcome.status == "compiled", outcome.error


def test_a_corrupt_package_binary_is_not_served(tmp_path, clean_env, package) -> None:
    root, _ = package
    for binary in root.rglob("*.o"):
        binary.chmod(0o644)
        binary.write_bytes(binary.read_bytes()[:-4] + b"evil")
    settings = make_settings(tmp_path / "fresh", clean_env, jit_compile="false")
    with CompileQueue(settings, workers=1, binary_dirs=[root]) as q:
        assert q.compile(_dynamic(tmp_path)).status == "compiled"


def test_pack_refuses_what_it_cannot_pack(tmp_path, package, fixture_cache) -> None:
    chip = tmp_path / "cache" / "kernel_cache" / SOC
    with pytest.raises(InvalidInputError, match="no entry te_add_nothing"):
        precompiled.pack(chip, ["te_add_nothing"], tmp_path / "pkg2")
    publish(chip, "te_mul_1", b"a CANN-written binary")  # GE's json: no supportInfo
    with pytest.raises(InvalidInputError, match="te_mul_1 has no supportInfo"):
        precompiled.pack(chip, ["te_mul_1"], tmp_path / "pkg2")
    ge_chip = tmp_path / "ge" / SOC
    shutil.copytree(fixture_cache / "kernel_cache" / SOC, ge_chip)
    for path in ge_chip.iterdir():
        path.chmod(0o644)
    bad = "te_Mul_cf8bca71d603c5a259847f46639e214579ce2d71b2b25f0b45680b0ec3680a79"
    with pytest.raises(InvalidInputError, match=f"{bad} does not verify: .*sha256"):
        precompiled.pack(ge_chip, [bad], tmp_path / "pkg2")
    assert not (tmp_path / "pkg2").exists()


def test_cli_pack_all(tmp_path, clean_env, package) -> None:
    _, kernels = package
    out = tmp_path / "pkg3"
    proc = run_cli(
        "pack", "--all", "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--json"
    )
    assert proc.returncode == 0, proc.stderr
    written = json.loads(proc.stdout)
    assert len(written) == 5 and all(Path(p).is_file() for p in written)
    proc = run_cli("pack", "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "te_add_0")
    assert proc.returncode == 2 and "no entry 'te_add_0'" in proc.stderr
    assert kernels
