"""Site keys: who may write the entries a site accepts from a remote (docs/remote.md#keys).

Each site signs what it uploads with its own ed25519 key and accepts from a remote only
what a key it trusts signed, as Nix's binary caches do (``nix key generate-secret``,
``trusted-public-keys``); the key formats are Nix's:

* a **private key file** holds one line ``NAME:BASE64`` where BASE64 encodes 64 bytes, the
  32-byte seed then the 32-byte public key. It is created by :func:`create_key_file`
  (``cachemgr remote keygen NAME``) with mode 0600, and read by :func:`read_key_file` only
  when it is a regular file of this user that nobody else may read or write;
* a **public key** is one line ``NAME:BASE64`` of the 32-byte public key, to paste into the
  other sites' ``[remote] trusted_keys``.

The names travel in every blob (:mod:`cachemgr.remote.blob`), so a reader finds the key at
once and two keys can be trusted together (rotation: trust the new key everywhere, switch
the writer to it, then drop the old one). The private key is never printed or logged: its
dataclass fields are left out of ``repr``.

``cryptography`` is imported only where a key is used (sign, verify, keygen): reading the
configuration stays cheap.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cachemgr.errors import ConfigError
from cachemgr.storage import secretfile

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

#: A key's name: what ``trusted_keys`` and the blobs call it (at most 64 characters).
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SEED_BYTES = 32
PUBLIC_BYTES = 32
SIGNATURE_BYTES = 64
#: The biggest private key file read (bytes): one short line.
MAX_KEY_FILE_BYTES = 4096

#: Why a signature was not accepted (the ``reason`` label of ``remote_rejected``).
UNKNOWN_KEY = "unknown_key"
BAD_SIGNATURE = "bad_signature"


def check_name(name: str, where: str) -> str:
    """``name`` when it is a key name (letters, digits, ``.``, ``_``, ``-``; 1 to 64).

    :raises ConfigError: naming the value and ``where`` it came from.
    """
    if not NAME_PATTERN.fullmatch(name):
        raise ConfigError(
            f"{where}: key name {name!r} is not 1 to 64 letters, digits, '.', '_' or '-' "
            "(starting with a letter or digit)"
        )
    return name


def _decode(text: str, size: int, where: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != size:
        raise ConfigError(f"{where}: {what} is not base64 of {size} bytes")
    return raw


@dataclass(frozen=True)
class PublicKey:
    """A named ed25519 public key (``raw``: 32 bytes)."""

    name: str
    raw: bytes

    @property
    def line(self) -> str:
        """``NAME:BASE64``, the form ``trusted_keys`` takes."""
        return f"{self.name}:{base64.b64encode(self.raw).decode()}"


def parse_public_key(text: str, where: str) -> PublicKey:
    """One ``trusted_keys`` item, ``NAME:BASE64`` (Nix's ``trusted-public-keys`` form).

    :raises ConfigError: naming the (public) value and ``where``.
    """
    name, sep, b64 = text.strip().partition(":")
    if not sep:
        raise ConfigError(
            f"{where}: {text!r} is not NAME:BASE64 (as `cachemgr remote keygen` prints)"
        )
    check_name(name, where)
    return PublicKey(name, _decode(b64, PUBLIC_BYTES, where, f"the key of {name!r}"))


@dataclass(frozen=True)
class SecretKey:
    """A site's private key as read from its file; ``seed`` and ``public`` are never shown
    (left out of ``repr``)."""

    name: str
    path: Path
    seed: bytes = field(repr=False)
    public: bytes = field(repr=False)

    @property
    def public_key(self) -> PublicKey:
        """The public half, to give to the other sites."""
        return PublicKey(self.name, self.public)


def read_key_file(path: Path, where: str) -> SecretKey:
    """The private key in ``path`` (see the module docstring).

    The file must be a regular file (a symbolic link is not followed), owned by this user,
    with no permission for group or others (``chmod 600``): a key another user can read is
    a key anyone can sign with.

    :raises ConfigError: one line naming the file and ``where``; the content is never shown.
    """
    raw = secretfile.read_private(path, where, MAX_KEY_FILE_BYTES, "the private key")
    if len(raw) > MAX_KEY_FILE_BYTES:
        raise ConfigError(f"{where} {path}: longer than {MAX_KEY_FILE_BYTES} bytes")
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        text = ""
    name, sep, b64 = text.partition(":")
    if not sep or not NAME_PATTERN.fullmatch(name):
        raise ConfigError(
            f"{where} {path}: not a private key file (one line NAME:BASE64, as written by "
            "`cachemgr remote keygen NAME`)"
        )
    both = _decode(b64, SEED_BYTES + PUBLIC_BYTES, f"{where} {path}", "the private key")
    return SecretKey(name, path, both[:SEED_BYTES], both[SEED_BYTES:])


def create_key_file(path: Path, name: str) -> PublicKey:
    """Make a new private key named ``name`` in a new file ``path`` (mode 0600, created
    with ``O_EXCL|O_NOFOLLOW``: an existing file or link is never overwritten or followed).

    :returns: the public key, to print.
    :raises ConfigError: a bad name.
    :raises FileExistsError, OSError: ``path`` exists or cannot be created.
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    check_name(name, "key name")
    private = Ed25519PrivateKey.generate()
    seed = private.private_bytes_raw()
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    line = f"{name}:{base64.b64encode(seed + public).decode()}\n".encode()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, line)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return PublicKey(name, public)


