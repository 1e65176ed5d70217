"""The config file's schema: one typed model for every table of ``config/cachemgr.toml``.

Each table is a frozen dataclass (:class:`DaemonConfig`, :class:`SandboxTable`,
:class:`CompilersTable`, :class:`PrecompiledTable`, :class:`ToolkitTable`) whose fields are
its keys, with their defaults; a field's :class:`Rule` (its metadata, else derived from the
default's type) says what is accepted. :func:`load` reads a TOML file and checks it whole:
an unknown table or key, a value of the wrong type or out of range is a
:class:`~cachemgr.errors.ConfigError` naming the file, the line, the key, the value and what
is accepted — never a silent default. The top-level options (``op_compiler_cache_mode``...)
are checked by :mod:`cachemgr.config.options`, which passes their parsers in.

The consumers keep reading the tables as mappings (``Settings.sections``: the compilers'
registry, the sandbox, the toolkit's versions); every mapping they get has passed this schema.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from cachemgr import parsedfiles
from cachemgr.constants import MAX_SECONDS
from cachemgr.errors import ConfigError
from cachemgr.storage import safeio

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

#: ``[daemon] lock_fallback`` values (docs/design.md#sharing-and-locking).
LOCK_FALLBACKS = ("refuse", "local")
#: Largest config file read (bytes): ``--config /dev/zero``, a FIFO or a sparse giant (a
#: careless ``CACHEMGR_CONFIG``) hung every command reading it, and ate memory.
MAX_CONFIG_BYTES = 1 << 20
#: Largest integer a key takes unless its rule says otherwise (C ``int``).
MAX_INT = 2**31 - 1
#: Most compile workers: a thread each (``workers = 10**26`` made ``serve`` allocate until
#: the OOM killer came); the CLI's ``--workers`` has the same bound.
MAX_WORKERS = 1024


@dataclass(frozen=True)
class Rule:
    """What one key accepts: ``kind`` is ``str``, ``int``, ``float``, ``list_str`` (a list
    of strings) or ``flag_map`` (a table of lists of strings); numbers within ``lo..hi``;
    strings one of ``choices`` when given; ``text`` overrides the generated description."""

    kind: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    text: str = ""

    def accepted(self) -> str:
        """One phrase: what this key accepts."""
        if self.text:
            return self.text
        if self.choices:
            return ", ".join(repr(c) for c in self.choices)
        what = {
            "str": "a string",
            "int": "an integer",
            "float": "a number",
            "list_str": "a list of strings",
            "bool": "true or false",
            "flag_map": "a table of lists of strings",
        }[self.kind]
        if self.lo is not None and self.hi is not None:
            return f"{what} {self.lo:g}..{self.hi:g}"
        if self.lo is not None:
            return f"{what} ≥ {self.lo:g}"
        return what

    def check(self, value: Any) -> Any:
        """``value`` converted to the key's type (an int given for a float becomes a float).

        :raises ValueError: not accepted (the message is :meth:`accepted`).
        """
        ok = _KIND_CHECKS[self.kind](value)
        if ok and self.kind == "float":
            ok = _is_int(value) or math.isfinite(value)
        if ok and self.kind in ("int", "float"):
            ok = (self.lo is None or value >= self.lo) and (self.hi is None or value <= self.hi)
        if ok and self.choices:
            ok = value in self.choices
        if not ok:
            raise ValueError(self.accepted())
        return float(value) if self.kind == "float" else value


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


_KIND_CHECKS: dict[str, Callable[[Any], bool]] = {
    "str": lambda v: isinstance(v, str),
    "int": _is_int,
    "float": lambda v: _is_int(v) or isinstance(v, float),
    "list_str": _is_str_list,
    "bool": lambda v: isinstance(v, bool),
    "flag_map": lambda v: isinstance(v, dict) and all(_is_str_list(x) for x in v.values()),
}


def rule(kind: str, lo: float | None = None, hi: float | None = None, **kw: Any) -> Any:
    """Field metadata carrying a :class:`Rule`."""
    return {"rule": Rule(kind, lo, hi, **kw)}


def rule_of(f: dataclasses.Field[Any]) -> Rule:
    """A field's rule: its metadata's, else from its default (numbers ≥ 0, any string)."""
    found = f.metadata.get("rule")
    if found is not None:
        return found  # type: ignore[no-any-return]
    default = f.default
    if isinstance(default, str):
        return Rule("str")
    if _is_int(default):
        return Rule("int", 0, MAX_INT, text=f"an integer 0..{MAX_INT}")
    if isinstance(default, float):
        return Rule("float", 0, MAX_SECONDS, text=f"a number of seconds 0..{MAX_SECONDS:g}")
    raise TypeError(f"{f.name}: no rule")  # a programming error, caught by the tests


@dataclass(frozen=True)
class DaemonConfig:
    """``[daemon]``: timings in seconds; ``workers`` 0 = CPU count; ``tcp_port`` 0 = no TCP
    listener. Numbers are ≥ 0 unless their rule says otherwise."""

    reconcile_interval_s: float = 300.0  # full rescan of every chip folder (other hosts' writes)
    reconcile_jitter_s: float = 30.0  # random spread so hosts sharing a root do not align
    reap_interval_s: float = 600.0  # temp files, dead locks, orphans, kernel_meta of dead pids
    # a gc child (eviction, reaping, POST /gc) stops at the next entry after this long and
    # reports what it did: members holding the locks of bad entries cost 5 s each
    gc_deadline_s: float = 600.0
    evict_debounce_s: float = 2.0  # crossing the limit schedules eviction this much later
    # ...but however many file events follow, no later than this after the first
    evict_max_delay_s: float = 10.0
    # how often the inotify watches are checked against the folders (re-armed after an
    # rm -rf, new chip folders armed); also the governance heartbeat
    watch_check_interval_s: float = 2.0
    # chip folders without an inotify watch (kernel limits, or the budget below) are
    # rescanned this often
    poll_interval_s: float = 10.0
    # most folders watched with inotify (the kernel cache counts as one); 0 = no cap of ours
    inotify_watches: int = 0
    # WATCHDOG=1 is withheld when the main loop, the request server or governance made no
    # progress for this long (seconds)
    heartbeat_timeout_s: float = 60.0
    # loggers logged at debug level whatever -v says, comma-separated (e.g. "cachemgr.evicted":
    # the names of evicted kernels, which the one-line eviction summary leaves out)
    debug_loggers: str = ""
    counters_save_interval_s: float = 60.0
    workers: int = field(
        default=0,
        metadata=rule(
            "int", 0, MAX_WORKERS, text=f"an integer ≥ 0 (0 = CPU count), at most {MAX_WORKERS}"
        ),
    )
    # compile slots beyond `workers`, each only for a caller none of whose jobs compiles while
    # every worker does (docs/daemon.md#fair-workers); 0 = none
    reserve_workers: int = field(
        default=1, metadata=rule("int", 0, MAX_WORKERS, text=f"an integer 0..{MAX_WORKERS}")
    )
    tcp_host: str = "127.0.0.1"
    tcp_port: int = field(default=0, metadata=rule("int", 0, 65535))
    max_body_bytes: int = 1 << 20
    stop_timeout_s: float = 600.0  # SIGTERM: how long running compiles may take to finish
    # docs/design.md#sharing-and-locking: what to do when fcntl locks do not work on the cache root
    # (checked at start): "refuse" to start, or "local": serve a cache on local disk instead, and
    # say so
    lock_fallback: str = field(default="refuse", metadata=rule("str", choices=LOCK_FALLBACKS))
    # the root of that local cache; "" = $CACHE_DIRECTORY (systemd) or ~/.cache/cachemgr
    local_cache_dir: str = ""
    # how long a compile waits for another process (or host) compiling the same kernel, then
    # compiles it itself (seconds); 0 = twice the compile timeout plus a minute
    lock_wait_s: float = 0.0
    # completed debug outputs in kernel_meta are the users' and stay; > 0:
    # a dead process's output folder whose newest file is older than this goes (seconds)
    kernel_meta_retention_s: float = 0.0
    # the user the daemon runs as (e.g. "cachemgr"): the CLI, given this config, trusts its
    # socket besides the caller's own and root's; "" = none
    user: str = ""
    # The secret the TCP listener requires (a 0600 file of the daemon's user);
    # without it the TCP listener does not start
    tcp_token_file: str = ""
    # connections held at once, in all and per caller uid; a silent connection is closed
    # after idle_timeout_s (seconds)
    max_connections: int = 512
    max_connections_per_caller: int = 128
    # 0 is not "no limit": a zero socket timeout makes every read fail at once
    idle_timeout_s: float = field(
        default=30.0,
        metadata=rule("float", 1, MAX_SECONDS, text=f"a number of seconds 1..{MAX_SECONDS:g}"),
    )
    # a whole request (request line, headers and body) must arrive within this many seconds
    # of its first byte, or it is answered 408 and the connection closed (slowloris); the
    # answer (a long compile) is not limited by it
    request_timeout_s: float = field(
        default=30.0,
        metadata=rule("float", 1, MAX_SECONDS, text=f"a number of seconds 1..{MAX_SECONDS:g}"),
    )
    # a TCP connection whose request headers with the token have not been read this many
    # seconds after its accept is answered 408 and closed (docs/security.md, section 9)
    auth_deadline_s: float = field(
        default=2.0,
        metadata=rule("float", 0.1, 60, text="a number of seconds 0.1..60"),
    )
    # TCP connections not authenticated yet, held per source address and in all (below
    # max_connections_per_caller: the rest is for authenticated ones); a newcomer over either
    # evicts the oldest unauthenticated one
    max_unauth_per_address: int = field(
        default=8, metadata=rule("int", 1, MAX_INT, text=f"an integer 1..{MAX_INT}")
    )
    max_unauth_connections: int = field(
        default=32, metadata=rule("int", 1, MAX_INT, text=f"an integer 1..{MAX_INT}")
    )
    # compile jobs one caller (uid) may have queued or running; more → 429
    max_queued_per_caller: int = 1000
    # the highest priority a caller other than the daemon's user (or root) may ask for
    max_caller_priority: int = 0
    # hits a second one caller (uid) other than the daemon's user or root may report to
    # /hits (docs/daemon.md#hits-a-client-reports); 0 = 20,000 per CPU core
    max_reported_hits_per_s: int = field(default=0, metadata=rule("int", 0))
    # globs of cache roots this service keeps within their own limits besides its own cache,
    # e.g. ["/home/*/atc_data", "/data/*/cache"]: each root's kernel_cache* folders with their
    # own op_cache.ini, as the root's owner (docs/daemon.md#governing-every-cache-on-a-build-host)
    govern: tuple[str, ...] = field(
        default=(),
        metadata=rule("list_str", text="a list of absolute globs like '/home/*/atc_data'"),
    )

    @classmethod
    def from_table(cls, table: Mapping[str, Any] | None, where: str = "[daemon]") -> DaemonConfig:
        """Build from the config file's ``[daemon]`` table (checked by :func:`load` already
        when it came from a file; checked again here for tables built in code).

        :raises ConfigError: unknown key, or a value of the wrong type or range (names both).
        """
        return build(cls, table, where)


_NOT_EMPTY = "a non-empty string"


def _opt_str(text: str = _NOT_EMPTY) -> Any:
    return field(default=None, metadata=rule("str", text=text))


@dataclass(frozen=True)
class SandboxTable:
    """``[sandbox]``: how the daemon runs compiler processes (``cachemgr.compilers.sandbox``);
    limits per process, 0 = no limit."""

    namespaces: str = field(default="auto", metadata=rule("str", choices=("auto", "off")))
    bwrap: str = field(default="bwrap", metadata=rule("str", text=_NOT_EMPTY))
    prlimit: str = field(default="prlimit", metadata=rule("str", text=_NOT_EMPTY))
    allow: tuple[str, ...] = field(default=(), metadata=rule("list_str", text="a list of folders"))
    hide: tuple[str, ...] = field(default=(), metadata=rule("list_str", text="a list of folders"))
    unshare: str | None = _opt_str()  # no longer used (bubblewrap's view replaced it): warned
    address_space_mb: int = 16384  # RLIMIT_AS, MiB
    cpu_s: int = 1200  # RLIMIT_CPU, seconds
    output_mb: int = 1024  # RLIMIT_FSIZE, MiB


@dataclass(frozen=True)
class CompilersTable:
    """``[compilers]``: the compiler backends (``cachemgr.compilers``); unset = found on PATH
    or the backend's default."""

    cc: str | None = _opt_str("a compiler path or name")
    nvcc: str | None = _opt_str("a compiler path or name")
    cuda_arch: str | None = _opt_str("an SM architecture like 'sm_90'")
    readelf: str | None = _opt_str("a program path or name")
    cce_command: str | None = _opt_str("a command template with {source} and {output}")
    cce_preprocess_command: str | None = _opt_str("a command template with {source}, {output}")
    cce_flags: dict[str, list[str]] | None = field(default=None, metadata=rule("flag_map"))
    cce_suffix: str | None = _opt_str()
    cce_magic: str | None = _opt_str()
    cce_core_type: str | None = _opt_str()
    # how a compiler is told apart in the key: its file's size and mtime, or its SHA-256
    # (cachemgr.compilers.stamp; ccache's compiler_check)
    compiler_check: str = field(default="mtime", metadata=rule("str", choices=("mtime", "content")))


