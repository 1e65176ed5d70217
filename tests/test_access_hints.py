"""A permission message's fix follows from the real modes and would work: a folder whose
group may not write it is given to a sharing group (``chgrp G DIR && chmod 2770 DIR``), a
user outside a group that may is told to join it (``usermod -aG G USER``), and group ``root``
is never offered — ``usermod -aG root`` beside ``drwxr-xr-x root:root`` would not have helped
(docs/shared-cache.md). Real users (tests/users_util.py), real folders, the real CLI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.test_security_fs import _as, _env
from tests.users_util import Runtime, Users, user_home


def _root_of(users: Users, group: str, mode: int) -> Path:
    root = users.base / "cache"
    root.mkdir()
    shutil.chown(root, "root", group)
    root.chmod(mode)
    return root


def _hint(users: Users, rt: Runtime, name: str, root: Path) -> str:
    """The one error line ``gc`` gives ``name`` for ``root`` (exit 2)."""
    env = _env(rt, user_home(users, name))
    done = _as(users, name, rt, "gc", "--local", "--cache-dir", str(root), env=env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done
    assert f"{root} is not writable by user {name}" in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("group_is_root", "mode", "who", "share", "join"),
    [
        (True, 0o755, "alice", True, False),  # the drwxr-xr-x root:root
        (True, 0o775, "carol", True, False),  # group root may write: still never joined
        (False, 0o755, "alice", True, False),  # a member; the group may not write
        (False, 0o755, "carol", True, True),  # an outsider; the group may not write
        (False, 0o2770, "carol", False, True),  # the group may: join it
    ],
)
def test_the_fix_follows_from_the_modes(
    users: Users,
    other_runtime: Runtime,
    group_is_root: bool,
    mode: int,
    who: str,
    share: bool,
    join: bool,
) -> None:
    group = "root" if group_is_root else users.group
    root = _root_of(users, group, mode)
    user = users.alice if who == "alice" else users.carol
    line = _hint(users, other_runtime, user, root)
    assert "usermod -aG root" not in line and "chgrp root" not in line, line
    sharing = "ascend" if group_is_root else users.group
    assert (f"'chgrp {sharing} {root} && chmod 2770 {root}'" in line) == share, line
    assert (f"usermod -aG {users.group} {user}" in line) == join, line


@pytest.mark.parametrize("group_is_root", [True, False])
def test_the_fix_offered_to_a_member_works(
    users: Users, other_runtime: Runtime, group_is_root: bool
) -> None:
    """The command the line names, run as root with the group of the cache's users, lets the
    member in: ``gc`` then exits 0."""
    root = _root_of(users, "root" if group_is_root else users.group, 0o755)
    line = _hint(users, other_runtime, users.alice, root)
    command = line.split("'")[1].replace("chgrp ascend ", f"chgrp {users.group} ")
    subprocess.run(["sh", "-c", command], check=True)
    env = _env(other_runtime, users.base / users.alice)  # made by _hint
    done = _as(
        users, users.alice, other_runtime, "gc", "--local", "--cache-dir", str(root), env=env
    )
    assert done.returncode == 0, done.stderr
