"""Precompiled binary packages in CANN's layout: look up, and build with ``pack`` (layer 7;
docs/design.md#precompiled-binaries).

A package root (CANN: ``$ASCEND_OPP_PATH/built-in/op_impl/ai_core/tbe/kernel/``) holds::

    config/<soc>/<op_file>.json          {"binList": [item, ...]}
    <soc>/<op_file>/<OpType>_<hash>.json the kernel json (binFileName, sha256, supportInfo...)
    <soc>/<op_file>/<OpType>_<hash>.o    the binary

``<soc>`` is CANN's short, lower-case chip name (``Ascend910B1`` → ``ascend910b``; the full
lower-case name is tried too), ``<op_file>`` the snake-case op type (``SoftmaxV2`` →
``softmax_v2``). A ``binList`` item carries, as in CANN: ``staticKey``, ``opMode``
(``static``/``dynamic``), ``deterministic`` (``true``/``false``/``ignore``), ``implMode``,
``inputs``/``outputs`` (``index``, ``dtype``, ``format``, ``paramType``, ``shape`` with -1 and
[-2]), ``attrs`` (``name``, ``dtype``, ``value``) and ``binInfo.jsonFilePath`` (relative to the
root). Lookup matches exactly or not at all:

* an item with a ``staticKey`` (cachemgr's own packages, :func:`pack`) serves a request only
  when the request's key — everything that changes the binary (docs/design.md#keys-and-manifests:
  source and header digests, defines, flags, language, compiler, options) — is listed in it;
* an item without one (CANN's own packages) is matched the way CANN selects its ``binList``
  items: by the signature its ``simplifiedKey`` encodes
  (``<OpType>/d=<deterministic>,p=<precision>/<dtype>,<format>/...``, CANN opbase's
  nnopbase binary collector) — each tensor's dtype, format and shape, ``deterministic`` and
  the attrs (:func:`item_matches`).

The binary is checked against the json's ``sha256`` before it is used.

Packages are read-only and never evicted: they live outside the cache, and nothing here
writes to a package except :func:`pack`, which builds one from chosen cache entries.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachemgr.compile.request import CompileRequest, TensorDesc
from cachemgr.config import layout
from cachemgr.errors import InvalidEntryError, InvalidInputError
from cachemgr.memo import Memo
from cachemgr.storage import entry, fsutil, partcopy

log = logging.getLogger(__name__)

CONFIG_DIR = "config"
BIN_LIST = "binList"
#: The kernel json field cachemgr's queue writes with the item of a future package.
SUPPORT_INFO = "supportInfo"
#: Package files are read-only (docs/design.md#precompiled-binaries).
PACKAGE_FILE_MODE = 0o444
_SHORT_SOC = re.compile(r"^(ascend\d+[a-z]?)\d*$")
#: Parsed precompiled-package configs by file identity (device, inode, size, mtime).
_configs: Memo[tuple[int, ...], list[dict[str, Any]]] = Memo("precompiled configs", 1024)
#: The largest per-op package config read (bytes): checked by ``fstat`` before a byte is read
#: (a member may plant a sparse 1.5 GB one; read whole, each compile's lookup held it).
#: CANN's own per-op configs are KiB to a few MiB (docs/daemon.md, "Bounded memory").
MAX_CONFIG_BYTES = 16 << 20


@dataclass(frozen=True)
class Binary:
    """A verified precompiled kernel: ``json_path``, ``bin_path`` and its ``item``."""

    json_path: Path
    bin_path: Path
    item: Mapping[str, Any]

    @property
    def files(self) -> tuple[Path, ...]:
        """``(json_path, bin_path)``: what a ``binary`` outcome hands back."""
        return (self.json_path, self.bin_path)


def soc_dirs(soc_version: str) -> list[str]:
    """Folder names a package may use for ``soc_version``: CANN's short name, the full name."""
    lower = soc_version.lower()
    match = _SHORT_SOC.match(lower)
    names = [match.group(1)] if match else []
    return list(dict.fromkeys([*names, lower]))


