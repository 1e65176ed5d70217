"""The json shapes that make CANN GE's cache code abort — the one place they are listed.

GE (``hicann/ge``, ``compiler/opcompiler/op_compile_adapter/source/``) reads an entry's fields
with nlohmann::json's typed conversions (``std::string s = j.at("x")``, ``j.at("x").get<
std::string>()``), which throw ``type_error`` for a value of another type (``null``
included), and no caller catches it: the process ends in ``std::terminate`` — ``SIGABRT``,
exit 134 — and every CANN process that looks that kernel up, or evicts that chip folder,
dies. Only a parse error is caught (``common/te_file_utils.cc``
``TeFileUtils::GetJsonValueFromJsonFile``: a clean miss). The rules, each with the GE step
that throws and what must hold before that step is reached:

* **F1** a main json (lookup and eviction) whose ``binFileName`` and ``binFileSuffix`` are
  both present, one not a string: ``common/compile_result_utils.cc``
  ``CompileResultUtils::SetBinFilePath``; ``cache/te_cache_space_manager.cc``
  ``TeCacheSpaceManager::AddBinFileInfoFromJson``;
* **F2** a main json naming a ``*.o``/``*.so`` binary whose ``kernelName`` is present and not a
  string: ``CompileResultUtils::SetKernelBin`` / ``SetKernelBinBySo``;
* **F3** a main json whose ``headerFileSuffix`` is present and not a string, once F2's step
  passed (a ``kernelName`` string, or another binary suffix):
  ``CompileResultUtils::SetHeaderFilePath``, which ``ParseCompileResult`` calls for every
  binary;
* **F4** a main json naming a ``*.o``/``*.so`` binary, past F2 and F3, whose ``sha256`` is
  present and not a string: ``cache/te_cache_manager.cc``
  ``TeCacheManager::VerifyBinFileSha256``;
* **F5** a main json whose ``jsonList`` is present, not ``null``, with an item that is not an
  object with a string ``jsonFileName`` (a number, string or boolean ``jsonList`` is its own
  single item; an object's values are its items): ``TeCacheSpaceManager::GetFilesAccessTime``
  (``(*it)["jsonFileName"]`` on a non-object, or a missing or non-string name converted to a
  string);
* **F6** a sub-json that a ``jsonList`` names whose ``binFileName`` and ``binFileSuffix`` are
  both present, one not a string: ``GetFilesAccessTime`` → ``AddBinFileInfoFromJson``;
* **F7** a ``<name>_pre.json`` whose ``pattern`` is present and not a string, and **F8** one
  whose ``pattern`` is a string and ``coreType`` or ``prebuilt_options`` is present and not a
  string: ``TeCacheManager::MatchPreCompileCache``.

"Main json" is every ``*.json`` GE may read as one: its lookup reads ``<kernel>.json``
(``TeCacheManager::MatchCompileCache``); its eviction reads every ``*.json`` of the chip
folder but ``*_mix_aic.json``/``*_mix_aiv.json`` (``CollectCacheJsonFileAccessTime``) and
skips ``*_pre.json`` before parsing it (``GetFilesAccessTime``). Its eviction runs at every
CANN process start while the folder is over its limit (``CacheSpaceInitialize``).

What GE survives (a clean miss, never listed here): a json it cannot parse (also a number
overflowing a double, ``NaN``, a top level that is not an object: ``contains``/``find`` are
false), a missing field, a binary that is absent, empty or larger than ``INT_MAX``
(``TeFileUtils::GetBufferFromBinFile``), a ``sha256`` that differs. GE's cache code converts no
json number: ``blockDim`` and the other numbers are read after a hit by the engine's
``TbeJsonFileParse`` (``compiler/engines/nn_engine/.../tbe_json_parse_impl.cc``), which catches
json exceptions and fails the op for a ``blockDim`` outside ``[-1, 65535]`` — an error, not
an abort.

* **F0** a json nested deeper than Python's parser goes (its recursion limit, ~1,000
  levels): nlohmann's parser is iterative and has no depth limit, so GE reads it and may
  abort on any of the shapes above, which cachemgr cannot see. cachemgr never writes such a
  json; it is treated as a shape GE may abort on, never as one GE survives.

An entry with one of these shapes is never served by GE (it aborts, or misses before the
step), so removing it can never delete what GE considers valid. The reader copies
nlohmann's ``operator>>`` (a parser without ``strict``, exceptions on): a leading UTF-8 BOM is
skipped, only the first json value of the file is read and the bytes after it are never
looked at (whatever they are: more json, text, bytes that are not UTF-8); a byte sequence
that is not UTF-8 inside that value (its strings: nlohmann's lexer checks each one) is a
``parse_error``, which GE catches: a miss.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachemgr.config import layout
from cachemgr.errors import CacheMgrError
from cachemgr.storage import entry, fsutil

#: GE's file suffixes that its eviction never reads as main jsons
#: (``TeCacheSpaceManager::CollectCacheJsonFileAccessTime``).
SUB_JSON_SUFFIXES = ("_mix_aic.json", "_mix_aiv.json")
PRE_JSON_SUFFIX = entry.PRE_SUFFIX + ".json"
_KERNEL_BIN = entry.KERNEL_BIN_SUFFIXES
_SET_BIN = "compile_result_utils.cc CompileResultUtils::SetBinFilePath"
_EVICT = "te_cache_space_manager.cc TeCacheSpaceManager::GetFilesAccessTime"
_ADD_BIN = "te_cache_space_manager.cc TeCacheSpaceManager::AddBinFileInfoFromJson"
_PRE = "te_cache_manager.cc TeCacheManager::MatchPreCompileCache"


@dataclass(frozen=True)
class Fatal:
    """One shape that aborts GE: the file, its field, the value's json type and GE's step."""

    rule: str
    file: str
    field: str
    #: what is wrong, e.g. ``is a number (12345), not a string``
    detail: str
    where: str

    def line(self) -> str:
        """One log line: ``<file>: <field> <detail>: GE aborts in <function> (<rule>)``."""
        return f"{self.file}: {self.field} {self.detail}: GE aborts in {self.where} ({self.rule})"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "a string"


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True)
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"{_json_type(value)} ({text})"


def _not_string(data: dict[str, Any], key: str) -> bool:
    return key in data and not isinstance(data[key], str)


def _fatal(rule: str, file: str, data: dict[str, Any], key: str, where: str) -> Fatal:
    return Fatal(rule, file, key, f"is {_shown(data[key])}, not a string", where)


def _bin_names_fatal(data: dict[str, Any], file: str, rule: str, where: str) -> Fatal | None:
    """F1/F6: GE converts both names once both are present."""
    if "binFileName" not in data or "binFileSuffix" not in data:
        return None
    for key in ("binFileName", "binFileSuffix"):
        if not isinstance(data[key], str):
            return _fatal(rule, file, data, key, where)
    return None


def _json_list_fatal(data: dict[str, Any], file: str) -> Fatal | None:
    """F5: GE's eviction iterates ``jsonList`` (array, object values, or a primitive as its
    own item) and converts each item's ``jsonFileName`` to a string."""
    if "jsonList" not in data or data["jsonList"] is None:
        return None
    items = _json_list_items(data["jsonList"])
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("jsonFileName"), str):
            why = f"has the item {_shown(item)}, not an object with a string jsonFileName"
            return Fatal("F5", file, "jsonList", why, _EVICT)
    return None


