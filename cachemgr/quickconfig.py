"""``cachemgr config`` (text and ``--json``) answered on the standard library's ``os`` alone,
for the console script's start-up fast path (:mod:`cachemgr.main`): the same lines, warnings
and exit code as the full path (:func:`cachemgr.config.options.resolve` and
:func:`cachemgr.console.config_report`), by the same rules, each taken from the os-only
module both paths use — the cache folder's order, the path characters, GE's limits and the
env variables' reading (:mod:`cachemgr.config.core`), ``op_cache.ini`` in GE's plain form
(:func:`cachemgr.quickini.limits`, shared with the lean ``stats``), the report's order and
the lock wait's words (:mod:`cachemgr.config.reportorder`), the config file's stored default rows
(:mod:`cachemgr.config.defaultrows`), the chips CANN knows (:mod:`cachemgr.config.socs`),
the installed toolkit's versions, GE's way (:mod:`cachemgr.config.toolkit`),
the mount's access-time rule (:mod:`cachemgr.storage.mountrule`), the outsiders' line
(:mod:`cachemgr.storage.exposure`), the socket and the daemon's user
(:func:`cachemgr.sockpath.client_rows`) — and JSON written as :mod:`json` writes it
(:mod:`cachemgr.plainjson`).

It answers only what it can answer exactly and *declines* (:func:`answer` returns None,
having written nothing) for everything else, which the full path then answers with its
words: a config file (``--config``, ``$CACHEMGR_CONFIG``) or remote tiers (``--remote``,
``$CACHEMGR_REMOTE_STORAGE``); any value the full resolution refuses (a
path's characters, a bad ``host_id`` or ``soc_version``, a bad
``ACL_OP_COMPILER_CACHE_MODE``); a root that is not plainly a writable folder on storage
(a read-only one included); an ``op_cache.ini`` not in GE's plain form; a kernel cache
folder that is not plainly a folder. ``tests/test_startup.py`` compares both paths' bytes on
real setups, and pins :data:`TOP_OPTIONS` to ``options.OPTIONS``.
"""

from __future__ import annotations

import os

from cachemgr import plainjson, sockpath
from cachemgr.config import core, reportorder, socs, toolkit
from cachemgr.config.defaultrows import NO_REMOTE_ROW, TABLE_ROWS
from cachemgr.constants import short_host
from cachemgr.quickini import Declined, limits
from cachemgr.storage import exposure, mountrule

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: typing costs start-up
    from collections.abc import Mapping
    from typing import Any, TypeAlias

    #: One row: ``{"value", "origin", "source"}`` and, where other names lost,
    #: ``passed_over``.
    Row: TypeAlias = dict[str, Any]
    #: What ``config`` writes: ``(to_stderr, text)`` lines, in order, and the exit code.
    Answer: TypeAlias = tuple[list[tuple[bool, str]], int]

#: Every top-level option as ``options.OPTIONS`` lists it: ``(name, default, env var)``
#: (a test keeps them equal). Only the four below may take a value here.
TOP_OPTIONS: tuple[tuple[str, Any, str | None], ...] = (
    ("op_compiler_cache_mode", "enable", "ACL_OP_COMPILER_CACHE_MODE"),
    ("op_compiler_cache_dir", None, None),
    ("host_id", None, "CACHEMGR_HOST_ID"),
    ("soc_version", None, None),
    ("jit_compile", "auto", None),
    ("op_debug_level", 0, None),
    ("op_debug_config", "", None),
    ("debug_dir", None, None),
    ("min_age_s", float(core.DEFAULT_MIN_AGE_S), None),
    ("clock_skew_s", 300.0, None),
)
#: How the command line spells the options given here (``options.CLI_FLAGS``).
CLI_FLAGS = {
    "op_compiler_cache_dir": "--cache-dir",
    "host_id": "--host-id",
    "soc_version": "--soc",
}
#: ``options.CACHE_MODES``: ``ACL_OP_COMPILER_CACHE_MODE``'s values (case and blanks aside).
CACHE_MODES = ("enable", "disable", "force")
#: Variables that bring what only the full path reads: a config file, remote tiers.
DECLINED_ENV = ("CACHEMGR_CONFIG", "CACHEMGR_REMOTE_STORAGE")
#: A single path component (``layout.validate_name``): letters, digits, ``_ - .``.
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")


