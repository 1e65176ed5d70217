"""Direct mode: a ``cachemgr compile REQUEST`` hit answered without the compile path's
modules (docs/performance.md#direct-mode-a-cli-hit-without-the-compile-path), the way
ccache's direct mode answers from a manifest without running the preprocessor
(https://ccache.dev/manual/latest.html#_the_direct_mode).

Standard library only (no click, no dataclasses, no pathlib): :func:`answer` is what
:mod:`cachemgr.main` runs first for a ``compile``; it writes nothing unless every check
below holds, and returns False (the click CLI then runs with the same ``argv``) on any doubt.

**The memo.** Whenever the full path answers a plain hit (default verbosity, the local
route, no warning, one request), :mod:`cachemgr.cli.directrecord` writes a *direct memo*
named by :func:`fingerprint`: a digest of everything this module cannot re-derive cheaply —
``argv``, the current folder, the whole environment, the user and groups, the host name and
cachemgr's version. Any difference gives another name: no memo, the full path. The memo
lists what the full path's key and decision were computed from, and this module re-checks
each one before it answers:

* each request path still resolving (``realpath``) to the file the run read, whose folder is
  the base of every relative path in the request, and that file's bytes (SHA-256 of the
  bytes the run parsed);
* every file the full path read to decide: the kernel source and each header (SHA-256, as
  the header manifest records them), the config file and ``op_cache.ini`` (the bytes the
  run parsed, or their absence), the compiler identity file, the header manifest itself;
* the places searched in vain (still no file there, as a hit checks:
  docs/design.md#keys-and-manifests);
* the compiler: every file it runs, and every ``PATH`` folder with the compiler's name in
  it (status: device, inode, size, modification and change times), so a compiler replaced
  or put earlier on ``PATH`` is a fall-through;
* no daemon socket at the default path (the full path would route through it);
* the entry as a hit verifies it (docs/design.md#writing-and-reading-an-entry): its json's
  bytes are the ones the full path verified, every binary's SHA-256 is the one its json
  names, no part a link, a hard link or not a regular file.

**Trust.** Memos live in the user's own cache folder
(``$XDG_CACHE_HOME/cachemgr/direct``, beside the compiler identity file), never in the
shared cache: a memo is read only from a folder and a file owned by this user that nobody
else may write, opened without following a link and capped in size; so no other user can
plant one to redirect a hit. A memo is only an index: the entry's own digests are verified
each time. One that names an entry gone (evicted, purged) is a fall-through; the full path
then writes a new one. The folder is bounded (:data:`MAX_MEMOS`).

**Effects**, identical to the full path's: the entry's files get their access time set to
now (``utimensat(UTIME_NOW)``, as :func:`cachemgr.storage.noatime.touch_atime`), the hit is
counted in ``<kernel cache>/cachemgr_stats_<soc>.json`` under ``cachemgr_stats.lock``
(docs/design.md#counters), and the same line (or ``--json`` object) is printed.
"""

from __future__ import annotations

import errno
import marshal
import os
import stat
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: typing costs ~2.5 ms of start-up
    from typing import Any

#: The memo's format (a memo of another format is not read).
FORMAT = 2
#: A memo's file name: ``<fingerprint><MEMO_SUFFIX>``. Its content is :mod:`marshal`'s (a
#: dict of strings, numbers and lists, written and read by the same interpreter version:
#: the fingerprint holds it): built in, where :mod:`json` imports :mod:`re` (~3 ms).
MEMO_SUFFIX = ".memo"
#: The largest memo read (bytes).
MAX_MEMO_BYTES = 256 * 1024
#: Memos kept in the folder; the oldest go when a new one is written beyond it.
MAX_MEMOS = 512
#: The largest input file hashed here (bytes), as the compile path's own limit.
MAX_INPUT_BYTES = 64 << 20
#: The largest entry json and binary read (bytes), as the entry readers' limits.
MAX_JSON_BYTES = 4 << 20
MAX_BINARY_BYTES = 1 << 30
#: The stats files: their lock, their largest size (bytes), and the new files' mode.
STATS_LOCK = "cachemgr_stats.lock"
MAX_STATS_BYTES = 64 * 1024
STATS_LOCK_WAIT_S = 2.0  # cachemgr.storage.counters.RUN_END_WAIT_S (tests hold them equal)
_KERNEL_BIN_SUFFIXES = (".o", ".so")
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