def _json_list_items(value: Any) -> Iterable[Any]:
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        return value.values()
    return [value]


class _TooDeep:
    """The value :func:`parse_like_ge` returns for a json nested too deep for Python."""

    def __repr__(self) -> str:
        return "TOO_DEEP"


#: :func:`parse_like_ge`'s answer for a json GE parses and Python cannot (rule F0)
TOO_DEEP: Any = _TooDeep()


def _too_deep(file: str) -> Fatal:
    why = "nests deeper than Python's json parser goes; nlohmann has no limit and GE reads it"
    return Fatal("F0", file, "(the whole json)", why, "te_file_utils.cc GetJsonValueFromJsonFile")


def main_fatal(data: Any, file: str) -> Fatal | None:
    """The first shape of rules F0–F5 in a json GE reads as a main json, or None."""
    if data is TOO_DEEP:
        return _too_deep(file)
    if not isinstance(data, dict):
        return None  # contains()/find() are false on a non-object: a clean miss
    found = _bin_names_fatal(data, file, "F1", _SET_BIN) or _json_list_fatal(data, file)
    if found or "binFileName" not in data or "binFileSuffix" not in data:
        return found  # without both names the lookup misses before the next steps
    reads_bin = str(data["binFileName"] + data["binFileSuffix"]).endswith(_KERNEL_BIN)
    if reads_bin and _not_string(data, "kernelName"):
        where = "compile_result_utils.cc CompileResultUtils::SetKernelBin"
        return _fatal("F2", file, data, "kernelName", where)
    if reads_bin and "kernelName" not in data:
        return None  # SetKernelBin fails: a miss before the header and sha256
    if _not_string(data, "headerFileSuffix"):
        where = "compile_result_utils.cc CompileResultUtils::SetHeaderFilePath"
        return _fatal("F3", file, data, "headerFileSuffix", where)
    if reads_bin and _not_string(data, "sha256"):
        where = "te_cache_manager.cc TeCacheManager::VerifyBinFileSha256"
        return _fatal("F4", file, data, "sha256", where)
    return None