def answer(given: Mapping[str, Any], env: Mapping[str, str]) -> Answer | None:
    """What ``cachemgr config`` prints (``(to_stderr, text)`` lines, in order) and its exit
    code, for the options ``given`` (``main._parse_options``' values), or None when this
    module does not answer exactly (the full path then does).

    :raises Exception: never on purpose: the caller treats any error as a decline.
    """
    try:
        return _answer(given, env)
    except Declined:
        return None


def _answer(given: Mapping[str, Any], env: Mapping[str, str]) -> Answer:
    if given.get("config_file") or given.get("remotes") or any(v in env for v in DECLINED_ENV):
        raise Declined("a config file, remote tiers or a toolkit: the full path reads them")
    rows = _top_rows(given, env)
    kcache, governed = _kernel_cache(rows, env)
    if rows["soc_version"]["value"] is not None:
        _check_soc(str(rows["soc_version"]["value"]), kcache)
    (max_mb, max_origin, max_source), ratio, problems = limits(kcache, env)
    origin, source = rows["kernel_cache_dir"]["origin"], rows["kernel_cache_dir"]["source"]
    rows["governed_kernel_caches"] = _row(governed, origin, source)
    rows["ini_path"] = _row(os.path.join(kcache, core.INI_NAME), origin, source)
    rows["max_op_cache_size"] = _row(max_mb, max_origin, max_source)
    rows["remain_cache_size_ratio"] = _row(*ratio)
    rows["kernel_meta_dir"] = _kernel_meta(env)
    lines = [(True, _warning_line(p)) for p in problems]
    report = _report(rows, env, bool(given.get("as_json")))
    return lines + report, 2 if problems else 0


def _row(value: Any, origin: str, source: str = "", over: tuple[str, ...] = ()) -> Row:
    row: Row = {"value": value, "origin": origin, "source": source}
    if over:
        row["passed_over"] = list(over)
    return row


def _top_rows(given: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Row]:
    """The top-level options as ``options._parse_all`` gives them: the command line, then
    the env var, then the default; the default ``host_id`` is the short host name."""
    rows: dict[str, Row] = {}
    for name, default, var in TOP_OPTIONS:
        raw = given.get(name)
        over: tuple[str, ...] = ()
        if raw is not None:
            origin, source = "option", CLI_FLAGS[name]
            if var and var in env:
                over = (f"{var}={env[var]} (an option given to the job comes first)",)
        elif var and var in env:
            raw, origin, source = env[var], "env", var
        else:
            rows[name] = _row(default, "default")
            continue
        if name == "op_compiler_cache_mode":
            raw = str(raw).strip().lower()
            if raw not in CACHE_MODES:
                raise Declined("a bad cache mode: the full path words it")
        elif name not in CLI_FLAGS:
            raise Declined("an option this module does not parse")
        rows[name] = _row(str(raw), origin, source, over)
    if rows["host_id"]["value"] is None:
        rows["host_id"] = _row(short_host(), "default", "short host name")
    return rows


def _name_ok(value: str) -> bool:
    """``layout.validate_name``'s rule: ``[A-Za-z0-9_.-]+``, not ``.`` or ``..``."""
    return bool(value) and value not in (".", "..") and all(c in _NAME_CHARS for c in value)


def _root(raw: str) -> str:
    """``layout.validate_path_value``: the absolute path of an accepted value."""
    if not core.path_value_ok(raw):
        raise Declined("a refused path value")
    return os.path.abspath(raw)


def _check_root(path: str) -> None:
    """``layout.check_root``'s test, passed plainly: the first existing ancestor of ``path``
    is a folder on storage (a pseudo filesystem has no blocks) this user may write."""
    cur = path
    while not os.path.lexists(cur) and os.path.dirname(cur) != cur:
        cur = os.path.dirname(cur)
    if not os.path.isdir(cur) or not os.statvfs(cur).f_blocks:
        raise Declined("a root the full path refuses")
    if not os.access(cur, os.W_OK | os.X_OK):
        raise Declined("a root this user may not write (or a read-only one): the full path")


