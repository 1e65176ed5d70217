"""What the command line writes, without click (layer below ``cli``, above the daemon): the
verbosity, terminal-safe text, the log format, and the report of ``cachemgr config``.

Both ways into the CLI use these: the click commands (:mod:`cachemgr.cli`) and the start-up
fast path (:mod:`cachemgr.main`), which answers ``cachemgr config`` without
importing click — so the two print the same bytes by construction, not by a copy kept in
step. Nothing here imports click.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import unicodedata
from typing import TYPE_CHECKING, Any

from cachemgr import sockpath
from cachemgr.config import reportorder
from cachemgr.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from cachemgr.config.options import Settings

#: One line of output: (True for stderr, the text without its newline).
Line = tuple[bool, str]


class Verbosity:
    """How much the CLI says: -1 with ``-q`` (errors only), 0 normal, 1+ with ``-v``.

    ``-v``/``-q`` may stand before or after the subcommand; each adds to :attr:`level`.
    """

    def __init__(self) -> None:
        self.level = 0

    def set(self, level: int) -> None:
        """Set the level and the log level (WARNING at 0, INFO at 1, DEBUG at 2+, ERROR -1)."""
        self.level = level
        log_level = max(logging.WARNING - 10 * level, logging.DEBUG)
        logging.basicConfig(format=LOG_FORMAT)
        for handler in logging.getLogger().handlers:
            if not isinstance(handler.formatter, SafeFormatter):
                handler.setFormatter(SafeFormatter(LOG_FORMAT))
        logging.getLogger().setLevel(log_level)


#: The one verbosity of this CLI run.
VERBOSITY = Verbosity()

#: The CLI's log lines: ``WARNING cachemgr.x: message``.
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"

#: Character classes shown escaped: controls (ESC starts terminal sequences), format
#: characters (bidi overrides), line/paragraph separators, undecodable bytes (surrogates).
_UNPRINTABLE = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))


def printable(text: str) -> str:
    """``text`` safe for a terminal and a log line: a file name any member may choose (a
    newline forges a line of ``verify`` or of the daemon's log; ESC sequences retitle or
    rewrite the operator's terminal) has its control, format and undecodable characters
    escaped (``\\n``, ``\\x1b``, ``\\xff`` for a byte that is not UTF-8) — the name
    stays recognisable, and ``--json`` keeps the exact name."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if unicodedata.category(ch) not in _UNPRINTABLE:
            out.append(ch)
        elif 0xDC80 <= ord(ch) <= 0xDCFF:  # a byte os.fsdecode could not decode
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        else:
            out.append(ch.encode("unicode_escape", "backslashreplace").decode("ascii"))
    return "".join(out)


class SafeFormatter(logging.Formatter):
    """A log formatter that escapes the message (:func:`printable`): one event, one line,
    whatever names it carries. cachemgr's own tracebacks are added after, as they are.

    Another library's record (any logger outside ``cachemgr``) is its line alone unless the
    root logger is at DEBUG (``-vv``, as the CLI's own "rerun with -vv for the traceback"):
    urllib3 logs a WARNING *with its traceback* for an HTTP remote's malformed header line,
    an answer cachemgr itself reports in one line (docs/remote.md#failure-isolation)."""

    def format(self, record: logging.LogRecord) -> str:
        extra = record.exc_info or record.exc_text or record.stack_info
        if extra and not _own(record) and not logging.getLogger().isEnabledFor(logging.DEBUG):
            record = logging.makeLogRecord(record.__dict__)  # other handlers keep theirs
            record.exc_info, record.exc_text, record.stack_info = None, None, None
        return super().format(record)

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)


def _own(record: logging.LogRecord) -> bool:
    """True for a record of cachemgr's own loggers (``cachemgr``, ``cachemgr.…``)."""
    return record.name == "cachemgr" or record.name.startswith("cachemgr.")


def warning_line(message: str) -> str:
    """The warning line the CLI prints on stderr (not with ``-q``)."""
    return printable(f"cachemgr: warning: {message}")


def json_text(data: Any) -> str:
    """``data`` as the one indented JSON document a command prints (``--json``)."""
    return json.dumps(data, indent=2, ensure_ascii=False, default=str)


def reader_gone() -> None:
    """The reader of our stdout has gone (``cachemgr ls | head``): stop quietly, exit 0.

    Output that is still buffered would fail again at exit, so stdout goes to /dev/null.
    """
    stdout_to_devnull()
    sys.exit(0)


