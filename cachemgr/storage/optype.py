"""An entry's op type, the same for every user who lists it (``cachemgr ls``).

GE names its entries ``te_<OpType>_<hash>``, the case kept (``te_MatMul_…``); cachemgr's own
names are lower-cased (``te_matmul_…``), while the main json records ``MatMul``. Reading that
json to learn the case works for its owner and root (``O_NOATIME``) but not for another
member of the group, on whom the read would move the json's access time — the eviction order
(docs/eviction.md) — which only the owner could put back; so ``ls`` showed ``add`` to a member
and ``Add`` to root. Instead the publish keeps the json's op type beside the name, in the
extended attribute :data:`XATTR` of the main json (set on the temp file before it is renamed
into place): reading an attribute never touches an access time, and needs only the read
permission every member has. Where the filesystem keeps no user attributes (NFSv3), or for
an entry published before, the name's op type is what everyone sees. See docs/commands.md
(``ls``).

Everything in a shared folder is untrusted: an attribute is used only when it is that
name's op type in another case (at most :data:`MAX_BYTES`, printable).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cachemgr.storage import entry

log = logging.getLogger(__name__)

#: The extended attribute of a main json that holds the op type as its json records it.
XATTR = "user.cachemgr.op_type"
#: The longest op type read from an attribute (bytes).
MAX_BYTES = 255
#: errno values of a filesystem (or a file) that keeps no user attribute: not a problem.
_NO_XATTR_ERRNOS = frozenset(
    {errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENODATA, errno.EPERM, errno.EACCES, errno.E2BIG}
)


def from_name(kernel: str) -> str:
    """``te_<optype>_<hash>`` → ``<optype>`` (GE's naming, ``assemble_json/te_json_assemble.cc``
    ``TeJsonAssemble::GenerateKernelName``), and the same for a pre-build entry
    ``te_<optype>_<hash>_pre`` (``GeneratePreBuildKernelName``; its json records no op type);
    ``""`` for a name of another form."""
    if entry.is_pre_entry(kernel):
        kernel = kernel[: -len(entry.PRE_SUFFIX)]
    parts = kernel.split("_")
    if len(parts) >= 3 and parts[0] == "te":
        return "_".join(parts[1:-1])
    return ""


def _same_op(found: Any, name_op: str) -> str | None:
    """``found`` when it is ``name_op`` in another case (a str), else None."""
    if isinstance(found, str) and found != name_op and found.lower() == name_op:
        return found
    return None


def in_json(main_json: Mapping[str, Any], kernel: str) -> str | None:
    """The op type ``main_json`` records (``supportInfo.opType``, else ``opType``) when it is
    the lower-cased name ``kernel``'s op type in another case (``MatMul`` for
    ``te_matmul_…``); None otherwise (GE's names keep the case: nothing to keep)."""
    name_op = from_name(kernel)
    if not name_op or name_op != name_op.lower():
        return None
    support = main_json.get("supportInfo")
    for found in (support.get("opType") if isinstance(support, dict) else None,
                  main_json.get("opType")):  # fmt: skip
        kept = _same_op(found, name_op)
        if kept is not None:
            return kept
    return None


def attach(dir_fd: int | None, name: str, op_type: str | None) -> None:
    """Keep ``op_type`` in :data:`XATTR` of the file ``name`` of the folder ``dir_fd`` (a
    publish's temp json, not yet visible); nothing when None. A filesystem without user
    attributes is no error: ``ls`` shows the name's op type there (logged at debug)."""
    if op_type is None:
        return
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        log.debug("op type of %s not kept: %s", name, exc.strerror)
        return
    try:
        os.setxattr(fd, XATTR, op_type.encode("utf-8"))
    except OSError as exc:
        if exc.errno not in _NO_XATTR_ERRNOS:
            raise
        log.debug("op type of %s not kept: %s", name, exc.strerror)
    finally:
        os.close(fd)


def shown(chip: Path, kernel: str) -> str:
    """The op type ``ls`` shows for ``kernel`` in the chip folder ``chip`` — the same for
    every user: the name's (GE's keep the case), or for cachemgr's lower-cased names the one
    kept in the main json's :data:`XATTR` at publish; never a read of the json."""
    name_op = from_name(kernel)
    if not name_op or name_op != name_op.lower():
        return name_op
    try:
        raw = os.getxattr(chip / f"{kernel}.json", XATTR, follow_symlinks=False)
    except OSError:
        return name_op
    if len(raw) > MAX_BYTES:
        return name_op
    text = raw.decode("utf-8", "replace")
    kept = _same_op(text, name_op) if text.isprintable() else None
    return kept or name_op