def _kernel_cache(rows: dict[str, Row], env: Mapping[str, str]) -> tuple[str, list[str]]:
    """The kernel cache folder and the governed ones (``options._resolve_kernel_cache``,
    ``options._governed``); sets the rows ``op_compiler_cache_dir`` (a root from the option
    or torch_npu's variable) and ``kernel_cache_dir``."""
    opt = rows["op_compiler_cache_dir"]
    option = str(opt["value"]) if opt["value"] else ""
    kind, raw, origin, source, over = core.cache_folder_choice(
        option, opt["origin"], opt["source"], env
    )
    root = _root(raw)
    governed: list[str] = []
    if kind in ("op_compiler_cache_dir", core.ACL_CACHE_DIR):
        rows["op_compiler_cache_dir"] = _row(root, origin, source, over)
        _check_root(root)
        kcache = os.path.join(root, core.KERNEL_CACHE)
    elif kind == "ASCEND_CACHE_PATH":
        _check_root(root)
        host = str(rows["host_id"]["value"])
        if host and not _name_ok(host):
            raise Declined("a host_id the full path refuses")
        name = f"{core.KERNEL_CACHE}_{host}" if host else core.KERNEL_CACHE
        kcache = os.path.join(root, name)
        governed = [p for p in _kernel_caches_under(root) if p != kcache]
    else:
        _check_root(os.path.join(root, "atc_data"))
        kcache = os.path.join(root, "atc_data", core.KERNEL_CACHE)
    rows["kernel_cache_dir"] = _row(kcache, origin, source, over)
    return kcache, [kcache, *governed]


def _kernel_caches_under(root: str) -> list[str]:
    """``layout.kernel_caches_under``: the real folders ``kernel_cache`` and
    ``kernel_cache_*`` (of a plain name) under ``root``, sorted."""
    try:
        with os.scandir(root) as it:
            found = [
                e.path
                for e in it
                if (e.name == core.KERNEL_CACHE or e.name.startswith(core.KERNEL_CACHE + "_"))
                and _name_ok(e.name)
                and e.is_dir(follow_symlinks=False)
            ]
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []
    return sorted(found)


def _check_soc(soc: str, kcache: str) -> None:
    """``soc_version`` as ``options.resolve`` checks it: a plain name (``validate_name``),
    and a chip CANN knows or an existing chip folder (``socs.check_soc_version``, after
    ``CacheLayout.chip_dirs`` listed the kernel cache without following a link)."""
    if not _name_ok(soc):
        raise Declined("a soc_version the full path refuses")
    chips = _chip_names(kcache)
    if soc not in socs.KNOWN_SOC_VERSIONS and soc not in chips:
        raise Declined("a chip CANN does not know: the full path words it")


def _chip_names(kcache: str) -> list[str]:
    """The chip folders' names, listed as ``CacheLayout.chip_dirs`` lists them (a missing
    folder has none); any other failure is the full path's to word."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    try:
        fd = os.open(os.path.dirname(kcache), flags)
        try:
            below = os.open(os.path.basename(kcache), flags | os.O_NOFOLLOW, dir_fd=fd)
        finally:
            os.close(fd)
        try:
            with os.scandir(below) as it:
                return [
                    e.name
                    for e in it
                    if core.chip_name_ok(e.name) and e.is_dir(follow_symlinks=False)
                ]
        finally:
            os.close(below)
    except FileNotFoundError:
        return []
    except OSError:
        raise Declined("a kernel cache folder the full path words") from None


def _kernel_meta(env: Mapping[str, str]) -> Row:
    """``options._resolve_kernel_meta`` without ``debug_dir`` (never set here):
    ``$ASCEND_WORK_PATH/kernel_meta``, else the current folder's."""
    work = env.get("ASCEND_WORK_PATH")
    if work:
        return _row(os.path.join(_root(work), "kernel_meta"), "env", "ASCEND_WORK_PATH")
    try:
        cwd = os.getcwd()
    except OSError:
        raise Declined("no current folder: the full path words it") from None
    return _row(os.path.join(cwd, "kernel_meta"), "default", "current directory")


def _reason(rows: dict[str, Row]) -> str:
    """``options.kernel_cache_reason``: why the kernel cache folder is where it is."""
    kc = rows["kernel_cache_dir"]
    if kc["source"] == "ASCEND_CACHE_PATH":
        root = os.path.dirname(kc["value"])
        host = rows["host_id"]
        if not host["value"]:
            return (
                f"ASCEND_CACHE_PATH={root}, plain {core.KERNEL_CACHE} as host_id is empty "
                f"(from {host['origin']}) — the folder GE uses"
            )
        return (
            f"ASCEND_CACHE_PATH={root} gives kernel_cache_<host id>, host_id {host['value']!r} "
            f"(from {host['origin']}: {host['source'] or 'set'}) — the per-host folder of "
            f"CANN's documentation; GE itself uses {os.path.join(root, core.KERNEL_CACHE)} "
            '(host_id = "" selects it) and governed too'
        )
    if kc["origin"] == "default":
        return (
            f"neither op_compiler_cache_dir (--cache-dir), {core.ACL_CACHE_DIR} nor "
            "ASCEND_CACHE_PATH is set, so $HOME/atc_data/kernel_cache — the folder GE uses"
        )
    where = f"{kc['origin']} {kc['source']}".strip()
    name = core.ACL_CACHE_DIR if kc["source"] == core.ACL_CACHE_DIR else "op_compiler_cache_dir"
    over = "".join(f"; passed over: {p}" for p in kc.get("passed_over", ()))
    return (
        f"{name}={os.path.dirname(kc['value'])} (from {where}) gives "
        f"<dir>/{core.KERNEL_CACHE} — the folder GE uses for that option{over}"
    )


