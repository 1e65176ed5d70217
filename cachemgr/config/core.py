"""The settings rules that decide where the kernel cache is and which limits apply, on the
standard library's ``os`` alone (docs/design.md#where-the-cache-lives,
#size-limits-and-eviction; docs/configuration.md#every-frameworks-name).

Every rule here exists once: :func:`cachemgr.config.options.resolve` (the full CLI, the
daemon) builds its :class:`~cachemgr.config.options.Settings` from these functions, and
:mod:`cachemgr.config.ini` reads ``op_cache.ini`` with them; a start-up fast path may call
them directly without importing ``pathlib``, ``re``, ``dataclasses`` or ``typing`` (each
costs start-up: docs/performance.md). Values are plain strings, ints and tuples.

* :func:`cache_folder_choice`: which name gives the cache root — the ``op_compiler_cache_dir``
  option > torch_npu's ``ACL_OP_COMPILER_CACHE_DIR`` > ``ASCEND_CACHE_PATH`` >
  ``$HOME/atc_data`` — and which names it passed over;
* :func:`ge_stoi` / :func:`ge_atoi`: GE's ``std::stoi`` / ``std::atoi`` of a limit;
* :func:`ge_sections` / :func:`ge_ini_values` / :func:`ge_limits`: ``op_cache.ini`` as GE
  reads it (CANN GE ``cache/te_cache_space_manager.cc``, ``LoadIniFile``,
  ``GetCacheInitFileCfg``, ``UpdateOpCacheSizeCfg``);
* :func:`env_limit`: ``ASCEND_MAX_OP_CACHE_SIZE`` / ``ASCEND_REMAIN_CACHE_SIZE_RATIO`` as GE
  reads them (``GetCacheSpaceMaxSizeCfg``, ``GetCacheRemainSizeRadio``), with cachemgr's
  warning for anything but a plain integer.
"""

from __future__ import annotations

import os

from cachemgr.constants import MIB, NEVER_EVICT

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: typing costs start-up
    from collections.abc import Mapping

#: torch_npu's (and ACL's) name for the cache folder (docs/configuration.md#every-frameworks-name).
ACL_CACHE_DIR = "ACL_OP_COMPILER_CACHE_DIR"
#: docs/design.md#size-limits-and-eviction: default limit 500 MB (MiB) and remain ratio 50 %.
DEFAULT_MAX_MB = 500
DEFAULT_RATIO = 50
#: Largest ``max_op_cache_size`` in MB GE accepts (``INT_MAX``).
MAX_MB_LIMIT = 2**31 - 1
RATIO_MIN_PCT = 1
RATIO_MAX_PCT = 100
#: The kernel cache folder's name under a cache root, and GE's ini file in it
#: (docs/design.md#where-the-cache-lives).
KERNEL_CACHE = "kernel_cache"
INI_NAME = "op_cache.ini"
#: The section GE reads, and the four keys it knows there.
SECTION = "op_compiler_cache"
MAX_KEY = "max_op_cache_size"
RATIO_KEY = "remain_cache_size_ratio"
ADK_KEY = "adk_version"
OPS_KEY = "ops_version"
KNOWN_KEYS = (MAX_KEY, RATIO_KEY, ADK_KEY, OPS_KEY)
MAX_ENV = "ASCEND_MAX_OP_CACHE_SIZE"
RATIO_ENV = "ASCEND_REMAIN_CACHE_SIZE_RATIO"

_BLANKS = " \t"
_C_SPACE = " \t\n\v\f\r"
_DIGITS = "0123456789"


def _leading_int(text: str) -> str | None:
    """The ``[+-]?[0-9]+`` after C's leading white space in ``text``, or None (no digit)."""
    i, n = 0, len(text)
    while i < n and text[i] in _C_SPACE:
        i += 1
    j = i + 1 if i < n and text[i] in "+-" else i
    k = j
    while k < n and text[k] in _DIGITS:
        k += 1
    return text[i:k] if k > j else None


def ge_stoi(text: str) -> int | None:
    """``std::stoi(text)``: leading whitespace, an optional sign, decimal digits; the rest is
    ignored (``2000MB`` → 2000). None where ``std::stoi`` throws (no digit, outside ``int``)."""
    digits = _leading_int(text)
    if digits is None or len(digits) > 20:
        return None
    value = int(digits)
    return value if -(2**31) <= value <= MAX_MB_LIMIT else None