def stdout_to_devnull() -> None:
    """Point stdout's descriptor at /dev/null, so output still buffered (written again at
    exit) cannot fail a second time; a stdout that is closed or has no descriptor is left."""
    with contextlib.suppress(OSError, AttributeError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


# --- cachemgr config -----------------------------------------------------------------------

#: The order ``config`` prints in, then anything else (shared with the lean path).
SHOWN = reportorder.SHOWN


def _toolkit_rows(settings: Settings) -> dict[str, dict[str, Any]]:
    """The installed toolkit's versions and where they were found, GE's way
    (docs/design.md#size-limits-and-eviction)."""
    from cachemgr.config import versions

    installed = versions.installed_versions(os.environ, settings.sections)
    rows = {}
    for name, found in zip(reportorder.TOOLKIT_ROWS, (installed.adk, installed.ops), strict=True):
        origin = "toolkit" if found.value else "unknown"
        if found.source.startswith("config "):
            origin = "option"
        rows[name] = {"value": found.value, "origin": origin, "source": found.source}
    return rows


def _remote_row(settings: Settings, cli: tuple[str, ...] = ()) -> dict[str, Any]:
    """The remote tiers, passwords redacted; when nothing names a remote (no ``--remote``,
    no ``$CACHEMGR_REMOTE_STORAGE``, no ``[remote]`` table) the stored row of no remotes
    (:mod:`cachemgr.config.defaultrows`), without importing the remote tiers' modules.

    :raises ConfigError: a bad remote spec (its message is redacted).
    """
    table = settings.sections.get("remote")
    if not cli and not os.environ.get(REMOTE_ENV, "").strip() and not table:
        from cachemgr.config.defaultrows import NO_REMOTE_ROW

        return dict(NO_REMOTE_ROW)
    return live_remote_row(table, os.environ, cli)


#: The variable that names the remote tiers (``cachemgr.remote.config.ENV_VAR``).
REMOTE_ENV = "CACHEMGR_REMOTE_STORAGE"


def live_remote_row(
    table: Mapping[str, Any] | None, env: Mapping[str, str], cli: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The remote tiers' row of ``config`` from ``--remote`` values ``cli``, the environment
    ``env`` and the ``[remote]`` table, passwords redacted (``cachemgr.remote.config``).

    :raises ConfigError: a bad remote spec (its message is redacted).
    """
    from cachemgr.remote import config as remote_config

    remotes = remote_config.resolve(list(cli), env, table)
    source = "" if remotes.origin == "default" else remotes.origin
    origin = "default" if not source else ("env" if source == remote_config.ENV_VAR else "file")
    if source == "--remote":
        origin = "option"
    row: dict[str, Any] = {"value": remotes.display, "origin": origin, "source": source}
    warnings = remote_config.trust_warnings(remotes)
    if warnings:  # shown as warning lines; in --json with the row
        row["warnings"] = warnings
    return row


#: The row of ``config`` naming each governed kernel cache's mount and its access-time rule.
FILESYSTEMS = reportorder.FILESYSTEMS


def _filesystems_row(settings: Settings) -> dict[str, Any]:
    """Which filesystem each governed kernel cache is on, its access-time rule and what that
    means for GE's own eviction (docs/interop.md#ges-eviction-and-access-times)."""
    from cachemgr.storage import atimes

    caches = [settings.layout.kernel_cache_dir, *settings.other_kernel_caches()]
    found = atimes.governed_atimes(caches)
    return {
        "value": [a.to_json() for a in found],
        "origin": "mount",
        "source": str(atimes.MOUNTINFO),
    }


def _shown(value: Any) -> str:
    """A value as the config file would spell it (lists and tables as JSON), unset empty."""
    if value is None:
        return ""
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


def config_report(
    settings: Settings, as_json: bool, remotes: tuple[str, ...]
) -> tuple[list[Line], int]:
    """What ``cachemgr config`` prints after the settings' warnings, and its exit code: every
    setting of every table, its value and origin (one JSON object with ``as_json``); 2 when
    a value was invalid and a fallback was used, or (one line, nothing else) when a remote
    spec is bad. A kernel cache every local user can read adds one warning line on stderr
    (:func:`~cachemgr.storage.exposure.outsiders_warning`; the exit code stays)."""
    data = settings.to_json()
    names = [n for n in SHOWN if n in data] + sorted(set(data) - set(SHOWN))
    data.update(_toolkit_rows(settings))
    names += list(reportorder.TOOLKIT_ROWS)
    try:
        data[reportorder.REMOTE_ROW] = _remote_row(settings, remotes)
    except ConfigError as exc:
        return [(True, f"cachemgr: {exc}")], 2
    names.append(reportorder.REMOTE_ROW)
    warnings: list[Line] = [
        (True, warning_line(w)) for w in data[reportorder.REMOTE_ROW].get("warnings", [])
    ]
    tables = settings.config_rows()
    sockpath.client_rows(tables, os.environ)  # the socket first, then the tables
    data[sockpath.SOCKET_ROW] = tables.pop(sockpath.SOCKET_ROW)
    names.append(sockpath.SOCKET_ROW)
    data.update(tables)
    names += list(tables)
    data[FILESYSTEMS] = _filesystems_row(settings)
    names.append(FILESYSTEMS)
    from cachemgr.config.options import kernel_cache_reason, kernel_cache_why  # loaded already
    from cachemgr.storage.exposure import outsiders_warning

    data["kernel_cache_dir"]["why"] = kernel_cache_reason(settings)
    notes = {reportorder.LOCK_WAIT: reportorder.explain_lock_wait(data.get(reportorder.LOCK_WAIT))}
    # a cache any local user can read: one line (docs/shared-cache.md#outsiders-read-nothing)
    exposed = outsiders_warning(settings.layout.kernel_cache_dir)
    if as_json:
        lines = [*warnings, (False, json_text({n: data[n] for n in names}))]
    else:
        # which folder, and why (docs/design.md#where-the-cache-lives)
        lines = [*warnings, (False, kernel_cache_why(settings))]
        for name in names:
            item = data[name]
            if name == FILESYSTEMS:  # one line per governed kernel cache
                lines += [(False, f"({item['origin']}: {fs['mount_point'] or '-'}) filesystem = "
                           f"{fs['line']}") for fs in item["value"]]  # fmt: skip
                continue
            origin = item["origin"] + (f": {item['source']}" if item["source"] else "")
            shown = _shown(item["value"])
            if notes.get(name):
                shown += f" ({notes[name]})"
            # a value from the environment may hold a newline: one row, one line
            lines.append((False, printable(f"({origin}) {name} = {shown}")))
            for lost in item.get("passed_over", ()):  # the framework's priority decided
                lines.append((False, printable(f"    passed over: {lost}")))
    if exposed:
        lines.append((True, exposed))
    return lines, 2 if settings.problems else 0
