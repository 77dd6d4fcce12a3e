"""The corpus of induced causes (``benchmarks/divergence_corpus.py``): its cheap cases run here
as the benchmark runs them (a seeded torch run recorded, the cause induced, ``envlock replay
--json``), and each must diverge and be named; the judging of a verdict is checked on made-up
verdicts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _corpus() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_bench_divergence_corpus", BENCH / "divergence_corpus.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    return module


corpus = _corpus()

VERDICT = {"divergences": [{"what": "step"}],
           "code": [{"what": "file", "name": "train.py", "original": "a", "replay": "b"},
                    {"what": "command", "name": "", "original": "x", "replay": "y"}],
           "context": [{"key": "env.OMP_NUM_THREADS", "original": None, "replay": "1", "ranks": [1]},
                       {"key": "native.libgomp.path", "original": "/a", "replay": "/b", "ranks": []}],
           "inputs": [{"name": "data.npy", "what": "content"}]}


def test_a_verdict_is_read_in_the_corpus_spelling() -> None:
    assert corpus.named(VERDICT) == ["file:train.py", "command", "ctx:env.OMP_NUM_THREADS@1",
                                     "ctx:native.libgomp.path", "input:data.npy"]


@pytest.mark.parametrize(("expect", "found"), [
    (("file:train.py",), True), (("file:helpers.py",), False), (("command",), True),
    (("ctx:env.OMP_NUM_THREADS@1",), True), (("ctx:env.OMP_NUM_THREADS@2",), False),
    (("ctx:env.OMP_NUM_THREADS",), True),  # a key on some ranks still names the cause
    (("ctx:native.",), True), (("ctx:native",), False),  # a family ends in "."
    (("input:data.npy",), True), (("ctx:seeds.seed", "input:data.npy"), True),
])
def test_a_cause_is_explained_when_the_verdict_names_it(expect: tuple[str, ...], found: bool) -> None:
    assert corpus.explained(VERDICT, expect) is found


def test_the_figure_counts_the_causes_that_diverged() -> None:
    case = corpus.CASES[0]
    results = [corpus.Result(case, "explained"), corpus.Result(case, "not explained"),
               corpus.Result(case, "no divergence"), corpus.Result(case, "not run")]
    assert corpus.figure(results) == (1, 2)
    assert "explained 1 of 2 (of 4 causes: 1 did not diverge, 1 not run)" in corpus.report(results)


def test_the_corpus_has_every_cause_the_issue_asks_for() -> None:
    names = {c.name for c in corpus.CASES}
    assert len(names) == len(corpus.CASES) >= 15
    assert {"omp_threads", "mkl_threads", "openblas_threads", "interop_threads", "aten_default",
            "ld_library_path", "ld_preload", "inductor_setting", "compile_cache_warm", "seed",
            "data_file", "hf_revision", "package_version", "edited_script", "numpy_blas",
            "rank1_threads"} <= names


# The cases this tree explains and that run in seconds: one seeded torch run per replay, two
# baselines (one process; two gloo ranks under torchrun). The libraries are built with the C
# compiler the machine has.
CHEAP = ["omp_threads", "openblas_threads", "aten_default", "ld_library_path", "ld_library_path_in_place",
         "custom_op_in_place", "ld_preload", "seed", "data_file", "hf_revision", "package_version",
         "edited_script", "edited_module", "rank1_threads"]


@pytest.mark.slow
def test_the_cheap_causes_diverge_and_are_named(tmp_path: Path) -> None:
    results = corpus.run_corpus(CHEAP, keep=tmp_path)
    assert {r.case.name: (r.status, r.why) for r in results} == {
        r.case.name: ("explained", r.why) for r in results}
    assert corpus.figure(results) == (len(CHEAP), len(CHEAP))
