"""``cachemgr ls`` and ``cachemgr verify`` (docs/design.md#cache-entries): read the cache without
touching atimes."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from cachemgr.cli import human
from cachemgr.cli.common import (
    VERBOSITY,
    chip_dirs,
    emit_json,
    failure,
    load_settings,
    printable,
    remote_option,
    report_line,
    settings_options,
)
from cachemgr.cli.lockcheck import checked_for_writing
from cachemgr.config.options import kernel_cache_why
from cachemgr.remote import config as remote_config
from cachemgr.remote.tierset import RemoteTiers
from cachemgr.storage import entry, fsutil, optype
from cachemgr.storage.store import VerifyReport
from cachemgr.storage.tiers import chip_store


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="seconds")


#: The files of a chip folder that are no entry's, by kind: (label, the scan's table).
LOOSE_KINDS = (
    ("header manifests", "manifests"),
    ("orphans", "orphans"),
    ("temps", "temps"),
    ("locks", "locks"),
    (".nfs files", "silly"),
)


def loose_bytes(scan: entry.ChipScan) -> dict[str, int]:
    """Bytes of the files that belong to no entry, by :data:`LOOSE_KINDS` label (apparent
    sizes, as ``used_bytes``): what ``ls`` names when the folder holds more than its entries.
    A header manifest is counted as one, never as a lock or temp
    (docs/design.md#files-of-an-entry)."""
    return {
        label: sum(f.size for f in getattr(scan, table).values()) for label, table in LOOSE_KINDS
    }


def list_chip(chip: Path) -> tuple[list[dict[str, Any]], int, dict[str, int]]:
    """One row per entry of a chip folder, by name grouping (no access time changes), the
    bytes of every regular file in it — what ``stats`` reports and GE counts toward the
    limit (``TeFileUtils::GetDirectorySize``), entries or not — and the bytes of the files no
    entry owns, by kind (:func:`loose_bytes`)."""
    scan = entry.scan_chip(chip)
    rows = []
    for kernel in sorted(scan.entries):
        group = scan.entries[kernel]
        if not group.resolved:
            entry.resolve_group(scan, group)
        rows.append(
            {
                "soc_version": chip.name,
                "kernel": kernel,
                "op_type": optype.shown(chip, kernel),
                "bytes": group.size,
                "atime": _iso(group.atime_ns),
                "parts": sorted(group.files),
            }
        )
    return rows, scan.used_bytes, loose_bytes(scan)


@click.command("ls", short_help="List the entries: chip, kernel, op type, size, access.")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of entries.")
@click.option("--bytes", "raw_bytes", is_flag=True, help="Sizes in bytes, not KiB/MiB.")
@settings_options
def ls_cmd(as_json: bool, raw_bytes: bool, **kw: Any) -> None:
    """List entries: chip, kernel, op type, size, last access (UTC), parts.

    One aligned row per entry, oldest access last; the total goes to stderr.
    """
    settings = load_settings(writable=False, **kw)
    rows: list[dict[str, Any]] = []
    used = 0
    loose: dict[str, int] = {}
    unreadable = []
    with fsutil.reads_keep_atime():
        for chip in chip_dirs(settings):
            try:
                found, chip_bytes, chip_loose = list_chip(chip)
            except PermissionError:  # a member's private folder: skipped, the others listed
                unreadable.append(fsutil.access_hint(chip, "readable"))
                continue
            rows += found
            used += chip_bytes
            for kind, n in chip_loose.items():
                loose[kind] = loose.get(kind, 0) + n
    if as_json:
        emit_json(rows)
        return
    shown = [
        (
            row["soc_version"],
            row["kernel"],
            row["op_type"] or "-",
            str(row["bytes"]) if raw_bytes else human.size(row["bytes"]),
            row["atime"].replace("T", " ").removesuffix("+00:00"),
            _short_parts(row["kernel"], row["parts"]),
        )
        for row in rows
    ]
    if shown:
        header = ("SOC", "KERNEL", "OP TYPE", "BYTES" if raw_bytes else "SIZE")
        human.table((*header, "LAST ACCESS (UTC)", "PARTS"), shown, right=(3,))
    if VERBOSITY.level >= 0:
        click.echo(_total_line(rows, used, loose, raw_bytes), err=True)
        click.echo(kernel_cache_why(settings), err=True)
    for line in unreadable:
        failure(f"{line}; that chip folder is not listed")
    if unreadable:
        sys.exit(1)


def _total_line(
    rows: list[dict[str, Any]], used: int, loose: dict[str, int], raw_bytes: bool
) -> str:
    """``N entries, X`` — and, when the chip folders hold more than their entries (header
    manifests, orphans, temps, lock files), the bytes ``stats`` shows and the limit counts,
    each kind that holds bytes named with its own (``loose``: bytes by kind)."""

    def size(n: int) -> str:
        return f"{n} B" if raw_bytes else human.size(n)

    total = sum(row["bytes"] for row in rows)
    line = f"{human.plural(len(rows), 'entry', 'entries')}, {size(total)}"
    if used > total:
        kinds = {kind: n for kind, n in loose.items() if n}
        other = used - total - sum(kinds.values())
        if other > 0:  # e.g. GE's op_cache_file_del.lock, when something wrote into it
            kinds["other files"] = other
        named = (
            ", ".join(kinds)
            if len(kinds) <= 1
            else ", ".join(f"{size(n)} {kind}" for kind, n in kinds.items())
        )
        line += (
            f"; the chip folders hold {size(used)} in all files, as `stats` shows and the "
            f"limit counts ({size(used - total)} not in entries: {named})"
        )
    return line


def _short_parts(kernel: str, parts: list[str]) -> str:
    """``te_x.json,te_x.o`` → ``.json,.o``: the kernel name is already on the line."""
    return ",".join(p[len(kernel) :] if p.startswith(kernel) else p for p in parts)


def _report_json(report: VerifyReport) -> dict[str, Any]:
    return {
        "checked": report.checked,
        "not_checked": report.not_checked + report.not_checked_files,
        "findings": [
            {
                "name": f.name,
                "kind": f.kind,
                "repaired": f.repaired,
                "problems": [{"kind": p.kind, "detail": p.detail} for p in f.problems],
            }
            for f in report.findings
        ],
    }


def _remote_rows(settings: Any, remotes: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Each remote's state: one cheap request each (Redis ``DBSIZE``,
    HTTP ``HEAD``), never a download; the remotes' contents are verified when fetched."""
    config = remote_config.from_settings(settings, list(remotes))  # ConfigError: exit 2
    tiers = RemoteTiers.from_config(config, stat_only=True)  # no key needed to ask DBSIZE
    if tiers is None:
        return []
    try:
        return [
            {"name": s.name, "state": s.state, "entries": s.entries, **s.detail}
            for s in tiers.stat_all()
        ]
    finally:
        tiers.close()


@click.command("verify", short_help="Check every entry; exit 1 if anything bad remains.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object keyed by soc_version.")
@click.option("--repair", is_flag=True, help="Remove bad entries and orphans.")
@settings_options
@remote_option
def verify_cmd(as_json: bool, repair: bool, remotes: tuple[str, ...], **kw: Any) -> None:
    """Check every entry (sha256, binaries, sub-parts); exit 1 if anything bad remains.

    Exit codes: 0 nothing bad; 1 something bad remains (after --repair: what it could not
    remove) or a chip folder could not be read; 2 bad input or configuration.
    """
    settings = load_settings(writable=repair, **kw)
    if repair:  # it removes files: the daemon's lock checks first
        values = {k: kw.get(k) for k in ("op_compiler_cache_dir", "host_id", "soc_version")}
        settings = checked_for_writing(settings, values, kw.get("config_file"))
    reports, unreadable = [], []
    for chip in chip_dirs(settings):
        try:
            reports.append(chip_store(chip).verify_all(repair=repair))
        except PermissionError:  # a member's private folder: skipped, the others verified
            unreadable.append(fsutil.access_hint(chip, "readable"))
    for line in unreadable:
        failure(f"{line}; that chip folder is not verified")
    bad = sum(len(r.bad) for r in reports)
    remote_rows = _remote_rows(settings, remotes)
    if as_json:
        emit_json(
            {
                "chip_folders": {r.chip_dir.name: _report_json(r) for r in reports},
                "bad": bad,
                "repaired": sum(len(r.findings) - len(r.bad) for r in reports),
                "remotes": remote_rows,
            }
        )
    else:
        for row in remote_rows:
            held = "" if row["entries"] is None else f", {row['entries']} keys"
            why = f": {row['error']}" if row.get("error") else ""
            report_line(f"remote {row['name']}: {row['state']}{held}{why}")
        for report in reports:
            for f in report.findings:
                state = "REPAIRED" if f.repaired else "BAD"
                why = "; ".join(f"{p.kind}: {p.detail}" for p in f.problems)
                line = printable(f"{state} {report.chip_dir.name}/{f.name}: {why}")
                report_line(line, failed=not f.repaired)  # -q: BAD lines are its errors
        checked = sum(r.checked for r in reports)
        report_line(
            f"checked {human.plural(checked, 'entry', 'entries')} in "
            f"{human.plural(len(reports), 'chip folder')}; {bad} bad"
        )
        not_checked = _not_checked_line(reports)
        if not_checked:
            report_line(not_checked, err=True)
    if bad or unreadable:
        sys.exit(1)


#: Owners named in the ``not checked`` line; more are counted.
NOT_CHECKED_OWNERS_SHOWN = 3


def _not_checked_line(reports: list[VerifyReport]) -> str:
    """``not checked: 2 entries and 1 header manifest of user bob — …; run verify as bob
    or root``: what was not read because a read would change its access time, entries and
    loose files counted apart (a manifest is not an entry), and whose they are — under the
    system service every entry is the daemon's user's, a member's verify checks none and
    must say who can; ``""`` when everything was read."""
    entries = sum(len(r.not_checked) for r in reports)
    files = sum(len(r.not_checked_files) for r in reports)
    if not entries and not files:
        return ""
    parts = [human.plural(entries, "entry", "entries")] if entries else []
    parts += [human.plural(files, "header manifest")] if files else []
    owners = sorted({fsutil.user_name(uid) for r in reports for uid in r.not_checked_owners})
    if not owners:  # every one gone before its owner was read
        whose, who = "other users", "their owner"
    else:
        shown = ", ".join(owners[:NOT_CHECKED_OWNERS_SHOWN])
        more = len(owners) - NOT_CHECKED_OWNERS_SHOWN
        shown += f" and {human.plural(more, 'other')}" if more > 0 else ""
        whose = f"{'user' if len(owners) == 1 else 'users'} {shown}"
        who = owners[0] if len(owners) == 1 else "their owner"
    return (
        f"not checked: {' and '.join(parts)} of {whose} — reading them would change "
        f"their access times (the eviction order); run verify as {who} or root"
    )
