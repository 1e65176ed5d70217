"""The sandbox and resource limits of compiler processes run by the daemon
(docs/daemon.md, *Sandbox*;
docs/security.md#5-callers-are-identified-the-daemon-reads-nothing-for-them).

A caller's source may ``#include "/home/cachemgr/secret"`` or ``.incbin`` a file only the
daemon user may read, test with ``__has_include`` whether any path exists, and a compiler may
be made to allocate, spin or write without bound. The daemon therefore runs every compiler
process (compile, dependency listing, probes) of another user:

* in an **allow-list view** of the file system, built by bubblewrap (``bwrap``, the sandbox
  of Flatpak; no privilege needed: a user namespace with its own mount and pid namespaces).
  Its root is an empty tmpfs holding only read-only binds of the system folders (``/usr`` and the
  ``/bin``, ``/sbin``, ``/lib*`` links or folders beside it), a few files of ``/etc`` the
  loader and ``cc`` alternatives need (:data:`ETC_FILES`), the compiler's own install folder
  (its program's folder, or that folder's parent when it is a ``bin``), the folder of a
  script compiler's interpreter, the folders of ``[sandbox] allow``; a minimal ``/dev`` (its
  ``tty`` a null device: never the daemon's terminal); an empty ``/tmp``; and, read-write,
  the job's build folder (the process's working folder) only. Nothing else of the host
  exists in it: no other caller's build folder, no cache, no ``/proc``, no HOME, no token
  file. The daemon user's private folders — its ``HOME``, state, configuration and runtime
  folders, the folders of its secret files (TCP token, remotes' password and token files)
  and any folder of ``[sandbox] hide`` — are moreover covered by an empty tmpfs where they
  fall inside an allowed folder, each of them (the state folder in ``~/.local/state`` though
  HOME holds it, when ``~/.local`` is shown).

  The view has its own network (a network namespace holding only its own loopback): code in
  it reached the daemon's TCP port, another user's abstract Unix socket (abstract names
  belong to a network namespace) and a remote cache's Redis, where it could write. A Unix
  socket *file* is reached by its path, not through the network, and no such path of the
  host exists in the view but in the folders shown read-only (``[sandbox] allow`` must not
  show a folder holding one).

  The view has its own process ids (a pid namespace): a compiler that its input took over
  (nvcc's shell was one way in; a crafted ``.gch`` or a compiler bug another) can signal no
  process outside it — with the host's ids, ``kill -1`` killed the daemon — and every
  process in it dies with the compile (a ``setsid`` child outlived it before, holding the
  build folder where the worker's next jobs, other callers', are written). When a process
  of the view has ended, its working folder must hold only plain files and folders
  (:meth:`Sandbox.check_left`): the daemon reads the outputs outside the view, where a link
  left there by a subverted compiler led it to any file of the daemon user.

  Until this view (an attack review) the namespace hid a deny-list of folders
  and showed the rest of the host: a failed compile's error text quoted the lines of any
  other file the daemon user could read, and ``__has_include`` told whether a path existed;
* under **resource limits** (``prlimit``): address space (``RLIMIT_AS``), CPU time
  (``RLIMIT_CPU``) and the size of any file written (``RLIMIT_FSIZE``), from the
  ``[sandbox]`` table.

A compile for the **daemon's own user** (a caller whose ``SO_PEERCRED`` uid is the daemon's:
:func:`cachemgr.compilers.process.for_own_user`) runs under the limits but not in the view:
it shows that user nothing it cannot read anyway — as its compiles without a daemon (an
in-process queue runs no sandbox) always could — and costs ~6 ms per compiler process.
A job shared by several callers runs in it when any caller joined before
it started is another user; a TCP caller (no credentials) is never the daemon's user.

Where bubblewrap cannot run (not installed, a kernel or systemd unit forbidding user
namespaces), :attr:`Sandbox.isolated` is False and the daemon refuses compiles for other
users with one line (see ``cachemgr.daemon.service``); compiles for its own user still run,
with the limits. The systemd unit must allow ``RestrictNamespaces=user mnt pid net`` and
``RestrictAddressFamilies=AF_NETLINK`` (bubblewrap brings the view's loopback up over
rtnetlink, and stops when it cannot). Every process of the view starts holding no
capability (:mod:`.caps`: bubblewrap refuses to start with one, and the unit gives the daemon
``CAP_FOWNER``), and :func:`_probe` starts its test the same way, in a build folder of its
own.

``[sandbox]`` keys: ``namespaces`` (``"auto"``: use the view when bubblewrap works; ``"off"``),
``bwrap`` and ``prlimit`` (the tools, default found on PATH), ``allow`` (more folders shown
read-only, e.g. a toolchain under ``/opt``), ``hide`` (folders covered inside allowed ones),
``address_space_mb`` (default 16384; 0 = no limit), ``cpu_s`` (default 1200; 0 = none),
``output_mb`` (default 1024; 0 = none). ``unshare`` (the tool of the deny-list namespace
before bubblewrap) is accepted and ignored, with a warning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachemgr.compilers import caps, envvars
from cachemgr.constants import MIB
from cachemgr.errors import CompileError, ConfigError

log = logging.getLogger(__name__)

_KEYS = (
    "namespaces", "bwrap", "prlimit", "allow", "hide", "address_space_mb", "cpu_s", "output_mb",
    "unshare",
)  # fmt: skip
#: The daemon's environment variables a compiler in the view gets (attack review: it got
#: them all — a proxy URL with its password, a unit's credentials — and a subverted compiler
#: printed them into the error text handed back to the member): the search path, locale,
#: library and include paths, and the toolkits' own variables.
ENV_KEPT = re.compile(
    r"^(?:PATH|HOME|LANG|LANGUAGE|LC_[A-Z]+|TZ|SOURCE_DATE_EPOCH"
    r"|LD_LIBRARY_PATH|LIBRARY_PATH|CPATH|C_INCLUDE_PATH|CPLUS_INCLUDE_PATH"
    r"|PYTHONPATH|PYTHONHOME|(?:ASCEND|CUDA|NVCC|TOOLCHAIN)_[A-Z0-9_]+)\Z"
)
#: Top-level system folders shown read-only (or re-made as the links they are: merged /usr).
SYSTEM_TOP = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: Files of ``/etc`` a compiler needs: the loader's cache and configuration (libraries in
#: multiarch folders) and the alternatives ``/usr/bin/cc`` may point through. Not ``/etc``
#: whole: a daemon's token or configuration may live there.
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives")
#: bwrap options of every view: a user namespace (implies a mount namespace), a process-id
#: namespace (the compiler can signal no process outside it, and every process in it dies
#: with it), a network namespace (nothing but its own loopback: no TCP port or abstract Unix
#: socket of the host, no remote host), no capability inside it, killed with its parent, an
#: empty root.
_BASE = (
    "--unshare-user", "--unshare-pid", "--unshare-net", "--cap-drop", "ALL", "--die-with-parent",
    "--tmpfs", "/",
)  # fmt: skip


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

    :ivar hidden: folders covered by an empty tmpfs where they fall inside an allowed one.
    :ivar allowed: more folders shown read-only (``[sandbox] allow``), resolved.
    :ivar isolated: True when other users' compiles run in the allow-list view.
    :ivar why_not: one line saying why not, when ``isolated`` is False.
    """

    limits: Limits = field(default_factory=Limits)
    hidden: tuple[str, ...] = ()
    bwrap: str | None = None
    prlimit: str | None = None
    allowed: tuple[str, ...] = ()
    isolated: bool = False
    why_not: str = "not configured"

    def wrap(self, argv: list[str], cwd: Path | None, namespaces: bool = True) -> list[str]:
        """``argv`` to run inside the view and under the limits (with ``namespaces`` False:
        under the limits only — a compile for the daemon's own user). ``cwd`` (the job's
        build folder) is the one folder the process may write, and its working folder."""
        limited = list(argv)
        if self.prlimit and self.limits.prlimit_args():
            limited = [self.prlimit, *self.limits.prlimit_args(), "--", *argv]
        if not self.in_view(namespaces) or self.bwrap is None:  # (None: for the type checker)
            return limited
        return [self.bwrap, *self.view_args(limited, cwd), "--", *limited]

    def in_view(self, namespaces: bool = True) -> bool:
        """Whether :meth:`wrap` with ``namespaces`` runs the process in the view."""
        return namespaces and self.isolated and self.bwrap is not None

    @staticmethod
    def check_left(work: Path, what: str) -> None:
        """After a process in the view ended (and with it, in its own pid namespace, every
        process it started): its working folder ``work`` — the one place it could write —
        must hold only plain files and folders. The daemon reads a compile's outputs outside
        the view, where a symbolic link would lead it to any file of the daemon user (handed
        back as an artefact, quoted, or cached) and a FIFO would block it.

        :raises CompileError: naming the first other entry (relative to ``work``) and
            ``what``.
        """
        found = _first_special(str(work))
        if found is not None:
            path, kind = found
            raise CompileError(
                f"{what}: the compiler left {kind} {os.path.relpath(path, work)!r} in its "
                "build folder; the daemon reads outputs outside the sandbox and never follows "
                "one: refused"
            )

    def view_args(self, argv: list[str], cwd: Path | None) -> list[str]:
        """bwrap options that build the view for ``argv`` run in ``cwd`` (module docstring)."""
        args = list(_BASE)
        for top in SYSTEM_TOP:
            if os.path.islink(top):
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        shown = [*SYSTEM_TOP, *ETC_FILES]
        for path in ETC_FILES:
            args += ["--ro-bind-try", path, path]
        # /dev/tty would be the daemon's controlling terminal (one started from a shell):
        # a subverted compiler could type a command line into it (TIOCSTI). A null device.
        args += ["--dev", "/dev", "--dev-bind", "/dev/null", "/dev/tty", "--tmpfs", "/tmp"]
        for path in _program_folders(argv) + list(self.allowed):
            if not any(_inside(path, s) for s in shown):
                args += ["--ro-bind", path, path]
                shown.append(path)
        covered: list[str] = []
        for folder in sorted(self.hidden, key=len):  # outer first; one inside it is covered
            if any(_inside(folder, s) for s in shown) and not any(
                _inside(folder, c) for c in covered
            ):
                args += ["--tmpfs", folder]
                covered.append(folder)
        work = os.path.abspath(cwd) if cwd else "/"
        if work != "/":
            args += ["--bind", work, work]
        for name in sorted(os.environ):  # the daemon's other variables may hold credentials
            if not ENV_KEPT.match(name) and name not in envvars.KEYED:  # (the caller's)
                args += ["--unsetenv", name]
        return [*args, "--chdir", work, "--setenv", "TMPDIR", "/tmp"]


