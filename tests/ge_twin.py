"""A GE twin for tests: does to a kernel cache exactly what CANN GE's cache code does.

Every step copies one function of GE (repository ``hicann/ge``, folder
``compiler/opcompiler/op_compile_adapter/source/``) and names it. The twin is independent of
cachemgr (it imports nothing from it), so a test can run it beside cachemgr — in this process,
or as a separate process (also as another Unix user)::

    python -m tests.ge_twin write CHIP KERNEL [--kind plain|mix|dynamic] [--header] [--size N]
    python -m tests.ge_twin pre CHIP KERNEL_pre [--pattern P]
    python -m tests.ge_twin hit CHIP KERNEL            # exit 0 on a hit, 1 on a miss,
                                                       # SIGABRT where GE aborts
    python -m tests.ge_twin evict CHIP MAX_BYTES RATIO_PCT [--now EPOCH_S]  # SIGABRT too
    python -m tests.ge_twin init KERNEL_CACHE SOC ADK OPS [--mode enable|force]
    python -m tests.ge_twin loop CHIP PREFIX SECONDS [--evict]  # write + hit until the end

API (what issue-15 tests reuse):

* :func:`write_entry` — kinds ``plain``, ``mix`` (``_mix_aic``/``_mix_aiv`` with ``jsonList``),
  ``dynamic`` (``supportInfo``, no ``opType``/``staticKey``); with or without a header; a
  ``sha256`` written upper-case on request (GE would then never hit it);
* :func:`write_pre` — a ``<name>_pre.json`` pre-build entry;
* :func:`hit` / :func:`hit_pre` — GE's verified lookup with its access-time update; both,
  and :func:`evict`, raise :class:`GeAbort` where GE's typed json conversions throw (the
  command line then aborts: ``SIGABRT``, exit 134);
* :func:`evict` — GE's eviction under ``op_cache_file_del.lock``: ``_pre.json`` counted,
  never deleted; each json read during the scan, its access time checked again before
  deleting (so on a ``relatime``/``strictatime`` mount it deletes nothing);
* :func:`init` — GE's start: ini check, create or restamp, purge;
* :func:`read_ini` — GE's ini reading: (stamps, limits) exactly as GE computes them.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import random
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

#: ``inc/te_fusion_util_constants.h`` ``FILE_AUTHORITY``.
FILE_AUTHORITY = 0o640
#: ``common/te_file_utils.cc`` ``CreateMultiLevelDir``: ``S_IRWXU | S_IRGRP | S_IXGRP``.
DIR_AUTHORITY = 0o750
#: ``cache/te_cache_space_manager.cc`` ``MIN_CACHE_AGING_TIME`` (seconds).
MIN_CACHE_AGING_TIME = 1800
SIZE_MB_UNIT = 1048576
INT_MAX = 2**31 - 1
EVICT_LOCK = "op_cache_file_del"
#: ``cache/te_cache_space_manager.cc`` ``kPreCompileFileSuffix``.
PRE_COMPILE_SUFFIX = "_pre.json"


# --- locks: cache/te_cache_utils.cc, common/te_file_utils.cc ----------------------------


def _flock(fd: int, kind: int) -> bool:
    """``TeFileUtils::FcntlLockFileSet``: ``fcntl(F_SETLK)`` on the whole file, no waiting."""
    data = struct.pack("hhqqi", kind, os.SEEK_SET, 0, 0, 0)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLK, data)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    return True


def lock_and_open(chip: Path, name: str) -> int | None:
    """``TeCacheUtils::LockAndOpenCacheFile``: ``fopen(<name>.lock, "a+")`` (0666 & ~umask),
    ``chmod 0640`` (whatever the umask), ``F_SETLK F_WRLCK`` without waiting. None when the
    file cannot be opened or the lock is held (GE then skips caching; it never waits)."""
    path = chip / f"{name}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
    except OSError:
        return None
    with contextlib.suppress(OSError):  # GE logs "Cannot Update file authority", goes on
        os.chmod(path, FILE_AUTHORITY)
    if not _flock(fd, fcntl.F_WRLCK):
        os.close(fd)
        return None
    return fd


def unlock_and_close(fd: int | None) -> None:
    """``TeCacheUtils::UnlockAndCloseCacheFile``: ``F_UNLCK`` then ``fclose``; never unlinks."""
    if fd is None:
        return
    _flock(fd, fcntl.F_UNLCK)
    os.close(fd)


# --- writing: cache/te_cache_manager.cc, common/te_file_utils.cc -------------------------


def make_dirs(path: Path) -> None:
    """``TeFileUtils::CreateMultiLevelDir``: every missing level ``mkdir 0750`` (& ~umask)."""
    missing = []
    cur = Path(path)
    while not cur.exists():
        missing.append(cur)
        cur = cur.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, DIR_AUTHORITY)


def _temp_name(dst: Path) -> Path:
    """``ConstructTempFileName`` (``common/common_utils.cc``): ``<name>_<pid>_<us>_<rand>.temp``."""
    return dst.with_name(
        f"{dst.name}_{os.getpid()}_{time.time_ns() // 1000}_{random.randint(0, 2**31)}.temp"
    )


def copy_to_cache(data: bytes, dst: Path) -> None:
    """``TeFileUtils::CopyFileToCacheDir`` / ``WriteNewFileInCache``: a temp file opened
    ``O_CREAT|O_RDWR`` 0640, ``fchmod 0640``, written, then ``rename()`` onto ``dst``."""
    tmp = _temp_name(dst)
    fd = os.open(tmp, os.O_CREAT | os.O_RDWR, FILE_AUTHORITY)
    try:
        os.fchmod(fd, FILE_AUTHORITY)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.rename(tmp, dst)


def sha256_hex(data: bytes) -> str:
    """``PythonApiCall::GetBinFileSha256Value``: hashlib's lower-case hex digest."""
    return hashlib.sha256(data).hexdigest()


