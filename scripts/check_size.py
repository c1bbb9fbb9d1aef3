"""Fail when a module or a function has grown past one job's size.

- a file under ``src/`` longer than ``--max-file`` lines (600);
- a function or method longer than ``--max-function`` lines (100), counted from its ``def``
  line to its last line, its docstring left out, in ``src/``, ``bench/``, ``scripts/`` and
  ``examples/``.

Run by ``make lint``; prints one line per offence and exits 1 when there is any.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

FILE_ROOTS = ("src",)
FUNCTION_ROOTS = ("src", "bench", "scripts", "examples")


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = node.body[0] if node.body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
        and first.end_lineno is not None
    ):
        return first.end_lineno - first.lineno + 1
    return 0


def function_offences(path: Path, limit: int, *, name: str) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=name)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
            length = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
            if length > limit:
                out.append(
                    f"{name}:{node.lineno}: function {node.name} is {length} lines "
                    f"(limit {limit}, docstring not counted); split it along its jobs"
                )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-file", type=int, default=600)
    ap.add_argument("--max-function", type=int, default=100)
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = ap.parse_args(argv)
    problems: list[str] = []
    for top in FILE_ROOTS:
        for path in sorted((args.root / top).rglob("*.py")):
            n = len(path.read_text(encoding="utf-8").splitlines())
            if n > args.max_file:
                rel = path.relative_to(args.root)
                problems.append(
                    f"{rel}: {n} lines (limit {args.max_file}); split the module along its jobs"
                )
    for top in FUNCTION_ROOTS:
        for path in sorted((args.root / top).rglob("*.py")):
            rel = str(path.relative_to(args.root))
            problems += function_offences(path, args.max_function, name=rel)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
