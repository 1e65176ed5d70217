"""``cachemgr stats`` measured in this process (the local route): the counters of the kernel
cache, each chip folder's fill against its limit, the other governed kernel caches'
folders, the limits in force and each governed mount's access-time rule
(docs/commands.md#what-stats-counts).

Click-free, so that the click command (:mod:`cachemgr.cli.gc_cmd`) and the console
script's fast path (:mod:`cachemgr.main`, :func:`answer`) print the same figures by
construction: both call :func:`measure` and :func:`complete`; every warning goes through the
``warn`` callable each is given (one message, without the ``cachemgr: warning:`` label).
:func:`chip_dirs` is also how the CLI's other commands (``ls``, ``verify``, ``purge``,
``pack``) pick their chip folders (``cachemgr.cli.common.chip_dirs`` calls it with click's
warning line).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cachemgr.compile.results import ChipStats, StatsResult
from cachemgr.config import options
from cachemgr.storage import atimes
from cachemgr.storage.counters import COUNTER_NAMES, CacheCounters, summed

if TYPE_CHECKING:
    from cachemgr.config.options import Settings

#: Says one warning (the message without its label).
Warn = Callable[[str], None]


def chip_dirs(settings: Settings, warn: Warn) -> list[Path]:
    """The chip folders to act on: the one of ``--soc`` (warned about when it is not a
    folder) or every existing one (warned about when the kernel cache is missing)."""
    soc = settings.value("soc_version")
    if soc:
        chip = settings.layout.chip_dir(soc)
        if not chip.is_dir():
            warn(f"no chip folder {soc} at {chip} (from --soc); nothing there")
        return [chip]
    warn_if_no_kernel_cache(settings, warn)
    return settings.layout.chip_dirs()


def warn_if_no_kernel_cache(settings: Settings, warn: Warn) -> None:
    """One warning when the resolved kernel cache folder does not exist (a mistyped
    ``--cache-dir`` must not look like a clean cache), naming where the path came from."""
    kcache = settings.layout.kernel_cache_dir
    if not kcache.is_dir():
        origin = settings["kernel_cache_dir"]
        warn(f"no kernel cache at {kcache} (from {origin.origin} {origin.source}) yet")


def measure(settings: Settings, warn: Warn) -> StatsResult:
    """The counters (summed and per chip folder) and each chip folder's figures, read here.

    :raises OSError: the counters cannot be read (a chip folder that cannot be listed is
        a row with its ``error`` instead).
    """
    counters = CacheCounters(settings.layout.kernel_cache_dir)
    per_chip = counters.per_chip()
    rows = {
        name: dataclasses.replace(row, counters=per_chip.get(name, dict.fromkeys(COUNTER_NAMES, 0)))
        for name, row in _chip_rows(settings, warn).items()
    }
    return StatsResult(summed(per_chip), rows)


def complete(
    data: StatsResult, via: str, route: dict[str, Any], settings: Settings, warn: Warn
) -> StatsResult:
    """``data`` (this process's or a daemon's) with what the CLI adds: the route, the other
    governed kernel caches' folders (docs/design.md#where-the-cache-lives), the kernel cache,
    the limits and the access-time rule of each governed mount
    (docs/interop.md#ges-eviction-and-access-times)."""
    return dataclasses.replace(
        data,
        via=via,
        route=route,
        other_kernel_caches=_other_stats(settings, warn),
        kernel_cache_dir=str(settings.layout.kernel_cache_dir),
        limits=settings.limits_json(),
        filesystems=[a.to_json() for a in governed_atimes(settings)],
    )


def governed_atimes(settings: Settings) -> list[atimes.CacheAtimes]:
    """The access-time rule of each governed kernel cache's mount, this one first."""
    caches = [settings.layout.kernel_cache_dir, *settings.other_kernel_caches()]
    return atimes.governed_atimes(caches)


def _chip_rows(settings: Settings, warn: Warn) -> dict[str, ChipStats]:
    """Each chip folder's figures by soc (:func:`cachemgr.eviction.usage.chip_row`)."""
    chips = chip_dirs(settings, warn)
    if not chips:  # nothing to count: the eviction modules are not needed
        return {}
    from cachemgr.eviction.usage import chip_row

    return {chip.name: ChipStats.from_json(chip_row(chip, settings)) for chip in chips}


def _other_stats(settings: Settings, warn: Warn) -> dict[str, dict[str, ChipStats]]:
    """Per chip folder figures of the other governed kernel caches, by path."""
    out = {}
    for kc in settings.other_kernel_caches():
        other = options.settings_for(settings, kc, os.environ)
        out[str(kc)] = _chip_rows(other, warn)
    return out


def answer(given: dict[str, Any], out: list[tuple[bool, str]]) -> int | None:
    """``cachemgr stats`` with the settings options ``given`` (``--cache-dir``, ``--host-id``,
    ``--soc``, ``--config``, ``--json``) on the local route, as the click command prints it:
    each line appended to ``out`` (``(to_stderr, text)``, in the order the click command
    writes them), and the exit code; None (nothing to print, the click command answers)
    when a daemon may serve this cache (``$CACHEMGR_SOCKET`` set, or a file at the default
    socket): the click command then asks it.

    :raises Exception: any error of the settings or the figures: click then answers.
    """
    from cachemgr import sockpath, stats_view
    from cachemgr.console import json_text, warning_line

    if os.environ.get("CACHEMGR_SOCKET"):
        return None
    socket = Path(sockpath.default_socket(os.environ))  # as the client spells it
    if os.path.lexists(socket):
        return None
    cli = {k: given.get(k) for k in ("op_compiler_cache_dir", "host_id", "soc_version")}
    settings = options.resolve(cli=cli, config_file=given.get("config_file"), writable=False)

    def warn(message: str) -> None:
        out.append((True, warning_line(message)))

    for problem in settings.problems:
        warn(problem)
    # what cli.common.route gives for no file at the default socket (the tests compare)
    reason = f"no daemon answers at the default socket {socket}"
    route = {"via": "local", "socket": None, "reason": reason}
    data = complete(measure(settings, warn), "local", route, settings, warn)
    if given.get("as_json"):
        out.append((False, json_text(data.to_json())))
    else:
        out += [(False, line) for line in stats_view.render(stats_view.lines(data))]
    return 0
