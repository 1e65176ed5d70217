"""Compile requests: one operator to build, read from JSON and checked (layer 6).

A request names the operator (``op_type``, ``soc_version``), its kernel (``language``,
``kernel_source``, ``kernel_entry``, ``defines``), its tensors (``inputs``/``outputs``: shape,
dtype, format), ``attrs`` and compile ``options``. The structure is checked against
``cachemgr/schemas/compile_request.schema.json`` (JSON Schema), then the meaning: shapes (dims
≥ 0, ``-1`` = dynamic dim, the shape ``[-2]`` = unknown rank, at most 2^31 elements), a source
file that exists. A relative path is relative to the request file.

Options missing from the request come from the resolved configuration
(docs/design.md#options-and-their-origins) through
:func:`resolve_options`. Every error is one line naming the field, the value and the request
it came from (:class:`~cachemgr.errors.InvalidInputError`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import xxhash

from cachemgr import parsedfiles
from cachemgr.compile import extraflags
from cachemgr.config import layout, options, socs
from cachemgr.config.options import Settings
from cachemgr.errors import ConfigError, InvalidInputError
from cachemgr.storage import safeio

#: The largest number of elements a tensor may have ("more than 2^31 elements").
MAX_ELEMENTS = 2**31
#: A dim of unknown size (dynamic shape, docs/design.md#precompiled-binaries).
DYNAMIC_DIM = -1
#: The whole shape ``[-2]``: unknown rank (docs/design.md#precompiled-binaries).
UNKNOWN_RANK = -2
#: Spellings of one dtype that are the same type (CANN accepts both); the key uses the first.
DTYPE_ALIASES = {"float": "float32", "bf16": "bfloat16", "float64": "double"}
#: Compile options a request may carry, beyond the ones of :data:`cachemgr.config.options.OPTIONS`.
KEY_OPTIONS = (
    "deterministic",
    "precision_mode",
    "precision_mode_v2",
    "op_select_implmode",
    "optypelist_for_implmode",
    "deterministic_level",
    "enable_small_channel",
    "aicore_num",
    "vector_core_num",
)
_PATH_OPTIONS = ("op_debug_config", "debug_dir")
_SETTINGS_OPTIONS = ("op_compiler_cache_mode", "jit_compile", "op_debug_level")


@dataclass(frozen=True)
class TensorDesc:
    """One input or output: ``shape`` (dims; -1 dynamic; ``(-2,)`` unknown rank), canonical
    ``dtype`` (``float32``, ``float16``, ...) and ``format`` (``ND``, ``NCHW``, ...)."""

    shape: tuple[int, ...]
    dtype: str
    format: str

    @property
    def dynamic(self) -> bool:
        """True for a dynamic dim (-1) or an unknown rank ([-2])
        (docs/design.md#precompiled-binaries)."""
        return any(d < 0 for d in self.shape)

    def to_json(self) -> dict[str, Any]:
        """``{"shape": [...], "dtype": ..., "format": ...}`` (canonical dtype)."""
        return {"shape": list(self.shape), "dtype": self.dtype, "format": self.format}


@dataclass(frozen=True)
class CompileRequest:
    """A checked compile request.

    :ivar kernel_source: absolute path of the kernel source.
    :ivar options: the options the request itself set, normalised (``jit_compile`` →
        ``auto``/``true``/``false``, ``op_debug_level`` → int, paths → absolute ``Path``,
        ``deterministic`` → bool); see :func:`resolve_options` for the rest.
    :ivar origin: where it came from (the request file, or ``"request"``), for messages.
    :ivar include_dirs: absolute include folders (``include_dirs`` then the ``-I`` of
        ``extra_flags``), in order.
    :ivar extra_flags: allowed compiler arguments (:mod:`cachemgr.compile.extraflags`), ``-I`` moved
        to ``include_dirs``.
    """

    op_type: str
    soc_version: str
    language: str
    kernel_source: Path
    kernel_entry: str
    inputs: tuple[TensorDesc, ...]
    outputs: tuple[TensorDesc, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict, hash=False)
    defines: Mapping[str, str | int | float | bool] = field(default_factory=dict, hash=False)
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    op_name: str | None = None
    origin: str = "request"
    include_dirs: tuple[Path, ...] = ()
    extra_flags: tuple[str, ...] = ()
    #: the framework the request says it comes from (``tf``, ``ge``, ``atc``, ``torch_npu``):
    #: its rule decides which ``op_debug_level`` keeps the cache on
    #: (docs/compiling.md#debug-options-and-the-cache-per-framework); not part of the key
    framework: str = "tf"

    @property
    def dynamic(self) -> bool:
        """True when any input or output has a -1 dim or unknown rank
        (docs/design.md#precompiled-binaries)."""
        return any(t.dynamic for t in (*self.inputs, *self.outputs))


@dataclass(frozen=True)
class RequestOptions:
    """Every option a compile needs, from the request or else the configuration
    (docs/design.md#options-and-their-origins).

    :ivar op_debug_config: the ``.cfg`` path, or None when unset.
    :ivar kernel_meta_dir: ``<base>/kernel_meta`` (base = request ``debug_dir`` > configured
        ``debug_dir`` > ``ASCEND_WORK_PATH`` > current directory,
        docs/design.md#debug-compiles-and-kernel_meta).
    :ivar extra: the other key-relevant options (:data:`KEY_OPTIONS` minus the two named).
    """

    op_compiler_cache_mode: str
    jit_compile: str
    op_debug_level: int
    op_debug_config: Path | None
    kernel_meta_dir: Path
    deterministic: bool
    precision_mode: str
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False)


