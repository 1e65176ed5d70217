"""``cachemgr stats`` (at a glance, on the local route) answered on the standard library's
``os`` alone, for the console script's start-up fast path (:mod:`cachemgr.main`): the same
report as :mod:`cachemgr.localstats` (what the click command calls), by the same rules —
each taken from the os-only module that both paths use: the cache folder's order, GE's
limits and the env variables' reading (:mod:`cachemgr.config.core`), the counters' files
(:mod:`cachemgr.storage.counterfiles`, read as :mod:`cachemgr.direct` reads them), a chip
folder's count (:mod:`cachemgr.storage.chipcount`), the mount's access-time rule
(:mod:`cachemgr.storage.mountrule`), ``op_cache.ini``'s limits in GE's plain form
(:mod:`cachemgr.quickini`, shared with the lean ``config``) and the report's words
(:mod:`cachemgr.stats_view`).

It answers only the case it can answer exactly and *declines* (:func:`answer` returns None,
having written nothing) for everything else, which the full path then answers with its
words: any option but ``--cache-dir``; a daemon that may serve the cache; a config file;
``ASCEND_CACHE_PATH`` (host folders, other governed caches); an ``op_cache.ini`` not in the
plain form GE writes (:func:`cachemgr.config.core.plain_ge_ini`; the strict reader,
:mod:`cachemgr.config.ini`, words the rest); any warning the settings or the figures would
print; any file or folder that is not plainly what it should be.
"""

from __future__ import annotations

import os

from cachemgr import direct, quickini, sockpath, stats_view
from cachemgr.config import core
from cachemgr.constants import NEVER_EVICT
from cachemgr.quickini import Declined
from cachemgr.storage import chipcount, counterfiles, mountrule

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: typing costs start-up
    from collections.abc import Mapping
    from typing import Any

#: Variables of the settings that the full resolution reads, parses and may refuse
#: (``options.OPTIONS``' env names, the config file's, the daemon's socket): set, the full
#: path answers.
_DECLINED_ENV = (
    "CACHEMGR_SOCKET",
    "CACHEMGR_CONFIG",
    "CACHEMGR_HOST_ID",
    "ACL_OP_COMPILER_CACHE_MODE",
    "ASCEND_CACHE_PATH",
)


class _Row:
    """One chip folder's figures, with the names :mod:`cachemgr.stats_view` reads of a
    ``ChipStats``."""

    error = None

    def __init__(self, entries: int, used: int, max_mb: int, times: tuple[Any, Any]) -> None:
        self.entries, self.bytes = entries, used
        self.limit_bytes = core.max_bytes(max_mb)
        self.fill_pct = (
            None if self.limit_bytes is None else round(100 * used / self.limit_bytes, 1)
        )
        self.oldest_access, self.newest_access = chipcount.iso(times[0]), chipcount.iso(times[1])


class _Stats:
    """The figures of one report, with the names :mod:`cachemgr.stats_view` reads of a
    ``StatsResult`` (local route: no daemon figures, no other governed caches)."""

    via = "local"
    daemon: dict[str, Any] = {}  # noqa: RUF012 (read only)
    other_kernel_caches: dict[str, Any] = {}  # noqa: RUF012 (read only)

    def __init__(self, kcache: str, counters: dict[str, int], limits: dict[str, Any]) -> None:
        self.kernel_cache_dir, self.counters, self.limits = kcache, counters, limits
        self.hits, self.misses = counters.get("hits", 0), counters.get("misses", 0)
        self.chip_folders: dict[str, _Row] = {}
        self.filesystems: list[dict[str, str]] = []


def answer(args: list[str], env: Mapping[str, str]) -> list[str] | None:
    """The lines ``cachemgr stats ARGS`` prints on stdout (exit code 0, nothing on stderr),
    or None when this module does not answer exactly (the full path then does).

    :raises Exception: never on purpose: the caller treats any error as a decline.
    """
    try:
        return _answer(args, env)
    except Declined:
        return None


def _answer(args: list[str], env: Mapping[str, str]) -> list[str]:
    option = _cache_dir_option(args)
    if any(name in env for name in _DECLINED_ENV) or os.path.lexists(sockpath.default_socket(env)):
        raise Declined("settings or a daemon the full path reads")
    kcache = _kernel_cache(option, env)
    if not os.path.isdir(kcache):
        raise Declined("no kernel cache: a warning")
    (max_mb, max_origin, max_source), ratio, warnings = quickini.limits(kcache, env)
    if warnings or _kernel_meta_refused(env):
        raise Declined("a warning or a refusal of the settings")
    limits = {
        "max_op_cache_size": {"value": max_mb, "origin": max_origin, "source": max_source},
        "remain_cache_size_ratio": {"value": ratio[0], "origin": ratio[1], "source": ratio[2]},
        "never_evict": max_mb == NEVER_EVICT,
    }
    stats = _Stats(kcache, _counters(kcache), limits)
    for soc in _chip_names(kcache):
        stats.chip_folders[soc] = _chip_row(os.path.join(kcache, soc), max_mb)
    stats.filesystems.append({"line": _filesystem_line(kcache)})
    return stats_view.render(stats_view.lines(stats))  # type: ignore[arg-type]


