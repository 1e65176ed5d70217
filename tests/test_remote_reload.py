"""``/reload`` re-reads ``[remote]`` (``Service.reload``): a remote added to the
config file is used, and a remote disabled because Redis refused its password is enabled
again with the credentials fixed in its password file — "fix its credentials, then reload",
as its error line says. A real ``redis-server`` with ``requirepass``, a real daemon running as
a real user (root only: ``users``/``other_runtime``), real compiles.
"""

from __future__ import annotations

import shutil
from typing import Any

import redis

from cachemgr.client import Client
from tests.daemon_util import wait_for
from tests.remote_util import RedisServer, keys_toml, site_key
from tests.shared_util import kernel_request
from tests.test_daemon_resources import _user_daemon
from tests.users_util import Runtime, Users

PASSWORD = "right-" + "x" * 12


def _request(rt: Runtime, n: int) -> dict[str, Any]:
    data = kernel_request(n)
    data["kernel_source"] = str(rt.kernels / "c" / "add.c")
    return data


def test_reload_adds_a_remote_and_re_enables_one_whose_credentials_were_fixed(
    users: Users, other_runtime: Runtime, redis_server: RedisServer
) -> None:
    redis_server.client().config_set("requirepass", PASSWORD)
    server = redis.Redis(host="127.0.0.1", port=redis_server.port, password=PASSWORD)
    secret = users.base / "redis.pw"
    secret.write_text("wrong\n")
    shutil.chown(secret, users.alice)
    secret.chmod(0o600)
    key, _ = site_key(users.base)
    shutil.chown(key, users.alice)  # the daemon user's own key (docs/remote.md#keys)
    d = _user_daemon(users, other_runtime, users.alice, "[remote]\n")  # no remote yet
    cfg = users.base / f"{users.alice}.toml"
    client = Client(d.socket_path, timeout_s=120, local_hits=False, daemon_user=users.alice)

    def state() -> str | None:
        row = client.stats().to_json()["remotes"].get("r")
        return None if row is None else str(row["state"])

    try:
        assert client.stats().to_json()["remotes"] == {}
        cfg.write_text(
            f'[remote]\nstorage = ["{redis_server.url}|name=r|password-file={secret}"]\n'
            + keys_toml(users.base)
        )
        assert client.reload()["reloaded"] is True
        assert state() == "ok"  # the remote of the edited config is in use

        out = client.compile(_request(other_runtime, 1), "/").to_json()
        assert out["status"] == "compiled", out
        wait_for(lambda: state() == "disabled", 60, "the remote disabled for its password")
        assert "remote r disabled" in d.log() and server.dbsize() == 0

        secret.write_text(PASSWORD + "\n")  # the operator fixes the credentials, then reloads
        assert client.reload()["reloaded"] is True
        assert state() == "ok"
        out = client.compile(_request(other_runtime, 2), "/").to_json()
        assert out["status"] == "compiled", out
        wait_for(lambda: server.dbsize() >= 2, 60, "the upload with the fixed password")
        assert state() == "ok"
        assert PASSWORD not in d.log()  # the secret never reaches the log
    finally:
        d.stop()