#: Data up to this size (bytes) is hashed with the interpreter's own SHA-256 (no OpenSSL to
#: load: ~2.5 ms of start-up); more with OpenSSL's, faster per byte. Same digests.
SMALL_HASH_BYTES = 1 << 20


def sha256(size: int = 0) -> Any:
    """A new SHA-256 object for about ``size`` bytes (see :data:`SMALL_HASH_BYTES`)."""
    if size <= SMALL_HASH_BYTES:
        try:
            from _sha256 import sha256 as small  # type: ignore[import-not-found]  # 3.11
        except ImportError:
            try:
                from _sha2 import sha256 as small  # type: ignore[import-not-found]  # 3.12+
            except ImportError:
                small = None
        if small is not None:
            return small()
    import hashlib

    return hashlib.sha256()


def sha256_hex(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    digest = sha256(len(data))
    digest.update(data)
    return str(digest.hexdigest())


class Decline(Exception):
    """Something differs from the memo, or cannot be checked: the full path answers."""


class Answered(Exception):
    """The daemon was asked and answered otherwise than the memo's hit (or the connection
    failed once the request was sent): the full path's code reports that answer — the
    request is never sent twice.

    :ivar memo: the memo the request came from; ``code`` the HTTP status (None when the
        connection failed: ``error``), ``raw`` the answer's body.
    """

    def __init__(
        self, memo: dict[str, Any], code: int | None, raw: bytes, error: BaseException | None
    ) -> None:
        super().__init__("answered")
        self.memo, self.code, self.raw, self.error = memo, code, raw, error


def memo_dir(env: Any = None) -> str:
    """``$XDG_CACHE_HOME/cachemgr/direct`` (default ``~/.cache/cachemgr/direct``)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cachemgr", "direct")


def fingerprint(argv: list[str], version: str) -> str:
    """Hex SHA-256 of what the memo cannot re-check: ``argv``, the current folder, the whole
    environment (but ``$_``, the shell's name of the program it ran: ``cachemgr`` or
    ``python``, read by nobody), the effective user and groups, the host's short name,
    cachemgr's ``version`` and the interpreter's."""
    from cachemgr.constants import short_host

    doc = [
        FORMAT,
        version,
        sys.implementation.cache_tag,
        argv,
        os.getcwd(),
        sorted(item for item in os.environ.items() if item[0] != "_"),
        os.geteuid(),
        os.getegid(),
        sorted(os.getgroups()),
        short_host(),
    ]
    return sha256_hex(repr(doc).encode("utf-8", "surrogateescape"))


def file_state(path: str) -> list[int] | None:
    """``[dev, ino, size, mtime_ns, ctime_ns]`` of ``path`` (links followed), None when it
    cannot be found."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def folder_mode(path: str) -> list[int] | None:
    """``[uid, gid, mode]`` of ``path`` itself (no link followed), None when it cannot be
    found: what decides whether this user may write the cache there."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return [st.st_uid, st.st_gid, st.st_mode]


def input_digest(path: str) -> str | None:
    """Hex SHA-256 of the regular file ``path`` (opened non-blocking, at most
    :data:`MAX_INPUT_BYTES`), None when it cannot be read so."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_INPUT_BYTES:
            return None
        digest, total = sha256(st.st_size), 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > MAX_INPUT_BYTES:
                return None
            digest.update(chunk)
        return str(digest.hexdigest())
    except OSError:
        return None
    finally:
        os.close(fd)


def on_disk(path: str) -> bool:
    """True when the compiler would open ``path`` as a header: it exists (links followed,
    as the compiler's ``open`` does) and is no folder (gcc skips a folder and searches on);
    a path that cannot be checked (no permission) counts as existing (its compile fails
    or differs: never assume it away). :mod:`cachemgr.compile.searched` uses this one."""
    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True


# --- reading -----------------------------------------------------------------------------


def _private_read(folder: str, name: str) -> bytes:
    """The bytes of ``folder/name`` when both are this user's and nobody else may write them.

    :raises Decline: anything else.
    """
    try:
        dfd = os.open(folder, _DIR)
    except OSError:
        raise Decline("no memo folder") from None
    try:
        dst = os.fstat(dfd)
        if dst.st_uid != os.geteuid() or dst.st_mode & 0o022:
            raise Decline("memo folder not private")
        return read_at(dfd, name, MAX_MEMO_BYTES, owner=os.geteuid())
    finally:
        os.close(dfd)


def read_at(dfd: int, name: str, cap: int, owner: int | None = None) -> bytes:
    """A regular file of one name (no link, no hard link) in the open folder ``dfd``, read
    without changing its access time where allowed, at most ``cap`` bytes.

    :raises Decline: missing, of another kind, too big, of another owner (``owner``).
    """
    fd = _open_at(dfd, name, cap)
    try:
        st = os.fstat(fd)
        if owner is not None and (st.st_uid != owner or st.st_mode & 0o022):
            raise Decline(f"{name}: not private")
        chunks, total = [], 0
        while chunk := os.read(fd, min(1 << 20, cap + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > cap:
                raise Decline(f"{name}: too big")
        return b"".join(chunks)
    except OSError:
        raise Decline(f"{name}: unreadable") from None
    finally:
        os.close(fd)


def _open_at(dfd: int, name: str, cap: int) -> int:
    """Open ``name`` in ``dfd`` as the entry readers do (``O_NOATIME`` when allowed, no
    link followed, never blocking); a regular file of one name and at most ``cap`` bytes.

    :raises Decline: anything else (including a read that would have to restore atimes).
    """
    if "/" in name or name in ("", ".", ".."):
        raise Decline(f"{name}: not a plain name")
    try:
        fd = os.open(name, _READ | getattr(os, "O_NOATIME", 0), dir_fd=dfd)
    except OSError:
        raise Decline(f"{name}: cannot open") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size > cap:
        os.close(fd)
        raise Decline(f"{name}: not a plain file")
    return fd


def _sha256_at(dfd: int, name: str) -> tuple[str, int]:
    """Hex SHA-256 and size of the entry file ``name`` in the open chip folder ``dfd``.

    :raises Decline: as :func:`_open_at`.
    """
    fd = _open_at(dfd, name, MAX_BINARY_BYTES)
    try:
        digest, size = sha256(os.fstat(fd).st_size), 0
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
            size += len(chunk)
            if size > MAX_BINARY_BYTES:
                raise Decline(f"{name}: too big")
        return str(digest.hexdigest()), size
    except OSError:
        raise Decline(f"{name}: unreadable") from None
    finally:
        os.close(fd)


def open_kernel_cache(kcache: str) -> int:
    """``<root>/kernel_cache`` opened as :meth:`cachemgr.storage.safedir.SafeDir.open_kernel_cache`
    does: the root as configured, ``kernel_cache`` without following a link.

    :raises Decline: either missing, a link, not a folder.
    """
    try:
        fd = os.open(os.path.dirname(kcache), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        raise Decline("no cache root") from None
    try:
        return os.open(os.path.basename(kcache), _DIR, dir_fd=fd)
    except OSError:
        raise Decline("no kernel cache folder") from None
    finally:
        os.close(fd)


def open_below(dfd: int, name: str) -> int:
    """The folder ``name`` of the open folder ``dfd``, no link followed.

    :raises Decline: missing, a link, not a folder.
    """
    try:
        return os.open(name, _DIR, dir_fd=dfd)
    except OSError:
        raise Decline(f"no folder {name}") from None


def open_chip(chip_dir: str) -> int:
    """``<root>/kernel_cache/<soc>`` opened as :meth:`cachemgr.storage.safedir.SafeDir.open_chip`
    does: the root as configured, each part below without following a link.

    :raises Decline: a part missing, a link, not a folder.
    """
    kfd = open_kernel_cache(os.path.dirname(chip_dir))
    try:
        return open_below(kfd, os.path.basename(chip_dir))
    finally:
        os.close(kfd)


# --- the checks --------------------------------------------------------------------------


def load(argv: list[str], version: str) -> dict[str, Any]:
    """The memo for ``argv`` run here now.

    :raises Decline: none, not private, unreadable, of another format.
    """
    name = fingerprint(argv, version) + MEMO_SUFFIX
    try:
        memo = marshal.loads(_private_read(memo_dir(), name))
    except (ValueError, EOFError, TypeError):
        raise Decline("memo unreadable") from None
    if not isinstance(memo, dict) or memo.get("format") != FORMAT:
        raise Decline("memo of another format")
    return memo


def check_inputs(memo: dict[str, Any]) -> None:
    """Every file, place, compiler and socket the memo names is as it was recorded.

    :raises Decline: one differs (or the memo is malformed).
    """
    try:
        for path, digest in memo["files"]:
            if digest is None:
                if os.path.lexists(path):
                    raise Decline(f"{path} appeared")
            elif input_digest(path) != digest:
                raise Decline(f"{path} changed")
        for path in memo["absent"]:
            if on_disk(path):
                raise Decline(f"{path} appeared")
        for files, absent in memo["earlier"]:  # the manifest's first match wins
            if all(input_digest(f) == d for f, d in files) and not any(map(on_disk, absent)):
                raise Decline("an earlier variant of the header manifest matches now")
        for path, state in memo["stats"]:
            if file_state(path) != state:
                raise Decline(f"{path} changed")
        for path, owner_mode in memo["modes"]:
            if folder_mode(path) != owner_mode:
                raise Decline(f"{path}: owner or mode changed")
        for link, real in memo["links"]:
            if os.path.realpath(link) != real:
                raise Decline(f"{link} points elsewhere")
        socket = memo["socket"]
        if memo["route"] == "local" and socket is not None and os.path.lexists(socket):
            raise Decline("a daemon socket is there")
    except (TypeError, ValueError, KeyError):
        raise Decline("memo malformed") from None


def check_entry(memo: dict[str, Any], dfd: int) -> list[str]:
    """The entry's part names in the order a hit lists them (json, sub-jsons, binaries, the
    header when present), once each part is verified.

    :raises Decline: a part differs from what the full path verified.
    """
    try:
        kernel, jsons, binaries, header = (
            memo["kernel"],
            memo["jsons"],
            memo["binaries"],
            memo["header"],
        )
        for name, digest in jsons:
            blob = read_at(dfd, name, MAX_JSON_BYTES)
            if sha256_hex(blob) != digest:
                raise Decline(f"{name} changed")
        for name, digest in binaries:
            actual, size = _sha256_at(dfd, name)
            if actual != digest or (not size and name.endswith(_KERNEL_BIN_SUFFIXES)):
                raise Decline(f"{name} does not match")
        manifest = memo["manifest"]
        if manifest is not None:
            name, digest = manifest
            if sha256_hex(read_at(dfd, name, MAX_JSON_BYTES)) != digest:
                raise Decline("header manifest changed")
        names = [n for n, _ in jsons] + [n for n, _ in binaries]
        if not names or names[0] != kernel + ".json":
            raise Decline("memo malformed")
    except (TypeError, ValueError, KeyError):
        raise Decline("memo malformed") from None
    if header:
        try:
            os.lstat(header, dir_fd=dfd)
            names.append(header)
        except FileNotFoundError:
            pass
        except OSError:
            raise Decline("header unknown") from None
    return names


def check_requests(memo: dict[str, Any]) -> None:
    """Each request path resolves, as the full path resolves it (``realpath``: every link
    followed, relative to the current folder), to the file the memo was recorded from —
    whose folder is the base of every relative path in the request — and that file holds
    the bytes the recorded run parsed. A link on the way flipped (``current -> v2``, a
    request file that is a link) is a fall-through even when the bytes are the same.

    :raises Decline: one resolves elsewhere or changed.
    """
    try:
        for given, real, digest in memo["requests"]:
            if os.path.realpath(given) != real:
                raise Decline(f"request {given} resolves elsewhere now")
            if input_digest(real) != digest:
                raise Decline(f"request {given} changed")
    except (TypeError, ValueError, KeyError):
        raise Decline("memo malformed") from None


# --- effects -----------------------------------------------------------------------------


def _lock_stats(kfd: int) -> int:
    """The stats lock of the open kernel cache folder ``kfd``, taken (fcntl record lock, as
    :class:`cachemgr.storage.locks.FcntlLock`: the file checked to be the one locked).

    :raises Decline: the lock file is missing or odd, or stayed busy.
    """
    import fcntl

    deadline = time.monotonic() + STATS_LOCK_WAIT_S
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    while True:
        try:
            fd = os.open(STATS_LOCK, flags, dir_fd=kfd)
        except OSError:
            raise Decline("no stats lock file") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            raise Decline("odd stats lock file")
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                raise Decline("stats lock busy") from None
            time.sleep(0.005)
            continue
        now = file_state_nofollow(STATS_LOCK, kfd)
        if now is not None and now[:2] == [st.st_dev, st.st_ino]:
            return fd
        os.close(fd)  # replaced while we waited: lock the new one


def file_state_nofollow(path: str, dir_fd: int | None = None) -> list[int] | None:
    """``[dev, ino]`` of ``path`` itself (no link followed; relative to the open folder
    ``dir_fd`` when given), None when gone."""
    try:
        st = os.lstat(path, dir_fd=dir_fd)
    except OSError:
        return None
    return [st.st_dev, st.st_ino]


def read_stats(path: str, dir_fd: int | None = None) -> dict[str, int]:
    """The counters of one stats file (``path`` relative to the open folder ``dir_fd`` when
    given), as :func:`cachemgr.storage.counters._read` takes them; a file that reader would
    warn about is a decline (its warning is the full path's).

    :raises Decline: too big, unreadable, damaged.
    """
    try:
        fd = os.open(path, _READ | getattr(os, "O_NOATIME", 0), dir_fd=dir_fd)
    except FileNotFoundError:
        return {}
    except OSError:
        raise Decline("stats file unreadable") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_STATS_BYTES:
            raise Decline("odd stats file")
        raw = os.read(fd, MAX_STATS_BYTES + 1)
    except OSError:
        raise Decline("stats file unreadable") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_STATS_BYTES:
        raise Decline("stats file too big")
    counts = parse_counts(raw)
    if counts is None:
        raise Decline("stats file not in the form cachemgr writes")
    return counts


def parse_counts(raw: bytes) -> dict[str, int] | None:
    """The counters of a stats file in exactly the form :func:`dump_counts` (and so
    :func:`cachemgr.storage.counters._write`: ``json.dumps`` with sorted keys) writes —
    ``{"name": 12, ...}``, names of letters, digits and ``_``, values ``0 <= v < 2**63`` —
    else None (the full path's JSON reader then takes it, and words any warning). Without
    :mod:`json`, which imports :mod:`re`."""
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    if not (text.startswith("{") and text.endswith("}")):
        return None
    counts: dict[str, int] = {}
    body = text[1:-1]
    for item in body.split(", ") if body else []:
        name, sep, value = item.partition(": ")
        key = name[1:-1]
        plain = name.startswith('"') and name.endswith('"') and key.replace("_", "a").isalnum()
        if not sep or not plain or not value.isdigit() or key in counts:
            return None
        if (value != "0" and value.startswith("0")) or int(value) >= 2**63:
            return None
        counts[key] = int(value)
    if dump_counts(counts) != raw:
        return None
    return counts


def dump_counts(counts: dict[str, int]) -> bytes:
    """``json.dumps(counts, sort_keys=True).encode()`` for names of letters, digits and
    ``_`` and integer values (the stats files' form)."""
    inner = ", ".join(f'"{k}": {int(v)}' for k, v in sorted(counts.items()))
    return ("{" + inner + "}").encode("ascii")


def _write_stats(kfd: int, name: str, values: dict[str, int]) -> None:
    """Replace the stats file ``name`` of the open kernel cache folder ``kfd`` atomically (a
    temp beside it, renamed), with that folder's shared mode
    (:func:`cachemgr.storage.modes.file_mode_in`).

    :raises OSError: the write failed (nothing is left behind).
    """
    from cachemgr.constants import shared_file_mode, short_host

    data = dump_counts(values)
    mode = shared_file_mode(os.fstat(kfd).st_mode)
    token = os.urandom(4).hex()
    tmp = f"{name}.{short_host()}.{os.getpid()}.{token}.temp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode, dir_fd=kfd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=kfd, dst_dir_fd=kfd)
    except BaseException:
        try:  # noqa: SIM105 (contextlib costs start-up)
            os.unlink(tmp, dir_fd=kfd)
        except OSError:
            pass
        raise


def _touch(dfd: int, names: list[str]) -> None:
    """Access time to the filesystem's now, modification time kept, for each part, as
    :func:`cachemgr.storage.noatime.touch_atime` (``utimensat`` with ``UTIME_NOW`` and
    ``UTIME_OMIT``; another user's file we may write: both to now).

    :raises Decline: a part gone or a read-only filesystem (the full path's warning).
    """
    utimensat = utimensat_now()
    for name in names:
        if utimensat(dfd, os.fsencode(name)) == 0:
            continue
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            os.utime(name, ns=(time.time_ns(), st.st_mtime_ns), dir_fd=dfd, follow_symlinks=False)
        except PermissionError:
            if st.st_uid == os.geteuid():
                raise Decline(f"{name}: cannot set its access time") from None
            try:
                os.utime(name, None, dir_fd=dfd, follow_symlinks=False)
            except PermissionError:
                continue  # another user's file: the full path skips it too
            except OSError:
                raise Decline(f"{name}: cannot set its access time") from None
        except OSError:
            raise Decline(f"{name}: cannot set its access time") from None


_UTIME_NOW, _UTIME_OMIT, _AT_SYMLINK_NOFOLLOW = (1 << 30) - 1, (1 << 30) - 2, 0x100


def utimensat_now() -> Any:
    """``f(dir_fd, name)``: the C library's ``utimensat(dir_fd, name, {UTIME_NOW,
    UTIME_OMIT}, AT_SYMLINK_NOFOLLOW)``, returning its result (0: done). Called through
    ``_ctypes`` itself with the ``struct timespec[2]`` packed by :mod:`struct`: the
    ``ctypes`` package costs ~2 ms to import, most of this path's own start-up; ``ctypes``
    where that is not available. A function that always returns -1 (the caller then sets
    the time itself) when neither is."""
    import struct

    times = struct.pack("@llll", 0, _UTIME_NOW, 0, _UTIME_OMIT)
    try:
        import _ctypes

        address = _ctypes.dlsym(_ctypes.dlopen(None), "utimensat")  # type: ignore[arg-type]
        call = _ctypes.call_function
        return lambda fd, name: call(address, (fd, name, times, _AT_SYMLINK_NOFOLLOW))
    except (ImportError, AttributeError, OSError):
        pass
    try:
        import ctypes

        func = ctypes.CDLL(None, use_errno=True).utimensat
    except (ImportError, AttributeError, OSError):
        return lambda fd, name: -1
    return lambda fd, name: func(fd, name, times, _AT_SYMLINK_NOFOLLOW)


# --- the answer --------------------------------------------------------------------------


def answer(
    argv: list[str], version: str, through: Any = None
) -> tuple[list[tuple[bool, str]], int] | None:
    """Answer the ``compile`` command ``argv`` (without the program name) from its memo:
    the lines to print (``(to stderr, text)``) and the exit code, the hit's effects done;
    None when it cannot be answered here (then nothing was written). A memo of a hit through
    the daemon goes to ``through(memo)`` (:func:`cachemgr.directwire.answer`) once its
    checks hold; without it, such a memo is declined.

    :raises Answered: from ``through``.
    """
    start = time.monotonic()
    try:
        memo = load(argv, version)
        check_requests(memo)
        check_inputs(memo)
        if memo["route"] == "daemon":
            return None if through is None else through(memo)
        chip_dir, kcache = memo["chip_dir"], memo["kernel_cache"]
        if os.path.dirname(chip_dir) != kcache:
            raise Decline("memo malformed")
        soc = os.path.basename(chip_dir)
        # every effect relative to the folders walked: a link swapped in after the walk is
        # never followed (docs/security.md, item 1)
        kfd = open_kernel_cache(kcache)
        try:
            dfd = open_below(kfd, soc)
            try:
                names = check_entry(memo, dfd)
                if not _count_hit(kfd, soc, dfd, names):
                    return None  # the full path keeps it pending and warns; it answers
            finally:
                os.close(dfd)
        finally:
            os.close(kfd)
        return [(False, _line(memo, names, time.monotonic() - start))], 0
    except (Decline, OSError, KeyError, TypeError, ValueError):
        return None


def _count_hit(kfd: int, soc: str, dfd: int, names: list[str]) -> bool:
    """The hit's effects: the parts' access times (in the chip folder ``dfd``) and one more
    ``hits`` in ``cachemgr_stats_<soc>.json`` of the kernel cache folder ``kfd``, under its
    stats lock. False when the stats file could not be written.

    :raises Decline: the stats lock or file is odd, or a part's access time cannot be set.
    """
    lock = _lock_stats(kfd)
    try:
        name = f"cachemgr_stats_{soc}.json"
        values = read_stats(name, kfd)
        _touch(dfd, names)
        values["hits"] = values.get("hits", 0) + 1
        try:
            _write_stats(kfd, name, values)
        except OSError:
            return False
        return True
    finally:
        os.close(lock)


def _line(memo: dict[str, Any], names: list[str], seconds: float) -> str:
    """The hit's report: ``compile``'s text line, or its ``--json`` object."""
    chip_dir, kernel = memo["chip_dir"], memo["kernel"]
    doc = memo.get("doc")
    if isinstance(doc, dict):
        doc = dict(doc)
        doc["files"] = [os.path.join(chip_dir, n) for n in names]
        doc["seconds"] = round(seconds, 6)
        import json  # only for --json: it imports re

        return json.dumps(doc, ensure_ascii=False)
    parts = " ".join(n.removeprefix(kernel) for n in names)
    return hit_line(kernel, seconds, chip_dir, parts)


#: ``Status.HIT`` of :mod:`cachemgr.compile.results`, spelled here: the direct path loads no
#: results module (tests/test_results.py holds the two equal).
HIT = "hit"


def hit_line(kernel: str, seconds: float, folder: str, parts: str) -> str:
    """The text line of a hit, as ``cachemgr.cli.compile_cmd`` prints it (``seconds`` of
    wall time; ``parts`` the entry's file names without the kernel name, space-separated)."""
    return f"{HIT:8} {kernel}  {seconds:.3f}s  {folder}/ {parts}"


def out_of_reach() -> bool:
    """True when the full path would print differently through click: stdout a terminal
    (a progress bar), or streams that are not UTF-8."""
    if sys.stdout is None or sys.stderr is None or sys.stdout.isatty():
        return True
    for stream in (sys.stdout, sys.stderr):
        if (getattr(stream, "encoding", "") or "").lower().replace("-", "") != "utf8":
            return True
    return False