@dataclass(frozen=True)
class PrecompiledTable:
    """``[precompiled]``: packages of precompiled kernels (docs/design.md#precompiled-binaries),
    searched before
    ``$ASCEND_OPP_PATH``'s built-in ones."""

    paths: tuple[str, ...] = field(default=(), metadata=rule("list_str", text="a list of paths"))


@dataclass(frozen=True)
class ToolkitTable:
    """``[toolkit]``: the installed toolkit's versions, overriding ``version.info``."""

    adk_version: str | None = _opt_str("a non-empty one-line string")
    ops_version: str | None = _opt_str("a non-empty one-line string")


@dataclass(frozen=True)
class RemoteTable:
    """``[remote]``: remote storage tiers (parsed by ``cachemgr.remote.config``,
    which also reads ``CACHEMGR_REMOTE_STORAGE``). Passwords in ``storage`` are redacted
    wherever the table is shown (:meth:`ConfigFile.rows`)."""

    storage: tuple[str, ...] = field(
        default=(), metadata=rule("list_str", text="a list of URLs like 'redis://host:6379/0'")
    )
    upload_queue: int = field(default=256, metadata=rule("int", 1))
    failures_before_open: int = field(default=3, metadata=rule("int", 1))
    open_s: float = field(default=30.0, metadata=rule("float", 0.001))
    #: entries per chip the daemon downloads from the remotes' index (0 = off),
    #: into ``prefetch_socs`` (default: the chip folders present, ``soc_version``)
    prefetch: int = field(default=0, metadata=rule("int", 0))
    prefetch_socs: tuple[str, ...] = field(
        default=(), metadata=rule("list_str", text="a list of chip names like 'Ascend910B1'")
    )
    #: this site's private key file (``cachemgr remote keygen NAME``); unset: no uploads
    signing_key: str | None = _opt_str("the path of a private key file")
    #: the public keys whose entries this site accepts, ``NAME:BASE64`` each
    trusted_keys: tuple[str, ...] = field(
        default=(), metadata=rule("list_str", text="a list of public keys like 'site-a:BASE64'")
    )
    #: accept entries without checking who signed them (one writer only: docs/remote.md)
    trust_unsigned: bool = field(default=False, metadata=rule("bool"))
    #: users whose CANN-written entries are uploaded (default: the daemon's own user)
    upload_writers: tuple[str, ...] = field(
        default=(), metadata=rule("list_str", text="a list of user names")
    )


