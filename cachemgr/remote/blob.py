"""The entry blob: every file of one entry in one value (issue 15 item 3). Format version 1.

Layout (all integers big-endian)::

    magic      8 bytes   b"CMGRENT\\x00"
    version    2 bytes   1
    hlen       4 bytes   length of the header (bytes), at most MAX_HEADER_BYTES
    header     hlen      UTF-8 JSON: {"format": 1, "soc_version": S, "kernel": K,
                         "files": [{"name": N, "size": bytes, "sha256": hex}, ...]}
    data       sum(size) the files' bytes, in the header's order, back to back
    digest     32 bytes  sha256 of everything before it

The main json (``<kernel>.json``) is one of the files. A reader checks, before anything is
written locally: the magic and version, the trailing digest, the sizes (each part at most
``max_part_bytes``, the whole blob at most ``max_blob_bytes``, the lengths adding up exactly),
every part's sha256, that ``soc_version`` and ``kernel`` are the ones asked for, and that every
name is a flat file name owned by the kernel (``cachemgr.storage.entry.owned_by``, SPEC §3.1). The
local store then checks each binary against the sha256 in its json (SPEC §3.3). Remote data
is untrusted input.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping

from cachemgr.config import layout
from cachemgr.errors import InvalidEntryError
from cachemgr.storage import entry
from cachemgr.storage.tiers import MAX_IN_MEMORY_BYTES, EntryFiles

MAGIC = b"CMGRENT\x00"
FORMAT_VERSION = 1
_HEAD = struct.Struct(">8sHI")
DIGEST_BYTES = 32
MAX_HEADER_BYTES = 1 << 20
#: Default caps (bytes): one part, one blob — what one entry may hold in memory
#: (:data:`cachemgr.storage.tiers.MAX_IN_MEMORY_BYTES`) and its header. A kernel binary is
#: rarely over a few MiB; a value over the cap is refused before it is read.
DEFAULT_MAX_PART_BYTES = MAX_IN_MEMORY_BYTES
DEFAULT_MAX_BLOB_BYTES = MAX_IN_MEMORY_BYTES + MAX_HEADER_BYTES + _HEAD.size + DIGEST_BYTES


class BadBlob(ValueError):
    """A blob that fails a check; the message names the check (one line)."""


def encode(item: EntryFiles) -> bytes:
    """The blob of ``item`` (files in name order, the main json last)."""
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
    body = b"".join(
        [_HEAD.pack(MAGIC, FORMAT_VERSION, len(raw)), raw, *(item.files[n] for n in names)]
    )
    return body + hashlib.sha256(body).digest()


def decode(
    blob: bytes,
    soc_version: str,
    kernel: str,
    max_part_bytes: int = DEFAULT_MAX_PART_BYTES,
    max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES,
) -> EntryFiles:
    """The verified entry in ``blob`` (see the module docstring).

    :raises BadBlob: naming the first check that failed.
    """
    if len(blob) > max_blob_bytes:
        raise BadBlob(f"blob of {len(blob)} bytes is over the {max_blob_bytes}-byte cap")
    if len(blob) < _HEAD.size + DIGEST_BYTES:
        raise BadBlob(f"blob of {len(blob)} bytes is too short")
    magic, version, hlen = _HEAD.unpack_from(blob)
    if magic != MAGIC:
        raise BadBlob("not a cachemgr entry blob (bad magic)")
    if version != FORMAT_VERSION:
        raise BadBlob(f"blob format {version} is not {FORMAT_VERSION}")
    # views, not copies: a blob is held once (docs/daemon.md, "Bounded memory")
    body, digest = memoryview(blob)[:-DIGEST_BYTES], blob[-DIGEST_BYTES:]
    if hashlib.sha256(body).digest() != digest:
        raise BadBlob("blob digest does not match")
    if hlen > MAX_HEADER_BYTES or _HEAD.size + hlen > len(body):
        raise BadBlob(f"header length {hlen} is out of range")
    header = _header(bytes(body[_HEAD.size : _HEAD.size + hlen]))
    if header.get("soc_version") != soc_version or header.get("kernel") != kernel:
        raise BadBlob(
            f"blob is for {header.get('soc_version')!r}/{header.get('kernel')!r}, "
            f"not {soc_version}/{kernel}"
        )
    files = _parts(header.get("files"), body, _HEAD.size + hlen, kernel, max_part_bytes)
    if kernel + ".json" not in files:
        raise BadBlob(f"blob has no {kernel}.json")
    return EntryFiles(soc_version, kernel, files)


def _header(raw: bytes) -> dict[str, object]:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadBlob(f"blob header is not JSON: {exc}") from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT_VERSION:
        raise BadBlob("blob header is not a format-1 object")
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
            raise BadBlob(f"blob names a bad file: {exc}") from exc
        if not entry.owned_by(name, kernel) or name in files:
            raise BadBlob(f"blob names {name!r}, not a file of {kernel}")
        if size < 0 or size > max_part_bytes:
            raise BadBlob(f"{name}: {size} bytes is over the {max_part_bytes}-byte part cap")
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
