"""CANN's ``op_cache.ini``: read, check and rewrite it (layer 3,
docs/design.md#size-limits-and-eviction, [GE]).

The file lives at ``<kernel cache>/op_cache.ini``. GE (``te_cache_space_manager.cpp`` in the
open-sourced CANN graph engine) creates it after the first compile and reads it like this::

    [op_compiler_cache]              # the only section GE reads (name trimmed, case-sensitive)
    adk_version=7.0.0                # version stamps GE writes; it ignores an ini without them
    ops_version=7.0.0
    max_op_cache_size=500            # MB (MiB) per chip folder; -1 = never evict
    remain_cache_size_ratio=80       # percent kept after an eviction, 1..100

Grammar accepted here (GE's, made strict so that mistakes surface):

* a line is blank, a comment (``#`` or ``;`` after optional blanks), a section header
  (``[name]`` starting in column 1) or ``key = value`` (blanks around ``=`` allowed; the value
  runs to the end of the line; keys are case-sensitive, as GE writes them);
* lines end with LF; the file has no byte-order mark;
* in ``[op_compiler_cache]`` each key appears once; the section appears once.

Anything else is recorded in :attr:`OpCacheIni.problems` (one line each, naming
``<path>:<line>``, the value and the accepted range); loading never raises for bad content.
Problems are warnings: the limits and stamps that count are the ones **GE computes** for the
same bytes (:func:`ge_reading`, a copy of GE's parser), so that GE and cachemgr never fight
over one folder. When GE does not use the ini (no stamps, another section first, a value
``std::stoi`` rejects) the caller falls back to ``ASCEND_MAX_OP_CACHE_SIZE`` /
``ASCEND_REMAIN_CACHE_SIZE_RATIO`` and the defaults (``cachemgr.config.options``), as GE does.

Rewrites keep every line that was not changed byte for byte (comments, other sections, blank
lines, key order, a BOM, CRLF ends, bytes that are not UTF-8) and go through a temp file and
``rename()`` (:func:`cachemgr.storage.fsutil.atomic_write_bytes`).
"""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from cachemgr import parsedfiles
from cachemgr.config import core
from cachemgr.constants import NEVER_EVICT
from cachemgr.errors import CachePermissionError, ConfigError
from cachemgr.storage import fsutil
from cachemgr.words import plural

log = logging.getLogger(__name__)

#: The section GE reads [GE].
SECTION = core.SECTION
#: File name inside the kernel cache folder [GE].
INI_NAME = core.INI_NAME

#: Size limit per chip folder, in MB (MiB) [GE].
MAX_KEY = core.MAX_KEY
#: Share of the limit kept after an eviction, in percent [GE].
RATIO_KEY = core.RATIO_KEY
#: Version stamps GE writes and compares with the installed toolkit [GE].
ADK_KEY = core.ADK_KEY
OPS_KEY = core.OPS_KEY
#: Largest ``max_op_cache_size`` in MB GE accepts (``INT_MAX``) [GE].
MAX_MB_LIMIT = core.MAX_MB_LIMIT
RATIO_MIN_PCT = core.RATIO_MIN_PCT
RATIO_MAX_PCT = core.RATIO_MAX_PCT

_KNOWN_KEYS = (MAX_KEY, RATIO_KEY, ADK_KEY, OPS_KEY)
_STAMPS = (ADK_KEY, OPS_KEY)
_MAX_RANGE = f"-1 or 1..{MAX_MB_LIMIT} (MB; -1 = never evict)"
_RATIO_RANGE = f"{RATIO_MIN_PCT}..{RATIO_MAX_PCT}"
_BOM = b"\xef\xbb\xbf"
#: Largest ``op_cache.ini`` read (bytes). GE's own file is five short lines; any member may
#: plant a huge (or sparse, terabyte-sized) one, which must not hold every command reading
#: the limits (docs/security.md item 3): a larger file is an unreadable ini.
MAX_INI_BYTES = 1 << 20
_BLANKS = " \t"
_INT = re.compile(r"-?[0-9]+")
_HEADER = re.compile(r"\[([^\]]*)\][ \t]*")
# Linear-time: no two blank runs can trade characters (the lazy form was cubic on a long
# line of blanks, which a shared, group-writable ini must not be able to do to every command).
_KEYVAL = re.compile(
    r"[ \t]*(?:([^= \t](?:[^=]*[^= \t])?)[ \t]*)?=[ \t]*((?:[^ \t](?:.*[^ \t])?)?)[ \t]*"
)
_KEY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")