def ge_atoi(text: str) -> int:
    """``std::atoi(text)`` as glibc computes it (``(int) strtol``): like :func:`ge_stoi`, but
    no digit gives 0 (never an error), and a value beyond ``long`` is clamped, then cut to
    32 bits. GE reads ``ASCEND_REMAIN_CACHE_SIZE_RATIO`` with it
    (``te_cache_space_manager.cc`` ``GetCacheRemainSizeRadio``)."""
    digits = _leading_int(text)
    if digits is None:
        return 0
    value = int(digits) if len(digits) <= 21 else (-(2**63) if digits[0] == "-" else 2**63 - 1)
    value = max(-(2**63), min(2**63 - 1, value))
    return ((value + 2**31) % 2**32) - 2**31


def ge_sections(text: str) -> dict[str, list[tuple[str, str]]]:
    """``TeCacheSpaceManager::LoadIniFile`` (``cache/te_cache_space_manager.cc``): lines from
    ``std::getline`` (LF only; a CR stays in the line), ``#`` in column 1 is a comment, a
    ``[`` in column 1 opens a section named up to the *last* ``]`` (no ``]``: the line is
    skipped and the previous name kept), ``key=value`` split at the first ``=``, both trimmed
    of spaces and tabs (``Trim``, ``common/common_utils.cc``), kept only when both are
    non-empty. Keys before any header flow into the first section. A section name seen again
    keeps its first content (``std::map::emplace``)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    content: list[tuple[str, str]] = []
    name = ""
    for line in text.split("\n"):
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            if name and content:
                sections.setdefault(name, content)
                content = []
            end = line.rfind("]")
            if end != -1:
                name = line[1:end].strip(_BLANKS)
            continue
        if "=" not in line:
            continue
        key, _, value = line.partition("=")
        key, value = key.strip(_BLANKS), value.strip(_BLANKS)
        if key and value:
            content.append((key, value))
    if content and name:
        sections.setdefault(name, content)
    return sections


def _byte_order(text: str) -> bytes:
    """``std::map``'s order of a name: its bytes."""
    return text.encode("utf-8", "surrogateescape")


def ge_ini_values(data: bytes) -> tuple[bool, dict[str, str]]:
    """``GetCacheInitFileCfg``: whether GE uses ``op_cache.ini`` bytes ``data`` (the first
    section in byte order is ``[op_compiler_cache]`` and it has both version stamps), and the
    four keys' raw values as GE holds them (keys in byte order, the last duplicate wins; a
    CRLF file leaves a ``\\r``)."""
    sections = ge_sections(data.decode("utf-8", "surrogateescape"))
    values: dict[str, str] = {}
    order = sorted(sections, key=_byte_order)
    if not order or order[0] != SECTION:
        return False, values
    for key, value in sorted(sections[SECTION], key=lambda kv: _byte_order(kv[0])):
        if key in KNOWN_KEYS:
            values[key] = value
    return bool(values.get(ADK_KEY) and values.get(OPS_KEY)), values


def ge_limits(max_raw: str, ratio_raw: str) -> tuple[int, int] | None:
    """``UpdateOpCacheSizeCfg``: (max MB, remain %) when both values are set, both pass
    ``std::stoi``, the limit is -1 or ≥ 1 and the ratio 1..100; None (GE falls back to the
    environment and the defaults) otherwise."""
    if not max_raw or not ratio_raw:
        return None
    max_mb, ratio = ge_stoi(max_raw), ge_stoi(ratio_raw)
    if max_mb is None or ratio is None or max_mb == 0 or max_mb < NEVER_EVICT:
        return None
    if not RATIO_MIN_PCT <= ratio <= RATIO_MAX_PCT:
        return None
    return max_mb, ratio


