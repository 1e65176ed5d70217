"""The chip names (``soc_version``) CANN accepts, and the check every new chip folder passes.

The kernel cache has one folder per chip, named exactly by ``soc_version``
(docs/design.md#where-the-cache-lives), so a misspelt or lower-case name (``ascend910b1``,
``Ascend999``) would silently start a second, cold chip folder beside the real one. CANN itself
accepts only the names of its platform table; so does cachemgr for anything that creates a chip
folder (a compile request), and for ``--soc`` unless a chip folder of that exact name already exists
(a newer CANN may have written one for a chip this table does not know yet: governing it must still
work).

Source of the table — the names CANN's runtime reports and its adapters accept
(``aclrtGetSocName``), as listed in:

* ``Ascend/pytorch`` ``torch_npu/csrc/core/npu/NpuVariables.cpp``, ``socVersionMap`` (used by
  ``SetSocVersion``, which rejects any other name with "Unsupported soc version"), and the
  ``SocVersion`` enum of ``NpuVariables.h`` beside it (adds ``Ascend310P5``,
  ``Ascend310P7``, ``Ascend910_9362``);
* the CANN custom-op build's ``SOC_VERSION_MAP`` (its ``check_args`` rejects names outside
  it, compared lower-cased): adds the family names ``Ascend310P``, ``Ascend310B``,
  ``Ascend910C`` and the virtual 310P3 instances ``Ascend310P3vir01/02/04/08``;
* CANN's ``PlatformAscendCManager`` (``convertMapInAicpu``): the same A2/A3/310P/310B names.

Names are case-sensitive, as the chip folder names are.
"""

from __future__ import annotations

from cachemgr.errors import InvalidInputError

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: collections costs start-up (the lean ``config``)
    from collections.abc import Iterable

#: Every ``soc_version`` CANN accepts (see the module docstring for the sources).
KNOWN_SOC_VERSIONS: frozenset[str] = frozenset(
    {
        # Ascend 910 (first generation)
        "Ascend910A", "Ascend910B", "Ascend910ProA", "Ascend910ProB", "Ascend910PremiumA",
        # Atlas A2 (Ascend 910B)
        "Ascend910B1", "Ascend910B2", "Ascend910B2C", "Ascend910B3", "Ascend910B4",
        "Ascend910B4-1",
        # Atlas A3 (Ascend 910C / 910_93)
        "Ascend910C", "Ascend910_9391", "Ascend910_9392", "Ascend910_9381", "Ascend910_9382",
        "Ascend910_9372", "Ascend910_9362", "Ascend910_9361",
        # Ascend 310P and its virtual instances
        "Ascend310P", "Ascend310P1", "Ascend310P2", "Ascend310P3", "Ascend310P4",
        "Ascend310P5", "Ascend310P7",
        "Ascend310P3vir01", "Ascend310P3vir02", "Ascend310P3vir04", "Ascend310P3vir08",
        # Ascend 310B
        "Ascend310B", "Ascend310B1", "Ascend310B2", "Ascend310B3", "Ascend310B4",
    }
)  # fmt: skip


def accepted_list() -> str:
    """The accepted names, sorted, comma-separated (for messages and ``--help``)."""
    return ", ".join(sorted(KNOWN_SOC_VERSIONS))


def check_soc_version(value: str, origin: str, existing: Iterable[str] = ()) -> str:
    """Return ``value`` when CANN accepts it as a ``soc_version`` (or it names an existing
    chip folder listed in ``existing``).

    :param origin: where the value came from, for the message (``request f.json``,
        ``option --soc``).
    :param existing: names of chip folders already in the kernel cache.
    :raises InvalidInputError: one line naming the value, its origin, the closest known
        name (``ascend910b1`` → ``Ascend910B1``) and every accepted name.
    """
    if value in KNOWN_SOC_VERSIONS or value in set(existing):
        return value
    import difflib  # only for a bad name's suggestion: not on the hit path

    by_lower = {name.lower(): name for name in KNOWN_SOC_VERSIONS}
    near = by_lower.get(value.lower()) or next(
        iter(difflib.get_close_matches(value, sorted(KNOWN_SOC_VERSIONS), n=1)), None
    )
    hint = f" did you mean {near!r}?" if near else ""
    raise InvalidInputError(
        f"soc_version={value!r} (from {origin}) is not a chip CANN knows (names are "
        f"case-sensitive);{hint} accepted: {accepted_list()}"
    )
