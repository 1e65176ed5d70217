"""Remote storage configuration, ccache's way (ccache ``remote_storage``).

A remote is one URL with optional ``|``-separated attributes, as ccache writes them::

    redis://:secret@cache.example:6379/0|read-only|operation-timeout=2000
    http://cache.example:8080/cache|layout=bazel|bearer-token-file=/etc/cachemgr/token

Sources, the first one set wins (like every cachemgr setting,
docs/design.md#options-and-their-origins): ``--remote`` on the CLI, the environment variable
``CACHEMGR_REMOTE_STORAGE`` (space-separated), the config file's ``[remote] storage`` (a TOML list,
or one space-separated string).

Attributes (timeouts in milliseconds, as ccache's):

* ``name=`` — how the tier is named in results (``"tier": "remote:<name>"``), stats and logs;
  default ``<scheme>://<host>:<port><path>`` without credentials.
* ``read-only`` — look up, never upload.
* ``connect-timeout=`` (default 100 ms, as ccache's), ``operation-timeout=`` (default 500 ms:
  every request a caller may wait on — a lookup, a fetch, an index read — and the longest
  silence allowed while one is answered) and ``upload-timeout=`` (default 10000 ms, as ccache's
  operation timeout: an upload, in the background, which no caller waits on). The defaults
  are for a cache on the LAN (docs/remote.md#timeouts); raise them for a remote across a WAN.
* ``layout=flat|subdirs|bazel`` — HTTP only (ccache's layouts; ``bazel`` is ``/ac/<sha256>``).
* ``password-file=`` — the password (Redis ``AUTH``, HTTP basic auth) read from a file instead
  of the URL; ``bearer-token-file=`` — an HTTP bearer token from a file.

Passwords and tokens are never shown: :attr:`RemoteSpec.display` (used by ``config``) puts
``********`` in their place; logs and error lines name a remote by its URL
(:attr:`RemoteSpec.url`), never by the spec with its attributes.

Who may write what this site accepts (docs/remote.md#keys): ``[remote] trusted_keys`` (the
public keys whose signatures are accepted), ``signing_key`` (this site's private key file;
without it nothing is uploaded), ``trust_unsigned`` (the single-writer opt-out) and
``upload_writers`` (the users whose CANN-written entries are uploaded).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pwd
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

from cachemgr.config.configfile import redact_url
from cachemgr.errors import ConfigError
from cachemgr.remote import signing

log = logging.getLogger(__name__)

#: The environment variable naming the remotes (space-separated URLs).
ENV_VAR = "CACHEMGR_REMOTE_STORAGE"
SCHEMES = ("redis", "rediss", "http", "https")
LAYOUTS = ("subdirs", "flat", "bazel")
#: Timeouts (milliseconds) for a cache on the LAN (docs/remote.md#timeouts): ccache's connect
#: timeout (``doc/MANUAL.adoc``, "Remote storage backends"); a lookup that a compile waits on
#: gets 500 ms (a LAN server answers in a few ms; a hung one costs a caller this once, then
#: the breaker skips it); an upload, which nobody waits on, ccache's 10 s operation timeout.
DEFAULT_CONNECT_TIMEOUT_MS = 100
DEFAULT_OPERATION_TIMEOUT_MS = 500
DEFAULT_UPLOAD_TIMEOUT_MS = 10_000
#: What replaces a password or token wherever a spec is shown.
REDACTED = "********"
#: The biggest secret file read (bytes): a password or token, not a blob.
MAX_SECRET_BYTES = 4096
#: ``[remote]`` keys besides ``storage`` and their defaults.
TABLE_DEFAULTS: Mapping[str, int | float] = {
    "upload_queue": 256,  # entries waiting for upload; more are dropped and counted
    "failures_before_open": 3,  # consecutive failures that open a remote's breaker
    "open_s": 30.0,  # seconds a tripped remote is skipped before one probe
}


@dataclass(frozen=True)
class RemoteSpec:
    """One configured remote: its URL (credentials split off), attributes and secrets."""

    scheme: str
    host: str
    port: int | None
    path: str
    name: str
    origin: str
    read_only: bool = False
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_MS / 1000
    operation_timeout_s: float = DEFAULT_OPERATION_TIMEOUT_MS / 1000
    upload_timeout_s: float = DEFAULT_UPLOAD_TIMEOUT_MS / 1000
    layout: str = "subdirs"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    bearer_token: str | None = field(default=None, repr=False)
    #: the attributes as written, secrets' values redacted (for :attr:`display`)
    attributes: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        """``redis`` or ``http`` (TLS variants included)."""
        return "redis" if self.scheme.startswith("redis") else "http"

    @property
    def base_url(self) -> str:
        """The URL without credentials: ``scheme://host[:port]path``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = f":{self.port}" if self.port is not None else ""
        return f"{self.scheme}://{host}{port}{self.path}"

    @property
    def url(self) -> str:
        """The URL without credentials or attributes (``scheme://host:port/path``): what log
        and error lines name the remote by."""
        return self.base_url

    @property
    def display(self) -> str:
        """The spec as written, password redacted: what ``config`` shows."""
        user = self.username or ""
        cred = ""
        if self.password is not None and not any(
            a.startswith("password-file=") for a in self.attributes
        ):
            cred = f"{user}:{REDACTED}@"
        elif user:
            cred = f"{user}@"
        base = self.base_url.replace("://", "://" + cred, 1)
        return "|".join((base, *self.attributes))

    def __str__(self) -> str:
        return self.url