def _filesystems(caches: list[str]) -> Row:
    """``console._filesystems_row``: each governed kernel cache's mount and access-time
    rule (``atimes.CacheAtimes.to_json``)."""
    text = mountrule.mountinfo_text()
    found = []
    for cache in caches:
        point, fstype, rule, lazytime = mountrule.folder_rule(cache, text)
        found.append(
            {
                "kernel_cache_dir": cache,
                "mount_point": point,
                "fstype": fstype,
                "atime": rule,
                "lazytime": lazytime,
                "ge_eviction": mountrule.GE_EFFECT[rule],
                "line": mountrule.line(os.path.basename(cache), fstype, rule, lazytime),
            }
        )
    return _row(found, "mount", mountrule.MOUNTINFO)


def _report(rows: dict[str, Row], env: Mapping[str, str], as_json: bool) -> list[tuple[bool, str]]:
    """``console.config_report``'s lines for these rows (no remote tiers, no config file).

    :raises Declined: a row's text would need escaping (``console.printable``)."""
    shown = reportorder.SHOWN
    names = [n for n in shown if n in rows] + sorted(set(rows) - set(shown))
    found = (toolkit.adk_version(env), toolkit.ops_version(env))
    for name, (value, source) in zip(reportorder.TOOLKIT_ROWS, found, strict=True):
        rows[name] = _row(value, "toolkit" if value else "unknown", source)
    rows[reportorder.REMOTE_ROW] = dict(NO_REMOTE_ROW)
    names += [*reportorder.TOOLKIT_ROWS, reportorder.REMOTE_ROW, sockpath.SOCKET_ROW]
    for name, row in TABLE_ROWS.items():
        rows[name] = dict(row)
        names.append(name)
    sockpath.client_rows(rows, env)
    rows[reportorder.FILESYSTEMS] = _filesystems(rows["governed_kernel_caches"]["value"])
    names.append(reportorder.FILESYSTEMS)
    rows["kernel_cache_dir"]["why"] = _reason(rows)
    notes = {reportorder.LOCK_WAIT: reportorder.explain_lock_wait(rows.get(reportorder.LOCK_WAIT))}
    exposed = exposure.outsiders_warning(rows["kernel_cache_dir"]["value"])
    if as_json:
        lines = [(False, plainjson.dumps({n: rows[n] for n in names}, 2, ensure_ascii=False))]
    else:
        why = f"kernel cache {rows['kernel_cache_dir']['value']}: {rows['kernel_cache_dir']['why']}"
        lines = [(False, why)]
        for name in names:
            lines += _text_lines(name, rows[name], notes.get(name, ""))
        if not all(text.isprintable() for _, text in lines[1:]):
            raise Declined("a value to escape (a newline in $CACHEMGR_SOCKET): the full path")
    if exposed:
        lines.append((True, exposed))
    return lines


def _text_lines(name: str, item: Row, note: str) -> list[tuple[bool, str]]:
    """One row as ``config_report`` prints it without ``--json``."""
    if name == reportorder.FILESYSTEMS:  # one line per governed kernel cache
        return [
            (False, f"({item['origin']}: {fs['mount_point'] or '-'}) filesystem = {fs['line']}")
            for fs in item["value"]
        ]
    origin = item["origin"] + (f": {item['source']}" if item["source"] else "")
    shown = _shown(item["value"]) + (f" ({note})" if note else "")
    lines = [(False, f"({origin}) {name} = {shown}")]
    lines += [(False, f"    passed over: {lost}") for lost in item.get("passed_over", ())]
    return lines


def _shown(value: Any) -> str:
    """``console._shown``: a value as the config file would spell it (lists and tables as
    JSON), unset empty."""
    if value is None:
        return ""
    if isinstance(value, list | dict):
        return plainjson.dumps(value)
    return str(value)


def _warning_line(message: str) -> str:
    """``console.warning_line`` of printable text (the caller declines any other)."""
    return f"cachemgr: warning: {message}"
