"""No room names a format: a format's name (``"recordio"``, ``"stoker-wds"``, ...) appears as a
string literal only in its own folder (``stoker/formats/<name>/``) and in the registry. Every
other room asks the registry (``names()``, ``writable()``, ``DEFAULT``, ``get(name)``) or the
folder's ``FORMAT``, so a format is added by a folder and one registry line."""

from __future__ import annotations

import ast
import pathlib

import stoker
from stoker.formats import registry

SRC = pathlib.Path(stoker.__file__).parent


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        if isinstance(node, kinds) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def format_literals(root: pathlib.Path = SRC) -> list[str]:
    """``file:line: 'name'`` for each string literal (docstrings aside) that is a format's
    registry name (a manifest's ``kind``) or version-1 manifest ``format`` field, outside that format's folder and the registry."""
    names = {f.name: f.name for f in registry.FORMATS.values()}
    names.update({f.v1.format: f.name for f in registry.FORMATS.values() if f.v1 is not None})
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "formats/registry.py":
            continue
        text = path.read_text(encoding="utf-8")
        if not any(n in text for n in names):
            continue  # no name anywhere in the file: nothing to parse
        tree = ast.parse(text)
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            owner = names.get(node.value)
            if owner is None or id(node) in skip or rel.startswith(f"formats/{owner}/"):
                continue
            found.append(f"{rel}:{node.lineno}: {node.value!r}")
    return found


def test_no_format_name_outside_its_folder_and_the_registry():
    found = format_literals()
    assert not found, (
        "format names spelled outside their folder and the registry (ask "
        "stoker.formats.registry: names(), writable(), DEFAULT, get(name)):\n" + "\n".join(found)
    )


def test_the_check_finds_a_literal(tmp_path):
    # the guard above is only as good as this search: a planted literal is found, one in
    # the format's own folder or in a docstring is not
    room = tmp_path / "loader"
    room.mkdir()
    (room / "x.py").write_text('"""recordio"""\nFMT = "tfrecord"\nM = "stoker-wds"\n')
    own = tmp_path / "formats" / "tfrecord"
    own.mkdir(parents=True)
    (own / "y.py").write_text('N = "tfrecord"\n')
    assert format_literals(tmp_path) == ["loader/x.py:2: 'tfrecord'", "loader/x.py:3: 'stoker-wds'"]
