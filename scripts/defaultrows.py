"""Write cachemgr/config/defaultrows.py: what ``cachemgr config`` shows for the config file's
tables and the remote tiers when no config file, ``--remote`` or ``$CACHEMGR_REMOTE_STORAGE``
sets them, stored so that ``config`` needs neither the schema's module nor the remote tiers'
(start-up). ``tests/test_settings_core.py`` fails when the stored rows differ from the live
ones; rerun this then::

    .venv/bin/python scripts/defaultrows.py
"""

from __future__ import annotations

import pprint
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "cachemgr" / "config" / "defaultrows.py"

HEAD = '''"""What ``cachemgr config`` shows when nothing sets the config file's tables or the remote
tiers, written by ``scripts/defaultrows.py`` from the live code (``configfile.empty().rows()``
and the remote row of no remotes); ``tests/test_settings_core.py`` fails when they differ.
A leaf module: plain data, no import at run time."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

'''


def main() -> None:
    """Render the live rows and write the module, formatted by ruff."""
    from cachemgr.config import configfile
    from cachemgr.console import live_remote_row

    tables = configfile.empty().rows()
    remote = live_remote_row({}, {})
    shown_tables = pprint.pformat(tables, width=96, sort_dicts=False)
    shown_remote = pprint.pformat(remote, width=96, sort_dicts=False)
    text = (
        HEAD
        + f"TABLE_ROWS: dict[str, dict[str, Any]] = {shown_tables}\n\n"
        + f"NO_REMOTE_ROW: dict[str, Any] = {shown_remote}\n"
    )
    MODULE.write_text(text)
    ruff = Path(sys.executable).parent / "ruff"
    subprocess.run([str(ruff), "format", "-q", str(MODULE)], check=False)
    print(f"wrote {MODULE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