def redact_url(text: str) -> str:
    """``text`` with the password of a ``scheme://user:password@host`` URL replaced by
    ``********`` (never shown by ``config``, logs or errors)."""
    head, sep, rest = text.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0].split("|", 1)[0]:
        return text
    cred, _, after = rest.partition("@")
    user = cred.split(":", 1)[0]
    shown = f"{user}:********" if ":" in cred else cred
    return f"{head}://{shown}@{after}"


#: GE's names of the two cache settings (``ge.op_compiler_cache_dir`` …, the options of GE's
#: own API), accepted in the config file for the plain ones
#: (docs/configuration.md#every-frameworks-name): as a dotted key, a quoted key or a ``[ge]``
#: table.
GE_ALIASES = {
    "ge.op_compiler_cache_dir": "op_compiler_cache_dir",
    "ge.op_compiler_cache_mode": "op_compiler_cache_mode",
}
GE_TABLE = "ge"


#: Every table of the config file and its model.
TABLES: dict[str, type] = {
    "daemon": DaemonConfig,
    "sandbox": SandboxTable,
    "compilers": CompilersTable,
    "precompiled": PrecompiledTable,
    "toolkit": ToolkitTable,
    "remote": RemoteTable,
}


#: A table model (a dataclass of this module) that :func:`build` makes.
_Model = TypeVar("_Model", bound="DataclassInstance")