def sub_fatal(data: Any, file: str) -> Fatal | None:
    """Rules F0/F6 in a sub-json that a main json's ``jsonList`` names, or None."""
    if data is TOO_DEEP:
        return _too_deep(file)
    if not isinstance(data, dict):
        return None
    return _bin_names_fatal(data, file, "F6", _ADD_BIN)


def pre_fatal(data: Any, file: str) -> Fatal | None:
    """Rules F0/F7/F8 in a ``<name>_pre.json``, or None."""
    if data is TOO_DEEP:
        return _too_deep(file)
    if not isinstance(data, dict) or "pattern" not in data:
        return None
    for key in ("pattern", "coreType", "prebuilt_options"):
        if _not_string(data, key):
            return _fatal("F7" if key == "pattern" else "F8", file, data, key, _PRE)
    return None


def read_as_main(name: str) -> bool:
    """Does GE read ``name`` as a main json (its lookup or its eviction)?"""
    return name.endswith(".json") and not name.endswith((*SUB_JSON_SUFFIXES, PRE_JSON_SUFFIX))


def sub_json_names(data: Any) -> list[str]:
    """The sub-json names GE's eviction reads from a main json's ``jsonList`` (flat names
    only: cachemgr reads nothing outside the chip folder)."""
    if not isinstance(data, dict) or data.get("jsonList") is None:
        return []
    names = []
    for item in _json_list_items(data["jsonList"]):
        name = item.get("jsonFileName") if isinstance(item, dict) else None
        if isinstance(name, str):
            try:
                names.append(layout.safe_file_name(name, "jsonFileName"))
            except CacheMgrError:
                continue
    return names


def _refuse_constant(text: str) -> Any:
    raise ValueError(f"{text} is not json")  # NaN, Infinity: nlohmann refuses them


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number overflow parsing {text[:20]!r}")  # nlohmann's error 406
    return value


def _finite_int(text: str) -> int | float:
    if len(text) > 20:  # beyond (u)int64 nlohmann reads a double, which may overflow
        return _finite_float(text)
    return int(text)


_DECODER = json.JSONDecoder(
    parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_finite_int
)


_FAST = json.JSONDecoder()