@dataclass(frozen=True)
class IniLimits:
    """The size limits an ``op_cache.ini`` sets (docs/design.md#size-limits-and-eviction, [GE]).

    :ivar max_op_cache_size: limit per chip folder in MB (MiB, 2^20 bytes); -1 = never evict.
    :ivar remain_cache_size_ratio: percent of the limit kept after an eviction, 1..100.
    """

    max_op_cache_size: int
    remain_cache_size_ratio: int


@dataclass(frozen=True)
class GeReading:
    """What GE reads from an ``op_cache.ini`` (:func:`ge_reading`).

    :ivar used: GE uses the ini (``GetCacheInitFileCfg`` returned true: the first section in
        sorted order is ``[op_compiler_cache]`` and it has both stamps).
    :ivar values: the four keys' raw values as GE holds them (a CRLF file leaves a ``\r``).
    :ivar limits: GE's limits (MB, percent), None when GE falls back to env / defaults.
    """

    used: bool
    values: dict[str, str]
    limits: IniLimits | None

    @property
    def stamps(self) -> tuple[str, str] | None:
        """(adk_version, ops_version) as GE compares them, or None when GE has none."""
        if not self.used:
            return None
        return self.values[ADK_KEY], self.values[OPS_KEY]


#: GE's ``std::stoi`` / ``std::atoi`` of a limit (:mod:`cachemgr.config.core`, where the
#: rule lives once).
ge_stoi = core.ge_stoi
ge_atoi = core.ge_atoi


def ge_reading(data: bytes) -> GeReading:
    """Read ``op_cache.ini`` bytes exactly as GE does (docs/design.md#size-limits-and-eviction,
    [GE]).

    ``GetCacheInitFileCfg``: sections in ``std::map`` (byte) order; the first must be
    ``op_compiler_cache`` or GE ignores the file; inside it keys in ``std::multimap`` order,
    the last duplicate wins; GE uses the ini only when both stamps are non-empty.
    ``UpdateOpCacheSizeCfg``: limits only when both values are set, both pass ``std::stoi``,
    ``max_op_cache_size`` is -1 or ≥ 1 and ``remain_cache_size_ratio`` is 1..100; otherwise
    GE falls back to the env vars and defaults.
    """
    used, values = core.ge_ini_values(data)
    if not used:
        return GeReading(False, values, None)
    limits = core.ge_limits(values.get(MAX_KEY, ""), values.get(RATIO_KEY, ""))
    return GeReading(True, values, None if limits is None else IniLimits(*limits))


@dataclass
class _Line:
    text: str  # decoded with surrogateescape (lossless); no line end, no BOM
    end: str  # "\n", "\r\n" or "" (last line without a line end)


@dataclass
class _Scan:
    """What one pass over the lines found; indices are 0-based line numbers."""

    problems: list[tuple[int, str]]  # (1-based line or 0 for the whole file, message)
    values: dict[str, str]  # key -> raw value of its last line in [op_compiler_cache]
    key_lines: dict[str, list[int]]  # key -> every line holding it in [op_compiler_cache]
    headers: list[int]  # lines of every [op_compiler_cache] header
    last_key_of_first_block: int | None  # where a new key goes


def _split(data: bytes) -> tuple[bool, list[_Line]]:
    bom = data.startswith(_BOM)
    text = data[len(_BOM) if bom else 0 :].decode("utf-8", "surrogateescape")
    pieces = text.split("\n")
    if pieces[-1] == "":
        pieces.pop()
        ends = ["\n"] * len(pieces)
    else:
        ends = ["\n"] * (len(pieces) - 1) + [""]
    lines = []
    for piece, end in zip(pieces, ends, strict=True):
        if end and piece.endswith("\r"):
            lines.append(_Line(piece[:-1], "\r\n"))
        else:
            lines.append(_Line(piece, end))
    return bom, lines