#: ``[remote] prefetch``: entries per chip the daemon downloads (0 = off).
PREFETCH_DEFAULT = 0


@dataclass(frozen=True)
class RemoteConfig:
    """Every remote in lookup order, and the ``[remote]`` table's tunables.

    ``prefetch``: how many of the entries most recently used anywhere the daemon downloads
    into each of this host's chip folders, at start and at every reconciliation (0 = off);
    ``prefetch_socs``: those chips (default: the chip folders present and ``soc_version``).
    """

    remotes: tuple[RemoteSpec, ...] = ()
    origin: str = "default"
    upload_queue: int = int(TABLE_DEFAULTS["upload_queue"])
    failures_before_open: int = int(TABLE_DEFAULTS["failures_before_open"])
    open_s: float = float(TABLE_DEFAULTS["open_s"])
    prefetch: int = PREFETCH_DEFAULT
    prefetch_socs: tuple[str, ...] = ()
    #: ``[remote] trusted_keys``: whose signatures a remote's entries may carry
    trusted_keys: tuple[signing.PublicKey, ...] = ()
    #: ``[remote] signing_key``: this site's private key file (read by :func:`load_keys`)
    signing_key: Path | None = None
    #: (inode, mtime ns, size) of ``signing_key`` when resolved: a key replaced in place is a
    #: changed configuration (a reload takes it)
    signing_key_stamp: tuple[int, int, int] | None = None
    #: ``[remote] trust_unsigned``: signatures are not checked (one writer only)
    trust_unsigned: bool = False
    #: ``[remote] upload_writers`` as written, and their uids (empty: the daemon's own user)
    upload_writers: tuple[str, ...] = ()
    upload_uids: tuple[int, ...] = ()

    @property
    def display(self) -> str:
        """The remotes as ``config`` shows them (space-separated, redacted)."""
        return " ".join(r.display for r in self.remotes)

    def secret_files(self) -> list[Path]:
        """The files the remotes' ``password-file=`` and ``bearer-token-file=`` name, and the
        ``signing_key`` (the compile sandbox hides their folders)."""
        found = [self.signing_key] if self.signing_key is not None else []
        for spec in self.remotes:
            for attr in spec.attributes:
                key, _, value = attr.partition("=")
                if key in ("password-file", "bearer-token-file") and value:
                    found.append(Path(value))
        return found