def op_file(op_type: str) -> str:
    """CANN's file stem of an op type: ``SoftmaxV2`` → ``softmax_v2``, ``MatMul`` → ``mat_mul``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", op_type).lower()


def signature(
    request: CompileRequest, deterministic: bool, key: str, impl_mode: str = ""
) -> dict[str, Any]:
    """The ``binList`` item (without ``binInfo``) that describes ``request`` (CANN's fields)."""
    return {
        "opType": request.op_type,
        "staticKey": key,
        "opMode": "dynamic" if request.dynamic else "static",
        "deterministic": "true" if deterministic else "false",
        "implMode": impl_mode,
        "int64Mode": False,
        "simplifiedKeyMode": 0,
        "simplifiedKey": [],
        "inputs": [_tensor(i, t) for i, t in enumerate(request.inputs)],
        "outputs": [_tensor(i, t) for i, t in enumerate(request.outputs)],
        "attrs": [
            {"name": k, "dtype": _attr_dtype(v), "value": v}
            for k, v in sorted(request.attrs.items())
        ],
    }


def _tensor(index: int, t: TensorDesc) -> dict[str, Any]:
    return {"index": index, "paramType": "required", **t.to_json()}


def _attr_dtype(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list) and value:
        return "list_" + _attr_dtype(value[0])
    return "json"


def shape_matches(pattern: Sequence[int], shape: Sequence[int]) -> bool:
    """A package shape ``[-2]`` takes any shape; else same rank and each dim equal or -1."""
    if list(pattern) == [-2]:
        return True
    if len(pattern) != len(shape):
        return False
    return all(p == -1 or p == s for p, s in zip(pattern, shape, strict=True))


def _tensors_match(items: Any, tensors: Sequence[TensorDesc]) -> bool:
    if not isinstance(items, list) or len(items) != len(tensors):
        return False
    for item, t in zip(items, tensors, strict=True):
        if not isinstance(item, dict):
            return False
        dtype = item.get("dtype")
        if isinstance(dtype, str):  # CANN's short names (a list or number is no dtype)
            dtype = {"float": "float32", "bf16": "bfloat16"}.get(dtype, dtype)
        if dtype != t.dtype or item.get("format", "ND") != t.format:
            return False
        if not shape_matches(item.get("shape", [-2]), t.shape):
            return False
    return True


def item_matches(item: Mapping[str, Any], request: CompileRequest, deterministic: bool) -> bool:
    """Does a ``binList`` item serve ``request``? Inputs and outputs: same count, dtype,
    format and a matching shape (:func:`shape_matches`); every attr the item lists equal to
    the request's, and no request attr it does not list; ``deterministic`` equal unless the
    item says ``ignore``."""
    if not _tensors_match(item.get("inputs"), request.inputs):
        return False
    if not _tensors_match(item.get("outputs"), request.outputs):
        return False
    det = str(item.get("deterministic", "ignore")).lower()
    if det != "ignore" and (det == "true") != deterministic:
        return False
    attrs = item.get("attrs", [])
    if not isinstance(attrs, list):
        return False
    listed = {a.get("name"): a.get("value") for a in attrs if isinstance(a, dict)}
    return listed == dict(request.attrs)


def _load_config(path: Path) -> list[dict[str, Any]]:
    """The ``binList`` of a config file (cached per file identity); [] when absent or bad —
    over :data:`MAX_CONFIG_BYTES` included (one warning per version of the file)."""
    st = fsutil.lstat_or_none(path)
    if st is None:
        return []
    ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    known = _configs.get(ident)
    if known is not None:
        return known
    try:
        data = json.loads(fsutil.read_bytes_noatime(path, max_bytes=MAX_CONFIG_BYTES))
        items = [i for i in data[BIN_LIST] if isinstance(i, dict)]
    except fsutil.FileTooLargeError as exc:
        log.warning(
            "precompiled config %s is not read: %s bytes, over the %d-byte cap "
            "(MAX_CONFIG_BYTES)", path, st.st_size, MAX_CONFIG_BYTES,
        )  # fmt: skip
        log.debug("precompiled config %s: %s", path, exc)
        _configs.put(ident, [])
        return []
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:  # [[[…]]] too
        log.warning("precompiled config %s is unreadable: %s", path, exc)
        return []
    _configs.put(ident, items)
    return items


def _inside(root: Path, rel: Any) -> Path | None:
    if not isinstance(rel, str) or not rel or rel.startswith("/") or ".." in rel.split("/"):
        return None
    return root / rel


def _verified(root: Path, item: Mapping[str, Any]) -> Binary | None:
    info = item.get("binInfo")
    json_path = _inside(root, info.get("jsonFilePath") if isinstance(info, dict) else None)
    if json_path is None:
        return None
    try:
        desc = entry.parse_entry(json_path.parent, json_path.name[: -len(".json")])
        problems = entry.verify_entry(json_path.parent, desc)
    except (OSError, InvalidEntryError) as exc:
        log.warning("precompiled kernel %s is unusable: %s", json_path, exc)
        return None
    if problems or len(desc.binaries) != 1:
        why = problems[0].detail if problems else "mix kernels are not served"
        log.warning("precompiled kernel %s is unusable: %s", json_path, why)
        return None
    return Binary(json_path, json_path.parent / desc.binaries[0].bin_name, item)


def find(
    roots: Iterable[Path], request: CompileRequest, key: str, deterministic: bool
) -> Binary | None:
    """The precompiled kernel for ``request``, or None (docs/design.md#precompiled-binaries).

    Per package root and chip folder name: an item whose ``staticKey`` lists ``key`` first,
    then the first item *without* a ``staticKey`` (CANN's) whose signature matches; its
    binary must verify (sha256). An item with another ``staticKey`` never serves.
    """
    for root in roots:
        for soc in soc_dirs(request.soc_version):
            items = _load_config(Path(root) / CONFIG_DIR / soc / f"{op_file(request.op_type)}.json")
            by_key = [i for i in items if key in str(i.get("staticKey", "")).split(",")]
            rest = [
                i
                for i in items
                if not i.get("staticKey") and item_matches(i, request, deterministic)
            ]
            for item in (*by_key, *rest):
                found = _verified(Path(root), item)
                if found is not None:
                    return found
    return None


# --- pack ----------------------------------------------------------------------------------


def pack(chip_dir: Path, kernels: Sequence[str], out_root: Path) -> list[Path]:
    """Build (or extend) a package under ``out_root`` from the cache entries ``kernels`` of
    ``chip_dir``: kernel files ``<soc>/<op_file>/<OpType>_<hash>.{json,<suffix>}`` and one
    ``binList`` item each in ``config/<soc>/<op_file>.json`` (an item with the same
    ``staticKey`` is replaced). Files are written atomically and read-only.

    :returns: the files written.
    :raises InvalidInputError: an entry that is absent, does not verify, is a mix kernel, or
        has no ``supportInfo`` (not compiled by cachemgr's queue) — naming it.
    """
    written: list[Path] = []
    soc = soc_dirs(chip_dir.name)[0]
    for kernel in kernels:
        desc, data, support = _packable(chip_dir, kernel)
        op_type = str(support["opType"])
        stem = f"{op_type}_{str(support['staticKey'])[:32]}"
        rel = f"{soc}/{op_file(op_type)}/{stem}.json"
        ref = desc.binaries[0]
        suffix = ref.bin_name[len(str(data["binFileName"])) :]
        doc = {**data, "binFileName": stem, "filePath": rel}
        folder = fsutil.ensure_dir(out_root / soc / op_file(op_type))
        written.append(_copy(chip_dir / ref.bin_name, folder / f"{stem}{suffix}", ref.sha256))
        written.append(_write(folder / f"{stem}.json", _dump(doc)))
        item = {k: v for k, v in support.items() if k != "opType"}
        item["binInfo"] = {"jsonFilePath": rel}
        written.append(_add_item(out_root / CONFIG_DIR / soc, op_file(op_type), item))
    return list(dict.fromkeys(written))


def _packable(
    chip_dir: Path, kernel: str
) -> tuple[entry.EntryDesc, dict[str, Any], Mapping[str, Any]]:
    try:
        desc, problems = entry.check_entry(chip_dir, kernel)
    except FileNotFoundError:
        raise InvalidInputError(f"pack: no entry {kernel} in {chip_dir}") from None
    if desc is None or problems:
        why = problems[0].detail if problems else "unreadable"
        raise InvalidInputError(f"pack: entry {kernel} does not verify: {why}")
    if desc.sub_jsons or len(desc.binaries) != 1:
        raise InvalidInputError(f"pack: entry {kernel} is a mix kernel; packing those is not done")
    support = desc.data.get(SUPPORT_INFO)
    if not isinstance(support, dict) or "opType" not in support or "staticKey" not in support:
        raise InvalidInputError(
            f"pack: entry {kernel} has no supportInfo with opType and staticKey "
            "(only entries compiled by cachemgr's queue carry their operator description)"
        )
    return desc, dict(desc.data), support


def _add_item(config_dir: Path, stem: str, item: dict[str, Any]) -> Path:
    path = fsutil.ensure_dir(config_dir) / f"{stem}.json"
    items: list[Any] = []
    if path.exists():
        try:
            raw = fsutil.read_bytes_noatime(path, max_bytes=MAX_CONFIG_BYTES)
            items = list(json.loads(raw.decode("utf-8"))[BIN_LIST])
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise InvalidInputError(f"pack: existing config {path} is unreadable: {exc}") from None
    items = [i for i in items if not isinstance(i, dict) or i.get("staticKey") != item["staticKey"]]
    items.append(item)
    return _write(path, _dump({BIN_LIST: items}))


def _copy(src: Path, dest: Path, sha256: str) -> Path:
    """Copy an entry's binary into the package in chunks (never read whole), read-only;
    it must still hash to the json's ``sha256``.

    :raises InvalidInputError: it changed since it was verified.
    :raises OSError: it cannot be read or the copy written.
    """
    layout.safe_file_name(dest.name, "package file")
    copied = partcopy.copy_temp(dest, src, mode=PACKAGE_FILE_MODE)
    if copied.sha256 != sha256:
        fsutil.safe_unlink(copied.tmp)
        raise InvalidInputError(f"pack: {src} changed while it was packed (sha256 differs)")
    fsutil.publish_temp(copied.tmp, dest)
    return dest


def _write(path: Path, data: bytes) -> Path:
    layout.safe_file_name(path.name, "package file")
    fsutil.atomic_write_bytes(path, data, mode=PACKAGE_FILE_MODE)
    return path


def _dump(doc: Mapping[str, Any]) -> bytes:
    return (json.dumps(doc, indent=4, ensure_ascii=False) + "\n").encode("utf-8")


def default_roots(env: Mapping[str, str] | None = None) -> list[Path]:
    """CANN's built-in package under ``$ASCEND_OPP_PATH`` when it exists
    (docs/design.md#precompiled-binaries)."""
    env = os.environ if env is None else env
    opp = env.get("ASCEND_OPP_PATH")
    if not opp:
        return []
    root = Path(opp) / "built-in" / "op_impl" / "ai_core" / "tbe" / "kernel"
    return [root] if root.is_dir() else []