def env_limit(
    env: Mapping[str, str], var: str, lo: int, allow_minus_one: bool, default: int
) -> tuple[int, str, str, str | None]:
    """GE's env parsing, exactly (``te_cache_space_manager.cc``): ``GetCacheSpaceMaxSizeCfg``
    reads ``ASCEND_MAX_OP_CACHE_SIZE`` with ``std::stoi`` (``300MB`` and ``1.5`` are 300 and
    1; no digit or beyond ``int``: the default) and accepts -1 or 1..``INT_MAX``-1;
    ``GetCacheRemainSizeRadio`` reads the ratio with ``std::atoi`` (no digit: 0) and accepts
    0..100; an empty variable is unset. cachemgr applies the value GE applies — two
    evictors on one folder must agree — and warns about anything but a plain integer.

    :returns: ``(value, origin, source, warning)``: origin ``env`` (source ``var``) or
        ``default`` (source empty, or ``fallback from VAR``); the warning or None.
    """
    raw = env.get(var)
    if raw is None or raw == "":
        return default, "default", "", None
    is_ratio = var.endswith("RATIO")
    value = ge_atoi(raw) if is_ratio else ge_stoi(raw)
    top = 100 if is_ratio else 2**31 - 2
    ok = value is not None and (lo <= value <= top or (value == -1 and allow_minus_one))
    rng = f"{lo}..100" if is_ratio else f"an integer ≥ {lo} or -1"
    if not ok or value is None:
        warning = (
            f"{var}={raw!r} (from env) is invalid (accepted: {rng}); using the default "
            f"{default}, as GE does"
        )
        return default, "default", f"fallback from {var}", warning
    if raw.strip() == str(value) or raw.strip() == f"+{value}":
        return value, "env", var, None
    how = "std::atoi" if is_ratio else "std::stoi"
    meaning = f": an eviction keeps {value} % of the limit" if is_ratio else " MiB"
    warning = (
        f"{var}={raw!r} (from env) is not a plain integer (accepted: {rng}); GE reads it as "
        f"{value}{meaning} ({how}), and cachemgr applies the same so that both evict alike; "
        f"set {var} to the integer you mean"
    )
    return value, "env", var, warning


def env_limits(
    env: Mapping[str, str],
) -> tuple[tuple[int, str, str], tuple[int, str, str], list[str]]:
    """Both limits from the environment (:func:`env_limit`): ``(max MB, origin, source)``,
    ``(remain %, origin, source)`` and their warnings, as GE falls back to them when no
    ``op_cache.ini`` gives limits."""
    max_mb, max_origin, max_source, warn1 = env_limit(env, MAX_ENV, 1, True, DEFAULT_MAX_MB)
    ratio, ratio_origin, ratio_source, warn2 = env_limit(env, RATIO_ENV, 0, False, DEFAULT_RATIO)
    warnings = [w for w in (warn1, warn2) if w]
    return (max_mb, max_origin, max_source), (ratio, ratio_origin, ratio_source), warnings


def passed_over(env: Mapping[str, str], names: tuple[str, ...], winner: str) -> tuple[str, ...]:
    """The cache-folder names in ``names`` that ``env`` sets, each as ``NAME=value (…)``:
    they lost to ``winner`` (docs/configuration.md#every-frameworks-name)."""
    return tuple(f"{n}={env[n]} ({winner} comes first)" for n in names if env.get(n))


def cache_folder_choice(
    option: str, option_origin: str, option_source: str, env: Mapping[str, str]
) -> tuple[str, str, str, str, tuple[str, ...]]:
    """Which name gives the cache root (docs/configuration.md#every-frameworks-name): the
    ``op_compiler_cache_dir`` option ``option`` (command line, config file; empty when not
    given) > torch_npu's ``ACL_OP_COMPILER_CACHE_DIR`` > ``ASCEND_CACHE_PATH`` >
    ``$HOME/atc_data``. The first two give ``<dir>/kernel_cache``, ``ASCEND_CACHE_PATH`` a
    per-host folder, ``$HOME`` ``atc_data/kernel_cache``
    (:mod:`cachemgr.config.layout` builds each).

    :returns: ``(kind, raw, origin, source, passed_over)``: ``kind`` is
        ``op_compiler_cache_dir``, ``ACL_OP_COMPILER_CACHE_DIR``, ``ASCEND_CACHE_PATH`` or
        ``HOME``; ``raw`` the value as given (not yet checked); origin and source of the
        value; the names passed over (:func:`passed_over`).
    """
    if option:
        over = passed_over(
            env, (ACL_CACHE_DIR, "ASCEND_CACHE_PATH"), option_source or option_origin
        )
        return "op_compiler_cache_dir", option, option_origin, option_source, over
    if env.get(ACL_CACHE_DIR):
        over = passed_over(env, ("ASCEND_CACHE_PATH",), ACL_CACHE_DIR)
        return ACL_CACHE_DIR, env[ACL_CACHE_DIR], "env", ACL_CACHE_DIR, over
    if env.get("ASCEND_CACHE_PATH"):
        return "ASCEND_CACHE_PATH", env["ASCEND_CACHE_PATH"], "env", "ASCEND_CACHE_PATH", ()
    home = env.get("HOME") or os.path.expanduser("~")
    return "HOME", home, "default", "$HOME/atc_data", ()


