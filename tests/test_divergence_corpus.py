"""The corpus of induced causes (``benchmarks/divergence_corpus.py``): its cheap cases run here
as the benchmark runs them (a seeded torch run recorded, the cause induced, ``envlock replay
--json``), and each must diverge and be named; the judging of a verdict is checked on made-up
verdicts."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

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


def test_what_the_run_read_is_read_in_the_corpus_spelling() -> None:
    """A file the two runs read differently is ``read:PATH``, a variable ``ctx:env.NAME``: the
    spellings the trace's cases expect."""
    verdict = {"divergences": [{"what": "step"}],
               "reads": [{"what": "file", "name": "/x/site/corpuspkg/__init__.py", "original": "sha256 a",
                          "replay": "sha256 b"},
                         {"what": "variable", "name": "CORPUS_LR", "original": None, "replay": "0.06"}]}
    assert corpus.named(verdict) == ["read:/x/site/corpuspkg/__init__.py", "ctx:env.CORPUS_LR"]
    assert corpus.explained(verdict, ("read:corpuspkg/__init__.py",))
    assert corpus.explained(verdict, ("ctx:env.CORPUS_LR",))


@pytest.mark.parametrize(("expect", "found"), [
    (("file:train.py",), True), (("file:helpers.py",), False), (("command",), True),
    (("ctx:env.OMP_NUM_THREADS@1",), True), (("ctx:env.OMP_NUM_THREADS@2",), False),
    (("ctx:env.OMP_NUM_THREADS",), True),  # a key on some ranks still names the cause
    (("ctx:native.",), True), (("ctx:native",), False),  # a family ends in "."
    (("input:data.npy",), True), (("ctx:seeds.seed", "input:data.npy"), True),
])
def test_a_cause_is_explained_when_the_verdict_names_it(expect: tuple[str, ...], found: bool) -> None:
    assert corpus.explained(VERDICT, expect) is found


def test_the_figure_counts_the_causes_that_changed_the_numbers() -> None:
    case = corpus.CASES[0]
    results = [corpus.Result(case, "explained"), corpus.Result(case, "not explained"),
               corpus.Result(case, "missed"), corpus.Result(case, "no effect here"),
               corpus.Result(case, "no divergence"), corpus.Result(case, "not run")]
    assert corpus.figure(results) == (1, 3)
    assert ("explained 1 of 3, spurious causes 0 (of 6 causes: missed 1, no effect here 1, no divergence 1, "
            "not run 1)" in corpus.report(results))


def test_a_listed_line_the_cause_did_not_bring_about_is_a_spurious_cause() -> None:
    by = {c.name: c for c in corpus.CASES}
    verdict = {"divergences": [{"what": "step"}], "code": [{"what": "tree", "name": ""}], "inputs": [],
               "context": [{"key": k, "ranks": []} for k in (
                   "env.OMP_NUM_THREADS", "determinism.num_threads", "native.runtimes.openmp.libgomp.num_threads",
                   "env.TORCHINDUCTOR_CACHE_DIR", "compile.caches.inductor.files")]}
    assert corpus.spurious(by["omp_threads"], verdict) == [
        "tree", "ctx:env.TORCHINDUCTOR_CACHE_DIR", "ctx:compile.caches.inductor.files"]
    assert corpus.spurious(by["edited_script"], verdict)[0] == "ctx:env.OMP_NUM_THREADS"
    # A replay that reproduced names no cause, false or not.
    assert corpus.spurious(by["omp_threads"], {**verdict, "divergences": []}) == []
    results = [corpus.Result(by["omp_threads"], "explained", verdict=verdict)]
    assert "explained 1 of 1, spurious causes 3 " in corpus.report(results)


REPRODUCED: dict[str, Any] = {"divergences": [], "code": [], "inputs": [],
              "context": [{"key": "env.ATEN_CPU_CAPABILITY", "original": None, "replay": "avx2", "ranks": []}]}
DIVERGED: dict[str, Any] = {**REPRODUCED, "divergences": [{"what": "step"}]}


@pytest.mark.parametrize(("verdict", "effect", "status"), [
    # The cause changed the numbers outside envlock (or was not witnessed: None).
    (DIVERGED, True, "explained"), (DIVERGED, None, "explained"),
    (REPRODUCED, True, "missed"), (REPRODUCED, None, "no divergence"),
    # It left this machine's numbers alone: the replay must reproduce, naming nothing.
    (REPRODUCED, False, "no effect here"), (DIVERGED, False, "false divergence"),
])
def test_a_case_is_judged_by_its_witness_and_its_replay(verdict: dict[str, Any], effect: bool | None, status: str) -> None:
    case = next(c for c in corpus.CASES if c.name == "aten_default")
    assert corpus.judge(case, verdict, effect).status == status
    assert (corpus.judge(case, {**verdict, "context": []}, effect).status
            == ("not explained" if status == "explained" else status))


