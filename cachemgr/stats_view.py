"""What ``cachemgr stats`` prints for a person, as ``ccache -s`` does: at a glance by default
(the cache folder, the hit rate split into local and remote hits, the misses a precompiled
binary answered, compiles, evictions in KiB/MiB, each chip folder's fill against its limit;
counters that are zero left out), everything with ``-v``. ``--json`` is not made here: it
is :meth:`cachemgr.compile.results.StatsResult.to_json`, the same whatever the verbosity.
What each counter means: docs/commands.md#what-stats-counts.

Click-free (outside :mod:`cachemgr.cli`): the console script's fast path
(:mod:`cachemgr.localstats`) prints the same report."""

from __future__ import annotations

from cachemgr import words

TYPE_CHECKING = False
if TYPE_CHECKING:  # types only (typing costs start-up): the report is made from what it is given
    from typing import Any

    from cachemgr.compile.results import ChipStats, StatsResult

#: One line of the report: its label and its text.
Line = tuple[str, str]

#: Whole numbers not listed with the running totals: the hits and misses (their own lines
#: before them) and a daemon's ``queue_jobs``, its queue now (queued + running: the
#: ``Queue`` line, shown only where there is a queue, a daemon's).
_NOT_COUNTERS = {"hits", "misses", "queue_jobs"}
#: The counters the default report folds into its Hits, Misses, Compiles and Evicted lines.
_FOLDED = {
    "hits_from_remote",
    "binaries",
    "coalesced",
    "compiles",
    "uncached",
    "debug_compiles",
    "failures",
    "no_space",
    "evicted_entries",
    "evicted_bytes",
}
#: Counters whose value is a size in bytes: shown in KiB/MiB (``--json`` keeps the bytes).
_BYTE_COUNTERS = {"evicted_bytes"}


def lines(stats: StatsResult, why: str = "", verbose: bool = False) -> list[Line]:
    """The report of ``stats``: :func:`_glance` by default, :func:`_everything` with ``-v``.

    :param why: why this kernel cache was chosen (``options.kernel_cache_reason``), ``-v`` only.
    """
    return _everything(stats, why) if verbose else _glance(stats)


def render(rows: list[Line]) -> list[str]:
    """``Label:  text`` with the texts aligned."""
    width = max(len(label) for label, _ in rows)
    return [f"{label + ':':<{width + 1}}  {text}" for label, text in rows]


def _glance(stats: StatsResult) -> list[Line]:
    """About ten lines: what an operator looks at first. Zero counts are left out."""
    data = {**stats.counters, **stats.daemon}
    hits, misses = stats.hits, stats.misses
    lookups = hits + misses
    remote = _count(data, "hits_from_remote")
    out: list[Line] = [("Kernel cache", f"{stats.kernel_cache_dir} (via {stats.via})")]
    if not lookups:
        out.append(("Hits", "no lookups yet"))
    else:
        local = _nonzero((hits - remote, "local"), (remote, "remote"))
        split = f": {local}" if local else ""
        out.append(("Hits", f"{hits} / {lookups} ({words.percent(hits, lookups)}){split}"))
        answered = _nonzero(
            (_count(data, "binaries"), "answered by a precompiled binary"),
            (_count(data, "coalesced"), "by another request's compile"),
        )
        tail = f": {answered}" if answered else ""
        out.append(("Misses", f"{misses} / {lookups} ({words.percent(misses, lookups)}){tail}"))
    runs = _nonzero(
        (_count(data, "uncached"), "not cached"),
        (_count(data, "debug_compiles"), "for debugging"),
        (_count(data, "failures"), "without a kernel"),
        (_count(data, "no_space"), "found no space"),
    )
    compiles = _count(data, "compiles")
    if compiles or runs:
        out.append(("Compiles", f"{compiles}" + (f"; {runs}" if runs else "")))
    evicted = _count(data, "evicted_entries")
    if evicted or _count(data, "evicted_bytes"):
        entries = words.plural(evicted, "entry", "entries")
        out.append(("Evicted", f"{entries}, {words.size(_count(data, 'evicted_bytes'))}"))
    for key in _other_counts(data):
        if data[key]:
            out.append((_label(key), str(data[key])))
    queue = data.get("queue")
    if isinstance(queue, dict) and (queue.get("queued") or queue.get("running")):
        out.append(("Queue", _queue_text(queue)))
    for name, rem in data.get("remotes", {}).items():  # a remote that does not work now
        if rem.get("state") != "ok":
            out.append((f"Remote {name}", f"{rem.get('state')}: compiles go on without it"))
    out.append(("Limit", _limit_text(stats.limits or {})))
    out += _chip_lines(stats, verbose=False)
    return out


