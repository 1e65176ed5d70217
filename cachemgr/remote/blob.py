"""The entry blob: every part of one entry in one value, signed by its writer. Format 2.

Layout (all integers big-endian)::

    magic      8 bytes   b"CMGRENT\\x00"
    version    2 bytes   2
    klen       1 byte    length of the key name
    key        klen      ASCII: the name of the key that signed it (signing.NAME_PATTERN)
    signature  64 bytes  ed25519, over: magic | version | klen | key | hlen | header
    hlen       4 bytes   length of the header (bytes), at most MAX_HEADER_BYTES
    header     hlen      UTF-8 JSON: {"format": 2, "soc_version": S, "kernel": K,
                         "files": [{"name": N, "size": bytes, "sha256": hex}, ...]}
    data       sum(size) the files' bytes, in the header's order, back to back

The signature covers the format version, the key's name, ``soc_version``, the kernel name and
every file's name, size and sha256, so it covers every byte of the blob. Format 1 had no
signature: its digests were computed by its writer, whoever that was, and proved nothing
about who wrote it (docs/remote.md#keys).

A reader, before anything is written locally: checks the caps (each part at most
``max_part_bytes``, the whole blob at most ``max_blob_bytes``), the magic and version,
then verifies the signature over the **raw** header bytes against the named key of
``[remote] trusted_keys`` — before the header is decoded; then decodes the header, checks that
``soc_version`` and ``kernel`` are the ones asked for, every part's size and sha256, and that
the files are exactly the entry's own parts (:func:`entry_parts`): a blob carries an entry and
nothing else — no ``<kernel>.lock``, temp file, ``.manifest`` or ``.bak``. The local store
then checks each binary against the sha256 in its json (docs/design.md; GE's rule R5 in
:mod:`cachemgr.storage.entry`). Remote data is untrusted input.

Every rejection is a :class:`BadBlob` with a ``reason`` (the ``reason`` label of
``remote_rejected``) and the ``key`` that signed it, when known.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from pathlib import Path

from cachemgr.config import layout
from cachemgr.errors import InvalidEntryError
from cachemgr.remote import signing
from cachemgr.storage import entry
from cachemgr.storage.tiers import MAX_IN_MEMORY_BYTES, EntryFiles

MAGIC = b"CMGRENT\x00"
FORMAT_VERSION = 2
_HEAD = struct.Struct(">8sHB")
_HLEN = struct.Struct(">I")
MAX_HEADER_BYTES = 1 << 20
#: The most a blob's framing adds to its header and parts (bytes): head, key name,
#: signature, header length.
_FRAME_BYTES = _HEAD.size + 255 + signing.SIGNATURE_BYTES + _HLEN.size
#: Default caps (bytes): one part, one blob — what one entry may hold in memory
#: (:data:`cachemgr.storage.tiers.MAX_IN_MEMORY_BYTES`) and its header. A kernel binary is
#: rarely over a few MiB; a value over the cap is refused before it is read.
DEFAULT_MAX_PART_BYTES = MAX_IN_MEMORY_BYTES
DEFAULT_MAX_BLOB_BYTES = MAX_IN_MEMORY_BYTES + MAX_HEADER_BYTES + _FRAME_BYTES

#: Why a blob was rejected (the ``reason`` label of ``remote_rejected``), besides the
#: signature's own reasons (``signing.UNKNOWN_KEY``, ``signing.BAD_SIGNATURE``).
UNSIGNED = "unsigned"  # format 1: no signature at all
CORRUPT = "corrupt"  # not a well-formed blob: magic, lengths, header, a part's sha256
WRONG_ENTRY = "wrong_entry"  # another chip's or kernel's blob under this key
PARTS = "parts"  # files that are not exactly the entry's parts
TOO_LARGE = "too_large"  # over a cap


class BadBlob(ValueError):
    """A blob that fails a check; the message names the check (one line), ``reason`` is a
    stable code (see the module's constants), ``key`` the signing key's name ("" if none)."""

    def __init__(self, message: str, reason: str = CORRUPT, key: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.key = key


def entry_parts(item: EntryFiles) -> None:
    """Check that ``item`` holds exactly its entry's own parts: the main json, the binaries
    its json (and its sub-jsons) name, the header when ``headerFileSuffix`` names one (it may be
    absent: GE's rule R6), the ``jsonList`` sub-jsons — or, for a ``<name>_pre`` entry, its
    ``_pre.json`` alone. The parts are computed by :func:`cachemgr.storage.entry.parse_entry`,
    the same reading every lookup makes.

    :raises BadBlob: reason ``parts`` naming a file too many or missing; ``corrupt`` for a
        main json that does not parse.
    """

    def read(name: str) -> bytes:
        try:
            return item.files[name]
        except KeyError:
            raise FileNotFoundError(name) from None

    try:
        desc = entry.parse_entry(Path(item.soc_version), item.kernel, read=read)
    except FileNotFoundError as exc:
        raise BadBlob(f"blob has no {exc}", PARTS) from exc
    except InvalidEntryError as exc:
        reason = PARTS if exc.reason == entry.MISSING_SUBPART else CORRUPT
        raise BadBlob(f"blob's entry is not valid: {exc}", reason) from exc
    allowed = desc.file_names()
    extra = sorted(set(item.files) - set(allowed))
    if extra:
        raise BadBlob(f"blob carries {extra[0]!r}, not a part of {item.kernel}", PARTS)
    missing = [n for n in allowed if n not in item.files and n != desc.header]
    if missing:
        raise BadBlob(f"blob lacks {missing[0]!r}, a part of {item.kernel}", PARTS)


def encode(item: EntryFiles, keys: signing.Keys) -> bytes:
    """The blob of ``item`` (files in name order, the main json last), signed with this
    site's key.

    :raises BadBlob: ``item`` is not exactly an entry's parts (:func:`entry_parts`).
    :raises ConfigError: no signing key is configured.
    """
    entry_parts(item)
    names = sorted(item.files, key=lambda n: (n == item.main_json, n))
    header = {
        "format": FORMAT_VERSION,
        "soc_version": item.soc_version,
        "kernel": item.kernel,
        "files": [
            {
                "name": n,
                "size": len(item.files[n]),
                "sha256": hashlib.sha256(item.files[n]).hexdigest(),
            }
            for n in names
        ],
    }
    raw = json.dumps(header, separators=(",", ":")).encode()
    name = (keys.signer_name or "").encode("ascii")
    head = _HEAD.pack(MAGIC, FORMAT_VERSION, len(name)) + name
    hlen = _HLEN.pack(len(raw))
    signature = keys.sign(head + hlen + raw)
    return b"".join([head, signature, hlen, raw, *(item.files[n] for n in names)])


def decode(
    blob: bytes,
    soc_version: str,
    kernel: str,
    keys: signing.Keys,
    max_part_bytes: int = DEFAULT_MAX_PART_BYTES,
    max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES,
) -> EntryFiles:
    """The verified entry in ``blob`` (see the module docstring).

    :raises BadBlob: naming the first check that failed, with its ``reason``.
    """
    if len(blob) > max_blob_bytes:
        raise BadBlob(f"blob of {len(blob)} bytes is over the {max_blob_bytes}-byte cap", TOO_LARGE)
    if len(blob) < _HEAD.size:
        raise BadBlob(f"blob of {len(blob)} bytes is too short")
    magic, version, klen = _HEAD.unpack_from(blob)
    if magic != MAGIC:
        raise BadBlob("not a cachemgr entry blob (bad magic)")
    if version == 1:
        raise BadBlob("blob of format 1 carries no signature", UNSIGNED)
    if version != FORMAT_VERSION:
        raise BadBlob(f"blob format {version} is not {FORMAT_VERSION}")
    key_at = _HEAD.size
    sig_at = key_at + klen
    hlen_at = sig_at + signing.SIGNATURE_BYTES
    header_at = hlen_at + _HLEN.size
    if len(blob) < header_at:
        raise BadBlob(f"blob of {len(blob)} bytes is too short")
    key = _key_name(blob[key_at:sig_at])
    (hlen,) = _HLEN.unpack_from(blob, hlen_at)
    if hlen > MAX_HEADER_BYTES or header_at + hlen > len(blob):
        raise BadBlob(f"header length {hlen} is out of range", key=key)
    view = memoryview(blob)  # views, not copies: a blob is held once (docs/daemon.md)
    raw_header = bytes(view[header_at : header_at + hlen])
    if not keys.trust_unsigned:
        signed = bytes(view[:sig_at]) + bytes(view[hlen_at : header_at + hlen])
        why = keys.verify(key, bytes(view[sig_at:hlen_at]), signed)
        if why is not None:
            raise BadBlob(f"blob signed by key {key!r}: {why.replace('_', ' ')}", why, key)
    header = _header(raw_header, key)
    if header.get("soc_version") != soc_version or header.get("kernel") != kernel:
        raise BadBlob(
            f"blob is for {header.get('soc_version')!r}/{header.get('kernel')!r}, "
            f"not {soc_version}/{kernel}",
            WRONG_ENTRY,
            key,
        )
    try:
        files = _parts(header.get("files"), view, header_at + hlen, kernel, max_part_bytes)
        item = EntryFiles(soc_version, kernel, files)
        entry_parts(item)
    except BadBlob as exc:
        exc.key = key
        raise
    return item


def _key_name(raw: bytes) -> str:
    """The blob's key name, or ``"?"`` when it is not one (it is untrusted text: only a
    valid name is ever logged)."""
    text = raw.decode("ascii", "replace")
    return text if signing.NAME_PATTERN.fullmatch(text) else "?"


def _header(raw: bytes, key: str) -> dict[str, object]:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BadBlob(f"blob header is not JSON: {str(exc)[:200]}", key=key) from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT_VERSION:
        raise BadBlob(f"blob header is not a format-{FORMAT_VERSION} object", key=key)
    return header


def _parts(
    listed: object, body: memoryview, offset: int, kernel: str, max_part_bytes: int
) -> Mapping[str, bytes]:
    if not isinstance(listed, list) or not listed:
        raise BadBlob("blob header lists no files")
    files: dict[str, bytes] = {}
    for item in listed:
        if not isinstance(item, dict):
            raise BadBlob("blob header: a file is not an object")
        name, size, digest = item.get("name"), item.get("size"), item.get("sha256")
        if not isinstance(name, str) or not isinstance(size, int) or not isinstance(digest, str):
            raise BadBlob("blob header: a file lacks name, size or sha256")
        try:
            layout.safe_file_name(name, "file name")
        except InvalidEntryError as exc:
            raise BadBlob(f"blob names a bad file: {exc}", PARTS) from exc
        if not entry.owned_by(name, kernel) or name in files:
            raise BadBlob(f"blob names {name!r}, not a file of {kernel}", PARTS)
        if size < 0 or size > max_part_bytes:
            raise BadBlob(
                f"{name}: {size} bytes is over the {max_part_bytes}-byte part cap", TOO_LARGE
            )
        data = body[offset : offset + size]
        if len(data) != size:
            raise BadBlob(f"{name}: blob is truncated")
        if hashlib.sha256(data).hexdigest() != digest:
            raise BadBlob(f"{name}: sha256 does not match")
        files[name] = bytes(data)
        offset += size
    if offset != len(body):
        raise BadBlob(f"blob has {len(body) - offset} bytes after its last file")
    return files
