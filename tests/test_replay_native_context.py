"""What a replay record's context keeps of native code (``drift/native.context_form``), and what
a replay names from it: a library rebuilt or upgraded at one path, two BLAS/OpenMP runtimes of
one kind, and a runtime's field only one process could learn (verify's rule, ``learnt_by_both``).
Built from real parts where the machine has them: shared objects compiled here, their RECORD
read by the probe, this host's package database, threadpoolctl's own answer."""

from __future__ import annotations

import glob
import json
import subprocess
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from helpers import make_lock

from envlock.drift.compare import compare
from envlock.drift.native import context_form, runtime_keys
from envlock.lock import Lock
from envlock.lock._seal import canonical_form
from envlock.probe.native import _from_threadpoolctl
from envlock.replay.compare import compare_records, context_of
from envlock.replay.record import Meta, Record, Step

ROOT = Path(__file__).resolve().parent.parent


def _record(lock: Lock, loss: float = 0.5) -> Record:
    meta = Meta(tool_version="0", created_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
                where="host", command=["python", "train.py"], exit_code=0)
    return Record(record=meta, context=context_of(canonical_form(lock)), steps=[Step(step=0, metrics={"loss": loss})])


def _changes(original: Lock, replay: Lock) -> dict[str, Any]:
    return {c.key: c for c in compare_records(_record(original), _record(replay, 0.25)).context}


# -- two runtimes of one kind ------------------------------------------------------------------------

SITE = "/venv/lib/python3.11/site-packages"
# threadpoolctl.threadpool_info() as it answers in a process that loaded torch's libgomp and
# an Intel OpenMP runtime, and numpy's and scipy's OpenBLAS.
INFO = [
    {"user_api": "openmp", "internal_api": "openmp", "num_threads": 8, "prefix": "libgomp",
     "filepath": f"{SITE}/torch/lib/libgomp.so.1", "version": None},
    {"user_api": "openmp", "internal_api": "openmp", "num_threads": 8, "prefix": "libiomp",
     "filepath": f"{SITE}/../../libiomp5.so", "version": None},
    {"user_api": "blas", "internal_api": "openblas", "num_threads": 8, "prefix": "libscipy_openblas",
     "filepath": f"{SITE}/numpy.libs/libscipy_openblas64_-32a4b2a6.so", "version": "0.3.31.188.0",
     "threading_layer": "pthreads", "architecture": "Haswell"},
    {"user_api": "blas", "internal_api": "openblas", "num_threads": 8, "prefix": "libscipy_openblas",
     "filepath": f"{SITE}/scipy.libs/libscipy_openblas-68440149.so", "version": "0.3.28.dev",
     "threading_layer": "pthreads", "architecture": "Haswell"},
]


def _runtimes_lock(info: list[dict[str, Any]]) -> Lock:
    return make_lock(native={"libraries": [], "runtimes": [_from_threadpoolctl(i) for i in info],
                             "runtimes_source": "threadpoolctl"})


def test_two_runtimes_of_one_kind_both_survive_in_a_record() -> None:
    context = context_of(canonical_form(_runtimes_lock(INFO)))
    runtimes = {k: v for k, v in context.items() if k.startswith("native.runtimes.")}
    assert runtimes["native.runtimes.openmp.openmp.libgomp.so.1.library"] == "libgomp.so.1"
    assert runtimes["native.runtimes.openmp.openmp.libiomp5.so.library"] == "libiomp5.so"
    assert runtimes["native.runtimes.blas.openblas.libscipy_openblas64_-32a4b2a6.so.version"] == "0.3.31.188.0"
    assert runtimes["native.runtimes.blas.openblas.libscipy_openblas-68440149.so.version"] == "0.3.28.dev"
    assert len([k for k in runtimes if k.endswith(".library")]) == 4
    # One of a kind keeps its kind's name, so numpy's OpenBLAS under another file name (every
    # numpy release renames it) still meets its counterpart.
    one = context_of(canonical_form(_runtimes_lock(INFO[2:3])))
    assert one["native.runtimes.blas.openblas.version"] == "0.3.31.188.0"


