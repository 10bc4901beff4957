"""Fail on any circle of imports among the modules of fluxmq, storage and raft.

Every import grimp finds is an arrow, importer -> imported: module level, under
``if TYPE_CHECKING:`` and inside functions alike (an import moved into a function still ties
the two modules together). A package is its ``__init__`` module: ``from storage import Record``
is an arrow to ``storage``, so a module that imports its own package's ``__init__``, which
imports it back to re-export it, is a circle like any other. Importing ``storage.api`` runs
``storage/__init__.py`` first, but that implicit step is not counted: it would make every
re-exporting ``__init__`` a circle.

A circle is a strongly connected component of the graph (Tarjan): two or more modules that each
reach the others, or a module that imports itself. Each is printed with its arrows and their
lines. ``[tool.check_import_cycles] allow`` in pyproject.toml lists the circles let through, each
as the exact set of its modules; an entry that no longer matches a circle fails the check as
well, so that it is removed once its circle is gone.

Exit status: 0 when every circle is allowed (one line on stdout), 1 otherwise.
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("fluxmq", "storage", "raft")
CONFIG = REPO / "pyproject.toml"
CONFIG_TABLE = "check_import_cycles"


@dataclass(frozen=True, slots=True)
class Arrow:
    importer: str
    imported: str
    lines: tuple[int, ...]  # where the importer imports it (empty for a graph built by hand)

    def __str__(self) -> str:
        where = ", ".join(map(str, self.lines)) or "?"
        return f"{self.importer} -> {self.imported}  (line {where})"


@dataclass(frozen=True, slots=True)
class Circle:
    modules: frozenset[str]
    arrows: tuple[Arrow, ...]  # every import between two of its modules

    def __str__(self) -> str:
        head = f"import circle of {len(self.modules)} module(s): {', '.join(sorted(self.modules))}"
        return "\n".join([head, *(f"    {arrow}" for arrow in self.arrows)])


def strongly_connected(
    nodes: Iterable[str], successors: Callable[[str], Iterable[str]]
) -> list[list[str]]:
    """The strongly connected components of a directed graph (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> Iterator[str]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        return iter(sorted(successors(node)))

    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, visit(root))]
        while work:
            node, todo = work[-1]
            for succ in todo:
                if succ not in index:
                    work.append((succ, visit(succ)))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while not component or component[-1] != node:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                    components.append(sorted(component))
    return components


def find_cycles(graph: grimp.ImportGraph) -> list[Circle]:
    """Every circle of ``graph``, with the arrows between its modules, in module order."""

    def imported_by(module: str) -> set[str]:
        return graph.find_modules_directly_imported_by(module)

    circles: list[Circle] = []
    for component in strongly_connected(graph.modules, imported_by):
        members = frozenset(component)
        if len(members) == 1 and component[0] not in imported_by(component[0]):
            continue
        arrows = tuple(
            Arrow(
                importer,
                imported,
                tuple(
                    sorted(
                        {
                            int(d["line_number"])
                            for d in graph.get_import_details(importer=importer, imported=imported)
                        }
                    )
                ),
            )
            for importer in component
            for imported in sorted(imported_by(importer) & members)
        )
        circles.append(Circle(members, arrows))
    return circles


def load_allowed(config: Path = CONFIG) -> list[frozenset[str]]:
    """The circles ``[tool.check_import_cycles] allow`` lets through, as sets of modules."""
    with config.open("rb") as f:
        table = tomllib.load(f).get("tool", {}).get(CONFIG_TABLE, {})
    return [frozenset(entry) for entry in table.get("allow", [])]


def check(circles: Collection[Circle], allowed: Collection[frozenset[str]]) -> int:
    """Print what fails (circles not allowed, allow entries that match no circle); 0 if none."""
    found = {circle.modules for circle in circles}
    bad = [circle for circle in circles if circle.modules not in allowed]
    stale = [entry for entry in allowed if entry not in found]
    for circle in bad:
        print(circle)
    for entry in stale:
        print(
            f"allowed circle {', '.join(sorted(entry))} no longer occurs: remove it from "
            f"[tool.{CONFIG_TABLE}] allow in pyproject.toml"
        )
    if bad or stale:
        print(f"import cycles: {len(bad)} circle(s) not allowed, {len(stale)} stale allow entries")
        return 1
    allowed_ones = "; ".join(", ".join(sorted(circle.modules)) for circle in circles)
    print(
        f"import cycles: none in {', '.join(PACKAGES)}"
        + (f" but the {len(circles)} allowed: {allowed_ones}" if circles else "")
    )
    return 0


def main() -> int:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # the packages of this checkout, not an installed copy
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, cache_dir=None)
    return check(find_cycles(graph), load_allowed())


if __name__ == "__main__":
    sys.exit(main())