@cache
def schema() -> dict[str, Any]:
    """The request JSON Schema (``cachemgr/schemas/compile_request.schema.json``)."""
    # beside the package's __init__ (importlib.resources would import zipfile and tempfile
    # on the hit path)
    package = Path(__file__).parents[__name__.count(".") - 1]  # cachemgr/, wherever this is
    text = package / "schemas" / "compile_request.schema.json"
    loaded: dict[str, Any] = json.loads(text.read_text(encoding="utf-8"))
    return loaded


@cache
def _validator() -> Any:
    import jsonschema  # ~50 ms of imports: only for a request the fast check refuses

    cls = jsonschema.validators.validator_for(schema())
    return cls(schema())


#: The JSON Schema keywords :func:`_compile_check` implements (draft 2020-12 semantics, as
#: ``jsonschema`` applies them); annotations are ignored. A schema using any other keyword
#: gets no fast check: every request then goes through ``jsonschema``.
_CHECKED = frozenset(
    {"type", "enum", "required", "properties", "additionalProperties", "pattern", "minLength"}
    | {"items", "maxItems", "minItems", "$ref", "propertyNames", "minimum"}
)
_ANNOTATIONS = frozenset(("$schema", "$id", "$defs", "title", "description"))
_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer())
    ),
}


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality of scalars as ``jsonschema``'s ``enum`` has it: ``true`` is not ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and isinstance(a, str) and a == b


def _compile_check(node: dict[str, Any], root: dict[str, Any]) -> Callable[[Any], bool]:
    """A predicate that is True only when ``node`` (a schema) accepts the value.

    :raises ValueError: ``node`` uses a keyword outside :data:`_CHECKED` (or a remote ``$ref``).
    """
    unknown = set(node) - _CHECKED - _ANNOTATIONS
    if unknown:
        raise ValueError(f"no fast check for {sorted(unknown)}")
    checks: list[Callable[[Any], bool]] = []
    if "$ref" in node:
        ref = node["$ref"]
        if not ref.startswith("#/$defs/"):
            raise ValueError(f"no fast check for $ref {ref}")
        checks.append(_compile_check(root["$defs"][ref.removeprefix("#/$defs/")], root))
    if "type" in node:
        kinds = [node["type"]] if isinstance(node["type"], str) else node["type"]
        tests = [_TYPES[k] for k in kinds]
        checks.append(lambda v: any(t(v) for t in tests))
    if "enum" in node:
        accepted = node["enum"]
        checks.append(lambda v: any(_json_equal(v, a) for a in accepted))
    checks += _string_checks(node) + _array_checks(node, root) + _object_checks(node, root)
    if "minimum" in node:
        low = node["minimum"]
        checks.append(lambda v: not _TYPES["number"](v) or v >= low)
    return lambda v: all(c(v) for c in checks)