def _join(bom: bool, lines: list[_Line]) -> bytes:
    body = "".join(line.text + line.end for line in lines).encode("utf-8", "surrogateescape")
    return _BOM + body if bom else body


def _near_miss(key: str) -> str | None:
    """The GE key ``key`` was probably meant to be (wrong case, ``ascend_`` prefix), or None."""
    if key in _KNOWN_KEYS:
        return None
    folded = key.lower().replace("-", "_").removeprefix("ascend_")
    return folded if folded in _KNOWN_KEYS else None


def _shorten(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _scan(lines: list[_Line]) -> _Scan:
    """Classify every line; record structural problems (values are checked by the caller)."""
    problems: list[tuple[int, str]] = []
    values: dict[str, str] = {}
    key_lines: dict[str, list[int]] = {}
    headers: list[int] = []
    other_sections: list[str] = []
    crlf: list[int] = []
    section: str | None = None
    last_key_of_first_block: int | None = None
    for idx, line in enumerate(lines):
        n = idx + 1
        text = line.text
        if line.end == "\r\n":
            crlf.append(n)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            problems.append((n, "is not valid UTF-8"))
        stripped = text.strip(_BLANKS)
        if not stripped or stripped[0] in "#;":
            continue
        if text.startswith("["):
            match = _HEADER.fullmatch(text)
            if match is None:
                problems.append((n, f"{_shorten(text)!r} is not a valid [section] header"))
                continue
            section = match.group(1).strip(_BLANKS)
            if section == SECTION:
                if headers:
                    problems.append(
                        (
                            n,
                            f"[{SECTION}] appears again (first at line {headers[0] + 1}); "
                            "GE reads only the first",
                        )
                    )
                headers.append(idx)
            elif section not in other_sections:
                other_sections.append(section)
            continue
        match = _KEYVAL.fullmatch(text)
        if match is None or not match.group(1):
            if stripped.startswith("["):
                msg = (
                    f"section header {_shorten(stripped)!r} is indented; "
                    "GE sees only headers in column 1"
                )
            else:
                msg = (
                    f"{_shorten(text)!r} is not 'key = value', a '#' comment or a [section] header"
                )
            problems.append((n, msg))
            continue
        key, value = match.group(1), match.group(2)
        meant = _near_miss(key)
        if meant is not None:
            problems.append(
                (
                    n,
                    f"{key} is not a key GE reads; did you mean {meant}? (keys are "
                    "case-sensitive and have no 'ascend_' prefix)",
                )
            )
        if section != SECTION:
            if key in _KNOWN_KEYS:
                where = "outside any section" if section is None else f"under [{section}]"
                problems.append((n, f"{key} is {where}; GE reads it only under [{SECTION}]"))
            continue
        if key in key_lines:
            problems.append(
                (
                    n,
                    f"{key} is set twice, at lines {key_lines[key][0] + 1} and {n}; "
                    "GE uses the last one",
                )
            )
        key_lines.setdefault(key, []).append(idx)
        values[key] = value
        if len(headers) == 1:
            last_key_of_first_block = idx
    if crlf:
        problems.append(
            (
                crlf[0],
                f"has CRLF line ends ({plural(len(crlf), 'line')}, first at line {crlf[0]}); "
                "CANN writes LF",
            )
        )
    if not headers:
        found = ", ".join(f"[{name}]" for name in other_sections) or "no section header at all"
        problems.append((0, f"has no [{SECTION}] section (found: {found})"))
    return _Scan(problems, values, key_lines, headers, last_key_of_first_block)


def _check_int(key: str, raw: str, low: int, high: int, accepted: str) -> tuple[int | None, str]:
    """Parse ``raw`` as GE's ini value ``key``; return (value, "") or (None, why)."""
    if raw == "":
        return None, f"{key}= is empty (accepted: {accepted})"
    if not _INT.fullmatch(raw):
        return None, f"{key}={raw} is not an integer (accepted: {accepted})"
    value = int(raw) if len(raw) <= 20 else None  # no giant int() of a hostile file
    if value is not None and ((key == MAX_KEY and value == NEVER_EVICT) or low <= value <= high):
        return value, ""
    return None, f"{key}={raw} is outside {accepted}"


def _check_value(key: str, raw: str) -> tuple[int | None, str]:
    if key == MAX_KEY:
        return _check_int(key, raw, 1, MAX_MB_LIMIT, _MAX_RANGE)
    return _check_int(key, raw, RATIO_MIN_PCT, RATIO_MAX_PCT, _RATIO_RANGE)


class UnreadableIniError(ConfigError):
    """``op_cache.ini`` exists but this user may not read it (e.g. another user's ``0600``
    file): callers go on as for an invalid ini — env/default limits, versions unknown, so
    never a purge (docs/security.md item 3). The message names the path, owner and mode."""


def _unreadable(path: Path, exc: OSError) -> UnreadableIniError:
    try:
        st = os.stat(path, follow_symlinks=False)
        who = (
            f"owner {fsutil.user_name(st.st_uid)}:{fsutil.group_name(st.st_gid)}, "
            f"mode {stat.filemode(st.st_mode)}"
        )
    except OSError:
        who = "owner unknown"
    return UnreadableIniError(
        f"{INI_NAME} {path} is not readable by user {fsutil.user_name()} "
        f"({who}): {exc.strerror or exc}"
    )


def _read(path: Path, dir_fd: int | None = None) -> bytes | None:
    """The file's bytes, or None when it does not exist.

    :raises UnreadableIniError: (a ``ConfigError``) the path is a folder, a symlink, not a
        regular file, or may not be read: any member may plant one, so its readers go on as
        for an invalid ini (docs/security.md items 2, 3).
    :raises ConfigError: any other read error.
    """
    try:
        st = fsutil.lstat_or_none(path, dir_fd)
        if st is None:
            return None
        if stat.S_ISDIR(st.st_mode):
            raise UnreadableIniError(f"{INI_NAME} {path} is a folder, not a file")
        if stat.S_ISLNK(st.st_mode):
            raise UnreadableIniError(
                f"{INI_NAME} {path} is a symlink; links inside the cache are not followed "
                "(docs/design.md#writing-and-reading-an-entry)"
            )
        if not stat.S_ISREG(st.st_mode):
            raise UnreadableIniError(f"{INI_NAME} {path} is not a regular file")
        return fsutil.read_bytes_noatime(path, dir_fd, max_bytes=MAX_INI_BYTES)
    except FileNotFoundError:
        return None
    except fsutil.FileTooLargeError as exc:
        raise UnreadableIniError(
            f"{INI_NAME} {path} {exc.strerror} (GE's is a few lines); not read"
        ) from exc
    except PermissionError as exc:
        raise _unreadable(path, exc) from exc
    except OSError as exc:
        raise ConfigError(f"cannot read {INI_NAME} {path}: {exc.strerror or exc}") from exc


class OpCacheIni:
    """One ``op_cache.ini`` as read from disk, plus changes made with :meth:`set`
    (docs/design.md#size-limits-and-eviction).

    :ivar path: the file, ``<kernel cache>/op_cache.ini``.
    :ivar exists: False when the file is missing (then every value is None and there are no
        problems).
    :ivar problems: one line per problem, ``"op_cache.ini <path>:<line>: <what>"``.
    :ivar max_op_cache_size: valid limit in MB (MiB), -1 = never evict, or None.
    :ivar remain_cache_size_ratio: valid percent 1..100 kept after eviction, or None.
    :ivar adk_version: GE's toolkit version stamp, or None when missing/empty.
    :ivar ops_version: GE's operator-package version stamp, or None when missing/empty.
    :ivar ge: what GE itself reads from the same bytes (:class:`GeReading`): the limits and
        the stamps that count (``ge.stamps`` is None when GE ignores the ini).
    """

    def __init__(self, path: Path, data: bytes | None) -> None:
        """Use :meth:`load` or :meth:`create`; ``data`` None means the file is missing."""
        self.path = Path(path)
        self.exists = data is not None
        self._disk = data  # the bytes last read from / written to disk
        self._bom, self._lines = _split(data or b"")
        self._changes: dict[str, str] = {}
        self._analyse()

    def __repr__(self) -> str:
        return (
            f"OpCacheIni({str(self.path)!r}, exists={self.exists}, "
            f"limits={self.limits()}, problems={len(self.problems)})"
        )

    @classmethod
    def load(cls, path: Path) -> OpCacheIni:
        """Read ``path``; bad content is recorded in :attr:`problems`, never raised.

        :raises ConfigError: the path is a folder, a symlink or cannot be read (names the path).
        """
        data = _read(Path(path))
        parsedfiles.note(str(path), data)  # what a direct memo binds its hit to
        ini = cls(Path(path), data)
        if ini.problems:
            log.debug("%s: problems: %s", ini.path, ini.problems)
        return ini

    @classmethod
    def create(
        cls,
        path: Path,
        max_op_cache_size: int,
        remain_cache_size_ratio: int,
        adk_version: str,
        ops_version: str,
    ) -> OpCacheIni:
        """Write an ini with both limits and both stamps and return it.

        A missing file is created as GE would write it (section, stamps, then the limits, LF
        ends). An existing file is updated in place like :meth:`set` + :meth:`save`: its
        other lines are kept.

        :param max_op_cache_size: MB (MiB) per chip folder, 1..2^31-1, or -1 = never evict.
        :param remain_cache_size_ratio: percent kept after an eviction, 1..100.
        :raises ConfigError: an invalid value (nothing is written), or an unreadable path.
        :raises OSError: the write failed; the previous file is unchanged.
        """
        ini = cls.load(path)
        for key, value in (
            (ADK_KEY, adk_version),
            (OPS_KEY, ops_version),
            (MAX_KEY, max_op_cache_size),
            (RATIO_KEY, remain_cache_size_ratio),
        ):
            ini.set(key, value)
        ini.save()
        return ini

    def limits(self) -> IniLimits | None:
        """The limits GE computes for this file (:func:`ge_reading`), or None when the caller
        must fall back to env vars / defaults as GE does (docs/design.md#size-limits-and-eviction).
        :attr:`problems` are warnings about doubtful lines; they do not change what GE computes."""
        return self.ge.limits

    def set(self, key: str, value: str | int) -> None:
        """Set ``key`` in ``[op_compiler_cache]`` in memory; :meth:`save` writes it.

        An existing ``key`` line keeps its spacing and line end (every occurrence is changed
        when the key is duplicated) — except a version stamp's, which is rewritten the way GE
        writes it (:meth:`stamp_lines_ge_cannot_rewrite`); a new one is written GE's way,
        ``key=value``, after the section's last key; the section is added at the end of the
        file when missing.

        :param key: case-sensitive, e.g. ``max_op_cache_size`` (MB) or
            ``remain_cache_size_ratio`` (percent); other keys are kept as given.
        :raises ConfigError: the key is malformed or a misspelt GE key, or the value is invalid
            for it (limits: see :class:`IniLimits`; stamps: non-empty) or spans lines.
        """
        text = _normalise(key, value)
        self._changes[key] = text
        self._apply(key, text)
        self._analyse()

    def stamp_lines_ge_cannot_rewrite(self) -> list[int]:
        """The lines (1-based) of ``[op_compiler_cache]`` holding a version stamp GE reads
        but cannot rewrite: spaces before ``=`` or an indented key (``adk_version = 7.0``).
        GE reads them trimmed (``LoadIniFile``), but its restamp after an upgrade
        (``te_cache_space_manager.cc`` ``UpdateOpCacheIniFile`` → ``GetNewVersionString``)
        replaces only a line whose text before the first ``=`` is exactly the key
        (``sscanf "%[^=]"`` + ``strcmp``): it keeps the old stamp and so purges the chip
        folder on every start. :meth:`set` of a stamp writes its line as GE does, ``key=value``."""
        out = []
        for key in _STAMPS:
            for idx in self._scan_result.key_lines.get(key, []):
                if self._lines[idx].text.partition("=")[0] != key:
                    out.append(idx + 1)
        return sorted(out)

    def save(self, dir_fd: int | None = None) -> None:
        """Write the ini atomically (temp file + ``rename()``,
        docs/design.md#writing-and-reading-an-entry).

        Every line :meth:`set` did not change is kept byte for byte. The section is added if
        missing and the file created if missing (its folder must exist). If the file changed
        on disk since it was loaded (e.g. GE rewrote the stamps), the changes made with
        :meth:`set` are applied to the current content instead, so nothing is lost. Nothing is
        written when the content is already on disk.

        :param dir_fd: the kernel cache folder, open (:mod:`cachemgr.storage.safedir`): the ini is
            read, written and renamed relative to it, never through a link.
        :raises ConfigError: the path became a folder, a symlink or unreadable.
        :raises CachePermissionError: the folder is not writable for this user.
        :raises OSError: any other write failure; the previous file is unchanged and no
            ``*.temp`` is left behind.
        """
        current = _read(self.path, dir_fd)
        if current != self._disk:
            log.info(
                "%s changed on disk since it was loaded; applying %s to it",
                self.path,
                plural(len(self._changes), "change"),
            )
            self._bom, self._lines = _split(current or b"")
            self._analyse()
            for key, text in self._changes.items():
                self._apply(key, text)
                self._analyse()
        if not self._scan_result.headers:
            self._add_section()
            self._analyse()
        data = _join(self._bom, self._lines)
        if data == current:
            log.debug("%s is up to date; not rewritten", self.path)
        else:
            try:
                fsutil.atomic_write_bytes(self.path, data, dir_fd=dir_fd)
            except PermissionError as exc:
                raise CachePermissionError(
                    f"cannot write {INI_NAME} {self.path}: " + fsutil.access_hint(self.path.parent)
                ) from exc
            log.info("wrote %s", self.path)
        self._disk = data
        self.exists = True
        self._changes.clear()

    # -- internals -----------------------------------------------------------------------

    def _where(self, line: int) -> str:
        return f"{INI_NAME} {self.path}:{line}" if line else f"{INI_NAME} {self.path}"

    def _analyse(self) -> None:
        """Recompute the public attributes and problems from the lines."""
        scan = _scan(self._lines)
        self._scan_result = scan
        found = list(scan.problems)
        if self._bom:
            found.append(
                (1, "starts with a UTF-8 byte-order mark; GE then misses a header on line 1")
            )
        limits: dict[str, int | None] = {}
        for key in (MAX_KEY, RATIO_KEY):
            raw = scan.values.get(key)
            limits[key] = None
            if raw is not None:
                limits[key], why = _check_value(key, raw)
                if why:
                    found.append((scan.key_lines[key][-1] + 1, why))
        present = [key for key in (MAX_KEY, RATIO_KEY) if key in scan.values]
        if len(present) == 1:
            other = RATIO_KEY if present[0] == MAX_KEY else MAX_KEY
            found.append(
                (
                    scan.key_lines[present[0]][-1] + 1,
                    f"{present[0]} is set but {other} is not; the ini's limits apply only when "
                    "both are valid (docs/design.md#size-limits-and-eviction)",
                )
            )
        stamps: dict[str, str | None] = {}
        for key in _STAMPS:
            stamps[key] = scan.values.get(key) or None
            if not scan.headers:
                continue  # "no section" already says it
            if key not in scan.values:
                found.append(
                    (
                        scan.headers[0] + 1,
                        f"[{SECTION}] has no {key}= version stamp; GE ignores an ini without "
                        f"{ADK_KEY} and {OPS_KEY}",
                    )
                )
            elif not stamps[key]:
                found.append(
                    (
                        scan.key_lines[key][-1] + 1,
                        f"{key}= is empty; GE ignores an ini without {ADK_KEY} and {OPS_KEY}",
                    )
                )
        if self._disk is None and not self._lines:
            found = []  # a missing file is not a problem: GE creates it, we fall back
        found.sort(key=lambda item: item[0] or float("inf"))
        self.problems = [f"{self._where(line)}: {msg}" for line, msg in found]
        self.ge = ge_reading(_join(self._bom, self._lines))
        if self.ge.limits is not None and (
            self.ge.limits.max_op_cache_size,
            self.ge.limits.remain_cache_size_ratio,
        ) != (limits[MAX_KEY], limits[RATIO_KEY]):
            self.problems.append(
                f"{self._where(0)}: GE reads the limits as max_op_cache_size="
                f"{self.ge.limits.max_op_cache_size}, remain_cache_size_ratio="
                f"{self.ge.limits.remain_cache_size_ratio}; cachemgr applies the same"
            )
        self.max_op_cache_size = limits[MAX_KEY]
        self.remain_cache_size_ratio = limits[RATIO_KEY]
        self.adk_version = stamps[ADK_KEY]
        self.ops_version = stamps[OPS_KEY]
        if self.exists and not self.ge.used and stamps[ADK_KEY] and stamps[OPS_KEY]:
            self.problems.append(
                f"{self._where(0)}: GE ignores this ini (a section sorts before "
                f"[{SECTION}]): its stamps and limits do not count"
            )

    def _default_end(self) -> str:
        """The file's usual line end (LF unless most lines end with CRLF): no normalising."""
        crlf = sum(line.end == "\r\n" for line in self._lines)
        return "\r\n" if crlf > sum(line.end == "\n" for line in self._lines) else "\n"

    def _insert(self, idx: int, text: str) -> None:
        end = self._default_end()
        if idx > 0 and not self._lines[idx - 1].end:
            self._lines[idx - 1].end = end
        self._lines.insert(idx, _Line(text, end))

    def _add_section(self) -> None:
        self._insert(len(self._lines), f"[{SECTION}]")

    def _apply(self, key: str, text: str) -> None:
        scan = self._scan_result
        if key in scan.key_lines:
            for idx in scan.key_lines[key]:
                line = self._lines[idx]
                match = _KEYVAL.fullmatch(line.text)
                if key in _STAMPS:  # as GE writes it (GetNewVersionString), or GE never can
                    line.text = f"{key}={text}"
                elif match is not None:  # always true for a key line; keeps mypy calm
                    line.text = line.text[: match.start(2)] + text + line.text[match.end(2) :]
                if key in _STAMPS and line.end == "\r\n":
                    line.end = "\n"  # GE keeps a CR in the value: the stamp would never match
            return
        if not scan.headers:
            self._add_section()
            scan = _scan(self._lines)
        after = scan.last_key_of_first_block
        self._insert((scan.headers[0] if after is None else after) + 1, f"{key}={text}")


def _normalise(key: str, value: str | int) -> str:
    """Check a :meth:`OpCacheIni.set` argument pair; return the value as it will be written.

    :raises ConfigError: see :meth:`OpCacheIni.set`.
    """
    if not isinstance(key, str) or not _KEY_NAME.fullmatch(key):
        raise ConfigError(f"{INI_NAME}: {key!r} is not a valid key (letters, digits, _ . -)")
    meant = _near_miss(key)
    if meant is not None:
        raise ConfigError(
            f"{INI_NAME}: GE does not read {key}; the key is {meant} (case-sensitive)"
        )
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ConfigError(f"{INI_NAME}: {key}={value!r} must be a string or an integer")
    text = str(value).strip(_BLANKS)
    if "\n" in text or "\r" in text:
        raise ConfigError(f"{INI_NAME}: {key}={text!r} spans lines")
    if key in (MAX_KEY, RATIO_KEY):
        number, why = _check_value(key, text)
        if number is None:
            raise ConfigError(f"{INI_NAME}: {why}")
        return str(number)
    if key in _STAMPS and not text:
        raise ConfigError(f"{INI_NAME}: {key} must not be empty (GE ignores an empty stamp)")
    return text
