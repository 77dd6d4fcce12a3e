"""Every module envlock imports at load time is the standard library's or a declared dependency.

The development venv holds many more packages than a user's install, so a leftover import of
an undeclared one (``tomlkit`` after it left ``dependencies``) passes every other test and
fails on the first ``pip install envlock-ml``. Imports inside functions and ``try`` blocks are
optional features that fail with a hint (cyclonedx, nvidia-ml-py, torch) and are not checked.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent


def declared() -> set[str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower().replace("-", "_") for d in deps}


def module_level_imports(tree: ast.Module) -> list[tuple[str, int]]:
    out = []
    for node in tree.body:  # top level only: not under def, class, try or if
        if isinstance(node, ast.Import):
            out += [(a.name.split(".")[0], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.append((node.module.split(".")[0], node.lineno))
    return out


def test_every_module_level_import_is_declared() -> None:
    allowed = declared() | set(sys.stdlib_module_names) | {"envlock"}
    undeclared = [f"{path.relative_to(REPO)}:{line} imports {name}"
                  for path in sorted((REPO / "envlock").rglob("*.py"))
                  for name, line in module_level_imports(ast.parse(path.read_text()))
                  if name not in allowed]
    assert undeclared == []


def test_the_check_sees_an_undeclared_import() -> None:
    tree = ast.parse("import os\nimport tomlkit\nfrom packaging.version import Version\n")
    assert module_level_imports(tree) == [("os", 1), ("tomlkit", 2), ("packaging", 3)]
    assert "tomlkit" not in declared() and "packaging" in declared()
