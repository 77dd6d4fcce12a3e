"""The one determinism knob table (``envlock.probe.rules.KNOBS``): the model, the probe and real
torch all agree with it."""

from __future__ import annotations

import typing
import warnings
from functools import partial
from typing import Any

import pytest
import torch

from envlock.lock import Determinism
from envlock.probe.rules import ALGORITHMS, KNOB_NAMES, KNOBS, Knob, knobs_in, quiet, read_knobs
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