def parse_spec(text: str, origin: str) -> RemoteSpec:
    """One remote spec (see the module docstring).

    :param origin: where it came from, for error messages (``--remote``, the env var, a file).
    :raises ConfigError: one line naming the (redacted) value and ``origin``.
    """
    shown = redact_url(text)
    url, *attrs = text.strip().split("|")

    def bad(why: str) -> ConfigError:
        return ConfigError(f"remote storage {shown!r} from {origin}: {why}")

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise bad(str(exc).replace(url, shown)) from exc
    if parts.scheme not in SCHEMES:
        raise bad(f"scheme must be one of {', '.join(SCHEMES)}")
    if not parts.hostname:
        raise bad("no host")
    if parts.query or parts.fragment:
        raise bad("a query or fragment is not allowed; attributes go after '|'")
    values = _attributes(attrs, parts, bad)
    given_name = values.pop("name", "")
    url_password = unquote(parts.password) if parts.password is not None else None
    if url_password is not None and "password" in values:
        raise bad("a password in the URL and a password-file: give one")
    values.setdefault("password", url_password)
    spec = RemoteSpec(
        scheme=parts.scheme,
        host=parts.hostname,
        port=port,
        path=parts.path.rstrip("/"),
        name="",
        origin=origin,
        username=unquote(parts.username) if parts.username else None,
        attributes=tuple(_shown_attr(a) for a in attrs if a),
        **values,
    )
    if spec.kind == "redis":
        _check_redis_path(spec, bad)
    return dataclasses.replace(spec, name=given_name or spec.base_url)


def _shown_attr(attr: str) -> str:
    key, _, _ = attr.partition("=")
    return attr if key != "password" else f"password={REDACTED}"


def _check_redis_path(spec: RemoteSpec, bad: Any) -> None:
    db = spec.path.lstrip("/")
    if db and not db.isdigit():
        raise bad(f"the Redis database must be a number, not {db!r}")


def _attributes(attrs: Sequence[str], parts: SplitResult, bad: Any) -> dict[str, Any]:
    """The ``|key=value`` attributes as :class:`RemoteSpec` fields."""
    out: dict[str, Any] = {}
    http = parts.scheme in ("http", "https")
    for attr in attrs:
        if not attr:
            continue
        key, eq, value = attr.partition("=")
        if key == "read-only" and not eq:
            out["read_only"] = True
        elif key in ("connect-timeout", "operation-timeout", "upload-timeout") and eq:
            if not value.isdigit() or int(value) == 0:
                raise bad(f"{key} must be a positive number of milliseconds, not {value!r}")
            out[key.replace("-", "_") + "_s"] = int(value) / 1000
        elif key == "layout" and eq and http:
            if value not in LAYOUTS:
                raise bad(f"layout must be one of {', '.join(LAYOUTS)}, not {value!r}")
            out["layout"] = value
        elif key == "name" and eq and value and "/" not in value and not value.isspace():
            out["name"] = value
        elif key == "password-file" and eq:
            out["password"] = _read_secret(Path(value), key, bad)
        elif key == "bearer-token-file" and eq and http:
            out["bearer_token"] = _read_secret(Path(value), key, bad)
        else:
            raise bad(f"unknown or malformed attribute {_shown_attr(attr)!r}")
    return out


