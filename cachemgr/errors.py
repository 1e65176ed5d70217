"""Errors raised by cachemgr's library layers (layer 0).

Every error carries a one-line message that names the offending value and where it came
from. Only the CLI (``cachemgr.cli``) turns these into messages and exit codes; library code
raises them and never prints.
"""

from __future__ import annotations


class CacheMgrError(Exception):
    """Base of every error cachemgr raises on purpose.

    ``exit_code`` is what the CLI exits with: 2 for bad input or configuration, 1 for
    operational failures (a compile that failed, a cache that is not healthy).
    """

    exit_code = 1


class ConfigError(CacheMgrError):
    """A configuration value is invalid: names the value, its origin and the accepted range."""

    exit_code = 2


class InvalidInputError(CacheMgrError):
    """Input from a caller (a request, a path, a name) is malformed."""

    exit_code = 2


class InvalidEntryError(CacheMgrError):
    """A cache entry on disk does not follow CANN's format (docs/design.md#files-of-an-entry).

    ``reason`` is a short machine-readable code (e.g. ``unreadable_json``, ``bad_name``).
    """

    exit_code = 1

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


class CachePermissionError(CacheMgrError):
    """The cache (or part of it) cannot be read or written by this user
    (docs/design.md#sharing-and-locking)."""

    exit_code = 2


class LockBusyError(CacheMgrError):
    """A lock is held by someone else and the caller asked not to wait.

    "Busy is not failure": non-blocking acquisition returns ``False``; this error is
    raised only where a caller asked for the lock with a deadline and the deadline passed.
    """

    exit_code = 1


class CompileError(CacheMgrError):
    """A compile failed: the compiler is missing, crashed, timed out or produced no binary."""

    exit_code = 1


class OutputFolderError(CacheMgrError):
    """A kernel compiled outside the cache (its cache folder read-only, full or not ours)
    could not be written to the output folder either: the compile's work is lost, one line
    names both folders and what to do."""

    exit_code = 1


class NoSpaceError(CacheMgrError):
    """The filesystem of a chip folder is full (``ENOSPC``) or the user's quota is spent
    (``EDQUOT``) while publishing: nothing was published, nothing partial is left
    (docs/design.md#writing-and-reading-an-entry).

    :ivar folder: the chip folder; ``bytes_needed``: the size of the entry (bytes).
    """

    exit_code = 1

    def __init__(self, message: str, folder: str, bytes_needed: int) -> None:
        super().__init__(message)
        self.folder = folder
        self.bytes_needed = bytes_needed
