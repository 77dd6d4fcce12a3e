"""What a replay record's context keeps of native code (``drift/native.context_form``), and what
a replay names from it: a library rebuilt or upgraded at one path, two BLAS/OpenMP runtimes of
one kind, and a runtime's field only one process could learn (verify's rule, ``learnt_by_both``).
Built from real parts where the machine has them: shared objects compiled here, their RECORD
read by the probe, this host's package database, threadpoolctl's own answer."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from helpers import make_lock

from envlock.drift.compare import compare
from envlock.lock import Lock
from envlock.lock._seal import canonical_form
from envlock.probe.native import _from_threadpoolctl
from envlock.replay.compare import compare_records, context_of
from envlock.replay.record import Meta, Record, Step


def _record(lock: Lock, loss: float = 0.5) -> Record:
    meta = Meta(tool_version="0", created_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
                where="host", command=["python", "train.py"], exit_code=0)
    return Record(record=meta, context=context_of(canonical_form(lock)), steps=[Step(step=0, metrics={"loss": loss})])


def _changes(original: Lock, replay: Lock) -> dict[str, Any]:
    return {c.key: c for c in compare_records(_record(original), _record(replay, 0.25)).context}


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
