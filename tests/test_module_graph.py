"""The module map in docs/design.md is the one the code follows.

Every import is read from the source: at module level, inside functions and under ``if
TYPE_CHECKING`` alike (an import that runs later still ties the two modules together, and a
type-only one still says one module knows the other). Two rules hold over that graph:

* no import cycle of any kind;
* the layers of docs/design.md's module map: a module imports only modules of its own layer
  or of the layers below it, and every module of the package is in exactly one layer.
"""

from __future__ import annotations

import ast
import re
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
from helpers import REPO

PACKAGE = REPO / "envlock"
DESIGN = REPO / "docs" / "design.md"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` names: itself, or the module that defines the attribute it ends in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """Every envlock module ``path`` imports, anywhere in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            for alias in node.names:
                # `from envlock import lock` imports the module envlock.lock; `from envlock
                # import __version__` an attribute of envlock itself.
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in modules else module)
    resolved = {_resolve(m, modules) for m in found if m == "envlock" or m.startswith("envlock.")}
    return {m for m in resolved if m is not None and m != name}


def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: imports_of(path, name, modules) for name, path in modules.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(g.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(g):
        if node not in index:
            visit(node)
    return found


def layers() -> list[tuple[str, list[str]]]:
    """docs/design.md's module map, bottom layer first: (layer name, module patterns).

    A pattern is a path under envlock/ without ``.py`` (``lock/*``, ``_files``), or
    ``envlock`` for the package's own ``__init__``."""
    text = DESIGN.read_text(encoding="utf-8")
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| **")]
    out = []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        layer = cells[0].strip("*")
        out.append((layer, re.findall(r"`([^`]+)`", cells[1])))
    return out


def _matches(module: str, pattern: str) -> bool:
    if pattern == "envlock":
        return module == "envlock"
    dotted = "envlock." + pattern.replace("/", ".")
    if dotted.endswith(".*"):
        return module == dotted[:-2] or fnmatchcase(module, dotted)
    return module == dotted


def layer_of(module: str, table: list[tuple[str, list[str]]]) -> list[int]:
    return [i for i, (_, patterns) in enumerate(table) if any(_matches(module, p) for p in patterns)]


def test_the_graph_is_read_from_every_kind_of_import() -> None:
    g = graph()
    assert "envlock.probe.rules" in g["envlock.lock._model"]  # module level
    assert "envlock.probe.scrub" in g["envlock.probe.collect"]  # a relative import
    assert "envlock.probing.capture" in g["envlock.distributed"]  # inside a function
    assert "envlock.lock" in g["envlock.report.render"]  # under TYPE_CHECKING


def test_no_import_cycle_of_any_kind() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_is_in_exactly_one_layer_of_the_map() -> None:
    table = layers()
    assert len(table) >= 8, "docs/design.md's module map was not found"
    placed = {m: layer_of(m, table) for m in _modules()}
    assert {m: where for m, where in placed.items() if len(where) != 1} == {}


def test_no_import_goes_up_the_map() -> None:
    table = layers()
    upward = []
    for module, targets in graph().items():
        (mine,) = layer_of(module, table)
        for target in targets:
            (theirs,) = layer_of(target, table)
            if theirs > mine:
                upward.append(f"{module} ({table[mine][0]}) imports {target} ({table[theirs][0]})")
    assert sorted(upward) == []


def test_the_lock_package_is_used_through_its_init() -> None:
    """Every module outside ``envlock/lock/`` imports the lock's API, never one of its ``_``
    modules: the record reuses the seal, the TOML reader and writer through the same door."""
    inside = [f"{m} imports {t}" for m, targets in graph().items() if not m.startswith("envlock.lock")
              for t in targets if t.startswith("envlock.lock._")]
    assert inside == []


def test_the_lock_rule_sees_an_import_of_a_private_module(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("from envlock.lock._seal import canonical_json\n")
    modules = {"envlock.lock": path, "envlock.lock._seal": path, "envlock.x": path}
    assert imports_of(path, "envlock.x", modules) == {"envlock.lock._seal"}


@pytest.mark.parametrize(("source", "expected"), [
    ("from envlock import lock\n", {"envlock.lock"}),
    ("from envlock import __version__\n", {"envlock"}),
    ("def f():\n    from envlock.lock import load\n", {"envlock.lock"}),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import envlock.report.render\n",
     {"envlock.report.render"}),
])
def test_the_import_reader(tmp_path: Path, source: str, expected: set[str]) -> None:
    path = tmp_path / "m.py"
    path.write_text(source)
    modules = {"envlock": path, "envlock.lock": path, "envlock.report.render": path, "envlock.x": path}
    assert imports_of(path, "envlock.x", modules) == expected
