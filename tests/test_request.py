"""Compile requests (issue 4): schema, shapes, sources, options and their origins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachemgr.compile.request import (
    MAX_ELEMENTS,
    load_request,
    parse_request,
    resolve_options,
    schema,
)
from cachemgr.compilers import LANGUAGES
from cachemgr.errors import InvalidInputError
from tests.compile_util import REQUESTS, make_settings, request_data


def _write(tmp_path: Path, data: object, name: str = "r.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _error(tmp_path: Path, data: object) -> str:
    with pytest.raises(InvalidInputError) as info:
        load_request(_write(tmp_path, data))
    message = str(info.value)
    assert "\n" not in message
    assert "r.json" in message, "the error names the request file"
    return message


@pytest.mark.parametrize("path", sorted(REQUESTS.glob("*.json")), ids=lambda p: p.stem)
def test_example_requests_load(path: Path) -> None:
    req = load_request(path)
    assert req.kernel_source.is_absolute() and req.kernel_source.is_file()
    assert req.kernel_source.parent.parent.name == "kernels"  # relative to the request file
    assert req.outputs and not req.dynamic
    assert req.options == {}


def test_schema_languages_are_the_backends_languages() -> None:
    assert set(schema()["properties"]["language"]["enum"]) == set(LANGUAGES)


def test_malformed_json_names_line_and_column(tmp_path: Path) -> None:
    message = _error(tmp_path, '{"op_type": "Add",\n  "inputs": [}')
    assert "malformed JSON at line 2 column" in message


def test_nan_is_not_a_number(tmp_path: Path) -> None:
    text = json.dumps(request_data()).replace('"attrs": {}', '"attrs": {"alpha": NaN}')
    assert "NaN" in _error(tmp_path, text)


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("inputs", 0, "dtype"), "float33", "inputs[0].dtype='float33': unknown dtype"),
        (("outputs", 0, "format"), "NCWH", "outputs[0].format='NCWH': unknown format"),
        (("language",), "fortran", "language='fortran': unknown language"),
        (("op_type",), "Add-2", "op_type='Add-2' does not match"),
        (("kernel_entry",), "1abc", "kernel_entry='1abc' does not match"),
        (("defines",), {"N; rm": 1}, "does not match"),
        (("options", "op_compiler_cache_mode"), "sometimes", "unknown op_compiler_cache_mode"),
        (("options", "jit_compile"), "maybe", "unknown jit_compile"),
        (
            ("options", "op_debug_level"),
            7,
            "op_debug_level=7 is invalid; accepted: an integer 0..4",
        ),
        (("options", "precision_mode"), "fast", "unknown precision_mode"),
        (("options", "no_such_option"), 1, "unknown field 'no_such_option' in options"),
        (("inputs", 0, "shape"), [2, 2.5], "must be of type integer"),
    ],
)
def test_bad_field_is_named_with_its_value(tmp_path, path, value, expected) -> None:
    data = request_data(options={})
    target = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    message = _error(tmp_path, data)
    assert expected in message


def test_missing_and_unknown_fields(tmp_path: Path) -> None:
    data = request_data()
    del data["kernel_entry"]
    assert "missing field 'kernel_entry'" in _error(tmp_path, data)
    assert "unknown field 'colour'" in _error(tmp_path, request_data(colour="red"))


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ([4, -3], "negative dim -3"),
        ([-2, 4], "must be the whole shape [-2]"),
        ([65536, 32769], "more than 2^31"),
        ([-1, 2**16, 2**16, 2], "more than 2^31"),
    ],
)
def test_bad_shapes(tmp_path: Path, shape: list[int], expected: str) -> None:
    data = request_data()
    data["inputs"][0]["shape"] = shape
    message = _error(tmp_path, data)
    assert expected in message and "inputs[0].shape=" in message


def test_dynamic_shapes_and_the_element_limit(tmp_path: Path) -> None:
    data = request_data()
    data["inputs"][0]["shape"] = [-1, 4096]
    data["inputs"][1]["shape"] = [-2]
    data["outputs"][0]["shape"] = [2**16, 2**15]  # exactly 2^31 elements is allowed
    req = load_request(_write(tmp_path, data))
    assert req.dynamic
    assert req.inputs[1].shape == (-2,) and req.outputs[0].shape == (65536, 32768)
    assert MAX_ELEMENTS == 65536 * 32768


def test_missing_source_names_the_path(tmp_path: Path) -> None:
    message = _error(tmp_path, request_data(kernel_source="nowhere/add.c"))
    assert "kernel_source='nowhere/add.c'" in message
    assert str(tmp_path / "nowhere" / "add.c") in message


def test_dtype_aliases_fold(tmp_path: Path) -> None:
    data = request_data()
    data["inputs"][0]["dtype"] = "float"
    data["inputs"][1]["dtype"] = "bf16"
    req = load_request(_write(tmp_path, data))
    assert [t.dtype for t in req.inputs] == ["float32", "bfloat16"]


def test_options_are_normalised_and_paths_relative_to_the_request(tmp_path: Path) -> None:
    opts = {
        "jit_compile": 0,
        "op_debug_level": "2",
        "op_debug_config": "dbg/x.cfg",
        "debug_dir": "meta",
        "deterministic": "1",
        "aicore_num": 24,
    }
    req = load_request(_write(tmp_path, request_data(options=opts)))
    assert req.options["jit_compile"] == "false"
    assert req.options["op_debug_level"] == 2
    assert req.options["op_debug_config"] == tmp_path / "dbg" / "x.cfg"
    assert req.options["debug_dir"] == tmp_path / "meta"
    assert req.options["deterministic"] is True
    assert req.options["aicore_num"] == 24


def test_missing_options_come_from_the_configuration(tmp_path: Path, clean_env) -> None:
    settings = make_settings(
        tmp_path, clean_env, op_compiler_cache_mode="disable", jit_compile="false"
    )
    req = load_request(_write(tmp_path, request_data(options={"jit_compile": "true"})))
    opts = resolve_options(req, settings)
    assert opts.op_compiler_cache_mode == "disable"  # from the configuration
    assert opts.jit_compile == "true"  # the request wins
    assert opts.op_debug_level == 0 and opts.op_debug_config is None
    assert opts.kernel_meta_dir == tmp_path / "kernel_meta"  # cwd (SPEC §7)
    assert opts.deterministic is False and opts.precision_mode == ""
    filled = parse_request(request_data(options={"jit_compile": "true"}), tmp_path, settings)
    assert filled.options["op_compiler_cache_mode"] == "disable"
    assert resolve_options(filled, settings) == opts


def test_debug_dir_of_the_request_beats_the_configuration(tmp_path: Path, clean_env) -> None:
    settings = make_settings(tmp_path, clean_env, debug_dir=str(tmp_path / "conf"))
    assert resolve_options(parse_request(request_data(), tmp_path), settings).kernel_meta_dir == (
        tmp_path / "conf" / "kernel_meta"
    )
    req = parse_request(request_data(options={"debug_dir": "mine"}), tmp_path)
    assert resolve_options(req, settings).kernel_meta_dir == tmp_path / "mine" / "kernel_meta"


def test_bad_path_characters_in_options(tmp_path: Path) -> None:
    message = _error(tmp_path, request_data(options={"debug_dir": "a b"}))
    assert "debug_dir" in message and "' '" in message