def _kernel_json(name: str, binary: bytes, upper_sha: bool = False, **extra: object) -> dict:
    sha = sha256_hex(binary)
    return {
        "binFileName": name,
        "binFileSuffix": ".o",
        "blockDim": 8,
        "core_type": "AIV",
        "kernelName": name + "__kernel0",
        "magic": "RT_DEV_BINARY_MAGIC_ELF_AIVEC",
        "sha256": sha.upper() if upper_sha else sha,
        **extra,
    }


def _dump(data: dict) -> bytes:
    return json.dumps(data, indent=4).encode()  # SERIALIZATION_JSON_FORMAT = 4


@dataclass(frozen=True)
class Written:
    """What :func:`write_entry` did: ``files`` written (names), or ``skipped`` and why."""

    kernel: str
    files: tuple[str, ...]
    skipped: str = ""


def write_entry(
    chip: Path,
    kernel: str,
    *,
    kind: str = "plain",
    header: bool = False,
    header_named: bool = False,
    size: int = 256,
    upper_sha: bool = False,
    seed: bytes = b"",
) -> Written:
    """``TeCacheManager::SetCompileResult`` + ``CopyCompileRetIntoCacheDir``: if neither the
    json nor the binary exists, take ``<kernel>.lock`` (no waiting: busy → not cached), check
    again, copy the binary, the header (only when the compile made one), the json last.

    :param kind: ``plain``; ``mix`` (main json with ``jsonList`` and ``<kernel>_mix_aic``/
        ``_mix_aiv`` sub-jsons and binaries); ``dynamic`` (``supportInfo``, no ``opType``).
    :param header: write ``<kernel>.h`` (and name it); ``header_named``: name
        ``headerFileSuffix`` in the json without the file (GE copies the header only when the
        compile made one: ``CopyCompileRetIntoCacheDir``).
    """
    make_dirs(chip)
    binary = (seed + kernel.encode()) * (size // max(1, len(kernel) + len(seed)) + 1)
    binary = binary[:size]
    json_path, bin_path = chip / f"{kernel}.json", chip / f"{kernel}.o"
    if json_path.exists() or bin_path.exists():
        return Written(kernel, (), "exists")
    fd = lock_and_open(chip, kernel)
    if fd is None:
        return Written(kernel, (), "busy")
    try:
        if json_path.exists() or bin_path.exists():  # "check file existed again"
            return Written(kernel, (), "exists")
        files: list[str] = []
        extra: dict[str, object] = {}
        if header or header_named:  # named whenever the op has a header
            extra["headerFileSuffix"] = ".h"
        if kind == "mix":
            json_list = []
            for sub in ("aic", "aiv"):
                name = f"{kernel}_mix_{sub}"
                data = binary + sub.encode()
                copy_to_cache(data, chip / f"{name}.o")
                copy_to_cache(_dump(_kernel_json(name, data, upper_sha)), chip / f"{name}.json")
                files += [f"{name}.o", f"{name}.json"]
                json_list.append({"binType": sub.upper(), "jsonFileName": f"{name}.json"})
            main: dict = {"coreType": "MixAICore", "blockDim": 32, "jsonList": json_list, **extra}
        else:
            copy_to_cache(binary, bin_path)
            files.append(bin_path.name)
            if kind == "dynamic":
                extra["supportInfo"] = {"op_type": "Mul", "dynamic": True, "inputs": [[-1, 16]]}
            main = _kernel_json(kernel, binary, upper_sha, **extra)
        if header:
            copy_to_cache(b"/* header */\n", chip / f"{kernel}.h")
            files.append(f"{kernel}.h")
        copy_to_cache(_dump(main), json_path)
        files.append(json_path.name)
        return Written(kernel, tuple(files))
    finally:
        unlock_and_close(fd)


def write_pre(chip: Path, kernel: str, pattern: str = "ElemWise", options: str = "") -> Written:
    """``TeCacheManager::SetPreCompileResult`` + ``SavePreCompileRetIntoCacheDir``:
    ``<kernel>.json`` (``kernel`` ends with ``_pre``) with pattern, coreType and
    ``prebuilt_options`` (``options``: any string, as long as the build's options are)."""
    make_dirs(chip)
    path = chip / f"{kernel}.json"
    if path.exists():
        return Written(kernel, (), "exists")
    fd = lock_and_open(chip, kernel)
    if fd is None:
        return Written(kernel, (), "busy")
    try:
        data = {"pattern": pattern, "coreType": "VectorCore", "prebuilt_options": options}
        copy_to_cache(_dump(data), path)
        return Written(kernel, (path.name,))
    finally:
        unlock_and_close(fd)


# --- reading: cache/te_cache_manager.cc, common/compile_result_utils.cc ------------------


def update_access_time(path: Path) -> bool:
    """``TeFileUtils::UpdateFileAccessTime``: ``utime(atime=now, mtime kept)``."""
    try:
        st = os.stat(path)
        os.utime(path, (int(time.time()), st.st_mtime))
    except OSError:
        return False
    return True


class GeAbort(BaseException):
    """nlohmann::json threw ``type_error`` and nothing in GE catches it: the process ends in
    ``std::terminate`` (``SIGABRT``, exit 134). In this process the twin raises this (a
    ``BaseException``: no ``except Exception`` swallows it); :func:`main` turns it into a real
    ``abort()``."""


def _json_type(value: object) -> str:
    """nlohmann's ``type_name()``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {list: "array", dict: "object", str: "string"}[type(value)]


def _string(info: dict, key: str, where: str) -> str:
    """``std::string s = j.at(key)`` / ``j.at(key).get<std::string>()``: nlohmann's
    ``from_json`` throws ``type_error.302`` for any other type, ``null`` included."""
    value = info[key]
    if not isinstance(value, str):
        raise GeAbort(
            f"{where}: [json.exception.type_error.302] type must be string, but is "
            f"{_json_type(value)}"
        )
    return value


def _refuse(text: str) -> object:
    raise ValueError(text)


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number overflow parsing {text!r}")  # out_of_range.406
    return value


def _finite_int(text: str) -> int | float:
    return _finite(text) if len(text) > 20 else int(text)  # beyond int64: a double


_NLOHMANN = json.JSONDecoder(parse_constant=_refuse, parse_float=_finite, parse_int=_finite_int)


#: nlohmann's parser is iterative (no depth limit); the twin reads this deep (Python's C
#: stack allows it), deeper is its own limit (a miss), not GE's
_TWIN_DEPTH = 20_000


def read_json(path: Path) -> object:
    """``TeFileUtils::GetJsonValueFromJsonFile``: ``ifs >> j`` (BOM skipped, the first value
    only, the bytes after it never read: ``operator>>`` parses without ``strict``; a string
    that is not UTF-8 inside it is a ``parse_error``); a parse error is caught → None."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    text = raw.decode("utf-8", "surrogateescape").removeprefix("\ufeff").lstrip(" \t\r\n")
    sys.setrecursionlimit(max(sys.getrecursionlimit(), _TWIN_DEPTH))
    try:
        value, end = _NLOHMANN.raw_decode(text)
        text[:end].encode("utf-8")  # an escaped byte inside the value: not UTF-8
    except (ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        return None
    return value


def hit(chip: Path, kernel: str, touch: bool = True) -> bool:
    """``TeCacheManager::MatchCompileCache``: parse the json
    (``CompileResultUtils::ParseCompileResult``), find the binary (``SetBinFilePath``), read
    it (``SetKernelBin``: ``kernelName`` needed, empty file fails), the header suffix
    (``SetHeaderFilePath``), compare ``sha256`` as a string (``VerifyBinFileSha256``), then
    update the json's and the binary's atime. Each typed conversion raises :class:`GeAbort`
    for another type, as GE aborts. The twin reads a ``.so`` like a ``.o`` (GE ``dlopen``s it,
    ``SetKernelBinBySo``, then needs the same ``kernelName``)."""
    json_path = chip / f"{kernel}.json"
    info = read_json(json_path)
    # contains() is false on a non-object; SetBinFilePath needs both names
    if not isinstance(info, dict) or "binFileName" not in info or "binFileSuffix" not in info:
        return False
    name = _string(info, "binFileName", "CompileResultUtils::SetBinFilePath")
    suffix = _string(info, "binFileSuffix", "CompileResultUtils::SetBinFilePath")
    bin_path = chip / (name + suffix)
    if not bin_path.exists():  # RealPath empty
        return False
    data = b""
    reads_bin = bin_path.name.endswith((".o", ".so"))
    if reads_bin:
        if "kernelName" not in info:
            return False
        _string(info, "kernelName", "CompileResultUtils::SetKernelBin")
        try:
            data = bin_path.read_bytes()  # GetBufferFromBinFile: size <= 0 fails
        except OSError:
            return False
        if not data:
            return False
    if "headerFileSuffix" in info:
        _string(info, "headerFileSuffix", "CompileResultUtils::SetHeaderFilePath")
    if not reads_bin or "sha256" not in info:  # kernelBin == nullptr: VerifyBinFileSha256 false
        return False
    sha = _string(info, "sha256", "TeCacheManager::VerifyBinFileSha256")
    if not sha or sha != sha256_hex(data):
        return False
    if touch:
        return update_access_time(json_path) and update_access_time(bin_path)
    return True


def hit_pre(chip: Path, kernel: str) -> bool:
    """``TeCacheManager::MatchPreCompileCache``: the json must have ``pattern`` (a string;
    ``coreType`` and ``prebuilt_options``, when present, too — else :class:`GeAbort`); then
    the atime update."""
    path = chip / f"{kernel}.json"
    info = read_json(path)
    if not isinstance(info, dict) or "pattern" not in info:
        return False
    where = "TeCacheManager::MatchPreCompileCache"
    _string(info, "pattern", where)
    for key in ("coreType", "prebuilt_options"):
        if key in info:
            _string(info, key, where)
    return update_access_time(path)


# --- eviction: cache/te_cache_space_manager.cc -----------------------------------------


def directory_size(path: Path) -> int:
    """``TeFileUtils::GetDirectorySize``: regular files' ``st_size``, recursively."""
    total = 0
    try:
        names = os.listdir(path)
    except OSError:
        return 0
    for name in names:
        try:
            st = os.stat(path / name)
        except OSError:
            continue
        if os.path.isdir(path / name):
            total += directory_size(path / name)
        elif st.st_mode & 0o170000 == 0o100000:
            total += st.st_size
    return total


def _json_files(chip: Path) -> list[Path]:
    """``CollectCacheJsonFileAccessTime``: every ``*.json`` but ``_mix_aic``/``_mix_aiv``."""
    out = []
    for name in sorted(os.listdir(chip)):
        if name.endswith(".json") and not name.endswith(("_mix_aic.json", "_mix_aiv.json")):
            out.append(chip / name)
    return out


def _json_list_items(value: object) -> list:
    """What ``for (it = jsonList.begin(); ...)`` visits: an array's items, an object's values,
    nothing for ``null``, a primitive itself (nlohmann's primitive iterator)."""
    if value is None:
        return []
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        return list(value.values())
    return [value]


def _add_bin_file(folder: Path, info: object, files: list[tuple[Path, int]]) -> None:
    """``AddBinFileInfoFromJson``: both names present (``find`` is false on a non-object),
    each ``get<std::string>()`` (:class:`GeAbort` for another type), then the binary's size."""
    if not isinstance(info, dict) or "binFileName" not in info or "binFileSuffix" not in info:
        return
    where = "TeCacheSpaceManager::AddBinFileInfoFromJson"
    binary = folder / (_string(info, "binFileName", where) + _string(info, "binFileSuffix", where))
    with contextlib.suppress(OSError):
        files.append((binary, os.stat(binary).st_size))


def _entry_files(path: Path) -> list[tuple[Path, int]]:
    """``GetFilesAccessTime`` + ``AddBinFileInfoFromJson``: the json, then its binary (or the
    sub-jsons and their binaries); a ``_pre.json`` alone. The header and lock are never
    listed: GE's eviction deletes these files only and leaves ``<kernel>.h`` behind. A
    ``jsonList`` item that is not an object with a string ``jsonFileName`` raises
    :class:`GeAbort` (``(*it)["jsonFileName"]``: ``type_error.305`` on a non-object, ``302``
    converting a missing — inserted ``null`` — or non-string name).

    The json is *read* here (``TeFileUtils::GetJsonValueFromJsonFile``: an ``ifstream``), after
    its access time was taken: on a ``relatime`` or ``strictatime`` mount that read moves the
    access time, which :func:`evict`'s re-check then finds changed."""
    files = []
    with contextlib.suppress(OSError):
        files.append((path, os.stat(path).st_size))
    if path.name.endswith("_pre.json"):
        return files
    info = read_json(path)
    if info is None:
        return files
    if not isinstance(info, dict) or "jsonList" not in info:  # traditional pattern
        _add_bin_file(path.parent, info, files)
        return files
    for item in _json_list_items(info["jsonList"]):
        if not isinstance(item, dict):
            raise GeAbort(
                "TeCacheSpaceManager::GetFilesAccessTime: [json.exception.type_error.305] "
                f"cannot use operator[] with a string argument with {_json_type(item)}"
            )
        item.setdefault("jsonFileName", None)  # operator[] inserts null
        sub = path.parent / _string(item, "jsonFileName", "TeCacheSpaceManager::GetFilesAccessTime")
        if sub.is_dir():
            continue
        with contextlib.suppress(OSError):
            files.append((sub, os.stat(sub).st_size))
        sub_info = read_json(sub)
        if sub_info is not None:
            _add_bin_file(path.parent, sub_info, files)
    return files


def _files_access_time(jsons: list[Path]) -> list[tuple[int, Path, list[tuple[Path, int]]]]:
    """``TeCacheSpaceManager::GetFilesAccessTime``, in its order: ``stat`` the json (its
    access time, in whole seconds, before anything reads it); a name ending in
    ``kPreCompileFileSuffix`` (``_pre.json``) is then skipped — never entered in the map, so
    GE never ages or deletes it (its bytes still count: ``GetDirectorySize``); every other
    json is read (:func:`_entry_files`) and entered under the access time taken first. Sorted
    by that time, equal times in scan order (``std::multimap``)."""
    items = []
    for path in jsons:
        try:
            atime = int(os.stat(path).st_atime)
        except OSError:
            atime = 0
        if path.name.endswith(PRE_COMPILE_SUFFIX):
            continue
        items.append((atime, path, _entry_files(path)))
    items.sort(key=lambda item: item[0])
    return items


def _delete_file(path: Path) -> None:
    """``TeFileUtils::DeleteFile``: ``lstat``, regular files only, ``remove``."""
    try:
        if os.lstat(path).st_mode & 0o170000 == 0o100000:
            os.remove(path)
    except OSError:
        pass


def _aging(items: list[tuple[int, Path, list[tuple[Path, int]]]], to_delete: int,
           now: float | None) -> list[str]:  # fmt: skip
    """``TeCacheSpaceManager::AgingCacheFileByAccessTime``: oldest first; an entry accessed
    less than ``MIN_CACHE_AGING_TIME`` ago stops it; the json's access time is read again
    (``stat`` of ``totalFileSizeInfos[0]``) and the entry deleted only when it is unchanged
    since the scan — after the scan's own read moved it (``relatime``, ``strictatime``) it
    never is; stops once ``to_delete`` bytes are gone. Returns the deleted jsons' names."""
    deleted, gone = 0, []
    for atime, path, files in items:
        current = time.time() if now is None else now
        if current - atime < MIN_CACHE_AGING_TIME:
            break
        if not files:
            continue
        try:
            again = int(os.stat(files[0][0]).st_atime)
        except OSError:
            again = None
        if again == atime:
            for file, size in files:
                _delete_file(file)
                deleted += size
            gone.append(path.name)
        if deleted >= to_delete:
            break
    return gone


def evict(chip: Path, max_bytes: int, ratio_pct: int, now: float | None = None) -> list[str]:
    """``TeCacheSpaceManager::CacheSpaceInitialize`` + ``DelCacheFileByAccessTime``: when the
    chip folder holds ≥ ``max_bytes`` (every regular file, ``_pre.json`` included), take
    ``op_cache_file_del.lock`` (held → skip), list the jsons
    (``CollectCacheJsonFileAccessTime``), scan them (:func:`_files_access_time`) and age them
    (:func:`_aging`) until ``used - max*ratio/100`` bytes are gone. Returns the evicted jsons'
    names ("busy" → ``["<busy>"]``)."""
    used = directory_size(chip)
    if used < max_bytes:
        return []
    fd = lock_and_open(chip, EVICT_LOCK)
    if fd is None:
        return ["<busy>"]
    try:
        to_delete = used - max_bytes * ratio_pct // 100
        return _aging(_files_access_time(_json_files(chip)), to_delete, now)
    finally:
        unlock_and_close(fd)


# --- start: cache/te_cache_space_manager.cc DelCachedFiles ------------------------------


def read_ini(data: bytes) -> tuple[bool, dict[str, str], tuple[int, int] | None]:
    """``LoadIniFile`` + ``GetCacheInitFileCfg`` + ``UpdateOpCacheSizeCfg`` on ``data``.

    Returns (GE uses the ini, its values, the limits (MB, percent) or None when GE falls
    back to env/defaults). Lines are split on LF only (``std::getline``), a line is a comment
    only when ``#`` is in column 1, blanks are spaces and tabs (``Trim``), a section header
    starts with ``[`` in column 1 and ends at the last ``]``, sections are visited in sorted
    order and the first must be ``op_compiler_cache``, the last duplicate key wins."""
    sections: dict[str, list[tuple[str, str]]] = {}
    content: list[tuple[str, str]] = []
    key = ""
    for line in data.decode("utf-8", "surrogateescape").split("\n"):  # std::getline
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            if key and content:
                sections.setdefault(key, content)  # std::map::emplace keeps the first
                content = []
            pos = line.rfind("]")
            if pos == -1:
                continue
            key = line[1:pos].strip(" \t")
            continue
        if "=" not in line:
            continue
        k, _, v = line.partition("=")
        k, v = k.strip(" \t"), v.strip(" \t")
        if k and v:
            content.append((k, v))
    if content and key:
        sections.setdefault(key, content)
    values: dict[str, str] = {}
    used = False
    for name in sorted(sections, key=lambda s: s.encode("utf-8", "surrogateescape")):
        if name != "op_compiler_cache":
            break
        for k, v in sorted(sections[name], key=lambda kv: kv[0].encode("utf-8", "surrogateescape")):
            if k in ("adk_version", "ops_version", "max_op_cache_size", "remain_cache_size_ratio"):
                values[k] = v
        used = bool(values.get("adk_version") and values.get("ops_version"))
        break
    if not used:
        return False, values, None
    return (
        True,
        values,
        _limits(values.get("max_op_cache_size", ""), values.get("remain_cache_size_ratio", "")),
    )


def stoi(text: str) -> int | None:
    """``std::stoi``: leading whitespace, a sign, decimal digits, the rest ignored; None for
    no digits or a value outside ``int`` (the exceptions GE catches)."""
    i = 0
    while i < len(text) and text[i] in " \t\n\v\f\r":
        i += 1
    j = i + (1 if i < len(text) and text[i] in "+-" else 0)
    k = j
    while k < len(text) and "0" <= text[k] <= "9":
        k += 1
    if k == j:
        return None
    value = int(text[i:k])
    return value if -(2**31) <= value <= INT_MAX else None


def _limits(max_raw: str, ratio_raw: str) -> tuple[int, int] | None:
    """``UpdateOpCacheSizeCfg``: both set, both parse, max in -1 or 1..INT_MAX, ratio 1..100."""
    if not max_raw or not ratio_raw:
        return None
    max_mb, ratio = stoi(max_raw), stoi(ratio_raw)
    if max_mb is None or ratio is None or max_mb == 0 or max_mb < -1:
        return None
    if ratio <= 0 or ratio > 100:
        return None
    return max_mb, ratio


def init(kernel_cache: Path, soc: str, adk: str, ops: str, mode: str = "enable") -> str:
    """``TeCacheSpaceManager::DelCachedFiles`` for chip folder ``<kernel_cache>/<soc>``:
    unknown versions → delete the chip folder's files; ``force`` → delete; no ini → create it
    (stamps only) and delete; an ini GE uses whose stamps differ → restamp and delete.
    Returns what it did: ``purged-unknown``, ``purged-missing``, ``purged-upgrade``, ``kept``."""
    chip = kernel_cache / soc
    make_dirs(chip)
    if not adk or not ops:
        _delete_files_in_dir(chip)
        return "purged-unknown"
    if mode == "force":
        _delete_files_in_dir(chip)
    ini = kernel_cache / "op_cache.ini"
    if not ini.exists():
        fd = os.open(ini, os.O_CREAT | os.O_RDWR, FILE_AUTHORITY)  # CreatOpCacheIniFile
        os.write(fd, f"[op_compiler_cache]\nadk_version={adk}\nops_version={ops}\n".encode())
        os.close(fd)
        _delete_files_in_dir(chip)
        return "purged-missing"
    used, values, _ = read_ini(ini.read_bytes())
    if not used:
        return "kept"
    if mode == "enable" and values["adk_version"] == adk and values["ops_version"] == ops:
        return "kept"
    # UpdateOpCacheIniFile: rewritten in place (truncate, then write), stamps replaced
    lines = []
    for line in _getlines(ini.read_bytes()):
        head = line.split("=", 1)[0]
        if head in ("adk_version", "ops_version"):
            line = f"{head}={adk if head == 'adk_version' else ops}"
        lines.append(line + "\n")
    with open(ini, "w", encoding="utf-8", errors="surrogateescape") as out:
        out.write("".join(lines))
    _delete_files_in_dir(chip)
    return "purged-upgrade"


def _getlines(data: bytes) -> list[str]:
    """The lines ``std::getline`` yields: split on LF, no empty piece after a final LF."""
    lines = data.decode("utf-8", "surrogateescape").split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def _delete_files_in_dir(chip: Path) -> None:
    """``TeFileUtils::DeleteFilesInDir(dir, false)``: remove every file (lock files too)."""
    for name in os.listdir(chip):
        path = chip / name
        if path.is_dir() and not path.is_symlink():
            _delete_files_in_dir(path)
        with contextlib.suppress(OSError):
            os.remove(path)


# --- command line ---------------------------------------------------------------------


def _loop(chip: Path, prefix: str, seconds: float, evict_too: bool = False) -> int:
    """Write and hit every kind of entry in a loop (a busy CANN process next to cachemgr);
    prints ``wrote <kernel>`` for each entry written; with ``evict_too`` also GE's eviction
    with a clock an hour ahead (what it removes depends on the mount: :func:`evict`)."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        name = f"{prefix}{n % 40:03d}"
        kind = ("plain", "mix", "dynamic", "pre", "nohdr")[n % 5]
        if kind == "pre":
            out = write_pre(chip, name + "_pre")
        elif kind == "nohdr":  # names a header the compile did not make
            out = write_entry(chip, name, header_named=True)
        else:
            out = write_entry(chip, name, kind=kind, header=n % 2 == 0)
        if out.files:
            print(f"wrote {out.kernel}", flush=True)
        if kind in ("plain", "dynamic", "nohdr"):
            hit(chip, f"{prefix}{(n * 7) % 40:03d}")
        if evict_too and n % 10 == 9:
            evict(chip, 1, 50, now=time.time() + 2 * MIN_CACHE_AGING_TIME)
        n += 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); exit 0 ok / hit, 1 miss."""
    p = argparse.ArgumentParser(prog="ge_twin")
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("chip", type=Path)
    w.add_argument("kernel")
    w.add_argument("--kind", default="plain", choices=("plain", "mix", "dynamic"))
    w.add_argument("--header", action="store_true")
    w.add_argument("--size", type=int, default=256)
    pr = sub.add_parser("pre")
    pr.add_argument("chip", type=Path)
    pr.add_argument("kernel")
    pr.add_argument("--pattern", default="ElemWise")
    h = sub.add_parser("hit")
    h.add_argument("chip", type=Path)
    h.add_argument("kernel")
    e = sub.add_parser("evict")
    e.add_argument("chip", type=Path)
    e.add_argument("max_bytes", type=int)
    e.add_argument("ratio", type=int)
    e.add_argument("--now", type=float, default=None, help="the clock GE's aging compares with")
    i = sub.add_parser("init")
    i.add_argument("kernel_cache", type=Path)
    i.add_argument("soc")
    i.add_argument("adk")
    i.add_argument("ops")
    i.add_argument("--mode", default="enable")
    lp = sub.add_parser("loop")
    lp.add_argument("chip", type=Path)
    lp.add_argument("prefix")
    lp.add_argument("seconds", type=float)
    lp.add_argument("--evict", action="store_true")
    a = p.parse_args(argv)
    if a.cmd == "write":
        out = write_entry(a.chip, a.kernel, kind=a.kind, header=a.header, size=a.size)
        print(out.skipped or " ".join(out.files))
        return 0
    if a.cmd == "pre":
        print(write_pre(a.chip, a.kernel, a.pattern).skipped or "written")
        return 0
    try:
        if a.cmd == "hit":
            pre = a.kernel.endswith("_pre")
            found = hit_pre(a.chip, a.kernel) if pre else hit(a.chip, a.kernel)
            return 0 if found else 1
        if a.cmd == "evict":
            print(" ".join(evict(a.chip, a.max_bytes, a.ratio, a.now)))
            return 0
    except GeAbort as exc:  # std::terminate: what GE's process does
        sys.stderr.write(f"terminate called after throwing nlohmann::json type_error\n  {exc}\n")
        sys.stderr.flush()
        os.abort()
    if a.cmd == "init":
        print(init(a.kernel_cache, a.soc, a.adk, a.ops, a.mode))
        return 0
    return _loop(a.chip, a.prefix, a.seconds, a.evict)


if __name__ == "__main__":
    sys.exit(main())
