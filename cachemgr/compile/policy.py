"""The compile rules as pure functions: debug, ``jit_compile``, cache modes (layer 7).

Nothing here touches the disk: the queue reads files and asks these functions what to do.

* **Debug** (docs/design.md#debug-compiles-and-kernel_meta, seed, [GE]): debug is on when an
  ``op_debug_config`` ``.cfg`` is set or the ``op_debug_level`` is one the request's framework
  compiles without its cache (:data:`CACHE_KEEPING_LEVELS`,
  docs/compiling.md#debug-options-and-the-cache-per-framework): the TF adapter, GE and ATC keep the
  cache at level 0 only, torch_npu at 0 and 3; then the cache is neither read nor written, whatever
  the mode. When the ``.cfg`` also has
  ``op_debug_list=``, its options apply only to the listed operators (bare names match the
  operator's name, ``OpType::X`` its type); the others compile through the cache as usual. The
  level's and the options' rows of the table in docs/design.md#debug-compiles-and-kernel_meta give
  the artefacts kept in ``kernel_meta`` and the backend-neutral debug flags
  (:data:`cachemgr.compilers.DEBUG_FLAGS`).
* **jit_compile** (docs/design.md#precompiled-binaries, seed): ``true`` → compile online; ``false``
  → a precompiled binary first; ``auto`` → precompiled first only for a dynamic shape (a -1 dim or
  [-2]). A debug compile always compiles: precompiled binaries carry no debug artefacts.
* **Cache modes** (docs/design.md#cache-modes): ``enable`` reads and writes, ``disable`` neither,
  ``force`` clears the chip folder first (once; the queue makes it safe), then reads and writes.

The ``.cfg`` grammar (docs/design.md#debug-compiles-and-kernel_meta, seed, GE ``SetOpdebugConfig``):
lines are trimmed; blank lines and ``#`` comments are skipped; ``op_debug_config = a,b,c`` (once)
and ``op_debug_list = X, OpType::Y`` (once); options come from :data:`CFG_ROWS`; ``ccec_O0`` with
``oom`` is an error (CANN: "may cause an AICore Error").
"""

from __future__ import annotations

from dataclasses import dataclass

from cachemgr.compilers import EMITS
from cachemgr.errors import InvalidInputError

#: Artefact kinds kept in kernel_meta (docs/design.md#debug-compiles-and-kernel_meta): binary,
#: kernel json, source as compiled, source-line map, computation description.
ARTEFACTS = frozenset({"o", "json", "cce", "loc", "compute"})


@dataclass(frozen=True)
class Row:
    """One row of the table in docs/design.md#debug-compiles-and-kernel_meta: artefacts ``keep`` (⊆
    :data:`ARTEFACTS`) and debug
    ``flags`` (⊆ :data:`cachemgr.compilers.DEBUG_FLAGS`)."""

    keep: frozenset[str]
    flags: frozenset[str] = frozenset()


_OJ = frozenset({"o", "json"})
#: docs/design.md#debug-compiles-and-kernel_meta, ``op_debug_level`` rows.
LEVEL_ROWS: dict[int, Row] = {
    0: Row(frozenset()),
    1: Row(_OJ | {"cce", "loc"}, frozenset({"instrument"})),
    2: Row(_OJ | {"cce", "loc"}, frozenset({"instrument", "O0", "g"})),
    3: Row(_OJ),
    4: Row(_OJ | {"cce", "compute"}),
}
#: docs/design.md#debug-compiles-and-kernel_meta, ``op_debug_config`` option rows.
CFG_ROWS: dict[str, Row] = {
    "oom": Row(_OJ, frozenset({"oom"})),
    "dump_bin": Row(_OJ),
    "dump_cce": Row(_OJ | {"cce"}),
    "dump_loc": Row(_OJ | {"loc"}),
    "ccec_O0": Row(_OJ, frozenset({"O0"})),
    "ccec_g": Row(_OJ, frozenset({"g"})),
    "check_flag": Row(_OJ, frozenset({"check_flag"})),
}
#: Options that must not be combined (seed: ``ccec_O0`` and ``oom`` together is an error).
CONFLICTS = (frozenset({"ccec_O0", "oom"}),)
CFG_KEY = "op_debug_config"
LIST_KEY = "op_debug_list"
OPTYPE_PREFIX = "optype::"

CACHE_MODES = ("enable", "disable", "force")
JIT_MODES = ("auto", "true", "false")