def _string_checks(node: dict[str, Any]) -> list[Callable[[Any], bool]]:
    checks: list[Callable[[Any], bool]] = []
    if "pattern" in node:
        search = re.compile(node["pattern"]).search  # jsonschema: re.search, unanchored
        checks.append(lambda v: not isinstance(v, str) or search(v) is not None)
    if "minLength" in node:
        least = node["minLength"]
        checks.append(lambda v: not isinstance(v, str) or len(v) >= least)
    return checks


def _array_checks(node: dict[str, Any], root: dict[str, Any]) -> list[Callable[[Any], bool]]:
    checks: list[Callable[[Any], bool]] = []
    if "items" in node:
        item = _compile_check(node["items"], root)
        checks.append(lambda v: not isinstance(v, list) or all(item(x) for x in v))
    if "maxItems" in node:
        most = node["maxItems"]
        checks.append(lambda v: not isinstance(v, list) or len(v) <= most)
    if "minItems" in node:
        least = node["minItems"]
        checks.append(lambda v: not isinstance(v, list) or len(v) >= least)
    return checks


def _object_checks(node: dict[str, Any], root: dict[str, Any]) -> list[Callable[[Any], bool]]:
    checks: list[Callable[[Any], bool]] = []
    required = node.get("required", [])
    props = {k: _compile_check(s, root) for k, s in node.get("properties", {}).items()}
    extra = node.get("additionalProperties", True)
    other = extra if isinstance(extra, bool) else _compile_check(extra, root)
    names = _compile_check(node["propertyNames"], root) if "propertyNames" in node else None

    def check(v: Any) -> bool:
        if not isinstance(v, dict):
            return True
        if any(k not in v for k in required):
            return False
        for key, value in v.items():
            if names is not None and not names(key):
                return False
            own = props.get(key)
            if own is not None:
                if not own(value):
                    return False
            elif other is False or (other is not True and not other(value)):
                return False
        return True

    checks.append(check)
    return checks


@cache
def _fast_check() -> Callable[[Any], bool] | None:
    """The request schema as a plain predicate (no ``jsonschema`` import: the hit path of
    ``cachemgr compile`` must start fast); None when the schema uses a
    keyword it does not implement. True means ``jsonschema`` would accept the request too
    (``tests/test_request.py`` checks that on generated requests); False sends the request to
    ``jsonschema`` for its one-line message."""
    try:
        return _compile_check(schema(), schema())
    except (ValueError, KeyError, re.error):
        return None


def _schema_valid(data: Any) -> bool:
    """True when the fast check accepts ``data`` (then ``jsonschema`` is not imported)."""
    check = _fast_check()
    return check is not None and check(data)