def test_a_change_to_the_second_runtime_of_a_kind_is_named() -> None:
    """scipy's OpenBLAS pinned to one thread while numpy's keeps eight: with both under one key
    the second overwrote the first and whichever came last decided what was compared."""
    changed = [dict(i) for i in INFO]
    changed[3]["num_threads"] = 1
    found = _changes(_runtimes_lock(INFO), _runtimes_lock(changed))
    key = "native.runtimes.blas.openblas.libscipy_openblas-68440149.so.num_threads"
    assert set(found) == {key} and (found[key].original, found[key].replay) == (8, 1)


def test_two_files_of_one_name_are_told_apart_by_their_directory() -> None:
    same = [{"api": "blas", "implementation": "openblas", "library": "libopenblas.so.0", "path": f"/x/{d}/libopenblas.so.0"}
            for d in ("numpy.libs", "scipy.libs")]
    assert runtime_keys(same) == ["blas.openblas.libopenblas.so.0.numpy.libs", "blas.openblas.libopenblas.so.0.scipy.libs"]


def test_a_process_that_loaded_two_openmp_runtimes_keeps_both(tmp_path: Path) -> None:
    """A real process: torch's libgomp and this host's own, both loaded (a package built against
    the system's), described by the probe with threadpoolctl where it is installed."""
    pytest.importorskip("threadpoolctl")
    import importlib.util

    spec = importlib.util.find_spec("torch")
    torch_gomp = [p for loc in (spec.submodule_search_locations or []) if spec
                  for p in glob.glob(f"{loc}/lib/libgomp*.so*")] if spec else []
    system = sorted(glob.glob("/usr/lib/*-linux-gnu/libgomp.so.1"))
    if not torch_gomp or not system:
        pytest.skip("needs torch's libgomp and the system's")
    script = textwrap.dedent(f"""
        import ctypes, json
        for path in {[torch_gomp[0], system[0]]!r}:
            ctypes.CDLL(path)
        from envlock.probe.native import collect_runtimes, loaded_libraries
        print(json.dumps(collect_runtimes(loaded_libraries())))
        """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    runtimes, source = json.loads(done.stdout)
    assert source == "threadpoolctl"
    openmp = [r for r in runtimes if r["api"] == "openmp"]
    assert len(openmp) == 2, runtimes
    form = context_form({"native": {"libraries": [], "runtimes": runtimes}})
    kept = [k for k in form["native"]["runtimes"] if k.startswith("openmp.openmp")]
    assert len(kept) == 2 and all(k != "openmp.openmp" for k in kept)


# -- a field one process could not learn -------------------------------------------------------------

def test_a_runtime_field_one_process_could_not_learn_is_no_cause() -> None:
    """The original ran without threadpoolctl (its runtimes named from their files); threadpoolctl
    was installed before the replay, which learnt the version, threading layer and threads.
    Verify says nothing of it, and neither does the replay; a thread count both learnt and that
    differs is still named by both."""
    by_file = make_lock(native={"libraries": [], "runtimes": [
        {"api": "blas", "implementation": "openblas", "library": "libscipy_openblas64_-32a4b2a6.so",
         "path": f"{SITE}/numpy.libs/libscipy_openblas64_-32a4b2a6.so"}], "runtimes_source": "maps"})
    asked = _runtimes_lock(INFO[2:3])
    assert [d.path for d in compare(by_file, asked).differences] == []
    assert _changes(by_file, asked) == {}
    assert _changes(asked, by_file) == {}
    fewer = [{**INFO[2], "num_threads": 1}]
    assert [d.path for d in compare(asked, _runtimes_lock(fewer)).differences] == ["native.runtimes.blas.openblas.num_threads"]
    assert set(_changes(asked, _runtimes_lock(fewer))) == {"native.runtimes.blas.openblas.num_threads"}
