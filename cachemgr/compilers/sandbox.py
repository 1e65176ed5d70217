"""The sandbox and resource limits of compiler processes run by the daemon (issue 10 items 5
and 10).

A caller's source may ``#include "/home/cachemgr/secret"`` or ``.incbin`` a file only the
daemon user may read, and a compiler may be made to allocate, spin or write without bound.
The daemon therefore runs every compiler process (compile, dependency listing, probes):

* in a **user + mount namespace** (``unshare --user --map-root-user --mount``, util-linux;
  no privilege needed) in which the daemon user's private folders — its ``HOME``, state,
  configuration and runtime folders and any folder of the ``[sandbox] hide`` list — are
  covered by an empty, mode-000 tmpfs: such an include or ``.incbin`` finds nothing. The
  build folder and the compiler's own folder are never hidden (the compile needs them);
* under **resource limits** (``prlimit``): address space (``RLIMIT_AS``), CPU time
  (``RLIMIT_CPU``) and the size of any file written (``RLIMIT_FSIZE``), from the
  ``[sandbox]`` table.

A compile for the **daemon's own user** (a caller whose ``SO_PEERCRED`` uid is the daemon's:
:func:`cachemgr.compilers.process.for_own_user`) runs under the limits but not in the
namespaces: they hide only that user's own folders, which such a caller reads anyway — as its
compiles without a daemon (an in-process queue runs no sandbox) always could; they cost
~3.7 ms per compiler process (``unshare`` + ``sh`` + ``mount``; issue 14 item 3). A job
shared by several callers runs in them when any caller joined before it started is another
user; a TCP caller (no credentials) is never the daemon's user.

Where user namespaces are not available (a kernel or systemd unit forbidding them, no
``unshare``), :attr:`Sandbox.isolated` is False and the daemon refuses compiles for other
users with one line (see ``cachemgr.daemon.service``); compiles for its own user still run,
with the limits. The systemd unit must allow ``RestrictNamespaces=user mnt``.

``[sandbox]`` keys: ``namespaces`` (``"auto"``: use them when they work; ``"off"``),
``unshare`` and ``prlimit`` (the tools, default found on PATH), ``hide`` (extra folders),
``address_space_mb`` (default 16384; 0 = no limit), ``cpu_s`` (default 1200; 0 = none),
``output_mb`` (default 1024; 0 = none).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachemgr.constants import MIB
from cachemgr.errors import ConfigError

log = logging.getLogger(__name__)

#: The shell step that runs inside the namespaces: mount an empty tmpfs on each folder up to
#: ``--``, then become the compiler (``exec``: the process group and the pipes stay the same).
_MOUNT_SCRIPT = (
    'while [ "$1" != "--" ]; do '
    'mount -t tmpfs -o size=4k,mode=000 cachemgr-hidden "$1" || exit 97; shift; done; '
    'shift; exec "$@"'
)
_KEYS = ("namespaces", "unshare", "prlimit", "hide", "address_space_mb", "cpu_s", "output_mb")


@dataclass(frozen=True)
class Limits:
    """Per compiler process: ``address_space_mb`` (RLIMIT_AS), ``cpu_s`` (RLIMIT_CPU, seconds),
    ``output_mb`` (RLIMIT_FSIZE); 0 = no limit."""

    address_space_mb: int = 16384
    cpu_s: int = 1200
    output_mb: int = 1024

    def prlimit_args(self) -> list[str]:
        """``prlimit`` options for the limits that are set."""
        out = []
        if self.address_space_mb:
            out.append(f"--as={self.address_space_mb * MIB}")
        if self.cpu_s:
            out.append(f"--cpu={self.cpu_s}")
        if self.output_mb:
            out.append(f"--fsize={self.output_mb * MIB}")
        return out


@dataclass
class Sandbox:
    """How the daemon runs compiler processes (see the module docstring).

    :ivar isolated: True when compiles run in the namespaces with the folders hidden.
    :ivar why_not: one line saying why not, when ``isolated`` is False.
    """

    limits: Limits = field(default_factory=Limits)
    hidden: tuple[str, ...] = ()
    unshare: str | None = None
    prlimit: str | None = None
    isolated: bool = False
    why_not: str = "not configured"

    def wrap(self, argv: list[str], cwd: Path | None, namespaces: bool = True) -> list[str]:
        """``argv`` to run inside the sandbox and under the limits (with ``namespaces``
        False: under the limits only — a compile for the daemon's own user)."""
        limited = list(argv)
        if self.prlimit and self.limits.prlimit_args():
            limited = [self.prlimit, *self.limits.prlimit_args(), "--", *argv]
        if not namespaces or not self.isolated or not self.unshare:
            return limited
        keep = [str(cwd)] if cwd else []
        keep.append(os.path.realpath(argv[0]) if argv else "")
        hide = [h for h in self.hidden if not any(_inside(k, h) for k in keep if k)]
        return [
            self.unshare,
            "--user",
            "--map-root-user",
            "--mount",
            "--",
            "/bin/sh",
            "-c",
            _MOUNT_SCRIPT,
            "cachemgr-sandbox",
            *hide,
            "--",
            *limited,
        ]


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def from_table(
    table: Mapping[str, Any] | None, private: Iterable[Path | str], where: str = "[sandbox]"
) -> Sandbox:
    """The daemon's sandbox: ``table`` is the config's ``[sandbox]`` table, ``private`` the
    daemon user's private folders (HOME, state, config, runtime); namespaces are probed.

    :raises ConfigError: an unknown key or a bad value (names both).
    """
    table = dict(table or {})
    for key in table:
        if key not in _KEYS:
            raise ConfigError(f"{where}: unknown setting {key!r} (known: {', '.join(_KEYS)})")
    limits = Limits(**{k: _count(table, k, getattr(Limits, k), where) for k in _LIMIT_KEYS})
    mode = table.get("namespaces", "auto")
    if mode not in ("auto", "off"):
        raise ConfigError(f"{where}: namespaces={mode!r} is invalid; accepted: 'auto', 'off'")
    extra = table.get("hide", [])
    if not isinstance(extra, list) or not all(isinstance(h, str) for h in extra):
        raise ConfigError(f"{where}: hide={extra!r} must be a list of folders")
    hidden = _folders([*private, *extra])
    box = Sandbox(
        limits,
        hidden,
        unshare=_tool(table, "unshare", where),
        prlimit=_tool(table, "prlimit", where),
    )
    if mode == "off":
        box.why_not = f"{where} namespaces = 'off'"
    elif box.unshare is None:
        box.why_not = "unshare (util-linux) is not installed"
    else:
        box.isolated, box.why_not = _probe(box)
    if box.isolated:
        log.info("compiles run in a user+mount namespace hiding %s", ", ".join(hidden) or "-")
    else:
        log.warning(
            "compiles run without a sandbox (%s): other users' compiles are refused", box.why_not
        )
    return box


_LIMIT_KEYS = ("address_space_mb", "cpu_s", "output_mb")


def _count(table: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: {key}={value!r} must be an integer ≥ 0 (0 = no limit)")
    return value


def _tool(table: Mapping[str, Any], key: str, where: str) -> str | None:
    value = table.get(key, key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {key}={value!r} must be a program name or path")
    found = shutil.which(value)
    return os.path.abspath(found) if found else None


def _folders(paths: Iterable[Path | str]) -> tuple[str, ...]:
    """Existing folders, links resolved, none inside another, never ``/`` or a parent of the
    temp folder (build folders live there)."""
    tmp = os.path.realpath(os.environ.get("TMPDIR") or "/tmp")
    found = set()
    for path in paths:
        real = os.path.realpath(str(path))
        if os.path.isdir(real) and real != "/" and not _inside(tmp, real):
            found.add(real)
    return tuple(sorted(p for p in found if not any(_inside(p, q) and p != q for q in found)))


def _probe(box: Sandbox) -> tuple[bool, str]:
    """Run ``true`` in the sandbox: does it work here?"""
    argv = dataclasses.replace(box, isolated=True).wrap(["/bin/true"], None)
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{box.unshare} cannot run: {exc}"
    if done.returncode != 0:
        text = (done.stderr or done.stdout).decode("utf-8", "replace").strip().splitlines()
        return False, f"user namespaces are not available: {text[-1] if text else done.returncode}"
    return True, ""