def _read_secret(path: Path, key: str, bad: Any) -> str:
    """A password or token file's first line (the file's content is never shown)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_SECRET_BYTES + 1)
    except OSError as exc:
        raise bad(f"{key} {path}: {exc.strerror}") from exc
    if len(raw) > MAX_SECRET_BYTES:
        raise bad(f"{key} {path}: longer than {MAX_SECRET_BYTES} bytes")
    try:
        text = raw.decode("utf-8").splitlines()[0] if raw.strip() else ""
    except UnicodeDecodeError as exc:
        raise bad(f"{key} {path}: not UTF-8 text") from exc
    if not text:
        raise bad(f"{key} {path}: empty")
    return text


def resolve(
    cli: Sequence[str] | None,
    env: Mapping[str, str],
    table: Mapping[str, Any] | None,
    where: str = "config file",
) -> RemoteConfig:
    """The remotes from ``--remote`` (``cli``), else ``CACHEMGR_REMOTE_STORAGE``, else the
    ``[remote]`` table's ``storage``; the table's tunables always apply.

    :raises ConfigError: a bad spec, an unknown ``[remote]`` key, a bad tunable.
    """
    table = dict(table or {})
    keys = ["storage", *TABLE_DEFAULTS, "prefetch", "prefetch_socs", *TRUST_KEYS]
    unknown = set(table) - set(keys)
    if unknown:
        known = ", ".join(keys)
        raise ConfigError(f"{where} [remote]: unknown key {sorted(unknown)[0]!r} (known: {known})")
    tunables: dict[str, Any] = {k: _tunable(table, k, where) for k in TABLE_DEFAULTS}
    tunables.update(_prefetch(table, where))
    tunables.update(_trust(table, where))
    if cli:
        texts, origin = [t for item in cli for t in item.split()], "--remote"
    elif env.get(ENV_VAR, "").strip():
        texts, origin = env[ENV_VAR].split(), ENV_VAR
    else:
        texts, origin = _table_storage(table, where), f"{where} [remote] storage"
    remotes = tuple(parse_spec(t, origin) for t in texts)
    names = [r.name for r in remotes]
    for n in names:
        if names.count(n) > 1:
            raise ConfigError(f"remote storage from {origin}: two remotes named {n!r}")
    return RemoteConfig(remotes, origin if remotes else "default", **tunables)


def _table_storage(table: Mapping[str, Any], where: str) -> list[str]:
    raw = table.get("storage", [])
    if isinstance(raw, str):
        return raw.split()
    if isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        return [t for x in raw for t in x.split()]
    raise ConfigError(f"{where} [remote] storage: a list of URL strings expected")


def _prefetch(table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``prefetch`` (a whole number ≥ 0) and ``prefetch_socs`` (a list of chip names)."""
    count = table.get("prefetch", PREFETCH_DEFAULT)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ConfigError(
            f"{where} [remote] prefetch: a whole number of entries per chip (0 = off) "
            f"expected, not {count!r}"
        )
    socs = table.get("prefetch_socs", [])
    if isinstance(socs, str):
        socs = socs.split()
    ok = isinstance(socs, list | tuple) and all(
        isinstance(x, str) and x and x.replace("_", "").replace("-", "").isalnum() for x in socs
    )
    if not ok:
        raise ConfigError(
            f"{where} [remote] prefetch_socs: a list of chip names like 'Ascend910B1' "
            f"expected, not {socs!r}"
        )
    return {"prefetch": count, "prefetch_socs": tuple(socs)}


#: The ``[remote]`` keys of who may write what this site accepts (docs/remote.md#keys).
TRUST_KEYS = ("trusted_keys", "signing_key", "trust_unsigned", "upload_writers")


