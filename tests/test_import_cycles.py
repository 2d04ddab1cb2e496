"""No import cycle in lib/ (issue 24 item 8): a module that imports one which imports it back
is two modules that cannot be read, tested or replaced apart. Function-level imports count
(grimp sees them); `if TYPE_CHECKING:` imports do not, as they never run."""

from __future__ import annotations

import sys
from pathlib import Path

import grimp

LIB = Path(__file__).resolve().parents[1] / "lib"

KNOWN_CYCLES: dict[frozenset[str], str] = {}
"""Cycles that exist today, each with why: none. A new one fails the test; so would one kept
here once it is gone (then delete its row). The last two went by moving code below both
sides: the checkout's paths into `stepscope.paths` (the stage registry and the run folder
both read it), and the guards' call out of `report.verdict` into `report.build`, above both."""


def strongly_connected(graph: grimp.ImportGraph) -> list[frozenset[str]]:
    """Groups of two or more modules that reach each other through imports (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(frozenset(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return out


def _graph() -> grimp.ImportGraph:
    sys.path.insert(0, str(LIB))
    try:
        return grimp.build_graph("stepscope", cache_dir=None, exclude_type_checking_imports=True)
    finally:
        sys.path.remove(str(LIB))


def test_no_new_import_cycle():
    cycles = set(strongly_connected(_graph()))
    new = [sorted(c) for c in cycles - set(KNOWN_CYCLES)]
    gone = [sorted(c) for c in set(KNOWN_CYCLES) - cycles]
    assert not new, f"import cycle(s) in lib/: {new}; move the shared part below both (see stepscope.execute)"
    assert not gone, f"cycle(s) no longer present, delete from KNOWN_CYCLES: {gone}"


def test_runner_and_inprocess_do_not_import_each_other():
    graph = _graph()
    assert "stepscope.runner" not in graph.find_modules_directly_imported_by("stepscope.inprocess")
    assert not graph.chain_exists("stepscope.inprocess", "stepscope.runner")


def test_finder_sees_a_cycle():
    graph = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(m)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.a")
    graph.add_import(importer="p.b", imported="p.c")
    assert strongly_connected(graph) == [frozenset({"p.a", "p.b"})]
