"""The ``cachemgr`` console script (and ``python -m cachemgr``): a start-up fast path in front
of the click CLI, as git and ccache answer their common cases without
loading everything.

Importing click with json, logging and dataclasses alone costs 2.3× ``python -c pass``
(``BENCHMARKS.md``, section startup), so the cases below are recognised from ``argv`` with
the standard library and cachemgr's own click-free modules; everything else — any option
this module does not know, any value it is not sure of, any error, any doubt — goes to the
click CLI (:func:`cachemgr.cli.main`) with the original ``argv``, before anything was
written:

* ``cachemgr --help`` / ``-h``: the top-level help, rendered ahead by
  ``scripts/manpages.py`` into :mod:`cachemgr.helptext` (``tests/test_startup.py`` fails
  when it differs from click's live output), printed when click would render it at its
  full width of 78 columns (a terminal of 80 columns or more, or not a terminal);
* ``cachemgr config [--json] [--cache-dir DIR] [--host-id ID] [--soc SOC] [--config FILE]
  [--remote URL]...``: first on os alone (:mod:`cachemgr.quickconfig`, which declines a
  config file, remote tiers, a toolkit to look for and anything the full resolution would
  word), else the same settings resolution (:func:`cachemgr.config.options.resolve`) and
  the same report (:func:`cachemgr.console.config_report`) as the click command; the
  whole output is computed first (log lines included), then written, so a decline leaves
  nothing behind;
* ``cachemgr stats [--json] [--cache-dir DIR] [--host-id ID] [--soc SOC] [--config FILE]``
  with no daemon that may serve the cache (no ``$CACHEMGR_SOCKET``, no file at the default
  socket): the same figures (:mod:`cachemgr.localstats`, which the click command calls too)
  and the same report (:mod:`cachemgr.stats_view`), computed first and then written as
  ``config``'s.

Shell completion (``$_CACHEMGR_COMPLETE``), ``--version`` and every other command are
click's.

* ``cachemgr compile ARGS``: a hit the full path answered before with the same ``argv``,
  folder, environment and user, answered from its direct memo once every input, the
  compiler, the configuration and the entry are checked to be as they were
  (:mod:`cachemgr.direct`, which says what is checked); anything else is click's, which
  then writes the memo (:mod:`cachemgr.cli.directrecord`). ``CACHEMGR_DIRECT=0`` turns
  this off: no memo is read or written.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: typing costs ~2.5 ms of start-up
    from collections.abc import Callable

#: The settings options that take a value (the click commands'), and whether repeatable.
_SETTINGS_VALUES = {
    "--cache-dir": ("op_compiler_cache_dir", False),
    "--host-id": ("host_id", False),
    "--soc": ("soc_version", False),
    "--config": ("config_file", False),
}
#: ``config``'s options that take a value.
_CONFIG_VALUES = {**_SETTINGS_VALUES, "--remote": ("remotes", True)}


def main() -> None:
    """Console-script entry point: the fast path when it applies, else the click CLI."""
    argv = sys.argv[1:]
    if "_CACHEMGR_COMPLETE" in os.environ:  # shell completion is click's
        pass
    elif argv in (["--help"], ["-h"]):
        if _full_width():
            from cachemgr.helptext import TOP

            _write([(False, TOP)], 0, gone=1)  # click's main exits 1 on EPIPE here
    elif argv[:1] == ["config"]:
        _config(argv[1:])
    elif argv[:1] == ["stats"]:
        _stats(argv[1:])
    elif argv[:1] == ["compile"] and _direct_on():
        _compile(argv)
    from cachemgr.cli import main as click_main

    click_main()


#: ``$CACHEMGR_DIRECT`` values that turn direct mode off (case aside).
_DIRECT_OFF = ("0", "no", "off", "false")


def _direct_on() -> bool:
    """False when ``$CACHEMGR_DIRECT`` turns direct mode off (``0``, ``no``, ``off``,
    ``false``): no memo is read or written, every ``compile`` takes the full path
    (docs/performance.md#direct-mode-a-cli-hit-without-the-compile-path)."""
    return os.environ.get("CACHEMGR_DIRECT", "").strip().lower() not in _DIRECT_OFF


def _compile(argv: list[str]) -> None:
    """A ``compile`` hit from its direct memo (:mod:`cachemgr.direct`); returns (to hand over
    to click, which then records the memo) when it cannot answer, having written nothing."""
    from cachemgr import direct
    from cachemgr.constants import VERSION

    if not direct.out_of_reach():
        try:
            answered = direct.answer(argv, VERSION, _through_daemon)
        except direct.Answered as got:  # the daemon said something else: reported in full
            from cachemgr.cli.compile_cmd import report_daemon_answer

            sys.exit(report_daemon_answer(got.memo, got.code, got.raw, got.error))
        if answered is not None:
            _write(*answered, quick=True)
    from cachemgr.cli import directrecord

    directrecord.ARGV = argv


def _through_daemon(memo: dict[str, object]) -> tuple[list[tuple[bool, str]], int] | None:
    """:func:`cachemgr.directwire.answer`, imported only for a memo of the daemon route."""
    from cachemgr import directwire

    return directwire.answer(memo)


def _full_width() -> bool:
    """True when click would render help at its full width (78 columns): its
    ``HelpFormatter`` takes ``min(terminal columns, 80) - 2``, the columns from
    :func:`shutil.get_terminal_size` (``$COLUMNS``, the terminal, else 80)."""
    import shutil

    return shutil.get_terminal_size().columns >= 80


def _config(args: list[str]) -> None:
    """``cachemgr config`` without click, when ``args`` are options it knows; returns (to
    hand over to click) otherwise or on any error, having written nothing."""
    given = _parse_options(args, _CONFIG_VALUES)
    if given is not None:
        _quick_config(given)
        _answer(lambda out: _config_lines(given, out))


def _quick_config(given: dict[str, object]) -> None:
    """``cachemgr config`` on os alone (:mod:`cachemgr.quickconfig`) when it answers exactly;
    returns, having written nothing, when it declines or fails."""
    try:
        from cachemgr import quickconfig

        answered = quickconfig.answer(given, os.environ)
    except Exception:
        return
    if answered is not None and _plain_text([text for _, text in answered[0]]):
        _write(*answered)


def _stats(args: list[str]) -> None:
    """``cachemgr stats`` without click (:func:`cachemgr.localstats.answer`), when ``args``
    are settings options or ``--json`` and no daemon may serve the cache; returns (to hand
    over to click) otherwise or on any error, having written nothing."""
    _quick_stats(args)
    given = _parse_options(args, _SETTINGS_VALUES)
    if given is None:
        return
    from cachemgr import localstats

    _answer(lambda out: _plain_lines(out, localstats.answer(given, out)))


def _quick_stats(args: list[str]) -> None:
    """``cachemgr stats`` on os alone (:mod:`cachemgr.quickstats`) when it answers exactly;
    returns, having written nothing, when it declines or fails."""
    try:
        from cachemgr import quickstats

        lines = quickstats.answer(args, os.environ)
    except Exception:
        return
    if lines is not None and _plain_text(lines):
        _write([(False, line) for line in lines], 0)


def _answer(compute: Callable[[list[tuple[bool, str]]], int | None]) -> None:
    """Run ``compute`` at default verbosity with every log line kept, in order, in the list
    it appends its own lines to (``(to_stderr, text)``); write them all and exit with its
    code. Returns, having written nothing, when it returns None or raises."""
    import logging

    from cachemgr.console import LOG_FORMAT, VERBOSITY, SafeFormatter

    out: list[tuple[bool, str]] = []
    handler = _list_handler_class()(out)
    handler.setFormatter(SafeFormatter(LOG_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)  # logging.basicConfig (VERBOSITY.set) then adds no other
    try:
        VERBOSITY.set(0)
        code = compute(out)
    except Exception:
        code = None
    finally:
        root.removeHandler(handler)
    if code is not None:
        _write(out, code)


def _parse_options(
    args: list[str], values: dict[str, tuple[str, bool]]
) -> dict[str, object] | None:
    """The click command's values for ``args`` (``--json`` and the options ``values`` names,
    with the key each gives and whether it repeats), or None for anything not plainly one
    of its options (``-v``, ``--help``, ``--``, a value that looks like an option, a
    repeated option, an argument…)."""
    given: dict[str, object] = {"as_json": False, "remotes": ()}
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if arg == "--json":
            given["as_json"] = True
            i += 1
            continue
        if name not in values:
            return None
        if not eq:
            if i + 1 >= len(args):
                return None
            value = args[i + 1]
            i += 1
        i += 1
        key, repeatable = values[name]
        if not value or value.startswith("-"):
            return None
        if repeatable:
            given[key] = (*given[key], value)  # type: ignore[misc]
        elif key in given:
            return None
        elif key == "config_file":
            if not _plain_file_option(value):
                return None
            from pathlib import Path  # only for a config file: the lean config declines it

            given[key] = Path(value)
        else:
            given[key] = value
    return given


def _plain_file_option(value: str) -> bool:
    """True when click's ``Path(dir_okay=False)`` takes ``value`` as it is: a missing path,
    or a readable file that is not a folder."""
    import stat

    try:
        st = os.stat(value)
    except OSError:
        return True
    return not stat.S_ISDIR(st.st_mode) and os.access(value, os.R_OK)


def _config_lines(given: dict[str, object], out: list[tuple[bool, str]]) -> int | None:
    """What the click command prints (warnings, then the report), appended to ``out``, and
    its exit code; None when its text could print differently through click
    (:func:`_plain_lines`).

    :raises Exception: any error of the resolution: click then answers (and words it).
    """
    from cachemgr.config import options
    from cachemgr.console import config_report, warning_line

    cli = {k: given.get(k) for k in ("op_compiler_cache_dir", "host_id", "soc_version")}
    config_file = given.get("config_file")
    settings = options.resolve(cli=cli, config_file=config_file, writable=True)  # type: ignore[arg-type]
    out += [(True, warning_line(p)) for p in settings.problems]
    report, code = config_report(settings, bool(given["as_json"]), given["remotes"])  # type: ignore[arg-type]
    out += report
    return _plain_lines(out, code)


def _plain_lines(out: list[tuple[bool, str]], code: int | None) -> int | None:
    """``code``, or None when a line of ``out`` could print differently through click
    (``click.echo`` strips escape sequences from a pipe, re-encodes a non-UTF-8 stream)."""
    if code is None or not _plain_text([text for _, text in out]):
        return None
    return code


def _plain_text(texts: list[str]) -> bool:
    """True when every line prints as it is through ``click.echo`` too: printable text
    (newlines aside) on UTF-8 streams."""
    for stream in (sys.stdout, sys.stderr):
        if (getattr(stream, "encoding", "") or "").lower().replace("-", "") != "utf8":
            return False
    return all(line.isprintable() for text in texts for line in text.split("\n"))


def _list_handler_class() -> type:
    import logging

    class ListHandler(logging.Handler):
        """Keeps formatted log lines, to be written with the rest of the output."""

        def __init__(self, into: list[tuple[bool, str]]) -> None:
            super().__init__()
            self.into = into

        def emit(self, record: logging.LogRecord) -> None:
            self.into.append((True, self.format(record)))

    return ListHandler


def _write(lines: list[tuple[bool, str]], code: int, gone: int = 0, quick: bool = False) -> None:
    """Write ``lines`` (each with a newline, flushed, as ``click.echo``) and exit ``code``;
    when the reader of stdout has gone, exit ``gone`` quietly (as the click CLI: 0 from a
    command, 1 from ``--help``, which click's own ``main`` handles).

    ``quick``: once every line is written and flushed, leave with :func:`os._exit`, without
    the interpreter's finalization (tearing down every module and object: ~0.2× ``python -c
    pass`` on this host, ``BENCHMARKS.md`` startup). Only for a direct hit: it has no
    ``atexit`` handler, thread, log handler or buffered file of its own left (its writes
    are ``os.write`` to descriptors it closed), so nothing is lost; any error above takes
    the ordinary exit."""
    try:
        for to_stderr, text in lines:
            stream = sys.stderr if to_stderr else sys.stdout
            if stream is None:  # started with that descriptor closed: click.echo skips too
                continue
            stream.write(text + "\n")
            stream.flush()
    except BrokenPipeError:
        from cachemgr.console import reader_gone

        try:
            reader_gone()
        except SystemExit:
            sys.exit(gone)
    except OSError as exc:  # a full disk behind stdout: one line, as the click CLI says it
        _cannot_write(exc)
    if quick:
        os._exit(code)
    sys.exit(code)


def _cannot_write(exc: OSError) -> None:
    """``cachemgr: error: <why>`` on stderr and exit 1 (the click CLI's words for an
    ``OSError``); stdout goes to /dev/null first, or its buffer would fail again at exit."""
    import contextlib

    from cachemgr.console import stdout_to_devnull

    stdout_to_devnull()
    if sys.stderr is not None:
        with contextlib.suppress(OSError):
            sys.stderr.write(f"cachemgr: error: {exc.strerror or exc}\n")
            sys.stderr.flush()
    sys.exit(1)