#: The frameworks a request may say it comes from; each has its own rule for which
#: ``op_debug_level`` keeps the cache on
#: (docs/compiling.md#debug-options-and-the-cache-per-framework).
FRAMEWORKS = ("tf", "ge", "atc", "torch_npu")
#: A request that names no framework follows the TF adapter's rule (the seed's).
DEFAULT_FRAMEWORK = "tf"
#: Per framework, the ``op_debug_level`` values with which the cache stays on: the TF
#: adapter (``op_debug_level`` non-zero or ``op_debug_config`` set: "不启用算子编译缓存"),
#: ATC's ``--op_compiler_cache_mode`` and GE's ``ge.op_debug_level`` (the same rule: level
#: non-zero disables it) keep it at 0 only; torch_npu (``ACL_OP_DEBUG_LEVEL``: "只有编译选项值
#: 为0或3才会启用编译缓存功能") at 0 and 3. A ``.cfg`` that applies turns it off in every one.
CACHE_KEEPING_LEVELS: dict[str, frozenset[int]] = {
    "tf": frozenset({0}),
    "ge": frozenset({0}),
    "atc": frozenset({0}),
    "torch_npu": frozenset({0, 3}),
}


@dataclass(frozen=True)
class DebugConfig:
    """A parsed ``.cfg`` file: its ``options`` (keys of :data:`CFG_ROWS`), the optional
    ``op_list`` (None = every operator; else bare names and ``OpType::X`` entries as written)
    and ``source`` (its path, for messages)."""

    options: frozenset[str]
    op_list: tuple[str, ...] | None = None
    source: str = "op_debug_config"


@dataclass(frozen=True)
class DebugPlan:
    """What debug means for one request: ``on`` (bypass the cache,
    docs/design.md#debug-compiles-and-kernel_meta), debug ``flags`` for the backend, ``emit`` (⊆
    :data:`cachemgr.compilers.EMITS`) and ``keep`` (artefact kinds left in kernel_meta)."""

    on: bool
    flags: frozenset[str] = frozenset()
    emit: frozenset[str] = frozenset()
    keep: frozenset[str] = frozenset()


@dataclass(frozen=True)
class CachePlan:
    """``read``/``write`` the disk cache; ``clear_first``: the chip folder is cleared first
    (``force``); ``replace``: recompile and replace this one entry."""

    read: bool
    write: bool
    clear_first: bool = False
    replace: bool = False


@dataclass(frozen=True)
class Decision:
    """Everything the queue does for one request, decided up front."""

    debug: DebugPlan
    binary_first: bool
    cache: CachePlan


