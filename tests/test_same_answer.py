"""The same answer for every user of a shared cache: ``ls`` shows a member the op type root
sees (``Add``, as the entry's json records it — not the lower-cased name's ``add``), and
``verify`` counts entries as entries (a header manifest it could not read is not one more
"entry of other users") and names whose they are. Real users (tests/users_util.py), a real
compile, real files."""

from __future__ import annotations

import json
import os

from tests.conftest import SOC, run_cli
from tests.test_security_fs import _as, _env, _request_file, _shared_root
from tests.users_util import Runtime, Users, user_home


def _bobs_cache(users: Users, rt: Runtime) -> tuple[str, list[str]]:
    """Bob compiles two kernels into the shared root; its path and the entries' names."""
    root = _shared_root(users)
    home = user_home(users, users.bob)
    requests = [str(_request_file(users.base, rt, n)) for n in (1, 2)]
    done = _as(
        users,
        users.bob,
        rt,
        "compile",
        "--local",
        "--cache-dir",
        str(root),
        *requests,
        env=_env(rt, home),
    )
    assert done.returncode == 0, done.stderr
    chip = root / "kernel_cache" / SOC
    kernels = sorted(p.stem for p in chip.glob("te_*.json"))
    assert len(kernels) == 2 and all(k.startswith("te_add_") for k in kernels), kernels
    return str(root), kernels


def test_ls_shows_a_member_the_op_type_root_sees(users: Users, other_runtime: Runtime) -> None:
    root, kernels = _bobs_cache(users, other_runtime)
    json_of = [os.path.join(root, "kernel_cache", SOC, f"{k}.json") for k in kernels]
    atimes = [os.stat(p).st_atime_ns for p in json_of]
    env = _env(other_runtime, user_home(users, users.alice))
    alice = _as(users, users.alice, other_runtime, "ls", "--json", "--cache-dir", root, env=env)
    as_root = run_cli("ls", "--json", "--cache-dir", root)
    assert alice.returncode == 0 and as_root.returncode == 0, alice.stderr + as_root.stderr
    theirs = {row["kernel"]: row["op_type"] for row in json.loads(alice.stdout)}
    ours = {row["kernel"]: row["op_type"] for row in json.loads(as_root.stdout)}
    assert theirs == ours == dict.fromkeys(kernels, "Add"), (theirs, ours)
    assert [os.stat(p).st_atime_ns for p in json_of] == atimes, "ls changed an access time"


def test_verify_counts_other_users_entries_not_their_manifests(
    users: Users, other_runtime: Runtime
) -> None:
    root, kernels = _bobs_cache(users, other_runtime)
    chip = os.path.join(root, "kernel_cache", SOC)
    manifests = [n for n in os.listdir(chip) if n.endswith(".manifest")]
    assert manifests, os.listdir(chip)
    env = _env(other_runtime, user_home(users, users.alice))
    alice = _as(users, users.alice, other_runtime, "verify", "--cache-dir", root, env=env)
    assert alice.returncode == 0, alice.stdout + alice.stderr
    (line,) = [ln for ln in alice.stderr.splitlines() if ln.startswith("not checked:")]
    want = f"not checked: 2 entries and {len(manifests)} header manifest"
    assert line.startswith(want), line
    # whose they are, and who may check them: under the system service every entry is the
    # daemon user's and a member's verify checks none (it said "of other users" only)
    assert f" of user {users.bob} — " in line and line.endswith(f"as {users.bob} or root"), line
    report = json.loads(
        _as(
            users, users.alice, other_runtime, "verify", "--json", "--cache-dir", root, env=env
        ).stdout
    )
    assert sorted(report["chip_folders"][SOC]["not_checked"]) == sorted(kernels + manifests)