def _trust(table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``trusted_keys``, ``signing_key`` (its path and stamp; the file is read by
    :func:`load_keys`), ``trust_unsigned`` and ``upload_writers`` (with their uids).

    :raises ConfigError: a bad key line, two keys of one name, an unknown user.
    """
    at = f"{where} [remote]"
    raw_keys = table.get("trusted_keys", [])
    if isinstance(raw_keys, str):
        raw_keys = [raw_keys]
    if not isinstance(raw_keys, list) or not all(isinstance(x, str) for x in raw_keys):
        raise ConfigError(f"{at} trusted_keys: a list of public keys 'NAME:BASE64' expected")
    trusted = tuple(signing.parse_public_key(x, f"{at} trusted_keys") for x in raw_keys)
    names = [k.name for k in trusted]
    for n in names:
        if names.count(n) > 1:
            raise ConfigError(f"{at} trusted_keys: two keys named {n!r}")
    path = table.get("signing_key")
    if path is not None and (not isinstance(path, str) or not path.strip()):
        raise ConfigError(f"{at} signing_key: the path of a private key file expected")
    unsigned = table.get("trust_unsigned", False)
    if not isinstance(unsigned, bool):
        raise ConfigError(f"{at} trust_unsigned: true or false expected, not {unsigned!r}")
    writers = table.get("upload_writers", [])
    if not isinstance(writers, list) or not all(isinstance(x, str) for x in writers):
        raise ConfigError(f"{at} upload_writers: a list of user names expected")
    key = Path(path) if path else None
    return {
        "trusted_keys": trusted,
        "signing_key": key,
        "signing_key_stamp": _stamp(key),
        "trust_unsigned": unsigned,
        "upload_writers": tuple(writers),
        "upload_uids": tuple(_uid(u, f"{at} upload_writers") for u in writers),
    }


def _stamp(path: Path | None) -> tuple[int, int, int] | None:
    if path is None:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _uid(user: str, where: str) -> int:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise ConfigError(f"{where}: no user {user!r} on this host") from None


def trust_warnings(config: RemoteConfig) -> list[str]:
    """One line per way this configuration weakens or limits the remote tier: signatures
    not checked (``trust_unsigned``), reading refused (no ``trusted_keys``), uploads off (no
    ``signing_key``). Empty without remotes. ``config`` and ``status`` show them."""
    if not config.remotes:
        return []
    out = []
    if config.trust_unsigned:
        out.append(
            "[remote] trust_unsigned = true: entries from the remotes are accepted without "
            "checking who signed them; anyone who can write to a remote can run code here"
        )
    elif not config.trusted_keys:
        out.append(READ_REFUSED)
    if config.signing_key is None and any(not r.read_only for r in config.remotes):
        out.append(UPLOADS_OFF)
    return out


#: Why a remote is not read (one line naming the settings).
READ_REFUSED = (
    "reading the remotes is refused: [remote] trusted_keys is empty; add the writers' public "
    "keys (`cachemgr remote keygen NAME` prints one), or set [remote] trust_unsigned = true "
    "for a single-writer setup (docs/remote.md#keys)"
)
#: Why nothing is uploaded (one line naming the setting).
UPLOADS_OFF = (
    "uploads to the remotes are off: [remote] signing_key is not set "
    "(`cachemgr remote keygen NAME` makes one)"
)


def load_keys(config: RemoteConfig, strict: bool) -> signing.Keys:
    """The keys of ``config``: the trusted public keys, and the private key read from
    ``signing_key`` (:func:`~cachemgr.remote.signing.read_key_file`).

    :param strict: a private key that cannot be used (missing, another user's, readable by
        others, malformed) raises (the daemon); else uploads are off with one warning line
        naming why (a member's CLI run with the daemon's config file).
    :raises ConfigError: reading is refused (no trusted key and no ``trust_unsigned``), or
        ``strict`` and the private key cannot be used.
    """
    if not config.trusted_keys and not config.trust_unsigned:
        raise ConfigError(READ_REFUSED)
    secret = None
    if config.signing_key is not None:
        try:
            secret = signing.read_key_file(config.signing_key, "[remote] signing_key")
            keys = signing.Keys(config.trusted_keys, secret, config.trust_unsigned)
        except ConfigError as exc:
            if strict:
                raise
            log.warning("uploads to the remotes are off: %s", exc)
            secret = None
        else:
            return keys
    return signing.Keys(config.trusted_keys, None, config.trust_unsigned)


def _tunable(table: Mapping[str, Any], key: str, where: str) -> Any:
    default = TABLE_DEFAULTS[key]
    raw = table.get(key, default)
    kind = type(default)
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw <= 0:
        raise ConfigError(f"{where} [remote] {key}: a positive number expected, not {raw!r}")
    if kind is int and not isinstance(raw, int):
        raise ConfigError(f"{where} [remote] {key}: a whole number expected, not {raw!r}")
    return kind(raw)


def from_settings(settings: Any, cli: Sequence[str] | None = None) -> RemoteConfig:
    """:func:`resolve` for a :class:`~cachemgr.config.options.Settings` (its ``[remote]`` table) and
    this process's environment."""
    return resolve(cli, os.environ, settings.sections.get("remote"))
