"""Compile requests: schema, shapes, sources, options and their origins."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachemgr.compile import request as request_mod
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
    # the current folder (docs/design.md#debug-compiles-and-kernel_meta)
    assert opts.kernel_meta_dir == tmp_path / "kernel_meta"
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


# --- the fast schema check --------------------------------------------------

_JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=2**31),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "ND", "float32", "float", "1", "true", "auto", "a b", "\x01", "Add"]),
    st.text(max_size=8),
)
_JSON = st.recursive(
    _JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into ``value`` (dict keys, list indexes), the root included."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def _mutated_requests(draw: st.DrawFn) -> Any:
    """A valid request (every optional field set) with a few random changes: a value
    replaced, a key dropped or added anywhere in it."""
    data = request_data(
        op_name="node_1",
        attrs={"axis": -1},
        defines={"N": 4, "F": 1.5, "B": True, "S": "x"},
        include_dirs=["inc"],
        extra_flags=["-O2"],
        options={"jit_compile": "auto", "deterministic": 1, "op_debug_level": 0,
                 "precision_mode": "force_fp16", "aicore_num": 2},
    )  # fmt: skip
    data["inputs"][0]["name"] = "x"
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(_paths(data)))
        parent: Any = data
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "drop", "add"]))
        if not path:
            if action == "replace":
                return draw(_JSON)
            continue
        if action == "replace":
            parent[path[-1]] = draw(_JSON)
        elif action == "drop" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "drop" and isinstance(parent, list):
            parent.pop(path[-1])
        elif isinstance(parent[path[-1]], dict):
            parent[path[-1]][draw(st.text(max_size=6))] = draw(_JSON)
        elif isinstance(parent[path[-1]], list):
            parent[path[-1]].append(draw(_JSON))
    return data


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(_mutated_requests())
def test_fast_check_accepts_only_what_jsonschema_accepts(data: Any) -> None:
    """The hit path's hand-compiled check never lets through a request the schema refuses,
    and accepts every request the schema accepts (so jsonschema runs only on errors)."""
    import jsonschema

    fast = request_mod._fast_check()
    assert fast is not None, "the request schema uses a keyword the fast check lacks"
    valid = jsonschema.Draft202012Validator(schema()).is_valid(data)
    assert fast(data) == valid, f"fast check says {fast(data)}, jsonschema {valid}: {data!r}"


@pytest.mark.parametrize("path", sorted(REQUESTS.glob("*.json")), ids=lambda p: p.stem)
def test_fast_check_accepts_the_examples(path: Path) -> None:
    assert request_mod._schema_valid(json.loads(path.read_text()))


def test_fast_check_refuses_a_schema_it_cannot_implement() -> None:
    with pytest.raises(ValueError, match="oneOf"):
        request_mod._compile_check({"type": "object", "oneOf": []}, {})
    with pytest.raises(ValueError, match=r"\$ref"):
        request_mod._compile_check({"$ref": "https://elsewhere/x.json"}, {})


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"attrs": {"alpha": "x\udc80"}}, "attrs.alpha"),
        ({"attrs": {"a\ud800": 1}}, "attrs"),
        ({"attrs": {"t": [{"k": ["\udfff"]}]}}, "attrs.t[0].k[0]"),
        ({"defines": {"N": "\udc80"}}, "defines.N"),
        ({"op_name": "n\udc80"}, "op_name"),
        ({"extra_flags": ["-DX=\udc80"]}, "extra_flags[0]"),
    ],
    ids=["attr-value", "attr-key", "nested", "define", "op_name", "flag"],
)
def test_a_lone_surrogate_is_bad_input_naming_its_field(
    tmp_path: Path, over: dict[str, Any], field: str
) -> None:
    """JSON's ``\\udc80`` escape decodes to a lone surrogate, which no UTF-8 text holds:
    the key's canonical form failed to encode it, an internal error (exit 70) instead of
    the bad request's one line naming the file, the field and the value."""
    message = _error(tmp_path, json.dumps(request_data(**over)))
    assert f" {field}" in message and "not UTF-8 text" in message, message
