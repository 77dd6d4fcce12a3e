"""The runtime package's shape: one knob table tied to the model and the probe, its layering.

The knob table is the runtime's only description of what a determinism knob is; these tests
keep it equal to the lock's ``[determinism]`` fields and to what the probe records, so a knob
added in one place and forgotten in another fails here rather than in a replay.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import torch

import envlock
from envlock import runtime
from envlock.lock import Determinism
from envlock.probe import torchstack
from envlock.runtime import determinism, knobs

# [determinism] fields that are not torch knobs: whether torch was loaded, variables, markers.
_NOT_KNOBS = {"torch_loaded", "env", "late", "process_env"}


def _recorded() -> dict[str, object]:
    return {k: v for k, v in torchstack.collect_determinism(torch).items() if k not in _NOT_KNOBS}


def test_the_knob_table_is_exactly_the_models_determinism_fields() -> None:
    names = [k.name for k in knobs.KNOBS]
    assert len(names) == len(set(names))
    assert set(names) == set(Determinism.model_fields) - _NOT_KNOBS


def test_the_runtime_reads_what_the_probe_records_by_default_and_after_deterministic() -> None:
    assert knobs.read_state(torch) == _recorded()
    with envlock.deterministic("warn"):
        live = knobs.read_state(torch)
        assert live == _recorded()
        assert live["deterministic_warn_only"] is True
    assert knobs.read_state(torch) == _recorded()


def test_deterministic_targets_the_strict_column_of_every_knob_this_torch_has() -> None:
    target = determinism.strict_target(torch, "strict")
    have = {k.name for k in knobs.knobs_in(torch)}
    assert set(target) == {k.name for k in knobs.KNOBS if k.strict is not None} & have
    assert set(target) == set(knobs.OWNED) & have
    assert target["deterministic_warn_only"] is False
    assert determinism.strict_target(torch, "warn")["deterministic_warn_only"] is True
    # Threads, SDPA backends and reduced-precision reductions stay as the user set them.
    assert not {"num_threads", "num_interop_threads", "sdpa_math"} & set(target)


def test_the_package_keeps_its_public_names_as_functions_and_classes() -> None:
    assert sorted(runtime.__all__) == [
        "ApplyResult", "Change", "Deterministic", "NotApplied", "ReproducibilityWarning",
        "apply", "canary", "dataloader_generator", "derive_seed", "deterministic", "load_compile_cache",
        "record", "save_compile_cache", "seed_everything", "worker_init_fn"]
    for name in runtime.__all__:
        value = getattr(runtime, name)
        # A submodule named like a function would shadow it (envlock.runtime.apply a module).
        assert inspect.isfunction(value) or inspect.isclass(value), name
        assert value.__module__.startswith("envlock.runtime."), name
    for lazy in ("apply", "canary", "deterministic", "seed_everything", "worker_init_fn",
                 "dataloader_generator", "record", "save_compile_cache", "load_compile_cache"):
        assert getattr(envlock, lazy) is getattr(runtime, lazy)
    assert runtime.SEED_ENV == "ENVLOCK_SEED" and callable(runtime.canary_module)


def _sibling_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name == "envlock.runtime":
                found.add("__init__")
            elif name.startswith("envlock.runtime.") and name.count(".") == 2:
                found.add(name.rsplit(".", 1)[1])
    return found


def test_runtime_modules_import_only_earlier_siblings_never_the_facade() -> None:
    package = Path(runtime.__file__).parent
    modules = {p.stem: p for p in package.glob("*.py") if p.stem != "__init__"}
    graph = {name: _sibling_imports(path) & (set(modules) | {"__init__"})
             for name, path in modules.items()}
    assert all("__init__" not in deps for deps in graph.values()), graph
    done: set[str] = set()
    while len(done) < len(graph):  # peel off modules whose imports are all done: no cycle
        ready = {name for name, deps in graph.items() if name not in done and deps <= done}
        assert ready, f"import cycle among {sorted(set(graph) - done)}"
        done |= ready
