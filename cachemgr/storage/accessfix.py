"""The fix a permission message offers, derived from the real modes (``fsutil.access_hint``).

A fix must be one that would work: joining a group helps only when that group may do what
is wanted (``usermod -aG root ncop`` beside a ``drwxr-xr-x root:root`` folder does nothing),
and the group of a shared cache is a sharing group, never ``root`` (docs/shared-cache.md,
"One group, umask 007": ``chgrp GROUP DIR && chmod 2770 DIR``). So, for a user that does
not own the path:

* the group may not (its bits lack ``w``, or ``r``, and ``x`` on a folder): the owner or
  root gives it to the group — ``chgrp G PATH && chmod 2770 PATH`` (``660`` for a file),
  ``G`` the path's group unless that is ``root``, else a sharing group (e.g. ``ascend``) —
  and a user outside ``G`` joins it too;
* the group may, and the user is not in it: ``usermod -aG G USER`` (``G`` not ``root``:
  then a sharing group as above);
* the group may and the user is in it: the modes do not explain it (an ACL, a folder above).
"""

from __future__ import annotations

import os
import stat

#: The example of a sharing group where the path's group is ``root`` (docs/shared-cache.md).
EXAMPLE_GROUP = "ascend"


def _group_may(st: os.stat_result, want: str) -> bool:
    """Whether the group bits of ``st`` allow ``want`` (``writable``: ``w``; ``readable``:
    ``r``; a folder also needs ``x``)."""
    need = stat.S_IWGRP if want == "writable" else stat.S_IRGRP
    if stat.S_ISDIR(st.st_mode):
        need |= stat.S_IXGRP
    return st.st_mode & need == need


def _share_command(path: os.PathLike[str] | str, st: os.stat_result, group: str) -> str:
    mode = "2770" if stat.S_ISDIR(st.st_mode) else "660"
    return f"chgrp {group} {path} && chmod {mode} {path}"


def fix(
    path: os.PathLike[str] | str,
    st: os.stat_result,
    want: str,
    user: str,
    owner: str,
    group: str,
    in_group: bool,
) -> str:
    """The clause after ``<path> … belongs to OWNER:GROUP, mode …`` for ``user``, who does
    not own ``path`` (``st``: its status; ``want``: ``writable`` or ``readable``;
    ``in_group``: the user's process is in ``st.st_gid``), starting with ``", "`` or
    ``"; "``."""
    by = "root" if owner == "root" else f"{owner} (or root)"
    join = f"usermod -aG {{}} {user}, then log in again"
    if st.st_gid == 0:  # never a group to share through, nor one to join
        share = _share_command(path, st, EXAMPLE_GROUP)
        return (
            f"; group root is no sharing group: ask {by} to give it one, e.g. '{share}' "
            f"({EXAMPLE_GROUP}: the group of the cache's users; add {user} with "
            f"{join.format(EXAMPLE_GROUP)}), or use another cache folder"
        )
    verb = "write" if want == "writable" else "read"
    if not _group_may(st, want):
        share = _share_command(path, st, group)
        also = "" if in_group else f", and add {user} to group {group} ({join.format(group)})"
        return (
            f", and group {group} may not {verb} it; ask {by} to run '{share}'{also}, "
            "or use another cache folder"
        )
    if not in_group:
        return (
            f", and {user} is not in group {group}; add {user} to it ({join.format(group)}) "
            "or use another cache folder"
        )
    return (
        f"; its modes let group {group} in, and {user} is in it: check its ACL (getfacl "
        f"{path}) and the folders above it"
    )
