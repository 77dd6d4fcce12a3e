"""One rule in one place: no function and no table of values is written out twice across
envlock's modules. Two copies drift apart silently: the BLAS/OpenMP runtime fields the probe
records and those the comparator compared were two tuples, and the version-number parser of
``[requires]`` and of the CUDA libraries' check two functions."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import envlock

PACKAGE = Path(envlock.__file__).parent
# A table this short (a pair, a "dist-info"/"egg-info" choice) says too little to be a rule.
MIN_TABLE = 3


def _body(node: ast.FunctionDef) -> list[ast.stmt]:
    """A function's statements without its docstring: two copies may explain themselves apart."""
    first = node.body[0] if node.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return node.body[1:]
    return node.body


def definitions(source: str) -> list[tuple[str, str]]:
    """(name, what it is written as) of each top-level function and literal table of a module."""
    out = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and _body(node):
            out.append((node.name, ast.dump(node.args) + "".join(ast.dump(s) for s in _body(node))))
        elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.Tuple, ast.List, ast.Set)) \
                and len(node.value.elts) >= MIN_TABLE:
            out.append((ast.unparse(node.targets[0]), ast.dump(node.value)))
    return out


def copies(files: dict[str, str]) -> list[list[str]]:
    """The definitions written out in more than one place, as ``module:name`` lists."""
    seen: dict[str, list[str]] = defaultdict(list)
    for module, source in sorted(files.items()):
        for name, written in definitions(source):
            seen[written].append(f"{module}:{name}")
    return [places for places in seen.values() if len(places) > 1]


def test_no_function_or_table_is_written_twice() -> None:
    files = {str(p.relative_to(PACKAGE)): p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}
    assert copies(files) == []


def test_a_second_copy_is_found_under_another_name() -> None:
    one = 'FIELDS = ("version", "threading_layer", "num_threads")\ndef n(v):\n    "why"\n    return v.split(".")\n'
    two = 'OTHER = ("version", "threading_layer", "num_threads")\ndef m(v):\n    return v.split(".")\n'
    assert sorted(copies({"a.py": one, "b.py": two})) == [["a.py:FIELDS", "b.py:OTHER"], ["a.py:n", "b.py:m"]]
    assert copies({"a.py": one, "b.py": 'PAIR = ("a", "b")\n'}) == []
