"""Options and where each value came from (layer 1; docs/design.md#options-and-their-origins,
#where-the-cache-lives, #size-limits-and-eviction).

One table (:data:`OPTIONS`) names every option, its type, default, unit and env var. One
loader per source (command line / config file, ``op_cache.ini``, environment, default) feeds
:func:`resolve`, which returns a frozen :class:`Settings` in which every value carries its
origin — what ``cachemgr config`` prints, as ``ccache -p`` does.

Origins are ``option`` (command line or config file), ``op_cache.ini``, ``env`` and
``default``. A bad option value raises :class:`~cachemgr.errors.ConfigError`; where CANN falls
back silently (env limits, an invalid ``op_cache.ini``) the fallback is used and a one-line
warning is recorded in ``Settings.problems``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cachemgr.config import core, layout, socs
from cachemgr.config.ini import OpCacheIni, UnreadableIniError
from cachemgr.constants import NEVER_EVICT, short_host
from cachemgr.errors import ConfigError

if TYPE_CHECKING:  # the schema's module is imported where a config file is read or asked for
    from cachemgr.config import configfile

ORIGIN_OPTION = "option"
ORIGIN_INI = core.INI_NAME
ORIGIN_ENV = "env"
ORIGIN_DEFAULT = "default"

#: torch_npu's (and ACL's) names for the two cache settings: CANN's environment-variable
#: reference and torch_npu's (docs/configuration.md#every-frameworks-name).
ACL_CACHE_DIR = core.ACL_CACHE_DIR
ACL_CACHE_MODE = "ACL_OP_COMPILER_CACHE_MODE"

#: docs/design.md#size-limits-and-eviction / seed: default limit 500 MB (MiB) and remain ratio 50 %.
DEFAULT_MAX_MB = core.DEFAULT_MAX_MB
DEFAULT_RATIO = core.DEFAULT_RATIO
#: GE's MIN_CACHE_AGING_TIME: an entry accessed this recently is never evicted (seconds).
DEFAULT_MIN_AGE_S = core.DEFAULT_MIN_AGE_S
#: Access times up to this far ahead of our clock are trusted (seconds).
DEFAULT_CLOCK_SKEW_S = 300

CACHE_MODES = ("enable", "disable", "force")
JIT_VALUES = {
    "auto": "auto", "2": "auto",
    "true": "true", "1": "true", "enable": "true",
    "false": "false", "0": "false", "disable": "false",
}  # fmt: skip


def _parse_mode(raw: Any) -> str:
    value = str(raw).strip().lower()
    if value not in CACHE_MODES:
        raise ValueError("accepted: enable, disable, force")
    return value


def _parse_jit(raw: Any) -> str:
    value = str(raw).strip().lower() if not isinstance(raw, bool) else str(raw).lower()
    if value not in JIT_VALUES:
        raise ValueError("accepted: auto, true, false (or 2, 1, 0; enable, disable)")
    return JIT_VALUES[value]


def _parse_int_range(lo: int, hi: int) -> Callable[[Any], int]:
    def parse(raw: Any) -> int:
        try:
            value = int(str(raw).strip()) if not isinstance(raw, bool) else None
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            raise ValueError(f"accepted: an integer {lo}..{hi}")
        return value

    return parse


def _parse_text(raw: Any) -> str:
    return str(raw)


def _parse_seconds(raw: Any) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if value < 0:
        raise ValueError("accepted: a number of seconds ≥ 0")
    return value


@dataclass(frozen=True)
class OptionSpec:
    """One row of the option table: name, parser, default, unit, env var, doc."""

    name: str
    parse: Callable[[Any], Any]
    default: Any
    unit: str = ""
    env: str | None = None
    doc: str = ""


#: Resolved values that are paths (``Path`` objects; strings in JSON).
PATH_VALUES = frozenset(
    {
        "op_compiler_cache_dir",
        "kernel_cache_dir",
        "ini_path",
        "kernel_meta_dir",
        "op_debug_config",
        "debug_dir",
    }
)

#: Every user-settable option; the rules each follows: docs/design.md#options-and-their-origins.
#: Derived values (kernel_cache_dir, ini_path, limits, kernel_meta_dir) are computed in
#: :func:`resolve` from these and their sources.
OPTIONS: tuple[OptionSpec, ...] = (
    # torch_npu's variable (docs/configuration.md#every-frameworks-name): an option given in
    # the code (here: the command line or the config file) comes first, as torch_npu says
    OptionSpec(
        "op_compiler_cache_mode",
        _parse_mode,
        "enable",
        env=ACL_CACHE_MODE,
        doc="enable, disable or force",
    ),
    OptionSpec(
        "op_compiler_cache_dir",
        _parse_text,
        None,
        "path",
        doc="the cache root, before ASCEND_CACHE_PATH",
    ),
    OptionSpec(
        "host_id",
        _parse_text,
        None,
        env="CACHEMGR_HOST_ID",
        doc="kernel_cache_<id> under ASCEND_CACHE_PATH",
    ),
    OptionSpec("soc_version", _parse_text, None, doc="chip folder to act on; all when unset"),
    OptionSpec("jit_compile", _parse_jit, "auto", doc="auto, true or false"),
    OptionSpec(
        "op_debug_level", _parse_int_range(0, 4), 0, doc="0..4; non-zero bypasses the cache"
    ),
    OptionSpec("op_debug_config", _parse_text, "", "path", doc="a debug .cfg file"),
    OptionSpec("debug_dir", _parse_text, None, "path", doc="kernel_meta base"),
    OptionSpec("min_age_s", _parse_seconds, float(DEFAULT_MIN_AGE_S), "s", doc="aging guard"),
    OptionSpec(
        "clock_skew_s",
        _parse_seconds,
        float(DEFAULT_CLOCK_SKEW_S),
        "s",
        doc="access times further in the future are suspect (clock skew)",
    ),
)
_SPECS = {spec.name: spec for spec in OPTIONS}


@dataclass(frozen=True)
class Resolved:
    """A value and where it came from: ``origin`` is one of the four origins, ``source`` the
    detail (``--cache-dir``, ``ASCEND_CACHE_PATH``, an ini's path, ...)."""

    value: Any
    origin: str
    source: str = ""
    #: the other names that also gave this setting a value and lost to ``source`` by the
    #: framework's documented priority, one ``NAME=value (why)`` each
    passed_over: tuple[str, ...] = ()


@dataclass(frozen=True)
class CacheLimits:
    """The limits in force for one kernel cache, built once per :class:`Settings`
    (docs/design.md#size-limits-and-eviction, GE's ``te_cache_space_manager.cc``):
    ``max_op_cache_size`` in MB (MiB) per chip folder,
    ``-1`` = never evict; the remain ratio in %; the aging guard in seconds. Every reader
    (``stats``, ``gc``, ``/metrics``, ``--json``) says "never evict" the same way:
    :attr:`never_evict` true and :attr:`max_bytes` None."""

    max_op_cache_size: int
    remain_cache_size_ratio: int
    min_age_s: float

    @property
    def never_evict(self) -> bool:
        """``max_op_cache_size = -1``: size eviction is off."""
        return self.max_op_cache_size == NEVER_EVICT

    @property
    def max_bytes(self) -> int | None:
        """The limit in bytes, None when eviction is off."""
        return core.max_bytes(self.max_op_cache_size)

    @property
    def target_bytes(self) -> int | None:
        """What an eviction leaves (ratio % of the limit) in bytes, None when it is off."""
        top = self.max_bytes
        return None if top is None else top * self.remain_cache_size_ratio // 100

    def to_json(self) -> dict[str, Any]:
        """The limits as JSON: the three values, ``never_evict`` and the byte figures."""
        return {
            "max_op_cache_size": self.max_op_cache_size,
            "remain_cache_size_ratio": self.remain_cache_size_ratio,
            "min_age_s": self.min_age_s,
            "never_evict": self.never_evict,
            "max_bytes": self.max_bytes,
            "target_bytes": self.target_bytes,
        }


@dataclass(frozen=True)
class Settings:
    """The resolved configuration: ``values[name]`` → :class:`Resolved`; ``problems`` are
    one-line warnings about values that fell back (docs/design.md#options-and-their-origins);
    ``sections`` are the config file's tables (``[compilers]``, ``[daemon]``, ...) for the layers
    that own them."""

    values: Mapping[str, Resolved]
    problems: tuple[str, ...] = ()
    sections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: the checked config file, None when there is none (:attr:`config` then gives the
    #: defaults)
    checked_config: configfile.ConfigFile | None = None

    def __getitem__(self, name: str) -> Resolved:
        return self.values[name]

    @cached_property
    def config(self) -> configfile.ConfigFile:
        """The checked config file: every table typed, with defaults. Without a config file
        the defaults are made on first use: a command that never asks (``stats``) does not
        import the schema's module (start-up, docs/performance.md)."""
        if self.checked_config is not None:
            return self.checked_config
        from cachemgr.config import configfile

        return configfile.empty()

    def value(self, name: str) -> Any:
        """The value of ``name`` (raises ``KeyError`` for an unknown name)."""
        return self.values[name].value

    def config_rows(self) -> dict[str, dict[str, Any]]:
        """Every key of every table of :attr:`config` (``ConfigFile.rows``); without a config
        file the stored defaults (:mod:`cachemgr.config.defaultrows`, which a test keeps
        equal to the live rows), so ``config`` does not import the schema's module."""
        if self.checked_config is None:
            from cachemgr.config.defaultrows import TABLE_ROWS

            return {name: dict(row) for name, row in TABLE_ROWS.items()}
        return self.config.rows()

    @cached_property
    def limits(self) -> CacheLimits:
        """The limits of this kernel cache, as one value (built once)."""
        return CacheLimits(
            int(self.value("max_op_cache_size")),
            int(self.value("remain_cache_size_ratio")),
            float(self.value("min_age_s")),
        )

    def limits_json(self) -> dict[str, Any]:
        """The limits in force with their origins (``max_op_cache_size`` in MiB,
        ``remain_cache_size_ratio`` in per cent, ``min_age_s`` in seconds: each ``{value,
        origin, source}``), ``never_evict``, ``max_bytes`` (bytes, None when eviction is off)
        and the problems that made any fall back (docs/design.md#size-limits-and-eviction)."""
        out: dict[str, Any] = {}
        for name in ("max_op_cache_size", "remain_cache_size_ratio", "min_age_s"):
            res = self[name]
            out[name] = {"value": res.value, "origin": res.origin, "source": res.source}
        out["never_evict"] = self.limits.never_evict
        out["max_bytes"] = self.limits.max_bytes
        out["problems"] = list(self.problems)
        return out

    @property
    def layout(self) -> layout.CacheLayout:
        """The cache layout these settings point at."""
        return layout.CacheLayout(Path(self.value("kernel_cache_dir")))

    def other_kernel_caches(self) -> list[Path]:
        """The governed kernel cache folders besides :attr:`layout`'s
        (docs/design.md#where-the-cache-lives: every
        ``kernel_cache*`` under ``${ASCEND_CACHE_PATH}``); empty in other set-ups."""
        res = self.values.get("governed_kernel_caches")
        caches = [Path(p) for p in (res.value if res is not None else [])]
        return [p for p in caches if p != Path(self.value("kernel_cache_dir"))]

    @classmethod
    def from_json(
        cls, data: Mapping[str, Mapping[str, Any]], sections: Mapping[str, Any] | None = None
    ) -> Settings:
        """Rebuild settings from :meth:`to_json` output (a client mirroring a daemon's)."""
        values = {}
        for name, item in data.items():
            value = item.get("value")
            if name in PATH_VALUES and value:
                value = Path(value)
            values[name] = Resolved(
                value,
                item.get("origin", ORIGIN_DEFAULT),
                item.get("source", ""),
                tuple(item.get("passed_over", ())),
            )
        return cls(values=values, sections=dict(sections or {}))

    def to_json(self) -> dict[str, dict[str, Any]]:
        """``{name: {"value": …, "origin": …, "source": …}}`` with paths as strings, and
        ``"passed_over": [...]`` where other names set it too and lost."""
        out: dict[str, dict[str, Any]] = {}
        for name, res in self.values.items():
            value = str(res.value) if isinstance(res.value, Path) else res.value
            out[name] = {"value": value, "origin": res.origin, "source": res.source}
            if res.passed_over:
                out[name]["passed_over"] = list(res.passed_over)
        return out


def _file_parser(spec: OptionSpec) -> Callable[[Any], Any]:
    """``spec.parse`` for a config file's value: a text option takes a TOML string only."""
    if spec.parse is not _parse_text:
        return spec.parse

    def parse(raw: Any) -> Any:
        if not isinstance(raw, str):
            raise ValueError("accepted: a string")
        return raw

    return parse


#: The top-level options' parsers for the config file's schema.
TOP_PARSERS = {spec.name: _file_parser(spec) for spec in OPTIONS}


def load_config_file(path: Path) -> configfile.ConfigFile:
    """Read a TOML config file and check it whole against the schema (``configfile``).

    :raises ConfigError: unreadable file, TOML syntax error, unknown table or key, a wrong
        type or range — naming file, line, key, value and what is accepted.
    """
    from cachemgr.config import configfile

    return configfile.load(path, TOP_PARSERS)


#: How the CLI spells the options whose flag differs from ``--<name>``.
CLI_FLAGS = {"op_compiler_cache_dir": "--cache-dir", "soc_version": "--soc"}


def _from_options(
    cli: Mapping[str, Any], config: configfile.ConfigFile | None
) -> dict[str, Resolved]:
    found: dict[str, Resolved] = {}
    if config is not None:
        for name, raw in config.top.items():
            alias = config.aliases.get(name)
            where = config.where(*alias) if alias else config.where("", name)
            source = f"{where} as {'.'.join(p for p in alias if p)}" if alias else where
            found[name] = Resolved(raw, ORIGIN_OPTION, source)
    for name, raw in cli.items():
        if raw is not None:
            if name not in _SPECS:
                raise ConfigError(f"unknown option {name!r}")
            flag = CLI_FLAGS.get(name, f"--{name.replace('_', '-')}")
            found[name] = Resolved(raw, ORIGIN_OPTION, flag)
    return found


def _parse_all(explicit: Mapping[str, Resolved], env: Mapping[str, str]) -> dict[str, Resolved]:
    out: dict[str, Resolved] = {}
    for spec in OPTIONS:
        res = explicit.get(spec.name)
        over: tuple[str, ...] = ()
        if res is not None and spec.env and spec.env in env:
            over = (f"{spec.env}={env[spec.env]} (an option given to the job comes first)",)
        if res is None and spec.env and spec.env in env:
            res = Resolved(env[spec.env], ORIGIN_ENV, spec.env)
        if res is None:
            out[spec.name] = Resolved(spec.default, ORIGIN_DEFAULT)
            continue
        try:
            out[spec.name] = Resolved(spec.parse(res.value), res.origin, res.source, over)
        except ValueError as exc:
            raise ConfigError(
                f"{spec.name}={res.value!r} (from {res.origin} {res.source}) is invalid; {exc}"
            ) from exc
    return out


def _resolve_kernel_cache(
    vals: dict[str, Resolved], env: Mapping[str, str], writable: bool
) -> Resolved:
    """The kernel cache folder: the name that gives the root is chosen by
    :func:`cachemgr.config.core.cache_folder_choice` (docs/configuration.md#every-frameworks-name);
    the option and ``ACL_OP_COMPILER_CACHE_DIR`` give ``<dir>/kernel_cache`` (ACL hands the
    variable to GE as its cache dir, GE adds ``kernel_cache``); the names passed over are
    recorded on the result. The value is checked here (characters, a folder, writable)."""
    check = layout.check_root if writable else layout.check_reachable
    opt = vals["op_compiler_cache_dir"]
    option = str(opt.value) if opt.value else ""
    kind, raw, origin, source, over = core.cache_folder_choice(option, opt.origin, opt.source, env)
    if kind in ("op_compiler_cache_dir", ACL_CACHE_DIR):
        where = f"{origin} {source}"
        root = layout.validate_path_value(raw, kind, where)
        vals["op_compiler_cache_dir"] = Resolved(root, origin, source, over)
        check(root, kind, where)
        return Resolved(layout.kernel_cache_for_option(root), origin, source, over)
    if kind == "ASCEND_CACHE_PATH":
        root = layout.validate_path_value(raw, kind, "env")
        check(root, kind, "env")
        host = vals["host_id"]
        host_id = str(host.value)
        if host_id:
            layout.validate_name(host_id, "host_id", f"{host.origin} {host.source}".strip())
        return Resolved(layout.kernel_cache_for_env(root, host_id), origin, source)
    root = layout.validate_path_value(raw, "HOME", "env")
    check(root / "atc_data", source, origin)
    return Resolved(layout.kernel_cache_for_home(root), origin, source)


def kernel_cache_why(settings: Settings) -> str:
    """One line: which kernel cache folder was chosen and why
    (docs/design.md#where-the-cache-lives), for ``config``,
    ``ls`` and ``stats``: ``kernel cache <path>: <reason>`` (:func:`kernel_cache_reason`)."""
    return f"kernel cache {settings.value('kernel_cache_dir')}: {kernel_cache_reason(settings)}"


def kernel_cache_reason(settings: Settings) -> str:
    """Why the kernel cache folder is where it is (docs/design.md#where-the-cache-lives). GE builds
    its folder the same way for every source — ``<op_compiler_cache_dir or ASCEND_CACHE_PATH or
    $HOME/atc_data>/ kernel_cache/<soc>`` (``cache/te_cache_manager.cc``,
    ``TeCacheManager::SetCacheDirPath``) — while docs/design.md#where-the-cache-lives (the seed)
    gives ``ASCEND_CACHE_PATH`` a per-host
    ``kernel_cache_<host id>``; the reason says so whenever the two differ, and that GE's
    folder is governed too."""
    kc = settings["kernel_cache_dir"]
    if kc.source == "ASCEND_CACHE_PATH":
        root = Path(kc.value).parent
        host = settings["host_id"]
        if not host.value:
            return (
                f"ASCEND_CACHE_PATH={root}, plain {layout.KERNEL_CACHE} as host_id is empty "
                f"(from {host.origin}) — the folder GE uses"
            )
        return (
            f"ASCEND_CACHE_PATH={root} gives kernel_cache_<host id>, host_id {host.value!r} "
            f"(from {host.origin}: {host.source or 'set'}) — the per-host folder of CANN's "
            f'documentation; GE itself uses {root / layout.KERNEL_CACHE} (host_id = "" '
            "selects it) and governed too"
        )
    if kc.origin == ORIGIN_DEFAULT:
        return (
            f"neither op_compiler_cache_dir (--cache-dir), {ACL_CACHE_DIR} nor "
            "ASCEND_CACHE_PATH is set, so $HOME/atc_data/kernel_cache — the folder GE uses"
        )
    where = f"{kc.origin} {kc.source}".strip()
    name = ACL_CACHE_DIR if kc.source == ACL_CACHE_DIR else "op_compiler_cache_dir"
    over = "".join(f"; passed over: {p}" for p in kc.passed_over)
    return (
        f"{name}={Path(kc.value).parent} (from {where}) gives "
        f"<dir>/{layout.KERNEL_CACHE} — the folder GE uses for that option{over}"
    )


def _governed(kcache: Resolved, env: Mapping[str, str]) -> Resolved:
    """docs/design.md#where-the-cache-lives: with the cache under ``${ASCEND_CACHE_PATH}``, gc,
    stats and the daemon govern every kernel cache folder there (``kernel_cache``,
    ``kernel_cache_*``), the resolved one first; otherwise just the resolved one. Paths as
    strings."""
    caches = [str(kcache.value)]
    if kcache.source == "ASCEND_CACHE_PATH":
        root = Path(kcache.value).parent
        caches += [str(p) for p in layout.kernel_caches_under(root) if str(p) != caches[0]]
    return Resolved(caches, kcache.origin, kcache.source)


def settings_for(settings: Settings, kernel_cache_dir: Path, env: Mapping[str, str]) -> Settings:
    """``settings`` pointed at another governed kernel cache: its own ``op_cache.ini`` limits
    (docs/design.md#where-the-cache-lives, #size-limits-and-eviction), everything else the same.

    :raises ConfigError: its ini path is a folder, a symlink or unreadable.
    """
    kc = Path(kernel_cache_dir)
    ini_path = kc / layout.INI_NAME
    max_res, ratio_res, problems = _resolve_limits(ini_path, env)
    base = settings["kernel_cache_dir"]
    vals = dict(settings.values)
    vals["kernel_cache_dir"] = Resolved(kc, base.origin, base.source)
    vals["ini_path"] = Resolved(ini_path, base.origin, base.source)
    vals["max_op_cache_size"] = max_res
    vals["remain_cache_size_ratio"] = ratio_res
    return Settings(
        values=vals,
        problems=tuple(problems),
        sections=settings.sections,
        checked_config=settings.checked_config,
    )


def _resolve_limits(ini_path: Path, env: Mapping[str, str]) -> tuple[Resolved, Resolved, list[str]]:
    """docs/design.md#size-limits-and-eviction: op_cache.ini's limits as GE computes them
    (``ini.ge_reading``); else env; else 500 MB / 50 %. Doubtful ini lines are warnings either
    way."""
    problems: list[str] = []
    try:
        ini = OpCacheIni.load(ini_path)
    # another user's 0600 ini: as an invalid one (docs/security.md item 3)
    except UnreadableIniError as exc:
        problems.append(f"{exc}; limits come from env or defaults")
        ini = OpCacheIni(ini_path, None)
    limits = ini.limits()
    if limits is not None:
        src = str(ini_path)
        if ini.problems:
            problems.extend(ini.problems)
            problems.append(
                f"op_cache.ini {ini_path} is used as GE reads it: max_op_cache_size="
                f"{limits.max_op_cache_size}, remain_cache_size_ratio="
                f"{limits.remain_cache_size_ratio}"
            )
        return (
            Resolved(limits.max_op_cache_size, ORIGIN_INI, src),
            Resolved(limits.remain_cache_size_ratio, ORIGIN_INI, src),
            problems,
        )
    if ini.exists and ini.problems:
        problems.extend(ini.problems)
        problems.append(f"op_cache.ini {ini_path} is not used; limits come from env or defaults")
    max_lim, ratio_lim, warnings = core.env_limits(env)
    problems.extend(warnings)
    return Resolved(*max_lim), Resolved(*ratio_lim), problems


def _resolve_kernel_meta(vals: dict[str, Resolved], env: Mapping[str, str], cwd: Path) -> Resolved:
    """docs/design.md#debug-compiles-and-kernel_meta: base = debug_dir > ASCEND_WORK_PATH > current
    directory."""
    dbg = vals["debug_dir"]
    if dbg.value:
        base = layout.validate_path_value(str(dbg.value), "debug_dir", f"{dbg.origin} {dbg.source}")
        return Resolved(layout.kernel_meta_dir(base), dbg.origin, dbg.source)
    if env.get("ASCEND_WORK_PATH"):
        base = layout.validate_path_value(env["ASCEND_WORK_PATH"], "ASCEND_WORK_PATH", "env")
        return Resolved(layout.kernel_meta_dir(base), ORIGIN_ENV, "ASCEND_WORK_PATH")
    return Resolved(layout.kernel_meta_dir(cwd), ORIGIN_DEFAULT, "current directory")


def resolve(
    cli: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
    cwd: Path | None = None,
    writable: bool = True,
) -> Settings:
    """Resolve every option with its origin (docs/design.md#options-and-their-origins,
    #where-the-cache-lives, #size-limits-and-eviction, #debug-compiles-and-kernel_meta).

    :param cli: option values given on the command line (None = not given).
    :param env: the environment (defaults to ``os.environ``); ``CACHEMGR_CONFIG`` names a
        config file when ``config_file`` is None.
    :param writable: check that the cache root is (or can be created as) a writable folder;
        read-only commands pass False.
    :raises ConfigError: for an invalid option value or cache path, naming value and origin.
    """
    env = dict(os.environ if env is None else env)
    origin = "option --config"
    if config_file is None and env.get("CACHEMGR_CONFIG"):
        config_file, origin = Path(env["CACHEMGR_CONFIG"]), "env CACHEMGR_CONFIG"
    try:
        config = load_config_file(config_file) if config_file else None
    except ConfigError as exc:  # say where the file's name came from, as every option does
        raise ConfigError(f"{exc} (from {origin})") from exc
    vals = _parse_all(_from_options(cli or {}, config), env)
    if vals["host_id"].value is None:
        vals["host_id"] = Resolved(short_host(), ORIGIN_DEFAULT, "short host name")
    if vals["soc_version"].value:
        res = vals["soc_version"]
        layout.validate_name(str(res.value), "soc_version", f"{res.origin} {res.source}".strip())
    if vals["op_debug_config"].value:
        res = vals["op_debug_config"]
        where = f"{res.origin} {res.source}"
        path = layout.validate_path_value(str(res.value), "op_debug_config", where)
        vals["op_debug_config"] = Resolved(path, res.origin, res.source)
    kcache = _resolve_kernel_cache(vals, env, writable)
    if vals["soc_version"].value:  # a name CANN knows, or an existing chip folder
        res, chips = vals["soc_version"], layout.CacheLayout(Path(kcache.value)).chip_dirs()
        where = f"{res.origin} {res.source}".strip()
        socs.check_soc_version(str(res.value), where, [c.name for c in chips])
    ini_path = Path(kcache.value) / layout.INI_NAME
    max_res, ratio_res, problems = _resolve_limits(ini_path, env)
    vals["kernel_cache_dir"] = kcache
    vals["governed_kernel_caches"] = _governed(kcache, env)
    vals["ini_path"] = Resolved(ini_path, kcache.origin, kcache.source)
    vals["max_op_cache_size"] = max_res
    vals["remain_cache_size_ratio"] = ratio_res
    vals["kernel_meta_dir"] = _resolve_kernel_meta(vals, env, cwd or Path.cwd())
    return Settings(
        values=vals,
        problems=tuple(problems),
        sections=dict(config.tables) if config is not None else {},
        checked_config=config,
    )
