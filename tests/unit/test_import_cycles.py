"""tools/check_import_cycles.py (make lint): finds every circle of imports, lets through only
the circles its allow-list names, fails on an allow entry whose circle is gone, and passes on
this repository."""

from __future__ import annotations

import importlib.util
import itertools
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import grimp
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "check_import_cycles.py"


@pytest.fixture(scope="module")
def tool() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("check_import_cycles", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while they are built
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def graph_of(*arrows: tuple[str, str] | tuple[str, str, int]) -> grimp.ImportGraph:
    graph = grimp.ImportGraph()
    for arrow in arrows:
        if len(arrow) == 3:
            importer, imported, line = arrow
            graph.add_import(
                importer=importer,
                imported=imported,
                line_number=line,
                line_contents=f"import {imported}",
            )
        else:
            graph.add_import(importer=arrow[0], imported=arrow[1])
    return graph


def test_a_circle_is_found_with_its_arrows_and_lines(tool: ModuleType) -> None:
    graph = graph_of(
        ("p.a", "p.b", 3),
        ("p.b", "p.c", 5),
        ("p.b", "p.c", 9),
        ("p.c", "p.a", 7),
        ("p.d", "p.a", 1),  # reaches the circle, is not in it
        ("p.a", "p.e", 2),  # reached from it, is not in it
    )
    [circle] = tool.find_cycles(graph)
    assert circle.modules == {"p.a", "p.b", "p.c"}
    assert [(a.importer, a.imported, a.lines) for a in circle.arrows] == [
        ("p.a", "p.b", (3,)),
        ("p.b", "p.c", (5, 9)),
        ("p.c", "p.a", (7,)),
    ]
    assert "p.b -> p.c  (line 5, 9)" in str(circle)


def test_no_circle_in_a_graph_without_one(tool: ModuleType) -> None:
    diamond = graph_of(("p.a", "p.b"), ("p.a", "p.c"), ("p.b", "p.d"), ("p.c", "p.d"))
    assert tool.find_cycles(diamond) == []
    # A package's __init__ importing its submodules is no circle on its own.
    assert tool.find_cycles(graph_of(("p", "p.a"), ("p", "p.b"), ("p.b", "p.a"))) == []


def test_a_module_importing_its_package_that_re_exports_it_is_a_circle(tool: ModuleType) -> None:
    # p/__init__.py: from p.a import A; p/a.py: from p import B
    graph = graph_of(("p", "p.a", 1), ("p.a", "p", 4), ("p", "p.b", 2))
    [circle] = tool.find_cycles(graph)
    assert circle.modules == {"p", "p.a"}


def test_separate_circles_and_a_self_import_each_reported(tool: ModuleType) -> None:
    graph = graph_of(("a", "b"), ("b", "a"), ("b", "c"), ("c", "d"), ("d", "c"), ("e", "e"))
    assert sorted(sorted(c.modules) for c in tool.find_cycles(graph)) == [
        ["a", "b"],
        ["c", "d"],
        ["e"],
    ]


def test_components_match_mutual_reachability(tool: ModuleType) -> None:
    rng = random.Random(7)
    for _ in range(200):
        nodes = [f"m{i}" for i in range(rng.randint(1, 12))]
        edges = {n: {m for m in nodes if rng.random() < 0.15} for n in nodes}
        reach = {n: set(edges[n]) for n in nodes}
        for k, i, j in itertools.product(nodes, nodes, nodes):  # Floyd-Warshall closure
            if k in reach[i] and j in reach[k]:
                reach[i].add(j)
        expected = {frozenset({n} | {m for m in reach[n] if n in reach[m]}) for n in nodes}
        found = tool.strongly_connected(nodes, edges.__getitem__)
        assert {frozenset(c) for c in found} == expected
        assert sorted(itertools.chain.from_iterable(found)) == sorted(nodes)


def test_a_long_chain_needs_no_recursion(tool: ModuleType) -> None:
    n = 5 * sys.getrecursionlimit()
    edges = {f"m{i:05}": [f"m{(i + 1) % n:05}"] for i in range(n)}
    [component] = tool.strongly_connected(edges, edges.__getitem__)
    assert len(component) == n


def test_only_allowed_circles_pass(tool: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    circles = tool.find_cycles(graph_of(("a", "b", 1), ("b", "a", 2), ("c", "d", 3), ("d", "c", 4)))
    assert tool.check(circles, [frozenset({"a", "b"}), frozenset({"c", "d"})]) == 0
    assert capsys.readouterr().out.count("\n") == 1  # one line: the summary
    assert tool.check(circles, [frozenset({"a", "b"})]) == 1
    out = capsys.readouterr().out
    assert "c -> d  (line 3)" in out and "d -> c  (line 4)" in out
    assert "a -> b" not in out


def test_a_stale_allow_entry_fails(tool: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert tool.check(tool.find_cycles(graph_of(("a", "b"))), [frozenset({"a", "b"})]) == 1
    assert "allowed circle a, b no longer occurs" in capsys.readouterr().out
    # A circle that grew is a new circle, and its old entry is stale.
    grown = tool.find_cycles(graph_of(("a", "b"), ("b", "c"), ("c", "a")))
    assert tool.check(grown, [frozenset({"a", "b"})]) == 1
    out = capsys.readouterr().out
    assert "import circle of 3 module(s): a, b, c" in out and "no longer occurs" in out


def test_the_allow_list_is_read_from_the_config(tool: ModuleType, tmp_path: Path) -> None:
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.check_import_cycles]\nallow = [["x.b", "x.a"]]\n')
    assert tool.load_allowed(config) == [frozenset({"x.a", "x.b"})]
    config.write_text("[tool.other]\n")
    assert tool.load_allowed(config) == []


def test_this_repository_has_no_circle_outside_the_allow_list() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("import cycles: none in fluxmq, storage, raft")
