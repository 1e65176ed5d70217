"""Run a real daemon the way ``systemd/cachemgr.service`` runs it, read from the unit file so
the two cannot drift apart: its capability sets and ``NoNewPrivileges=`` through ``setpriv``,
its ``RestrictAddressFamilies=`` and ``RestrictNamespaces=`` through a seccomp filter that a
small C program (built by the test with gcc) installs before it execs the daemon — as systemd
does: ``EAFNOSUPPORT`` for a ``socket()`` of another family, ``EPERM`` for an ``unshare``,
``clone`` or ``setns`` of another namespace, ``ENOSYS`` for ``clone3`` (whose flags a filter
cannot read). ``SystemCallFilter=`` is not emulated. Plus two probes run as compilers: the
capability sets of a process (``capdump``) and what it can connect to (``NETPROBE``).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

UNIT = ROOT / "systemd" / "cachemgr.service"

#: linux/sched.h
CLONE_NS = {
    "mnt": 0x00020000,
    "cgroup": 0x02000000,
    "uts": 0x04000000,
    "ipc": 0x08000000,
    "user": 0x10000000,
    "pid": 0x20000000,
    "net": 0x40000000,
    "time": 0x00000080,
}


def final_list(key: str, text: str | None = None) -> list[str]:
    """The words of a list setting of the unit after every assignment (an empty one resets
    it), in order."""
    words: list[str] = []
    for line in (text if text is not None else UNIT.read_text()).splitlines():
        if line.startswith(f"{key}="):
            more = line.split("=", 1)[1].split()
            words = [] if not more else [*words, *(w for w in more if w not in words)]
    assert not any(w.startswith("~") for w in words), f"{key}=~… is not translated: {words}"
    return words


def setting(key: str) -> str | None:
    """The last value of a single-valued setting of the unit, or None."""
    found = [
        ln.split("=", 1)[1] for ln in UNIT.read_text().splitlines() if ln.startswith(f"{key}=")
    ]
    return found[-1] if found else None


def capabilities() -> tuple[set[str], set[str]]:
    """The unit's ambient and bounding sets, as capability names (``CAP_FOWNER``)."""
    return set(final_list("AmbientCapabilities")), set(final_list("CapabilityBoundingSet"))


def setpriv_argv(user: str, group: str) -> list[str]:
    """``setpriv`` options that make a root process what systemd makes of ``User=user``,
    ``Group=group`` and the unit's capability settings: uid, primary group, the user's groups,
    the ambient capabilities (also inheritable, as systemd makes them), the bounding set,
    ``NoNewPrivileges=``."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    ambient, bounding = capabilities()

    def caps(names: set[str]) -> str:
        return ",".join(["-all", *sorted(f"+{n.removeprefix('CAP_').lower()}" for n in names)])

    argv = [setpriv, f"--reuid={user}", f"--regid={group}", "--init-groups"]
    argv += [f"--inh-caps={caps(ambient)}", f"--ambient-caps={caps(ambient)}"]
    argv += [f"--bounding-set={caps(bounding)}"]
    if setting("NoNewPrivileges") == "yes":
        argv.append("--no-new-privs")
    return [*argv, "--"]


GOVERNOR_UNIT = ROOT / "systemd" / "cachemgr-governor.service"


def root_setpriv_argv(unit: Path = GOVERNOR_UNIT) -> list[str]:
    """``setpriv`` options that make a root process what systemd makes of ``unit`` run as
    root (``User=root``): uid 0 kept, no inheritable or ambient capability, the unit's
    bounding set — so the ``exec`` that follows gets exactly those capabilities, as under
    systemd — and ``NoNewPrivileges=``."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    text = unit.read_text()
    bounding = final_list("CapabilityBoundingSet", text)
    caps = ",".join(["-all", *sorted(f"+{n.removeprefix('CAP_').lower()}" for n in bounding)])
    argv = [setpriv, "--inh-caps=-all", "--ambient-caps=-all", f"--bounding-set={caps}"]
    nnp = [ln for ln in text.splitlines() if ln.startswith("NoNewPrivileges=")]
    if nnp and nnp[-1].endswith("=yes"):
        argv.append("--no-new-privs")
    return [*argv, "--"]