def build(cls: type[_Model], table: Mapping[str, Any] | None, where: str) -> _Model:
    """An instance of the table model ``cls`` from ``table``.

    :raises ConfigError: ``where: unknown setting …`` or ``where: key=value is invalid;
        accepted: …``.
    """
    known = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, raw in dict(table or {}).items():
        f = known.get(key)
        if f is None:
            raise ConfigError(f"{where}: unknown setting {key!r} (accepted: {', '.join(known)})")
        try:
            values[key] = _checked(rule_of(f), raw)
        except ValueError as exc:
            raise ConfigError(f"{where}: {key}={raw!r} is invalid; accepted: {exc}") from None
    return cls(**values)


def _checked(r: Rule, raw: Any) -> Any:
    value = r.check(raw)
    needs_text = r.kind == "str" and bool(r.text) and not r.choices
    if needs_text and (not value.strip() or "\n" in value):
        raise ValueError(r.accepted())
    if r.kind == "list_str":
        return tuple(value)
    return value


@dataclass(frozen=True)
class ConfigFile:
    """A checked config file: ``top`` holds its top-level option values (raw, parsed by
    :mod:`cachemgr.config.options`), ``tables`` the raw tables, ``models`` the typed tables (every
    table, defaults where absent) and ``lines`` the line of each ``(table, key)`` set."""

    path: Path | None = None
    top: Mapping[str, Any] = field(default_factory=dict)
    tables: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    models: Mapping[str, Any] = field(default_factory=dict)
    lines: Mapping[tuple[str, str], int] = field(default_factory=dict)
    #: a top-level option set by its GE name: option → ``(table, key)`` as written
    #: (``("ge", "op_compiler_cache_dir")``, or ``("", "ge.op_compiler_cache_dir")`` quoted)
    aliases: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    def where(self, table: str, key: str) -> str:
        """``config FILE:LINE`` of a key, for origins and messages."""
        line = self.lines.get((table, key))
        return f"config {self.path}" + (f":{line}" if line else "")

    def rows(self) -> dict[str, dict[str, Any]]:
        """Every key of every table: ``{"table.key": {value, origin, source}}`` (``origin``
        ``option`` when the file sets it, else ``default``)."""
        out: dict[str, dict[str, Any]] = {}
        for name, cls in TABLES.items():
            model = self.models.get(name) or cls()
            given = self.tables.get(name, {})
            for f in dataclasses.fields(cls):
                value = getattr(model, f.name)
                value = list(value) if isinstance(value, tuple) else value
                if name == "remote" and f.name == "storage":
                    value = [redact_url(v) for v in value]
                if f.name in given:
                    row = {"value": value, "origin": "option", "source": self.where(name, f.name)}
                else:
                    row = {"value": value, "origin": "default", "source": ""}
                out[f"{name}.{f.name}"] = row
        return out


