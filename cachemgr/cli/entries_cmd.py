"""``cachemgr ls`` and ``cachemgr verify`` (SPEC §3): read the cache without touching atimes."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from cachemgr import entry, fsutil
from cachemgr.cli.common import chip_dirs, emit_json, load_settings, settings_options
from cachemgr.cli.lockcheck import checked_for_writing
from cachemgr.store import Store, VerifyReport


def op_type_of(kernel: str) -> str:
    """``te_<optype>_<hash>`` → ``<optype>`` (GE's naming, SPEC §3.1); ``""`` otherwise."""
    parts = kernel.split("_")
    if len(parts) >= 3 and parts[0] == "te":
        return "_".join(parts[1:-1])
    return ""


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="seconds")


def list_chip(chip: Path) -> list[dict[str, Any]]:
    """One row per entry of a chip folder, by name grouping (no access time changes)."""
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
                "op_type": op_type_of(kernel),
                "bytes": group.size,
                "atime": _iso(group.atime_ns),
                "parts": sorted(group.files),
            }
        )
    return rows


@click.command("ls")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of entries.")
@settings_options
def ls_cmd(as_json: bool, **kw: Any) -> None:
    """List entries: kernel, op type, bytes, access time, parts."""
    settings = load_settings(writable=False, **kw)
    with fsutil.reads_keep_atime():
        rows = [row for chip in chip_dirs(settings) for row in list_chip(chip)]
    if as_json:
        emit_json(rows)
        return
    for row in rows:
        click.echo(
            f"{row['soc_version']}/{row['kernel']}  {row['op_type'] or '-'}  "
            f"{row['bytes']} B  {row['atime']}  {_short_parts(row['kernel'], row['parts'])}"
        )
    click.echo(f"{len(rows)} entries", err=True)


def _short_parts(kernel: str, parts: list[str]) -> str:
    """``te_x.json,te_x.o`` → ``.json,.o``: the kernel name is already on the line."""
    return ",".join(p[len(kernel) :] if p.startswith(kernel) else p for p in parts)


def _report_json(report: VerifyReport) -> dict[str, Any]:
    return {
        "checked": report.checked,
        "not_checked": report.not_checked,
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


@click.command("verify")
@click.option("--json", "as_json", is_flag=True, help="One JSON object keyed by soc_version.")
@click.option("--repair", is_flag=True, help="Remove bad entries and orphans.")
@settings_options
def verify_cmd(as_json: bool, repair: bool, **kw: Any) -> None:
    """Check every entry (sha256, binaries, sub-parts); exit 1 if anything bad remains."""
    settings = load_settings(writable=repair, **kw)
    if repair:  # it removes files: the daemon's lock checks first (issue 12 item 11)
        values = {k: kw.get(k) for k in ("op_compiler_cache_dir", "host_id", "soc_version")}
        settings = checked_for_writing(settings, values, kw.get("config_file"))
    reports = [Store(chip).verify_all(repair=repair) for chip in chip_dirs(settings)]
    bad = sum(len(r.bad) for r in reports)
    if as_json:
        emit_json(
            {
                "chip_folders": {r.chip_dir.name: _report_json(r) for r in reports},
                "bad": bad,
                "repaired": sum(len(r.findings) - len(r.bad) for r in reports),
            }
        )
    else:
        for report in reports:
            for f in report.findings:
                state = "REPAIRED" if f.repaired else "BAD"
                why = "; ".join(f"{p.kind}: {p.detail}" for p in f.problems)
                click.echo(f"{state} {report.chip_dir.name}/{f.name}: {why}")
        checked = sum(r.checked for r in reports)
        click.echo(f"checked {checked} entries in {len(reports)} chip folders; {bad} bad")
        skipped = sum(len(r.not_checked) for r in reports)
        if skipped:
            click.echo(
                f"not checked: {skipped} entries of other users — reading them would change "
                "their access times (the eviction order); run verify as their owner or root",
                err=True,
            )
    if bad:
        sys.exit(1)