class Keys:
    """What a site signs with and whose signatures it accepts.

    :param trusted: the ``trusted_keys`` (their names are unique).
    :param secret: the site's own private key (None: this site does not upload).
    :param trust_unsigned: accept blobs without checking their signature (a single-writer
        setup that opted out: docs/remote.md#keys, "No trusted key").
    :raises ConfigError: the private key file's two halves do not match.
    """

    def __init__(
        self,
        trusted: Sequence[PublicKey] = (),
        secret: SecretKey | None = None,
        trust_unsigned: bool = False,
    ) -> None:
        self.trusted = {k.name: k for k in trusted}
        self.secret = secret
        self.trust_unsigned = trust_unsigned
        self._verifiers: dict[str, Ed25519PublicKey] = {}
        self._signer: Ed25519PrivateKey | None = None
        if secret is not None:
            self._signer = _private(secret)

    @property
    def signer_name(self) -> str | None:
        """The name this site signs with, None when it has no key."""
        return self.secret.name if self.secret is not None else None

    @property
    def can_read(self) -> bool:
        """True when some signature can be accepted (or the check is opted out of)."""
        return bool(self.trusted) or self.trust_unsigned

    def sign(self, message: bytes) -> bytes:
        """The 64-byte ed25519 signature of ``message`` by this site's key.

        :raises ConfigError: no ``signing_key`` is configured.
        """
        if self._signer is None:
            raise ConfigError("[remote] signing_key is not set: this site does not upload")
        return self._signer.sign(message)

    def verify(self, name: str, signature: bytes, message: bytes) -> str | None:
        """None when ``signature`` is the trusted key ``name``'s over ``message``, else why
        not (:data:`UNKNOWN_KEY`, :data:`BAD_SIGNATURE`)."""
        from cryptography.exceptions import InvalidSignature

        key = self.trusted.get(name)
        if key is None:
            return UNKNOWN_KEY
        verifier = self._verifiers.get(name)
        if verifier is None:
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

            verifier = self._verifiers[name] = Ed25519PublicKey.from_public_bytes(key.raw)
        try:
            verifier.verify(signature, message)
        except InvalidSignature:
            return BAD_SIGNATURE
        return None


def _private(secret: SecretKey) -> Ed25519PrivateKey:
    """The signing key of ``secret``, after checking that its public half is its own.

    :raises ConfigError: the halves do not match (a damaged or hand-edited file).
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    private = Ed25519PrivateKey.from_private_bytes(secret.seed)
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    if public != secret.public:
        raise ConfigError(
            f"[remote] signing_key {secret.path}: its public half does not match its private "
            "half (a damaged file?)"
        )
    return private
