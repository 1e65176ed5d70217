"""Run a process with exactly the systemd unit's credentials: the capability sets, the
no-new-privileges flag and the umask read from ``systemd/cachemgr.service`` (so a test and
the unit cannot drift apart), applied with ``setpriv`` as systemd would for ``User=`` /
``Group=`` (the sharing group as the primary and only group)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT

UNIT = ROOT / "systemd" / "cachemgr.service"


def unit_value(key: str, text: str | None = None) -> list[str]:
    """The words of ``key=`` after every assignment in the unit (an empty one resets a
    list, as systemd does)."""
    value: list[str] = []
    for line in (UNIT.read_text() if text is None else text).splitlines():
        if line.startswith(f"{key}="):
            words = line.split("=", 1)[1].split()
            value = [] if not words else value + words
    return value


def _caps(names: list[str]) -> str:
    return ",".join(["-all", *(f"+{n.removeprefix('CAP_').lower()}" for n in names)])


def setpriv_argv(user: str, group: str) -> list[str]:
    """``setpriv`` arguments giving a process (started as root) the unit's user, group,
    capability sets and ``NoNewPrivileges=``; then the program's argv follows."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed")
    ambient, bounding = unit_value("AmbientCapabilities"), unit_value("CapabilityBoundingSet")
    argv = [
        "setpriv",
        f"--reuid={user}",
        f"--regid={group}",
        f"--groups={group}",
        f"--inh-caps={_caps(ambient)}",
        f"--ambient-caps={_caps(ambient)}",
        f"--bounding-set={_caps(bounding)}",
    ]
    if unit_value("NoNewPrivileges") == ["yes"]:
        argv.append("--no-new-privs")
    return argv


def unit_umask() -> int:
    """The unit's ``UMask=`` (octal)."""
    (value,) = unit_value("UMask")
    return int(value, 8)


def unit_wrapper(folder: Path, user: str, group: str, program: str) -> Path:
    """An executable (world-readable) script that runs ``program "$@"`` with the unit's
    umask and credentials — what a test hands ``start_daemon`` as its ``python``."""
    script = folder / f"as-unit-{user}.sh"
    argv = " ".join(setpriv_argv(user, group))
    script.write_text(f'#!/bin/sh\numask {unit_umask():04o}\nexec {argv} {program} "$@"\n')
    script.chmod(0o755)
    return script