def _everything(stats: StatsResult, why: str) -> list[Line]:
    """Every counter (zeros too, bytes in KiB/MiB), the queue, the limits, the remotes and
    each chip folder with its oldest and newest access."""
    hits, misses = stats.hits, stats.misses
    lookups = hits + misses
    out: list[Line] = [
        ("Kernel cache", f"{stats.kernel_cache_dir} (via {stats.via})"),
        *([("Chosen because", why)] if why else []),
        ("Hits", f"{hits} / {lookups} ({words.percent(hits, lookups)})"),
        ("Misses", f"{misses} / {lookups} ({words.percent(misses, lookups)})"),
    ]
    # the counters, then a daemon's other whole numbers (remote_uploads_dropped)
    data = {**stats.counters, **stats.daemon}
    for key in sorted(k for k, v in data.items() if k not in _NOT_COUNTERS and _is_count(v)):
        shown = words.size(data[key]) if key in _BYTE_COUNTERS else str(data[key])
        out.append((_label(key), shown))
    queue = data.get("queue")
    if isinstance(queue, dict):  # from a daemon: its queue now
        out.append(("Queue", _queue_text(queue)))
    out.append(("Limit", _limit_text(stats.limits or {})))
    for name, rem in data.get("remotes", {}).items():
        reasons = ", ".join(f"{k} {v}" for k, v in rem.get("rejected_by_reason", {}).items())
        out.append(
            (
                f"Remote {name}",
                f"{rem['state']}: {rem['hits']} hits, {rem['misses']} misses, "
                f"{rem['errors']} errors, {rem['rejected']} rejected"
                + (f" ({reasons}), " if reasons else ", ")
                + f"{words.size(rem['bytes_in'])} in, {words.size(rem['bytes_out'])} out",
            )
        )
    return out + _chip_lines(stats, verbose=True)


def _chip_lines(stats: StatsResult, verbose: bool) -> list[Line]:
    """Each chip folder's fill (every file in it, as GE counts toward the limit; ``ls`` sums
    entries and labels the difference), the access-time rule of each governed kernel cache's
    mount (what it means for GE's own eviction: docs/interop.md#ges-eviction-and-access-times),
    then the other governed kernel caches' folders."""
    out: list[Line] = []
    for soc, row in stats.chip_folders.items():
        out.append((soc, _chip_text(row, verbose)))
    if not stats.chip_folders:
        out.append(("Chip folders", "none yet"))
    for fs in stats.filesystems or []:  # each governed kernel cache's access-time rule
        out.append(("Filesystem", str(fs["line"])))
    for kc, folders in (stats.other_kernel_caches or {}).items():
        for soc, row in folders.items():  # every kernel cache under ASCEND_CACHE_PATH
            if row.error:
                out.append((f"{kc}/{soc}", f"cannot be read: {row.error}"))
                continue
            of = "" if row.limit_bytes is None else f" of {words.size(row.limit_bytes)}"
            entries = words.plural(row.entries, "entry", "entries")
            out.append((f"{kc}/{soc}", f"{entries}, {words.size(row.bytes)}{of}"))
    return out


def _chip_text(row: ChipStats, verbose: bool) -> str:
    """``N entries, X of LIMIT (P % full) [###-------]``; with ``verbose`` the oldest and
    newest access too."""
    if row.error:
        return f"cannot be read: {row.error}"
    fill = "" if row.fill_pct is None else f" ({row.fill_pct:.1f} % full) {words.bar(row.fill_pct)}"
    of = " (never evicts)" if row.limit_bytes is None else f" of {words.size(row.limit_bytes)}"
    text = f"{words.plural(row.entries, 'entry', 'entries')}, {words.size(row.bytes)}{of}{fill}"
    if verbose:
        text += f"; oldest access {row.oldest_access or '-'}, newest {row.newest_access or '-'}"
    return text


def _limit_text(lim: dict[str, Any]) -> str:
    if lim["never_evict"]:
        return "never evict (max_op_cache_size=-1)"
    size, ratio = lim["max_op_cache_size"], lim["remain_cache_size_ratio"]
    kept = f"{ratio['value']} % kept after an eviction"
    if size["origin"] == ratio["origin"]:  # one origin for both: said once
        return f"{size['value']} MiB per chip folder, {kept} (from {size['origin']})"
    per_chip = f"{size['value']} MiB per chip folder (from {size['origin']})"
    return f"{per_chip}, {kept} (from {ratio['origin']})"


def _queue_text(queue: dict[str, Any]) -> str:
    return (
        f"{queue.get('queued', 0)} queued, {queue.get('running', 0)} running, "
        f"{queue.get('waited', 0)} waited for another request's compile"
    )


def _other_counts(data: dict[str, Any]) -> list[str]:
    """Whole numbers the glance does not fold into a line of its own (a daemon's
    ``remote_uploads_dropped``…), by name."""
    return sorted(k for k, v in data.items() if k not in _NOT_COUNTERS | _FOLDED and _is_count(v))


def _nonzero(*parts: tuple[int, str]) -> str:
    """``2 compiled, 1 failed``: the parts whose count is not zero."""
    return ", ".join(f"{n} {what}" for n, what in parts if n)


def _count(data: dict[str, Any], key: str) -> int:
    value = data.get(key, 0)
    return value if _is_count(value) else 0


#: Labels other than the counter's name (kept within the column the others fit in).
_LABELS = {"ge_fatal_removed": "Fatal to GE"}  # removed: docs/interop.md#entries-that-abort-ge


def _label(key: str) -> str:
    return _LABELS.get(key) or key.replace("_", " ").capitalize()


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
