"""Folders of the cache reached without following links (layer 0;
docs/design.md#sharing-and-locking, docs/security.md item 1).

The cache root is group-writable, so any member may replace ``kernel_cache``, a chip folder
or any file below it by a symbolic link — before an operation, or in the middle of one.
Checking a path and then using it by name does not help (the name can change in between).
So every folder below the root is *opened* once, step by step, each step relative to the
descriptor of the one above with ``O_DIRECTORY | O_NOFOLLOW``, and every later removal,
rename, create, stat, lock and read is made relative to that descriptor
(``unlinkat``/``renameat``/``openat``/``fstatat(AT_SYMLINK_NOFOLLOW)``). A name swapped for
a link after the walk cannot redirect the operation: the descriptor still points at the
folder that was walked.

The *anchor* (the configured cache root: ``op_compiler_cache_dir``, ``ASCEND_CACHE_PATH``,
``$HOME/atc_data``) is named by the administrator or the user and is opened as configured;
everything below it is untrusted.

Usage::

    with SafeDir.open_chip(chip_dir) as chip:     # <root>/kernel_cache/<soc>
        for de in chip.scandir(): ...
        chip.unlink("te_x.o")
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from cachemgr.errors import ConfigError
from cachemgr.storage import fsutil

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
#: New folders are made with this mode, then given ``fsutil.dir_mode_in`` their parent's:
#: group-writable, others what the parent gives them, setgid where the parent has it.
DIR_MODE = 0o770


class UnsafePathError(ConfigError):
    """A folder of the cache is a symbolic link or not a folder: the operation stops there,
    with one line naming it (docs/security.md item 1). Exit code 2."""


def _what(depth: int, total: int) -> str:
    if total == 2:
        return "kernel cache folder" if depth == 0 else "chip folder"
    return "folder"


def _refusal(path: Path, what: str) -> UnsafePathError:
    """The one line for a link (or a non-folder) where a folder of the cache is expected."""
    try:
        target = os.readlink(path)
    except OSError:
        return UnsafePathError(
            f"{what} {path} is not a folder; cachemgr never follows links or uses other files "
            "as folders inside the cache (docs/security.md): remove it"
        )
    return UnsafePathError(
        f"{what} {path} is a symbolic link (to {target}); cachemgr never follows links inside "
        "the cache (docs/security.md): remove it"
    )


class SafeDir:
    """An open folder of the cache: ``fd`` for the ``*at()`` calls, ``path`` for messages.

    Close it (or use it as a context manager); files named relative to it are never reached
    through a link, whatever happens to the path meanwhile.
    """

    __slots__ = ("_name", "_parent", "_path", "fd")

    def __init__(
        self, fd: int, path: Path | None, parent: SafeDir | None = None, name: str = ""
    ) -> None:
        self.fd = fd
        # the path is for messages: a child's is joined only when asked (each pathlib join
        # re-parses; a hit opens two folders: the profile of a lookup)
        self._path = path if path is None or isinstance(path, Path) else Path(path)
        self._parent, self._name = parent, name

    @property
    def path(self) -> Path:
        """The folder's path (for messages; calls go through :attr:`fd`)."""
        if self._path is None:
            assert self._parent is not None
            self._path = self._parent.path / self._name
        return self._path

    # --- opening ---------------------------------------------------------------------

    @classmethod
    def open(cls, anchor: Path, parts: Sequence[str] = (), *, create: bool = False) -> SafeDir:
        """Open ``anchor/parts[0]/parts[1]/...``: the anchor as configured, each part with
        ``O_NOFOLLOW`` relative to the one above. With ``create`` missing parts are made
        (``fsutil.dir_mode_in`` the parent's mode whatever the umask: group-writable,
        others no more than the parent gives them, setgid where it has it;
        docs/design.md#sharing-and-locking).

        :raises UnsafePathError: a part is a symbolic link or not a folder (names it).
        :raises FileNotFoundError: a part (or the anchor) is missing and ``create`` is off.
        :raises OSError: e.g. ``EACCES``.
        """
        anchor = anchor if isinstance(anchor, Path) else Path(anchor)
        if not create:
            return cls._walk(anchor, parts)
        # the configured root: created as configured (docs/design.md#where-the-cache-lives)
        fsutil.ensure_dir(anchor)
        fd = os.open(anchor, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
        here = cls(fd, anchor)
        try:
            for depth, name in enumerate(parts):
                child = here.child(name, create=create, what=_what(depth, len(parts)))
                here.close()
                here = child
        except BaseException:
            here.close()
            raise
        return here

    @classmethod
    def _walk(cls, anchor: Path, parts: Sequence[str]) -> SafeDir:
        """:meth:`open` of existing folders: the same ``openat`` steps on bare descriptors
        (a hit opens its chip folder every time), one object for the folder reached, its
        path joined only when asked."""
        fd = os.open(anchor, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
        try:
            for depth, name in enumerate(parts):
                try:
                    below = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        where = anchor.joinpath(*parts[: depth + 1])
                        raise _refusal(where, _what(depth, len(parts))) from exc
                    raise
                os.close(fd)
                fd = below
        except BaseException:
            os.close(fd)
            raise
        if not parts:
            return cls(fd, anchor)
        return cls(fd, None, cls(-1, anchor), "/".join(parts))

    @classmethod
    def open_kernel_cache(cls, kernel_cache_dir: Path, *, create: bool = False) -> SafeDir:
        """Open ``<root>/kernel_cache`` (the root is the anchor)."""
        kernel_cache_dir = Path(kernel_cache_dir)
        return cls.open(kernel_cache_dir.parent, [kernel_cache_dir.name], create=create)

    @classmethod
    def open_chip(cls, chip_dir: Path, *, create: bool = False) -> SafeDir:
        """Open ``<root>/kernel_cache/<soc>`` (the root is the anchor)."""
        anchor, parts = _chip_parts(chip_dir if isinstance(chip_dir, Path) else Path(chip_dir))
        return cls.open(anchor, parts, create=create)

    def child(self, name: str, *, create: bool = False, what: str = "folder") -> SafeDir:
        """Open the sub-folder ``name`` without following a link (see :meth:`open`).

        :raises UnsafePathError: ``name`` is a link or not a folder.
        """
        if create:
            self._mkdir(name)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise _refusal(self.path / name, what) from exc
            raise
        return SafeDir(fd, None, self, name)

    def _mkdir(self, name: str) -> None:
        try:
            os.mkdir(name, DIR_MODE, dir_fd=self.fd)
        except FileExistsError:
            return
        mode = fsutil.dir_mode_in(os.fstat(self.fd).st_mode)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
        except OSError:
            return  # swapped meanwhile: the open in child() says what is there
        try:
            if os.fstat(fd).st_uid == os.geteuid():
                os.fchmod(fd, mode)  # through the descriptor: never a link's target
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> SafeDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SafeDir({str(self.path)!r}, fd={self.fd})"

    # --- names inside --------------------------------------------------------------------

    def lstat(self, name: str) -> os.stat_result | None:
        """``fstatat(name, AT_SYMLINK_NOFOLLOW)``; None when gone (ENOENT/ESTALE)."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError as exc:
            if exc.errno in fsutil.GONE_ERRNOS:
                return None
            raise

    def unlink(self, name: str) -> bool:
        """``unlinkat(name)``: removes the name (a link, not its target); False when gone.

        :raises OSError: anything but ENOENT/ESTALE (e.g. ``EACCES``, ``EISDIR``).
        """
        return fsutil.safe_unlink(self.path / name, dir_fd=self.fd)

    def rename(self, src: str, dst: str) -> None:
        """``renameat(src, dst)`` inside this folder (atomic; replaces ``dst``)."""
        os.rename(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def scandir(self) -> Iterator[os.DirEntry[str]]:
        """The folder's entries (``DirEntry.stat(follow_symlinks=False)`` is an fstatat)."""
        with os.scandir(self.fd) as it:
            yield from it

    def names(self) -> list[str]:
        """The names in the folder."""
        return os.listdir(self.fd)


@functools.lru_cache(maxsize=256)
def _chip_parts(chip_dir: Path) -> tuple[Path, tuple[str, str]]:
    """``<root>/kernel_cache/<soc>`` split into the root and the two names below it (once
    per chip folder: a hit opens it every time)."""
    kernel_cache = chip_dir.parent
    return kernel_cache.parent, (kernel_cache.name, chip_dir.name)


class DirLock(fsutil.FcntlLock):
    """An :class:`~cachemgr.storage.fsutil.FcntlLock` on a lock file of a cache folder that it opens
    itself (``open_folder()``, e.g. ``lambda: SafeDir.open_chip(chip)``) for exactly as long
    as the lock is held: the lock file is opened, checked and unlinked relative to that
    descriptor, never through a link (docs/security.md item 1).
    """

    def __init__(self, path: Path, open_folder: Callable[[], SafeDir]) -> None:
        super().__init__(path)
        self._open_folder = open_folder
        self._folder: SafeDir | None = None

    def acquire(self, blocking: bool = True, timeout_s: float | None = None) -> bool:
        """See :meth:`FcntlLock.acquire`; also :raises UnsafePathError: for a linked folder."""
        folder = self._open_folder()
        self._dir_fd = folder.fd
        try:
            taken = super().acquire(blocking, timeout_s)
        except BaseException:
            self._dir_fd = None
            folder.close()
            raise
        if not taken:
            self._dir_fd = None
            folder.close()
            return False
        self._folder = folder
        return True

    def release(self, unlink: bool = False) -> None:
        """See :meth:`FcntlLock.release`; closes the folder afterwards."""
        try:
            super().release(unlink)
        finally:
            if self._folder is not None and not self.held:
                self._folder.close()
                self._folder = None
                self._dir_fd = None