def load_request(path: Path, settings: Settings | None = None) -> CompileRequest:
    """Read and check the request file ``path`` (see :func:`parse_request`).

    :raises InvalidInputError: unreadable file, malformed JSON (with line and column), or any
        error of :func:`parse_request` — one line naming the file.
    """
    path = Path(path)
    try:
        resolved = path.resolve()  # once: the bytes and the base folder from one file
        # non-blocking, regular files only, capped: a FIFO named here must not hang us
        raw = safeio.read_regular(resolved)
        parsedfiles.note(str(path), raw, str(resolved))  # what a direct memo binds to
        text = raw.decode("utf-8")
    except safeio.UnsafeFileError as exc:
        raise InvalidInputError(f"request {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
        raise InvalidInputError(f"request {path}: cannot read ({why})") from exc
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(
            f"request {path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except ValueError as exc:
        raise InvalidInputError(f"request {path}: {exc}") from None
    except RecursionError:
        raise InvalidInputError(f"request {path}: JSON nested too deeply") from None
    return parse_request(data, resolved.parent, settings, origin=str(path))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_request(
    data: Any,
    base_dir: Path,
    settings: Settings | None = None,
    origin: str = "request",
    check_exists: bool = True,
) -> CompileRequest:
    """Check ``data`` (a decoded request) and build a :class:`CompileRequest`.

    :param base_dir: folder that relative ``kernel_source``/``op_debug_config``/``debug_dir``
        are relative to (the request file's folder).
    :param settings: when given, the options the request leaves out are filled in from it
        now (docs/design.md#options-and-their-origins); otherwise :func:`resolve_options` does it
        when the request is compiled.
    :param origin: where ``data`` came from, for messages (the request file).
    :param check_exists: check that ``kernel_source`` is a file; False when the request
        carries the source bytes (:mod:`cachemgr.compile.inputs`: the daemon opens no path a caller
        names).
    :raises InvalidInputError: one line naming ``origin``, the field and the value: a schema
        violation (unknown dtype/format/language, missing field, wrong type), a negative dim
        other than -1 or the shape [-2], more than 2^31 elements, a missing source file, a bad
        option value.
    """
    _check_text(data, origin)
    if not _schema_valid(data):
        errors = sorted(_validator().iter_errors(data), key=_error_rank)
        if errors:
            raise InvalidInputError(f"{origin}: {_describe(errors[0])}")
    if data["soc_version"] in (".", ".."):
        raise InvalidInputError(f"{origin}: soc_version={data['soc_version']!r} is not a chip")
    socs.check_soc_version(data["soc_version"], origin)  # it names the chip folder
    inputs = tuple(_tensor(t, f"inputs[{i}]", origin) for i, t in enumerate(data["inputs"]))
    outputs = tuple(_tensor(t, f"outputs[{i}]", origin) for i, t in enumerate(data["outputs"]))
    base_dir = Path(base_dir)
    source = _source_path(data["kernel_source"], base_dir, origin, check_exists)
    opts = _normalise_options(data.get("options", {}), base_dir, origin)
    flags = extraflags.check(data.get("extra_flags", []), origin)
    include_dirs = [_abs(d, base_dir) for d in data.get("include_dirs", [])]
    include_dirs += [_abs(f[2:], base_dir) for f in flags if f.startswith("-I")]
    req = CompileRequest(
        op_type=data["op_type"],
        soc_version=data["soc_version"],
        language=data["language"],
        kernel_source=source,
        kernel_entry=data["kernel_entry"],
        inputs=inputs,
        outputs=outputs,
        attrs=dict(data.get("attrs", {})),
        defines=dict(data.get("defines", {})),
        options=opts,
        op_name=data.get("op_name"),
        origin=origin,
        include_dirs=tuple(include_dirs),
        extra_flags=tuple(f for f in flags if not f.startswith("-I")),
        framework=data.get("framework", "tf"),
    )
    _check_attrs(req.attrs, origin)
    return req if settings is None else with_options(req, settings)


def _error_rank(err: Any) -> tuple[int, str]:
    # report the shallowest, then the most specific error first; stable for the tests
    return (len(err.absolute_path), str(list(err.absolute_path)))


def _where(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "request"


def _describe(err: Any) -> str:
    """One line for a ``jsonschema.ValidationError``: where, the value, what is wrong."""
    where = _where(err.absolute_path)
    value = err.instance
    kind = err.validator
    if kind == "required":
        missing = [k for k in err.validator_value if k not in (value or {})]
        unknown = sorted(set(value or {}) - set(err.schema.get("properties", {})))
        typed = _close(missing[0], unknown)
        given = f": {typed!r} is given — did you mean {missing[0]!r}?" if typed else ""
        return f"missing field {missing[0]!r} in {where}{given}"
    if kind == "additionalProperties":
        extra = sorted(set(value) - set(err.schema.get("properties", {})))
        known = ", ".join(sorted(err.schema.get("properties", {})))
        if where == "options" and extra[0] in schema()["properties"]:  # e.g. extra_flags
            return (
                f"unknown field {extra[0]!r} in options: {extra[0]} goes at the top level of "
                f"the request, beside options (options takes: {known})"
            )
        meant = _close(extra[0], list(err.schema.get("properties", {})))
        hint = f"; did you mean {meant!r}?" if meant else ""
        return f"unknown field {extra[0]!r} in {where}{hint} (known: {known})"
    if kind == "enum":
        # as JSON spells them, each once: true and "true", 1 and "1" read the same here
        spelled = (v if isinstance(v, str) else json.dumps(v) for v in err.validator_value)
        accepted = ", ".join(dict.fromkeys(v for v in spelled if v != ""))
        what = where.rsplit(".", 1)[-1]
        return f"{where}={value!r}: unknown {what} (accepted: {accepted})"
    if kind == "type":
        return f"{where}={_short(value)} must be of type {err.validator_value}"
    if kind == "pattern" and "propertyNames" in err.schema_path:
        return f"{where}: name {value!r} does not match {err.validator_value}"
    if kind == "pattern":
        return f"{where}={value!r} does not match {err.validator_value}"
    return f"{where}={_short(value)}: {err.message}"


def _close(name: str, candidates: list[str]) -> str | None:
    """The candidate ``name`` most resembles (``optype`` → ``op_type``), or None: difflib's
    ratio, as click suggests a mistyped option."""
    import difflib

    found = difflib.get_close_matches(name, candidates, n=1)
    return found[0] if found else None


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _tensor(raw: Mapping[str, Any], where: str, origin: str) -> TensorDesc:
    shape = tuple(raw["shape"])
    if UNKNOWN_RANK in shape and shape != (UNKNOWN_RANK,):
        raise InvalidInputError(
            f"{origin}: {where}.shape={list(shape)}: -2 (unknown rank) must be the whole shape [-2]"
        )
    bad = [d for d in shape if d < DYNAMIC_DIM and shape != (UNKNOWN_RANK,)]
    if bad:
        raise InvalidInputError(
            f"{origin}: {where}.shape={list(shape)} has a negative dim {bad[0]} "
            "(dims are >= 0, -1 = dynamic, or the shape [-2] = unknown rank)"
        )
    known = [d for d in shape if d >= 0]
    count = math.prod(known) if known else 0
    if count > MAX_ELEMENTS:
        raise InvalidInputError(
            f"{origin}: {where}.shape={list(shape)} has {count} elements, more than 2^31"
        )
    dtype = DTYPE_ALIASES.get(raw["dtype"], raw["dtype"])
    return TensorDesc(shape, dtype, raw["format"])


#: Deepest nesting of ``attrs`` values (levels): the entry json embeds them, and a json
#: nested deeper than ``entry.MAX_JSON_DEPTH`` (64) is a bad entry — such a request was
#: compiled, then failed to publish (a compile for nothing, exit 1, not 2).
MAX_ATTRS_DEPTH = 32


def _check_text(data: Any, origin: str) -> None:
    """Every string of the request (keys too) UTF-8 text: JSON's ``\\udc80`` escape decodes
    to a lone surrogate, which no UTF-8 file or argument holds (the key's canonical form
    failed to encode one: an internal error, exit 70, naming nothing). The whole
    request is looked at by ``json``'s C encoder once (a few µs); only one that fails it is
    walked, to name the field.

    :raises InvalidInputError: naming the field's path and the value.
    """
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
        return
    except UnicodeEncodeError:
        pass
    except (TypeError, ValueError, RecursionError):
        return  # not JSON data, circular or too deep: the checks after this one name it
    todo: list[tuple[str, Any]] = [("", data)]
    while todo:
        where, value = todo.pop()
        if isinstance(value, str):
            if value.isascii():
                continue
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidInputError(
                    f"{origin}: {where or 'the request'}={value!r} is not UTF-8 text (a lone "
                    "surrogate: a \\u escape of half a pair)"
                ) from None
        elif isinstance(value, Mapping):
            for k, v in value.items():
                inner = f"{where}.{k}" if where else str(k)
                todo += [(f"{where or 'the request'} key", k), (inner, v)]
        elif isinstance(value, list):
            todo += [(f"{where}[{i}]", v) for i, v in enumerate(value)]


def _check_attrs(attrs: Mapping[str, Any], origin: str) -> None:
    """Every number in ``attrs`` finite (also inside lists and tables: an ``inf`` there was
    ``cannot serialise the key material``, naming nothing), nesting bounded.

    :raises InvalidInputError: naming the attribute's path and the value.
    """
    todo: list[tuple[str, Any, int]] = [(f"attrs.{k}", v, 1) for k, v in attrs.items()]
    while todo:
        where, value, depth = todo.pop()
        if depth > MAX_ATTRS_DEPTH:
            raise InvalidInputError(
                f"{origin}: {where}: attrs nested deeper than {MAX_ATTRS_DEPTH} levels"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidInputError(f"{origin}: {where}={value!r} is not a finite number")
        if isinstance(value, Mapping):
            todo += [(f"{where}.{k}", v, depth + 1) for k, v in value.items()]
        elif isinstance(value, list):
            todo += [(f"{where}[{i}]", v, depth + 1) for i, v in enumerate(value)]


def _abs(raw: str, base_dir: Path) -> Path:
    """``raw`` made absolute against ``base_dir`` and normalised (no file system access)."""
    return Path(os.path.normpath(raw if os.path.isabs(raw) else os.path.join(base_dir, raw)))


def _source_path(raw: str, base_dir: Path, origin: str, check_exists: bool) -> Path:
    if not check_exists:
        return _abs(raw, base_dir)
    return _existing_file(raw, base_dir, "kernel_source", origin)


def _existing_file(raw: str, base_dir: Path, name: str, origin: str) -> Path:
    """``raw`` made absolute against ``base_dir`` and normalised *without* following a
    symbolic link: the compiler is given the path as the caller names it, so a quoted
    ``#include`` of a linked source resolves in the link's folder, as the caller's own
    compiler run on that path would (docs/compiling.md#files-looked-for). It must be (a link
    to) a regular file.

    :raises InvalidInputError: missing, unreadable or not a file (one line naming it).
    """
    path = _abs(raw, base_dir)  # stat below: links followed by the kernel, no recursion
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise InvalidInputError(f"{origin}: {name}={raw!r} ({path}) does not exist") from None
    except OSError as exc:  # e.g. a folder this user may not enter
        raise InvalidInputError(
            f"{origin}: {name}={raw!r} ({path}) cannot be read ({exc.strerror})"
        ) from None
    if not stat.S_ISREG(mode):
        raise InvalidInputError(f"{origin}: {name}={raw!r} ({path}) is not a file")
    return path


_SPECS = {spec.name: spec for spec in options.OPTIONS}


def _normalise_options(raw: Mapping[str, Any], base_dir: Path, origin: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if name in _SETTINGS_OPTIONS:
            out[name] = _parse_setting(name, value, origin)
        elif name in _PATH_OPTIONS:
            out[name] = _parse_path(name, value, base_dir, origin)
        elif name == "deterministic":
            out[name] = str(value).lower() in ("1", "true")
        elif name == "enable_small_channel":
            out[name] = int(str(value).lower() in ("1", "true"))
        else:
            out[name] = value
    return out


def _parse_setting(name: str, value: Any, origin: str) -> Any:
    try:
        return _SPECS[name].parse(value)
    except ValueError as exc:
        raise InvalidInputError(f"{origin}: options.{name}={value!r} is invalid; {exc}") from None


def _parse_path(name: str, value: str, base_dir: Path, origin: str) -> Path | None:
    if value == "":
        return None
    path = value if Path(value).is_absolute() else str(base_dir / value)
    try:
        return layout.validate_path_value(path, name, origin)
    except ConfigError as exc:
        raise InvalidInputError(str(exc)) from None


def resolve_options(request: CompileRequest, settings: Settings) -> RequestOptions:
    """The request's options, each missing one taken from ``settings``
    (docs/design.md#options-and-their-origins).

    ``deterministic`` defaults to off and ``precision_mode`` to unset (``""``) when neither
    the request nor the configuration sets them.
    """
    opts = request.options

    def pick(name: str) -> Any:
        return opts[name] if name in opts else settings.value(name)

    cfg = opts.get("op_debug_config") if "op_debug_config" in opts else None
    if "op_debug_config" not in opts and settings.value("op_debug_config"):
        cfg = Path(settings.value("op_debug_config"))
    if opts.get("debug_dir") is not None:
        meta = layout.kernel_meta_dir(opts["debug_dir"])
    else:
        meta = Path(settings.value("kernel_meta_dir"))
    extra = {k: v for k, v in opts.items() if k in KEY_OPTIONS}
    extra.pop("deterministic", None)
    extra.pop("precision_mode", None)
    return RequestOptions(
        op_compiler_cache_mode=pick("op_compiler_cache_mode"),
        jit_compile=pick("jit_compile"),
        op_debug_level=int(pick("op_debug_level")),
        op_debug_config=cfg,
        kernel_meta_dir=meta,
        deterministic=bool(opts.get("deterministic", _setting(settings, "deterministic", False))),
        precision_mode=str(opts.get("precision_mode", _setting(settings, "precision_mode", ""))),
        extra=extra,
    )


def _setting(settings: Settings, name: str, default: Any) -> Any:
    res = settings.values.get(name)
    return default if res is None or res.value is None else res.value


def with_options(request: CompileRequest, settings: Settings) -> CompileRequest:
    """``request`` with every option filled in (request values win,
    docs/design.md#options-and-their-origins)."""
    opts = resolve_options(request, settings)
    filled = {
        **request.options,
        "op_compiler_cache_mode": opts.op_compiler_cache_mode,
        "jit_compile": opts.jit_compile,
        "op_debug_level": opts.op_debug_level,
        "op_debug_config": opts.op_debug_config,
        "debug_dir": opts.kernel_meta_dir.parent,
        "deterministic": opts.deterministic,
        "precision_mode": opts.precision_mode,
    }
    return dataclasses.replace(request, options=filled)


class ParsedRequests:
    """An LRU of parsed requests keyed by their canonical JSON and base folder, so a caller
    asking again for the same kernel skips schema validation (the hit path of the daemon and
    of ``cachemgr.Client``). Thread-safe.

    :param size: entries kept (each a few KB).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._items: OrderedDict[bytes, CompileRequest] = OrderedDict()

    def get(
        self, data: Mapping[str, Any], base_dir: str, origin: str, check_exists: bool = True
    ) -> CompileRequest:
        """:func:`parse_request` of ``data``, remembered.

        :raises InvalidInputError: as :func:`parse_request` (errors are not remembered).
        """
        raw = json.dumps(
            [data, base_dir, check_exists], sort_keys=True, separators=(",", ":")
        ).encode()
        key = xxhash.xxh3_128_digest(raw)
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                return found
        parsed = parse_request(dict(data), Path(base_dir), origin=origin, check_exists=check_exists)
        with self._lock:
            self._items[key] = parsed
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return parsed
