"""Generate the man pages (``man/man1/cachemgr*.1``) from the click help, with click-man.

    .venv/bin/python scripts/manpages.py            # rewrite man/man1/ and cachemgr/helptext.py
    .venv/bin/python scripts/manpages.py OUT_DIR    # write elsewhere (tests compare)

The pages are shipped in the source tree and installed by ``pip install .`` into
``<prefix>/share/man/man1`` (``[tool.setuptools.data-files]``), where ``man`` finds them
for a virtualenv on PATH. ``tests/test_docs.py`` regenerates them and fails when the shipped
ones differ from the current help, so they cannot go stale.
"""

from __future__ import annotations

import json
import sys
from importlib import metadata, resources
from pathlib import Path

from click_man.core import write_man_pages

from cachemgr.cli import COMMANDS, cli, top_help

ROOT = Path(__file__).resolve().parents[1]

#: The top-level help, stored for ``cachemgr --help`` without click.
HELP_MODULE = ROOT / "cachemgr" / "helptext.py"

#: The pages carry this instead of a date, so that regenerating them changes nothing.
DATE = "cachemgr " + metadata.version("cachemgr")


def generate(out_dir: Path) -> list[Path]:
    """Write one page per command into ``out_dir``; return the pages written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = cli.make_context("cachemgr", [], resilient_parsing=True)
    for name in COMMANDS:  # the CLI loads commands lazily; click-man reads .commands
        command = cli.get_command(ctx, name)
        if command is not None:
            cli.add_command(command, name)
    write_man_pages(
        "cachemgr", cli, version=metadata.version("cachemgr"), target_dir=str(out_dir), date=DATE
    )
    package = str(resources.files("cachemgr"))
    pages = sorted(out_dir.glob("cachemgr*.1"))
    for page in pages:  # the schema's path in the help is where this checkout is
        text = page.read_text().replace(package, "<site-packages>/cachemgr")
        page.write_text(text.replace("\b\n", ""))  # click's no-rewrap marker, not text
    return pages


def help_module() -> str:
    """The source of :mod:`cachemgr.helptext`: click's top-level help (78 columns)."""
    return (
        '"""``cachemgr --help``, rendered ahead from the click CLI by ``scripts/manpages.py``\n'
        "(do not edit): :mod:`cachemgr.main` prints it without importing click;\n"
        '``tests/test_startup.py`` fails when it differs from click\'s live output."""\n\n'
        + "TOP = (\n"
        + "".join(
            f"    {json.dumps(line, ensure_ascii=False)}\n"
            for line in top_help().splitlines(keepends=True)
        )
        + ")\n"
    )  # JSON's string syntax is Python's, in the double quotes ruff format wants


if __name__ == "__main__":
    if len(sys.argv) == 1:
        HELP_MODULE.write_text(help_module())
        print(HELP_MODULE)
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "man" / "man1"
    for old in target.glob("cachemgr*.1"):
        old.unlink()
    for written in generate(target):
        print(written)
