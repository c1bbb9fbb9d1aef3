"""Fail when any two modules of the package import each other, directly or through others.

The import-linter contracts in ``pyproject.toml`` keep the rooms (``loader``, ``formats``, ...)
layered and a few rooms free of circles inside; this check covers every module of the house:
it builds the import graph of ``stoker`` (every ``import`` statement, those inside functions
too, since a lazy import that closes a circle is still a circle to read; those under
``TYPE_CHECKING`` left out) and lists each strongly connected group of modules with the lines
that import one another.

    python scripts/check_cycles.py

Exit 0 when there is no circle, 1 (with the circles listed) otherwise.
"""

from __future__ import annotations

import sys

import grimp


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    group.append(m)
                    if m == v:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def main() -> int:
    graph = grimp.build_graph("stoker", exclude_type_checking_imports=True)
    found = circles(graph)
    for group in found:
        print(f"import circle of {len(group)} modules:")
        members = set(group)
        for a in group:
            for b in sorted(graph.find_modules_directly_imported_by(a) & members):
                for d in graph.get_import_details(importer=a, imported=b):
                    print(f"  {a}:{d['line_number']} imports {b}: {d['line_contents']}")
    print(f"{len(graph.modules)} modules, {len(found)} import circles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