def _first_special(folder: str) -> tuple[str, str] | None:
    """The first entry below ``folder`` (no link followed, any depth) that is neither a
    plain file nor a folder, with its kind (a folder it cannot list is one too), or None."""
    stack = [folder]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except FileNotFoundError:
            continue
        except OSError:  # a folder it made unlistable (000): what is inside is unknown
            return current, "an unreadable folder"
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            elif not entry.is_file(follow_symlinks=False):
                mode = entry.stat(follow_symlinks=False).st_mode
                kinds = {stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO"}
                return entry.path, kinds.get(stat.S_IFMT(mode), "a special file")
    return None


def _program_folders(argv: list[str]) -> list[str]:
    """The folders a compiler (``argv``'s first word that is not the limits tool) needs shown
    read-only: its install folder, as given and resolved, and a script's interpreter's.
    Never ``/`` or a folder holding the temp folder (other callers' build folders): then
    the program file alone."""
    programs = [w for w in argv[:1] if os.path.isabs(w)]
    if len(argv) > 1 and "--" in argv:  # prlimit … -- compiler …
        after = argv[argv.index("--") + 1 :]
        programs += [w for w in after[:1] if os.path.isabs(w)]
    for program in list(programs):
        programs += _interpreter(program)
    tmp = os.path.realpath(tempfile.gettempdir())
    found: list[str] = []
    for program in programs:
        for path in dict.fromkeys((program, os.path.realpath(program))):
            folder = os.path.dirname(path)
            if os.path.basename(folder) == "bin":
                folder = os.path.dirname(folder)
            for pick in (folder, os.path.dirname(path), path):
                if pick != "/" and not _inside(tmp, pick) and not _inside(pick, tmp):
                    found.append(pick)
                    break
            else:
                found.append(path)
    return list(dict.fromkeys(found))


def _interpreter(program: str) -> list[str]:
    """The interpreter of a ``#!`` script (absolute paths only), else nothing."""
    try:
        with open(program, "rb") as fh:
            head = fh.read(256)
    except OSError:
        return []
    if not head.startswith(b"#!"):
        return []
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    return [w for w in words[:1] if os.path.isabs(w)]


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def from_table(
    table: Mapping[str, Any] | None, private: Iterable[Path | str], where: str = "[sandbox]"
) -> Sandbox:
    """The daemon's sandbox: ``table`` is the config's ``[sandbox]`` table, ``private`` the
    daemon user's private folders (HOME, state, config, runtime, secret files' folders);
    namespaces are probed.

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
    hidden = _folders([*private, *_list(table, "hide", where)], outermost=False)
    allowed = _folders(_list(table, "allow", where), missing_ok=False, where=f"{where} allow")
    if "unshare" in table:
        log.warning(
            "%s unshare is no longer used: other users' compiles run in bubblewrap (bwrap)", where
        )
    box = Sandbox(
        limits,
        hidden,
        bwrap=_tool(table, "bwrap", where),
        prlimit=_tool(table, "prlimit", where),
        allowed=allowed,
    )
    if mode == "off":
        box.why_not = f"{where} namespaces = 'off'"
    elif box.bwrap is None:
        box.why_not = f"bubblewrap ({table.get('bwrap', 'bwrap')}) is not installed"
    else:
        box.isolated, box.why_not = _probe(box)
    if box.isolated:
        log.info(
            "other users' compiles run in an allow-list view (bwrap) hiding %s",
            ", ".join(hidden) or "-",
        )
    else:
        log.warning(
            "compiles run without a sandbox (%s): other users' compiles are refused", box.why_not
        )
    return box


def _list(table: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(h, str) for h in value):
        raise ConfigError(f"{where}: {key}={value!r} must be a list of folders")
    return value


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


def _folders(
    paths: Iterable[Path | str], missing_ok: bool = True, where: str = "", outermost: bool = True
) -> tuple[str, ...]:
    """Existing folders, links resolved, never ``/`` or a parent of the temp folder (build
    folders live there); with ``outermost``, none inside another. Hidden folders keep the
    inner ones: the state folder in ``~/.local/state`` must be covered where ``~/.local`` is
    shown though HOME is not.

    :raises ConfigError: with ``missing_ok`` False, for a path that is not such a folder
        (named with ``where``).
    """
    tmp = os.path.realpath(os.environ.get("TMPDIR") or "/tmp")
    found = set()
    for path in paths:
        real = os.path.realpath(str(path))
        if os.path.isdir(real) and real != "/" and not _inside(tmp, real):
            found.add(real)
        elif not missing_ok:
            raise ConfigError(
                f"{where}: {str(path)!r} is not a folder other than / and the temp folder's "
                "parents (their files would all be shown)"
            )
    if not outermost:
        return tuple(sorted(found))
    return tuple(sorted(p for p in found if not any(_inside(p, q) and p != q for q in found)))


def _probe(box: Sandbox) -> tuple[bool, str]:
    """Run ``true`` in the view as a compile for another user runs (same options and limits,
    started as :func:`.caps.start` starts every compiler process, working in a build folder
    of its own): does the view work here, with this process's capabilities, namespaces and
    system-call filter? A probe started otherwise said "works" (or "does not") for a view
    that real compiles did not get."""
    with tempfile.TemporaryDirectory(prefix="cachemgr-probe-") as work:
        argv = dataclasses.replace(box, isolated=True).wrap(["/bin/true"], Path(work))
        try:
            proc = caps.start(argv, work)
        except OSError as exc:
            return False, f"{box.bwrap} cannot run: {exc}"
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its process group, as a compile's
            proc.communicate()
            return False, f"{box.bwrap} did not finish within 30 s"
    if proc.returncode != 0:
        text = (stderr or stdout).decode("utf-8", "replace").strip().splitlines()
        why = text[-1] if text else f"exit {proc.returncode}"
        return False, f"bubblewrap cannot make its namespaces here: {why}"
    return True, ""
