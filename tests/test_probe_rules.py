"""The one determinism knob table (``envlock.probe.rules.KNOBS``): the model, the probe and real
torch all agree with it."""

from __future__ import annotations

import typing
import warnings
from functools import partial
from typing import Any

import pytest
import torch
from helpers import LockFactory

from envlock.lock import Determinism
from envlock.probe.rules import (
    ALGORITHMS,
    KNOB_NAMES,
    KNOBS,
    NUMERICS_ENV,
    Knob,
    knobs_in,
    numerics_variable,
    quiet,
    read_knobs,
)
from envlock.probe.torchstack import collect_determinism

# Fields of [determinism] that are not torch knobs.
NOT_KNOBS = {"torch_loaded", "env", "late", "process_env"}


def test_the_models_determinism_fields_are_exactly_the_tables_knobs() -> None:
    fields = Determinism.model_fields
    assert set(fields) - NOT_KNOBS == set(KNOB_NAMES)
    assert len(KNOB_NAMES) == len(set(KNOB_NAMES))
    for knob in KNOBS:
        # The model's type is the table's, and None means "this torch has no such knob".
        assert set(typing.get_args(fields[knob.name].annotation)) == {knob.kind, type(None)}, knob.name
        assert fields[knob.name].default is None


def test_the_probe_records_every_knob_through_the_table() -> None:
    det = collect_determinism(torch)
    assert det["torch_loaded"] is True
    knobs = {k: v for k, v in det.items() if k not in NOT_KNOBS}
    assert knobs == read_knobs(torch)
    # torch 2.13 has every knob of the table; each reads back with the table's type.
    assert set(knobs) == set(KNOB_NAMES)
    for knob in KNOBS:
        assert type(knobs[knob.name]) is knob.kind, knob.name
    Determinism.model_validate(det)


def test_the_fp32_tree_is_only_there_with_the_new_api() -> None:
    class OldTorch:
        class _C:  # no _get_fp32_precision_getter: torch < 2.9
            pass

    assert [k.name for k in knobs_in(OldTorch)] == [k.name for k in KNOBS if not k.fp32_api]
    assert [k.name for k in knobs_in(torch)] == list(KNOB_NAMES)
    assert KNOB_NAMES[:2] == ALGORITHMS  # one torch call sets both, before anything else


def _write(target: dict[str, Any]) -> None:
    """Write ``target`` in table order, repeated until a pass changes nothing (the TF32 APIs
    are coupled: an earlier write can move a later knob)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            wrote = False
            for knob in knobs_in(torch):
                if knob.name in target and quiet(partial(knob.read, torch)) != target[knob.name]:
                    knob.write(torch, target[knob.name])
                    wrote = True
            if not wrote:
                return


@pytest.mark.slow
def test_every_knob_is_set_and_read_back_through_the_table() -> None:
    before = read_knobs(torch)
    # torch fixes the interop pool at the first parallel operation; the rest must take.
    settable = [k for k in KNOBS if k.name != "num_interop_threads"]
    strict = {k.name: k.strict for k in settable if k.strict is not None}
    flipped = {k.name: (not before[k.name]) for k in settable
               if k.kind is bool and k.strict is None and k.name in before}
    try:
        _write(strict)
        assert {k: v for k, v in read_knobs(torch).items() if k in strict} == strict
        _write(flipped)
        assert {k: v for k, v in read_knobs(torch).items() if k in flipped} == flipped
        threads = torch.get_num_threads()
        _write({"num_threads": max(1, threads - 1)})
        assert torch.get_num_threads() == max(1, threads - 1)
    finally:
        _write({k: v for k, v in before.items() if k != "num_interop_threads"})
    assert read_knobs(torch) == before


def test_a_knob_entry_reads_and_writes_torch_not_a_copy() -> None:
    entry = dict((k.name, k) for k in KNOBS)["cudnn_benchmark"]
    assert isinstance(entry, Knob) and entry.kind is bool and entry.strict is False
    old = torch.backends.cudnn.benchmark
    try:
        entry.write(torch, not old)
        assert torch.backends.cudnn.benchmark is (not old) and entry.read(torch) is (not old)
    finally:
        torch.backends.cudnn.benchmark = old


# -- numerics variables: one rule for the lock, the canary, a replay record and the cache key --

# Each changes which kernel runs or how it reduces; none shows in a version number.
KERNEL_CHOOSERS = {"NVTE_FUSED_ATTN": "0", "KMP_DETERMINISTIC_REDUCTION": "true",
                   "MKL_DEBUG_CPU_TYPE": "5", "OMP_NUM_THREADS": "3"}
# Their over-inclusion twins: a diagnostic and a location of the same families.
NOT_NUMERICS = {"NVTE_DEBUG": "1", "NVTE_CUDA_INCLUDE_PATH": "/usr/local/cuda/include",
                "MKL_VERBOSE": "1"}


def test_one_numerics_rule_for_the_lock_the_canary_the_record_and_the_cache_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Four lists disagreed: the lock sealed variables the cache key ignored, the canary kept
    fewer than the lock, the record others again (NVTE_*: none of them but the record)."""
    from envlock.probe import kernels
    from envlock.probe.cache import key_variable, torch_cache_key
    from envlock.probe.env import collect_env
    from envlock.replay.compare import context_of

    without = torch_cache_key()
    for name, value in {**KERNEL_CHOOSERS, **NOT_NUMERICS}.items():
        monkeypatch.setenv(name, value)
    locked = collect_determinism(None)["env"]
    assert {k: v for k, v in locked.items() if k in KERNEL_CHOOSERS or k in NOT_NUMERICS} == KERNEL_CHOOSERS
    assert all(numerics_variable(k) for k in locked)
    # The canary's settings hold the very same variables, scrubbed as the lock's.
    settings = kernels._settings(torch, ["cpu"])
    assert {k[4:]: v for k, v in settings.items() if k.startswith("env.")} == locked
    # A replay record keeps each of them, sealed, and every one the lock's [env] keeps.
    context = context_of({"determinism": {"env": locked}, "env": collect_env()})
    for name, value in KERNEL_CHOOSERS.items():
        assert context[f"determinism.env.{name}"] == value and context[f"env.{name}"] == value
    for name, value in NOT_NUMERICS.items():
        assert context[f"env.{name}"] == value and f"determinism.env.{name}" not in context
    # The torch-facts key holds every numerics variable.
    assert all(key_variable(name) for name in NUMERICS_ENV)
    with_them = torch_cache_key()
    monkeypatch.delenv("NVTE_FUSED_ATTN")
    assert without is not None and len({without, with_them, torch_cache_key()}) == 3


def test_restore_sets_what_the_rule_calls_numerics_and_refuses_the_rest(restore_lock: LockFactory) -> None:
    from envlock.errors import UnsafeValue
    from envlock.restore.image import numerics_env

    lock = restore_lock(determinism={"env": {"NVTE_FUSED_ATTN": "0", "MKL_DEBUG_CPU_TYPE": "5"}})
    assert numerics_env(lock, process=False) == {"MKL_DEBUG_CPU_TYPE": "5", "NVTE_FUSED_ATTN": "0"}
    with pytest.raises(UnsafeValue):
        numerics_env(restore_lock(determinism={"env": {"NVTE_DEBUG": "1"}}), process=False)