def empty() -> ConfigFile:
    """No config file: every table at its defaults."""
    return ConfigFile(models={name: cls() for name, cls in TABLES.items()})


# patterns, compiled on first use by re's own cache (a run without a config file, such as a
# CLI hit, compiles none)
_HEADER = r"^\s*\[\s*([A-Za-z0-9_.\"' -]+?)\s*\]\s*(#.*)?$"
_KEY = r"^\s*([A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*')\s*[.=]"
_DOTTED = r"^\s*([A-Za-z0-9_-]+)\s*\.\s*([A-Za-z0-9_-]+)\s*="


def _lines(text: str) -> dict[tuple[str, str], int]:
    """Where each ``(table, key)`` is set (1-based); ``(table, "")`` is a table's header.
    TOML's own parser keeps no positions; this scan covers the file's plain form (headers
    and ``key = value`` lines), which is all the schema has."""
    out: dict[tuple[str, str], int] = {}
    table = ""
    depth = 0
    for number, line in enumerate(text.splitlines(), 1):
        if depth == 0:
            header = re.match(_HEADER, line)
            if header:
                table = header.group(1).strip("\"'")
                out.setdefault((table, ""), number)
                continue
            key = re.match(_KEY, line)
            if key:
                out.setdefault((table, key.group(1).strip("\"'")), number)
            dotted = re.match(_DOTTED, line) if table == "" else None
            if dotted:  # ge.op_compiler_cache_dir = …: the key of table "ge"
                out.setdefault((dotted.group(1), dotted.group(2)), number)
        depth = max(0, depth + line.count("[") - line.count("]"))
    return out