#: GE's MIN_CACHE_AGING_TIME: an entry accessed this recently is never evicted (seconds).
DEFAULT_MIN_AGE_S = 1800
#: docs/design.md#options-and-their-origins: the characters of a path value besides ``/``:
#: a-z A-Z 0-9 _ - . and Chinese characters (the three CJK blocks below).
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")
_CJK = ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF))


def path_char_ok(char: str) -> bool:
    """True for a character a path value may hold (docs/design.md#options-and-their-origins):
    a-z A-Z 0-9 ``_ - . /`` and Chinese characters."""
    if char in _NAME_CHARS or char == "/":
        return True
    code = ord(char)
    return any(lo <= code <= hi for lo, hi in _CJK)


def path_value_ok(value: str) -> bool:
    """True when every character of the non-empty ``value`` is :func:`path_char_ok`."""
    return bool(value) and all(path_char_ok(c) for c in value)


def chip_name_ok(name: str) -> bool:
    """True for a chip folder's name: a ``soc_version`` as CANN's platform table spells them,
    letters, digits, ``_`` and ``-``, starting with a letter or digit (never a ``.``:
    :data:`cachemgr.config.layout.CHIP_NAME_RE` says why)."""
    if not name or name[0] in "_-.":
        return False
    return all(c in _NAME_CHARS and c != "." for c in name)


def max_bytes(max_mb: int) -> int | None:
    """The limit ``max_mb`` (MiB, -1 = never evict) in bytes, None when eviction is off."""
    return None if max_mb == NEVER_EVICT else max_mb * MIB


#: Characters of a version stamp the plain form below takes (CANN writes ``7.0.0``,
#: ``8.0.RC1``…).
_STAMP_CHARS = _NAME_CHARS | frozenset("+")


def plain_ge_ini(data: bytes) -> dict[str, str] | None:
    """The values of ``op_cache.ini`` bytes ``data`` when they are in the plain form GE writes
    (``CreatOpCacheIniFile``: ``[op_compiler_cache]`` and its ``key=value`` lines, LF ends)
    with, at most, the two limits an operator adds: every line ``key=value`` of a known key
    once, both version stamps of plain characters, the limits both or neither, each a plain
    decimal in GE's range (:func:`ge_limits` takes it as written). None for anything else.

    Not a second reading of the file: a subset of what :class:`cachemgr.config.ini.OpCacheIni`
    reads without a problem and with these values (``tests/test_os_only_rules.py`` checks
    that on generated files), for a fast path that declines the rest to it.
    """
    if not data.endswith(b"\n"):
        return None
    try:
        lines = data.decode("ascii").split("\n")[:-1]
    except UnicodeDecodeError:
        return None
    if not lines or lines[0] != f"[{SECTION}]":
        return None
    values: dict[str, str] = {}
    for text in lines[1:]:
        key, eq, value = text.partition("=")
        if not eq or key not in KNOWN_KEYS or key in values or not value:
            return None
        values[key] = value
    for key in (ADK_KEY, OPS_KEY):
        stamp = values.get(key, "")
        if not stamp or not all(c in _STAMP_CHARS for c in stamp):
            return None
    if (MAX_KEY in values) != (RATIO_KEY in values):
        return None
    if MAX_KEY in values:
        max_mb, ratio = values[MAX_KEY], values[RATIO_KEY]
        limits = ge_limits(max_mb, ratio)
        if limits is None or (str(limits[0]), str(limits[1])) != (max_mb, ratio):
            return None
    return values