def parse_debug_config(text: str, source: str) -> DebugConfig:
    """Parse a ``.cfg`` file's text (docs/design.md#debug-compiles-and-kernel_meta).

    :param source: the file's path, named in every error.
    :raises InvalidInputError: an unknown option, a line that is neither a comment nor one of
        the two keys, a key given twice or empty, ``ccec_O0`` with ``oom``.
    """
    found: dict[str, tuple[int, str]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key = key.strip().lower()
        if not sep or key not in (CFG_KEY, LIST_KEY):
            raise InvalidInputError(
                f"{source}:{number}: {line!r} is not 'op_debug_config = a,b,c' or "
                "'op_debug_list = X,OpType::Y'"
            )
        if key in found:
            raise InvalidInputError(f"{source}:{number}: {key} is given twice")
        found[key] = (number, value.strip())
    if CFG_KEY not in found:
        raise InvalidInputError(f"{source}: has no 'op_debug_config = ...' line")
    number, value = found[CFG_KEY]
    opts = _split(value)
    unknown = [o for o in opts if o not in CFG_ROWS]
    if unknown or not opts:
        what = f"unknown option {unknown[0]!r}" if unknown else "no option"
        raise InvalidInputError(
            f"{source}:{number}: op_debug_config={value!r}: {what} "
            f"(accepted: {', '.join(CFG_ROWS)})"
        )
    for pair in CONFLICTS:
        if pair <= set(opts):
            raise InvalidInputError(
                f"{source}:{number}: op_debug_config={value!r}: "
                f"{' and '.join(sorted(pair))} cannot be combined (CANN: AICore error)"
            )
    op_list = None
    if LIST_KEY in found:
        number, value = found[LIST_KEY]
        op_list = tuple(_split(value))
        if not op_list:
            raise InvalidInputError(f"{source}:{number}: op_debug_list is empty")
    return DebugConfig(frozenset(opts), op_list, source)


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def in_debug_list(cfg: DebugConfig, op_type: str, op_name: str | None) -> bool:
    """True when the ``.cfg``'s options apply to this operator: no ``op_debug_list``, or the
    list names ``op_name`` or ``OpType::<op_type>`` (prefix case-insensitive) [GE]."""
    if cfg.op_list is None:
        return True
    for item in cfg.op_list:
        if item.lower().startswith(OPTYPE_PREFIX):
            if item[len(OPTYPE_PREFIX) :] == op_type:
                return True
        elif op_name is not None and item == op_name:
            return True
    return False


def keeps_cache(framework: str, level: int) -> bool:
    """True when ``framework`` compiles through its cache at ``op_debug_level`` ``level``
    (:data:`CACHE_KEEPING_LEVELS`).

    :raises InvalidInputError: an unknown framework (naming the accepted ones).
    """
    levels = CACHE_KEEPING_LEVELS.get(framework)
    if levels is None:
        raise InvalidInputError(
            f"framework={framework!r} is unknown (accepted: {', '.join(FRAMEWORKS)})"
        )
    return level in levels


def debug_plan(
    level: int,
    cfg: DebugConfig | None,
    op_type: str,
    op_name: str | None = None,
    framework: str = DEFAULT_FRAMEWORK,
) -> DebugPlan:
    """docs/design.md#debug-compiles-and-kernel_meta for one operator: the level's row, plus the
    ``.cfg`` rows when they apply; off (the cache used, nothing kept in ``kernel_meta``) when no
    ``.cfg`` applies and the level is one ``framework`` keeps its cache at (:func:`keeps_cache`).

    :param level: ``op_debug_level`` 0..4.
    :param framework: one of :data:`FRAMEWORKS`.
    :raises InvalidInputError: for a level outside 0..4, an unknown framework.
    """
    if level not in LEVEL_ROWS:
        raise InvalidInputError(f"op_debug_level={level!r} is outside 0..4")
    rows = [LEVEL_ROWS[level]]
    cfg_applies = cfg is not None and in_debug_list(cfg, op_type, op_name)
    if cfg is not None and cfg_applies:
        rows += [CFG_ROWS[o] for o in sorted(cfg.options)]
    on = not keeps_cache(framework, level) or cfg_applies
    if not on:
        return DebugPlan(False)
    keep = frozenset().union(*(r.keep for r in rows))
    flags = frozenset().union(*(r.flags for r in rows))
    return DebugPlan(True, flags, keep & EMITS, keep)


def binary_first(jit_compile: str, dynamic: bool) -> bool:
    """docs/design.md#precompiled-binaries: look for a precompiled binary before compiling?

    :raises InvalidInputError: for a value other than auto/true/false.
    """
    if jit_compile not in JIT_MODES:
        raise InvalidInputError(f"jit_compile={jit_compile!r} is not one of {JIT_MODES}")
    return jit_compile == "false" or (jit_compile == "auto" and dynamic)


def cache_plan(mode: str, debug_on: bool, replace: bool = False) -> CachePlan:
    """docs/design.md#cache-modes (debug bypasses the cache in every mode).

    :param replace: the per-request "recompile and replace this one entry".
    :raises InvalidInputError: for a mode other than enable/disable/force.
    """
    if mode not in CACHE_MODES:
        raise InvalidInputError(f"op_compiler_cache_mode={mode!r} is not one of {CACHE_MODES}")
    if debug_on or mode == "disable":
        return CachePlan(read=False, write=False)
    if replace:
        return CachePlan(read=False, write=True, replace=True)
    return CachePlan(read=True, write=True, clear_first=mode == "force")


def decide(
    *,
    mode: str,
    jit_compile: str,
    level: int,
    cfg: DebugConfig | None,
    op_type: str,
    op_name: str | None,
    dynamic: bool,
    replace: bool = False,
    framework: str = DEFAULT_FRAMEWORK,
) -> Decision:
    """Every rule at once: debug (by ``framework``'s rule) first, then jit and the
    cache mode (docs/design.md#the-policy-table).

    :raises InvalidInputError: a bad level, jit value, mode or framework."""
    debug = debug_plan(level, cfg, op_type, op_name, framework)
    first = binary_first(jit_compile, dynamic) and not debug.on and not replace
    return Decision(debug, first, cache_plan(mode, debug.on, replace))