def parse_like_ge(raw: bytes, exact: bool = True) -> Any:
    """The json value GE reads from ``raw`` (``ifs >> j``: BOM skipped, the first value
    only, the bytes after it never looked at), None when GE's parser fails (then GE
    misses, it does not abort), or :data:`TOO_DEEP` when the value nests deeper than
    Python's parser goes (rule F0: GE parses it). ``exact`` also refuses what nlohmann
    refuses and Python accepts (``NaN``, ``Infinity``, a number overflowing a double) — a
    hook per number, so a first pass goes without it.

    Bytes that are not UTF-8 are decoded as lone surrogates (``surrogateescape``): after the
    value they are ignored, as nlohmann never reads them; inside it (nlohmann's lexer
    checks every string's UTF-8, and any other token is plain ASCII) the parse fails.
    """
    text = raw.decode("utf-8", "surrogateescape")
    text = text.removeprefix("\ufeff").lstrip(" \t\r\n")
    try:
        value, end = (_DECODER if exact else _FAST).raw_decode(text)
    except RecursionError:
        return TOO_DEEP
    except ValueError:
        return None
    if not raw.isascii() and not _utf8(text[:end]):
        return None  # ill-formed UTF-8 in the value: nlohmann's parse_error 101, a miss
    return value


def _utf8(text: str) -> bool:
    """Was ``text`` decoded from well-formed UTF-8 (no escaped byte in it)?"""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


Reader = Callable[[str], bytes]
Rule = Callable[[Any, str], "Fatal | None"]


class _Jsons:
    """The entry's jsons, each read once: judged on a fast parse, a shape found confirmed on
    nlohmann's exact one (a json GE cannot parse is a miss, never an abort)."""

    def __init__(self, read: Reader) -> None:
        self.read = read
        self.raw: dict[str, bytes | None] = {}
        self.values: dict[str, Any] = {}

    def value(self, name: str) -> Any:
        if name not in self.raw:
            try:
                self.raw[name] = self.read(name)
            except (OSError, CacheMgrError):
                self.raw[name] = None
            raw = self.raw[name]
            self.values[name] = None if raw is None else parse_like_ge(raw, exact=False)
        return self.values[name]

    def judge(self, rule: Rule, name: str) -> Fatal | None:
        found = rule(self.value(name), name)
        raw = self.raw.get(name)
        if found is None or raw is None:
            return None
        return rule(parse_like_ge(raw), name)


def entry_fatal(kernel: str, json_names: Iterable[str], read: Reader) -> Fatal | None:
    """The first GE-fatal shape among an entry's jsons, or None.

    :param kernel: the entry (``<kernel>.json`` is its main json; a ``_pre`` name is a
        pre-build entry).
    :param json_names: the other ``*.json`` files of the entry (parts by name).
    :param read: ``read(name) -> bytes``; raises ``OSError`` when a file cannot be read
        (that file is then not judged).
    """
    main_name = kernel + ".json"
    jsons = _Jsons(read)
    if entry.is_pre_entry(kernel):
        return jsons.judge(pre_fatal, main_name)
    found = jsons.judge(main_fatal, main_name)
    for name in json_names:
        if found is None and name != main_name and read_as_main(name):
            found = jsons.judge(main_fatal, name)
    for name in sub_json_names(jsons.value(main_name)):
        if found is None:
            found = jsons.judge(sub_fatal, name)
    return found


def chip_reader(chip_dir: Path, dir_fd: int | None) -> Reader:
    """A reader of a chip folder's jsons that never changes an access time (a read this
    user could neither avoid nor undo is refused: ``fsutil.reads_keep_atime``), never
    follows a link and never reads more than ``entry.MAX_JSON_BYTES``."""

    def read(name: str) -> bytes:
        with fsutil.reads_keep_atime():
            return fsutil.read_bytes_noatime(
                chip_dir / name, dir_fd, single_link=True, max_bytes=entry.MAX_JSON_BYTES
            )

    return read