def _cache_dir_option(args: list[str]) -> str:
    """The ``--cache-dir`` value of ``args`` ("" without one), as click would take it."""
    if not args:
        return ""
    if len(args) == 1 and args[0].startswith("--cache-dir="):
        value = args[0][len("--cache-dir=") :]
    elif len(args) == 2 and args[0] == "--cache-dir":
        value = args[1]
    else:
        raise Declined("options of the full path")
    if not value or value.startswith("-"):
        raise Declined("a value click words")
    return value


def _kernel_cache(option: str, env: Mapping[str, str]) -> str:
    """The kernel cache folder (:func:`cachemgr.config.core.cache_folder_choice`), its root
    checked as ``options.resolve(writable=False)`` checks it."""
    kind, raw, _origin, _source, _over = core.cache_folder_choice(option, "option", "", env)
    if kind not in ("op_compiler_cache_dir", core.ACL_CACHE_DIR, "HOME"):
        raise Declined("another kind of cache folder")
    if not core.path_value_ok(raw):
        raise Declined("a refused path value")
    root = os.path.abspath(raw)
    if kind == "HOME":
        _check_folder(os.path.join(root, "atc_data"))
        return os.path.join(root, "atc_data", core.KERNEL_CACHE)
    _check_folder(root)
    return os.path.join(root, core.KERNEL_CACHE)


def _check_folder(path: str) -> None:
    """``layout.check_folder``'s test, passed: the first existing ancestor of ``path`` is a
    folder on storage (a pseudo filesystem has no blocks: the full path words it)."""
    cur = path
    while not os.path.lexists(cur) and os.path.dirname(cur) != cur:
        cur = os.path.dirname(cur)
    if not os.path.isdir(cur) or not os.statvfs(cur).f_blocks:
        raise Declined("a root the full path refuses")


def _kernel_meta_refused(env: Mapping[str, str]) -> bool:
    """True when the full resolution would refuse the kernel_meta base
    (``ASCEND_WORK_PATH``'s characters, or no current folder)."""
    work = env.get("ASCEND_WORK_PATH")
    if work and not core.path_value_ok(work):
        return True
    try:
        os.getcwd()
    except OSError:
        return True
    return False


def _counters(kcache: str) -> dict[str, int]:
    """Every counter summed over the kernel cache's stats files, in ``stats``' order."""
    total: dict[str, int] = {}
    for name in sorted(os.listdir(kcache)):
        if counterfiles.soc_of(name) is None:
            continue
        try:
            counts = direct.read_stats(os.path.join(kcache, name))
        except direct.Decline as exc:  # the full path warns about this file
            raise Declined(str(exc)) from None
        for key, value in counterfiles.full(counts).items():
            total[key] = total.get(key, 0) + value
    return counterfiles.full(total)


def _chip_names(kcache: str) -> list[str]:
    """The chip folders' names, sorted, listed through ``kernel_cache`` opened without
    following a link (as ``layout.CacheLayout.chip_dirs``)."""
    fd = os.open(os.path.dirname(kcache), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        below = os.open(core.KERNEL_CACHE, flags, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        with os.scandir(below) as it:
            return sorted(
                e.name for e in it if core.chip_name_ok(e.name) and e.is_dir(follow_symlinks=False)
            )
    finally:
        os.close(below)


def _chip_row(chip: str, max_mb: int) -> _Row:
    """One chip folder's figures, counted as ``eviction.usage.chip_stats`` counts them."""
    try:
        fd = direct.open_chip(chip)
    except direct.Decline as exc:
        raise Declined(str(exc)) from None
    try:
        entries, used, oldest, newest = chipcount.usage_stream(fd)
    finally:
        os.close(fd)
    return _Row(entries, used, max_mb, (oldest, newest))


def _filesystem_line(kcache: str) -> str:
    """The ``Filesystem`` line of the kernel cache's mount (``storage.atimes``' words)."""
    text = mountrule.mountinfo_text()
    _point, fstype, rule, lazytime = mountrule.folder_rule(kcache, text)
    return mountrule.line(os.path.basename(kcache), fstype, rule, lazytime)
