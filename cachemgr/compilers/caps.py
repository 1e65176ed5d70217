"""Compiler processes hold no capability, while the daemon keeps its own.

The systemd unit gives the daemon ``CAP_FOWNER`` as an *ambient* capability
(``AmbientCapabilities=CAP_FOWNER``, docs/interop.md#what-it-needs): the daemon uses it to give
the files CANN writes ``0640``/``0750`` back to the group, and its gc child (a Python it starts)
needs it too. An ambient capability is handed to every program the process starts, so every
compiler got ``CAP_FOWNER`` as well — and bubblewrap, which refuses to run with a capability it
was not installed setuid for (``bwrap: Unexpected capabilities but not setuid``), refused every
compile for another user (docs/security.md#the-systemd-unit).

:func:`start` therefore starts each compiler process (bubblewrap, ``prlimit``, the compiler)
from a thread whose *inheritable* and *ambient* sets are empty for that moment: by the exec
rules of capabilities(7) a program without file capabilities, started by a non-root user,
then gets empty permitted, effective and ambient sets. The thread's sets are put back right
after the start. Capabilities belong to a thread, not to the process (capset(2), prctl(2)
``PR_CAP_AMBIENT``), so no other thread of the daemon ever lacks ``CAP_FOWNER`` meanwhile, and the
child is started with ``vfork`` as before (a ``preexec_fn`` would make CPython ``fork`` the whole
daemon, and run Python in a child of a threaded process). Lowering the inheritable set needs no
privilege; raising it again needs the capability in the permitted set (kept), and raising an
ambient one needs it in the permitted and inheritable sets — all of which
``NoNewPrivileges=yes`` leaves alone (it acts on ``execve`` only).

The bounding set cannot be lowered here: ``PR_CAPBSET_DROP`` needs ``CAP_SETPCAP``, which the
unit rightly does not give (``setpriv --bounding-set=-all`` then does nothing, silently). It
grants nothing by itself: it only caps what an ``execve`` may add from file capabilities or a
setuid program, and ``NoNewPrivileges=yes`` adds nothing. In the view, bubblewrap empties it
too (``--cap-drop ALL`` in its own user namespace, where it holds ``CAP_SETPCAP``).

As root (``serve --allow-root``) the exec rules give a program every capability whatever these
sets hold; bubblewrap then drops them all in the view (``--cap-drop ALL``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

log = logging.getLogger(__name__)

#: linux/capability.h: the 64-bit capability sets, as two 32-bit words.
_VERSION_3 = 0x20080522
#: linux/prctl.h
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_RAISE = 2
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_PR_CAP_AMBIENT_IS_SET = 1


class _Header(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _Data(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


_Sets = _Data * 2


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, loaded on first use: the symbols of this process (Python links it),
    never ``ctypes.util.find_library``, which runs ``ldconfig -p`` (a process on every CLI
    hit, and ~10 ms)."""
    try:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.capget, lib.capset, lib.prctl  # noqa: B018 (AttributeError: not a Linux libc)
        return lib
    except (OSError, AttributeError):  # no capabilities to speak of
        return None


def _get() -> tuple[_Header, ctypes.Array[_Data]] | None:
    """This thread's capability sets, or None where they cannot be read."""
    libc = _libc()
    if libc is None:
        return None
    head, sets = _Header(_VERSION_3, 0), _Sets()
    if libc.capget(ctypes.byref(head), sets) != 0:
        return None
    return head, sets


def _word(sets: ctypes.Array[_Data], name: str) -> int:
    return int(getattr(sets[0], name)) | int(getattr(sets[1], name)) << 32


def _set_inheritable(head: _Header, sets: ctypes.Array[_Data], value: int) -> bool:
    sets[0].inheritable, sets[1].inheritable = value & 0xFFFFFFFF, value >> 32
    libc = _libc()
    return libc is not None and libc.capset(ctypes.byref(head), sets) == 0


@contextlib.contextmanager
def none_inherited() -> Iterator[None]:
    """Within the block, a program this thread starts gets no capability (see the module
    docstring); the thread's inheritable and ambient sets are put back after it. Nothing to do
    (and nothing done) when the inheritable set is already empty — then the ambient set is
    too, being a subset of it — as for a daemon without ``AmbientCapabilities=``.

    Cannot fail: a set that could not be put back (never seen) is one warning line, and only
    costs this thread's later children (the gc child) the capability.
    """
    found = _get()
    inheritable = _word(found[1], "inheritable") if found else 0
    if found is None or not inheritable:
        yield
        return
    head, sets = found
    libc = _libc()
    if libc is None:  # (found: never; for the type checker)
        yield
        return
    ambient = [
        cap
        for cap in range(64)
        if inheritable >> cap & 1
        and libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_IS_SET, cap, 0, 0) == 1
    ]
    _set_inheritable(head, sets, 0)  # the kernel drops ambient bits outside it
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    try:
        yield
    finally:
        back = _set_inheritable(head, sets, inheritable)
        for cap in ambient:
            back = back and libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE, cap, 0, 0) == 0
        if not back:
            log.warning(
                "could not put back this thread's inheritable/ambient capabilities (%s): "
                "programs it starts later lack them",
                ctypes.get_errno(),
            )


def start(
    argv: list[str], cwd: Path | str | None, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` as every compiler process starts: holding no capability
    (:func:`none_inherited`), in a process group of its own (its pid), stdin ``/dev/null``,
    stdout and stderr piped, working in ``cwd``, with environment ``env`` (None: this
    process's).

    :raises OSError: ``argv[0]`` cannot be run.
    """
    with none_inherited():
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            process_group=0,
        )