def _fail(path: Path, line: int | None, what: str) -> ConfigError:
    at = f"{path}:{line}" if line else str(path)
    return ConfigError(f"config file {at}: {what}")


def load(path: Path, top_parsers: Mapping[str, Callable[[Any], Any]]) -> ConfigFile:
    """Read and check a TOML config file against the schema.

    :param top_parsers: the top-level options' parsers (``cachemgr.config.options.OPTIONS``); each
        raises ``ValueError("accepted: …")`` for a bad value.
    :raises ConfigError: unreadable file, TOML syntax error (with its line), an unknown table
        or key, a wrong type or an out-of-range value — one line naming file, line, key, value
        and what is accepted.
    """
    import tomllib  # only with a config file (a CLI hit without one never loads it)

    try:
        # never blocks on a FIFO, never reads /dev/zero or a sparse giant for ever
        raw = safeio.read_regular(path, MAX_CONFIG_BYTES, follow=True)
        parsedfiles.note(str(path), raw)  # what a direct memo binds its hit to
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path}: not UTF-8 text (byte {exc.start})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc
    lines = _lines(text)
    top = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    aliases = _take_aliases(path, top, tables, lines)
    for key, value in top.items():
        parse = top_parsers.get(key)
        if parse is None:
            known = ", ".join(sorted(top_parsers))
            raise _fail(path, lines.get(("", key)), f"unknown option {key!r} (accepted: {known})")
        try:
            parse(value)
        except ValueError as exc:
            where = aliases.get(key, ("", key))
            shown = ".".join(p for p in where if p)
            raise _fail(path, lines.get(where), f"{shown} = {value!r} is invalid; {exc}") from None
    models: dict[str, Any] = {}
    for name, table in tables.items():
        cls = TABLES.get(name)
        if cls is None:
            raise _fail(
                path,
                lines.get((name, "")),
                f"unknown table [{name}] (accepted: {', '.join(f'[{t}]' for t in TABLES)})",
            )
        models[name] = _build_at(cls, name, table, path, lines)
    for name, cls in TABLES.items():
        models.setdefault(name, cls())
    return ConfigFile(path, top, tables, models, lines, aliases)


def _take_aliases(
    path: Path,
    top: dict[str, Any],
    tables: dict[str, Any],
    lines: Mapping[tuple[str, str], int],
) -> dict[str, tuple[str, str]]:
    """Move the values set by their GE names (:data:`GE_ALIASES`) to the plain option in
    ``top`` (both changed in place); returns option → ``(table, key)`` as written.

    :raises ConfigError: an unknown ``ge.`` key, or a GE name and the plain one (or the
        two GE spellings) both set to different values — naming both lines.
    """
    given: list[tuple[tuple[str, str], Any]] = []
    for key in [k for k in top if k.startswith(GE_TABLE + ".")]:
        given.append((("", key), top.pop(key)))
    for key, value in (tables.pop(GE_TABLE, None) or {}).items():
        given.append(((GE_TABLE, key), value))
    aliases: dict[str, tuple[str, str]] = {}
    for where, value in given:
        spelled = ".".join(p for p in where if p)
        name = GE_ALIASES.get(spelled)
        if name is None:
            accepted = ", ".join(GE_ALIASES)
            raise _fail(
                path, lines.get(where), f"unknown GE option {spelled!r} (accepted: {accepted})"
            )
        if name in top and top[name] != value:
            first = aliases.get(name, ("", name))
            at = lines.get(first)
            raise _fail(
                path,
                lines.get(where),
                f"{spelled} = {value!r} and {'.'.join(p for p in first if p)} = {top[name]!r}"
                f"{f' (line {at})' if at else ''} set one setting to two values; keep one of them",
            )
        if name not in top:
            top[name] = value
            aliases[name] = where
    return aliases


def _build_at(
    cls: type, name: str, table: Mapping[str, Any], path: Path, lines: Mapping[tuple[str, str], int]
) -> Any:
    known = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in table.items():
        line = lines.get((name, key)) or lines.get((name, ""))
        f = known.get(key)
        if f is None:
            accepted = ", ".join(known)
            raise _fail(path, line, f"[{name}] unknown setting {key!r} (accepted: {accepted})")
        try:
            _checked(rule_of(f), value)
        except ValueError as exc:
            raise _fail(
                path, line, f"[{name}] {key} = {value!r} is invalid; accepted: {exc}"
            ) from None
    return build(cls, table, f"config {path} [{name}]")
