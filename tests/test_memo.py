"""Process-wide caches are owned, bounded objects."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest

import cachemgr
from cachemgr.memo import Memo, OnceSet

PACKAGE = Path(cachemgr.__file__).resolve().parent
MUTABLE_CALLS = {
    "dict",
    "set",
    "list",
    "OrderedDict",
    "defaultdict",
    "deque",
    "WeakValueDictionary",
}


def test_memo_keeps_the_most_recently_used_within_its_bound() -> None:
    memo: Memo[int, str] = Memo("test", 3)
    for i in range(3):
        memo.put(i, str(i))
    assert memo.get(0) == "0"  # 0 is now the most recent: 1 goes first
    memo.put(3, "3")
    assert len(memo) == 3 and memo.get(1) is None
    assert [memo.get(i) for i in (0, 2, 3)] == ["0", "2", "3"]
    for i in range(100, 200):
        memo.put(i, str(i))
    assert len(memo) == 3 and memo.get(199) == "199"
    with pytest.raises(ValueError, match="max_entries=0"):
        Memo("bad", 0)


def test_once_set_says_first_exactly_once_across_threads() -> None:
    once: OnceSet[str] = OnceSet("test", 8)
    answers: list[bool] = []
    start = threading.Barrier(16)

    def ask() -> None:
        start.wait()
        answers.append(once.first("/cache/kernel_cache/Ascend910B1"))

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers.count(True) == 1 and len(answers) == 16
    once.forget("/cache/kernel_cache/Ascend910B1")
    assert once.first("/cache/kernel_cache/Ascend910B1")


def _unbounded(path: Path) -> list[str]:
    """Module-level empty mutable containers (a dict that only grows) and unbounded
    ``functools`` caches on functions that take arguments."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in tree.body:
        value = getattr(node, "value", None)
        empty = isinstance(value, (ast.Dict, ast.List, ast.Set)) and not ast.unparse(value)[1:-1]
        call = isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1]
        if empty or call in MUTABLE_CALLS:
            found.append(f"line {node.lineno}")
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = node.args.args + node.args.kwonlyargs + node.args.posonlyargs
        for deco in map(ast.unparse, node.decorator_list):
            unbounded = deco.endswith("cache") or "maxsize=None" in deco
            if unbounded and params:
                found.append(f"{node.name}: @{deco}")
    return found


def test_no_module_level_cache_is_unbounded() -> None:
    where = {
        str(path.relative_to(PACKAGE)): found
        for path in sorted(PACKAGE.rglob("*.py"))
        if (found := _unbounded(path))
    }
    assert where == {}


def test_every_module_memo_has_a_bound() -> None:
    from cachemgr import parsedfiles
    from cachemgr.compile import inputs, kernel_meta, precompiled
    from cachemgr.compilers import base
    from cachemgr.storage import manifest

    memos = [inputs._digests, inputs._probed, kernel_meta._dirs, precompiled._configs]
    memos += [base._identity_cache, manifest._parsed, parsedfiles._SEEN]
    assert all(isinstance(m, Memo) and 0 < m.max_entries <= 16384 for m in memos)