def _bpf() -> list[str]:
    """The filter's instructions (C initialisers), jumps resolved from labels."""
    families = [int(getattr(socket, name)) for name in final_list("RestrictAddressFamilies")]
    allowed = sum(CLONE_NS[n] for n in final_list("RestrictNamespaces"))
    denied = sum(CLONE_NS.values()) & ~allowed
    ld = "BPF_LD|BPF_W|BPF_ABS"
    ret = "BPF_RET|BPF_K"
    prog: list[tuple[str, str, str, str, str]] = [  # (label, code, k, jump if true, if false)
        ("", ld, "offsetof(struct seccomp_data, arch)", "", ""),
        ("", "BPF_JMP|BPF_JEQ|BPF_K", "ARCH", "", "allow"),
        ("", ld, "offsetof(struct seccomp_data, nr)", "", ""),
        ("", "BPF_JMP|BPF_JEQ|BPF_K", "SYS_socket", "socket", ""),
        ("", "BPF_JMP|BPF_JEQ|BPF_K", "SYS_unshare", "flags", ""),
        ("", "BPF_JMP|BPF_JEQ|BPF_K", "SYS_clone", "flags", ""),
        ("", "BPF_JMP|BPF_JEQ|BPF_K", "SYS_setns", "setns", ""),
        ("", "BPF_JMP|BPF_JEQ|BPF_K", "SYS_clone3", "enosys", "allow"),
        ("socket", ld, "offsetof(struct seccomp_data, args[0])", "", ""),
        *(("", "BPF_JMP|BPF_JEQ|BPF_K", str(f), "allow", "") for f in families),
        ("", ret, "SECCOMP_RET_ERRNO|EAFNOSUPPORT", "", ""),
        ("flags", ld, "offsetof(struct seccomp_data, args[0])", "", ""),
        ("", "BPF_JMP|BPF_JSET|BPF_K", hex(denied), "eperm", "allow"),
        ("setns", ld, "offsetof(struct seccomp_data, args[1])", "", ""),
        ("", "BPF_JMP|BPF_JEQ|BPF_K", "0", "eperm", ""),
        ("", "BPF_JMP|BPF_JSET|BPF_K", hex(denied), "eperm", "allow"),
        ("eperm", ret, "SECCOMP_RET_ERRNO|EPERM", "", ""),
        ("enosys", ret, "SECCOMP_RET_ERRNO|ENOSYS", "", ""),
        ("allow", ret, "SECCOMP_RET_ALLOW", "", ""),
    ]
    at = {label: i for i, (label, *_) in enumerate(prog) if label}
    out = []
    for i, (_, code, k, yes, no) in enumerate(prog):
        if code.startswith("BPF_JMP"):
            jt = at[yes] - i - 1 if yes else 0
            jf = at[no] - i - 1 if no else 0
            out.append(f"BPF_JUMP({code}, {k}, {jt}, {jf})")
        else:
            out.append(f"BPF_STMT({code}, {k})")
    return out


RESTRICT_C = """
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#error "no architecture"
#endif
int main(int argc, char **argv) {
  struct sock_filter f[] = { %s };
  struct sock_fprog p = {sizeof f / sizeof f[0], f};
  if (argc < 2) return 2;
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p)) {
    perror("seccomp"); return 1;
  }
  execvp(argv[1], argv + 1);
  perror(argv[1]);
  return 127;
}
"""

CAPDUMP_C = """
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/capability.h>
int main(void) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];
  unsigned long long bnd = 0, amb = 0;
  if (syscall(SYS_capget, &h, d) != 0) { perror("capget"); return 1; }
  for (int c = 0; c < 64; c++) {
    if (prctl(PR_CAPBSET_READ, c, 0, 0, 0) == 1) bnd |= 1ULL << c;
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, c, 0, 0) == 1) amb |= 1ULL << c;
  }
  printf("CapInh=%llx CapPrm=%llx CapEff=%llx CapBnd=%llx CapAmb=%llx\\n",
         (unsigned long long)d[1].inheritable << 32 | d[0].inheritable,
         (unsigned long long)d[1].permitted << 32 | d[0].permitted,
         (unsigned long long)d[1].effective << 32 | d[0].effective, bnd, amb);
  return 0;
}
"""


def _build(source: str, out: Path) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run([gcc, "-O2", "-o", str(out), str(src)], check=True, capture_output=True)
    out.chmod(0o755)
    return out


def restrict_helper(folder: Path) -> Path:
    """A program that execs its arguments under the unit's address-family and namespace
    restrictions (module docstring)."""
    return _build(RESTRICT_C % ",\n    ".join(_bpf()), folder / "restrict")


def capdump(folder: Path) -> Path:
    """A program printing its capability sets in one line: ``CapInh=… CapPrm=… CapEff=…
    CapBnd=… CapAmb=…`` (hex), from ``capget`` and ``prctl`` (the view has no ``/proc``)."""
    return _build(CAPDUMP_C, folder / "capdump")


def cap_sets(line: str) -> dict[str, int]:
    """``capdump``'s line, or a ``/proc/<pid>/status``, as ``{"CapEff": bits, ...}``."""
    found = {}
    for word in line.replace(":\t", "=").split():
        name, _, value = word.partition("=")
        if name.startswith("Cap") and value:
            found[name] = int(value, 16)
    return found


def cap_bit(name: str) -> int:
    """The bit of capability ``name`` (``CAP_FOWNER``) in a set (linux/capability.h)."""
    numbers = {"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_DAC_READ_SEARCH": 2, "CAP_FOWNER": 3}
    assert name in numbers, f"{name}: add its number to tests/unit_util.py"
    return 1 << numbers[name]


#: A program run as the compiler: connects to each ``kind:address`` of its arguments and
#: prints one line per target, ``<target> connected`` or ``<target> refused: <why>``.
NETPROBE = """
import socket, sys
for target in sys.argv[1:]:
    kind, _, where = target.partition(":")
    try:
        if kind == "tcp":
            host, _, port = where.rpartition(":")
            s = socket.create_connection((host, int(port)), timeout=3)
        else:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(3)
            s.connect("\\0" + where if kind == "abstract" else where)
        s.close()
        print(target, "connected")
    except OSError as exc:
        print(target, "refused:", exc)
"""


def unit_umask() -> int:
    """The unit's ``UMask=`` (octal)."""
    value = setting("UMask")
    assert value is not None, f"{UNIT} has no UMask="
    return int(value, 8)


def unit_wrapper(folder: Path, user: str, group: str, program: str) -> Path:
    """An executable (world-readable) script that runs ``program "$@"`` with the unit's
    umask and credentials — what a test hands ``start_daemon`` as its ``python``."""
    script = folder / f"as-unit-{user}.sh"
    argv = " ".join(setpriv_argv(user, group))
    script.write_text(f'#!/bin/sh\numask {unit_umask():04o}\nexec {argv} {program} "$@"\n')
    script.chmod(0o755)
    return script