def test_only_causes_that_depend_on_the_machine_may_have_no_effect() -> None:
    by = {c.name: c for c in corpus.CASES}
    assert by["aten_default"].machine and by["omp_threads"].machine and by["rank1_threads"].machine
    assert not by["control"].expect and not by["control"].machine  # a control must change nothing, anywhere
    assert not by["edited_script"].machine and not by["data_file"].machine and not by["ld_preload"].machine


def test_the_corpus_has_every_cause_the_issue_asks_for() -> None:
    names = {c.name for c in corpus.CASES}
    assert len(names) == len(corpus.CASES) >= 15
    assert {"omp_threads", "mkl_threads", "openblas_threads", "interop_threads", "aten_default",
            "ld_library_path", "ld_preload", "inductor_setting", "compile_cache_warm", "seed",
            "data_file", "hf_revision", "package_version", "edited_script", "numpy_blas",
            "rank1_threads"} <= names


def test_the_corpus_runs_as_one_piece_per_baseline_holding_each_case_once() -> None:
    """Every case runs in exactly one piece, its baseline's (whose workspace no other piece
    touches), in the corpus's order; the longest baseline first."""
    units = corpus._units(list(corpus.CASES))
    assert [kind for kind, _ in units] == list(corpus.BASELINES) == ["compile", "main", "ranks"]
    for kind, part in units:
        assert part == [c for c in corpus.CASES if c.baseline == kind]
    assert corpus._units([c for c in corpus.CASES if c.baseline != "compile"])[0][0] == "main"


def test_a_controls_first_pass_is_the_baselines_own_replay_and_second_witness(tmp_path: Path) -> None:
    """A control induces nothing: its first pass is judged on the baseline's replay (checked to
    reproduce) and its second witness (checked to print the same numbers), not run again. A case
    that induces a cause is never taken from the baseline, nor is its cause induced here."""
    ws = corpus.Workspace(tmp_path, tmp_path, {}, "main")
    controls = [c for c in corpus.CASES if not c.expect]
    assert {c.baseline for c in controls} == set(corpus.BASELINES)
    for case in controls:
        result = corpus.control_result(ws, case, REPRODUCED)
        assert result is not None and (result.status, result.effect, result.verdict) == (
            "no effect here", False, REPRODUCED)
        diverged = corpus.control_result(ws, case, DIVERGED)
        assert diverged is not None and diverged.status == "false divergence"
    edited = next(c for c in corpus.CASES if c.name == "edited_script")
    assert corpus.control_result(ws, edited, REPRODUCED) is None  # train.py does not exist: not induced


@pytest.mark.slow
def test_the_whole_corpus_twice_with_the_shared_cache_written_between(tmp_path: Path) -> None:
    """Every case, the compile and numpy ones too, then all of them again with another job
    writing the user's shared Inductor cache before each replay.

    Whether a cause changes the numbers depends on the CPU for some (``ATEN_CPU_CAPABILITY``
    where torch keeps the same kernels, a thread count): each case's witness, the script run
    outside envlock with and without the cause, says so on this machine. A cause that changed
    them is named, with no spurious cause beside it; one that did not is replayed as reproduced,
    naming nothing. The causes only a trace of what the run read can name (``TRACE_DEPENDS``)
    must diverge here, named or not; the second pass must judge every case as the first did."""
    alt = os.environ.get("ENVLOCK_TEST_NUMPY_ALT")
    assert alt, "ENVLOCK_TEST_NUMPY_ALT is not set: scripts/test.sh installs numpy 1.26.4 for numpy_blas"
    # Two baselines at a time (``corpus._units``), each in its own workspace: each case is still
    # judged against its own baseline and witness.
    results = corpus.run_corpus(numpy_alt=Path(alt), keep=tmp_path, twice=True, workers=2)
    first = [r for r in results if not r.shared]
    assert {r.case.name for r in first} == {c.name for c in corpus.CASES}

    def allowed(r: Any) -> tuple[str, ...]:
        if not r.case.expect:  # a control
            return ("no effect here",)
        if r.case.depends == corpus.TRACE_DEPENDS:
            return ("explained", "not explained")
        if r.case.machine:
            return ("explained", "no effect here")
        if r.effect is None:  # made by envlock's own options: no witness outside it
            return ("explained", "no divergence")
        return ("explained",)

    assert {r.case.name: (r.status, r.why) for r in results if r.status not in allowed(r)} == {}
    for r in results:
        if r.status in ("no effect here", "no divergence"):
            assert r.verdict["same"] is True and not r.verdict["divergences"], r.case.name
    assert {f"{r.case.name}{' (shared)' if r.shared else ''}": corpus.spurious(r.case, r.verdict)
            for r in results if corpus.spurious(r.case, r.verdict)} == {}
    assert [(r.case.name, r.status) for r in results if r.shared] == [(r.case.name, r.status) for r in first]
