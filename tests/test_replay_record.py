"""The replay record on the host, without a container: the in-process journal, the sealed TOML
record, the comparison (bit-identical and within a tolerance), the inputs (data paths, a
Hugging Face cache built by hand) and the ``record`` / ``replay`` / ``verify --record``
commands on small scripts."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envlock.commands import main
from envlock.errors import LockInvalid, LockTampered
from envlock.probe import deep, inputs
from envlock.probe.rules import env_allowed
from envlock.replay.compare import (
    Tolerance,
    compare_records,
    context_of,
    metric_equal,
)
from envlock.replay.make import make_record, read_journal
from envlock.replay.record import (
    Input,
    Meta,
    Output,
    Record,
    Step,
    TensorDigest,
    dumps,
    load,
    loads,
    seal,
    unrecordable,
)
from envlock.replay.report import replay_text
from envlock.runtime import recorder

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def meta(**kw: Any) -> Meta:
    return Meta(**{"tool_version": "0.1.0", "created_at": NOW, "where": "host",
                   "command": ["python", "train.py"], "exit_code": 0, **kw})


def rec(losses: list[float], **kw: Any) -> Record:
    steps = [Step(step=i, metrics={"loss": v}) for i, v in enumerate(losses)]
    return Record(**{"record": meta(), "steps": steps, **kw})


# -- the record file -----------------------------------------------------------------------------

EDGE_FLOATS = [0.1, -0.0, 0.0, 5e-324, 1.7976931348623157e308, 1e16, 1e-5, math.inf, -math.inf,
               2.325411796569824, float.fromhex("0x1.29a7180000000p+1")]


def test_floats_keep_their_bits_through_the_file(tmp_path: Path) -> None:
    r = Record(record=meta(), steps=[Step(step=0, metrics={f"m{i}": v for i, v in enumerate(EDGE_FLOATS)}),
                                     Step(step=1, metrics={"nan": math.nan, "big": 2**62, "flag": True})])
    r.save(tmp_path / "run.record")
    back = load(tmp_path / "run.record")
    for i, v in enumerate(EDGE_FLOATS):
        got = back.steps[0].metrics[f"m{i}"]
        assert isinstance(got, float) and got.hex() == v.hex()
    assert math.isnan(back.steps[1].metrics["nan"])  # type: ignore[arg-type]
    assert back.steps[1].metrics["big"] == 2**62 and back.steps[1].metrics["flag"] is True
    assert compare_records(r, back).same


def test_a_tensor_metric_round_trips() -> None:
    t = TensorDigest(sha256="a" * 64, dtype="float32", shape=[2, 3], mean=0.25)
    r = Record(record=meta(), steps=[Step(step=7, metrics={"w": t})])
    assert loads(dumps(seal(r))).steps[0].metrics["w"] == t


def test_an_edited_record_is_refused_as_tampered(tmp_path: Path) -> None:
    rec([1.0, 2.0]).save(tmp_path / "a.record")
    text = (tmp_path / "a.record").read_text()
    (tmp_path / "a.record").write_text(text.replace("loss = 2.0", "loss = 2.5"))
    with pytest.raises(LockTampered, match="edited after it was recorded"):
        load(tmp_path / "a.record")
    assert main(["replay", str(tmp_path / "a.record"), "--against", str(tmp_path / "a.record")]) == 2


def test_unsealed_missing_and_invalid_records_are_exit_2(tmp_path: Path) -> None:
    with pytest.raises(LockTampered, match="not sealed"):
        loads(dumps(rec([1.0])))
    with pytest.raises(LockInvalid, match="not found"):
        load(tmp_path / "none.record")
    with pytest.raises(LockInvalid, match="not a replay record"):
        loads("[record]\nwhere = 'moon'\n")


def test_paths_with_quotes_and_newlines_round_trip_verbatim() -> None:
    """The TOML writer escapes what the record holds: nothing in a path opens a table."""
    evil = 'out"]\n[record]\nexit_code = 0 #\t\\'
    r = Record(record=meta(), outputs=[Output(path=evil, sha256="b" * 64, size=1)])
    back = loads(dumps(seal(r)))
    assert back.outputs[0].path == evil and back.record.exit_code == 0


def test_the_verdict_escapes_terminal_controls() -> None:
    """C0 controls cannot enter a record (the model refuses them); C1 and bidi controls can,
    and are escaped in the text."""
    with pytest.raises(ValueError):
        Output(path="o\x1b]0;pwn\x07.pt")
    path = "o\u202etp.\x9b31m"
    a = Record(record=meta(), outputs=[Output(path=path, sha256="a" * 64)])
    b = Record(record=meta(), outputs=[Output(path=path, sha256="c" * 64)])
    text = replay_text(compare_records(a, b), "run\u202e.record")
    assert "\u202e" not in text and "\x9b" not in text and "DIVERGED" in text
    plain = replay_text(compare_records(a, b.model_copy(update={"outputs": [Output(path="ok.pt")]})), "r")
    assert "output o" in plain  # over-escaping twin: an ordinary path shows as it is
    assert "output ok.pt" not in plain


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400))
def test_fuzz_the_reader_raises_only_its_own_error(text: str) -> None:
    """Any text reaches the TOML parser and the models; the only failure is LockInvalid (2)."""
    try:
        loads("[record]\n" + text)
    except LockInvalid:
        pass


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=False), min_size=1, max_size=5), st.integers(0, 4))
def test_fuzz_a_written_record_reads_back_equal(values: list[float], extra: int) -> None:
    r = Record(record=meta(exit_code=extra), steps=[Step(step=i, metrics={"x": v}) for i, v in enumerate(values)])
    assert compare_records(r, loads(dumps(seal(r)))).same


# -- comparing -----------------------------------------------------------------------------------


def test_bit_identical_is_the_default_and_names_the_first_diverging_step() -> None:
    a, b = rec([1.0, 2.0, 3.0, 4.0]), rec([1.0, 2.0, 3.0000000000000004, 5.0])
    cmp = compare_records(a, b)
    assert not cmp.same and cmp.first is not None
    assert (cmp.first.what, cmp.first.where) == ("step", "step 2, loss")
    assert "0x1.8000000000000p+1" in cmp.first.original and "0x1.8000000000001p+1" in cmp.first.replay
    assert len(cmp.divergences) == 1  # what follows a divergence follows from it


def test_signed_zero_differs_bitwise_but_not_within_a_tolerance() -> None:
    assert not metric_equal(0.0, -0.0, Tolerance())
    assert metric_equal(0.0, -0.0, Tolerance(atol=1e-12))
    assert metric_equal(math.nan, math.nan, Tolerance())
    assert not metric_equal(1, True, Tolerance()) and not metric_equal(1.0, 1, Tolerance())


def test_a_tolerance_compares_by_value_and_tensors_by_mean() -> None:
    a, b = rec([1.0, 2.0]), rec([1.0, 2.0 + 1e-9])
    assert not compare_records(a, b).same
    assert compare_records(a, b, Tolerance(rtol=1e-6)).same
    assert not compare_records(a, b, Tolerance(rtol=1e-12)).same
    t1 = TensorDigest(sha256="a" * 64, dtype="float32", shape=[3], mean=1.0)
    t2 = TensorDigest(sha256="b" * 64, dtype="float32", shape=[3], mean=1.0 + 1e-7)
    assert not metric_equal(t1, t2, Tolerance())
    assert metric_equal(t1, t2, Tolerance(rtol=1e-5))
    assert not metric_equal(t1, t2.model_copy(update={"shape": [4]}), Tolerance(rtol=1e-5))


def test_missing_steps_outputs_and_exit_codes_are_divergences() -> None:
    a = rec([1.0, 2.0, 3.0], outputs=[Output(path="model.pt", sha256="a" * 64)])
    b = Record(record=meta(exit_code=1), steps=a.steps[:2], outputs=[Output(path="model.pt")])
    cmp = compare_records(a, b)
    whats = [d.what for d in cmp.divergences]
    assert whats == ["steps", "exit code", "output"]
    assert cmp.divergences[0].where.startswith("step 2")
    assert cmp.divergences[2].replay == "missing"


def test_the_context_beside_a_divergence_lists_only_what_differs() -> None:
    a = rec([1.0], context={"determinism.num_threads": 2, "torch.cpu_capability": "AVX2", "gpu.driver": "550"})
    b = rec([1.5], context={"determinism.num_threads": 1, "torch.cpu_capability": "AVX2"})
    cmp = compare_records(a, b)
    assert [(c.key, c.original, c.replay) for c in cmp.context] == [
        ("determinism.num_threads", 2, 1), ("gpu.driver", "550", None)]
    text = replay_text(cmp, "run.record")
    assert "first divergence: step 0, loss" in text
    assert "determinism.num_threads: 2 -> 1" in text and "gpu.driver: 550 -> (none)" in text


def test_a_family_of_facts_one_record_predates_is_not_a_difference() -> None:
    """A record written before envlock kept packages (or any family added later) is not a
    process without packages; its twin: both records have the family, a change is named."""
    a = rec([1.0], context={"determinism.num_threads": 2})
    b = rec([1.5], context={"determinism.num_threads": 2, "packages.numpy": "2.4.6", "python.prefix": "/v"})
    assert compare_records(a, b).context == ()
    c = rec([1.0], context={"determinism.num_threads": 2, "packages.numpy": "2.4.5", "python.prefix": "/v"})
    assert [(x.key, x.original, x.replay) for x in compare_records(c, b).context] == [
        ("packages.numpy", "2.4.5", "2.4.6")]


def test_compile_caches_are_compared_only_where_both_processes_compiled() -> None:
    """A record of a process that never compiled has no compile caches; one an older envlock
    wrote has the user's shared cache directories of every torch process (another job fills
    them), and a cache loaded for a replay that did not compile ran nothing: neither is a
    cause. Its twin: two processes that compiled, a changed cache or a cold start is named."""
    old_record = {"compile.triton": "3.7.1", "compile.caches.inductor.files": 0, "compile.caches.triton.files": 0}
    never = {"compile.triton": "3.7.1"}
    assert compare_records(rec([1.0], context=old_record), rec([1.0], context=never)).context == ()
    assert compare_records(rec([1.0], context={**never, "compile.loaded": "a" * 64}),
                           rec([1.0], context=never)).context == ()
    warm = {**old_record, "compile.caches.inductor.files": 3, "compile.loaded": "a" * 64}
    assert [(x.key, x.original, x.replay) for x in compare_records(rec([1.0], context=warm),
                                                                   rec([1.0], context=old_record)).context] == [
        ("compile.caches.inductor.files", 3, 0), ("compile.loaded", "a" * 64, None)]
    # What every torch process records stays compared: another Triton.
    assert [x.key for x in compare_records(rec([1.0], context=never),
                                           rec([1.0], context={"compile.triton": "3.8.0"})).context] == [
        "compile.triton"]


def test_context_keeps_numerics_facts_and_drops_the_rest() -> None:
    form = {"platform": {"cpu_model": "EPYC", "kernel": "6.1"},
            "torch": {"cpu_capability": "AVX512", "version": "2.13.0", "arch_list": ["sm_90"],
                      "build": {"blas": "mkl", "compiler": "gcc"}},
            "gpu": {"driver": "550", "devices": [{"index": 0, "name": "H200", "uuid_sha256": "f" * 64}]},
            "determinism": {"num_threads": 4, "process_env": ["X"], "late": [], "env": {"OMP_NUM_THREADS": "4"}},
            "env": {"OMP_NUM_THREADS": "4", "PYTHONPATH": "/src", "HF_HOME": "/hf", "ENVLOCK_SEED": "1",
                    "EDITOR": "vi"}}
    ctx = context_of(form, {"world_size": 8})
    # Every variable a lock records is kept (which code imports, where models come from), and
    # only those: EDITOR is no lock's.
    assert ctx == {"determinism.env.OMP_NUM_THREADS": "4", "determinism.num_threads": 4,
                   "env.ENVLOCK_SEED": "1", "env.HF_HOME": "/hf", "env.OMP_NUM_THREADS": "4",
                   "env.PYTHONPATH": "/src", "gpu.devices.0.name": "H200",
                   "gpu.driver": "550", "platform.cpu_model": "EPYC", "process.world_size": 8,
                   "process.env_recorded": "lock", "torch.build.blas": "mkl", "torch.cpu_capability": "AVX512", "torch.version": "2.13.0"}


# -- the journal (in-process API) ----------------------------------------------------------------


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "journal.jsonl"
    monkeypatch.setenv(recorder.RECORD_ENV, str(path))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(recorder, "_state", {"path": None, "fh": None, "ranked": None})
    yield path
    if recorder._state["fh"] is not None:
        recorder._state["fh"].close()


def test_record_without_the_variable_does_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(recorder.RECORD_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    import envlock

    envlock.record(0, loss=1.0)
    assert list(tmp_path.iterdir()) == []


def test_record_writes_the_capture_then_one_line_per_call(journal: Path) -> None:
    import hashlib

    import numpy as np
    import torch

    import envlock

    weights = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    envlock.record(5, half=torch.ones(3, dtype=torch.bfloat16), empty=torch.zeros(0))
    steps_before = 1
    envlock.record(0, loss=torch.tensor(0.1, dtype=torch.float32), lr=0.01, step_ok=True)
    envlock.record(1, w=weights, a=np.arange(4, dtype=np.int64), n=np.int64(3), f=np.float32(0.5))
    lines = journal.read_text().splitlines()
    assert len(lines) == 3 + steps_before and "capture" in json.loads(lines[0])
    ran = read_journal(journal)
    steps, context = ran.steps, ran.context
    half = steps.pop(0).metrics["half"]
    assert isinstance(half, TensorDigest) and half.dtype == "bfloat16" and half.mean == 1.0
    assert half.sha256 == hashlib.sha256(b"\x80\x3f" * 3).hexdigest()  # bf16 1.0 is 0x3f80
    loss = steps[0].metrics["loss"]
    assert isinstance(loss, float) and loss.hex() == float(torch.tensor(0.1, dtype=torch.float32)).hex()
    w = steps[1].metrics["w"]
    assert isinstance(w, TensorDigest) and w.dtype == "float32" and w.shape == [2, 3] and w.mean == 2.5
    assert w.sha256 == hashlib.sha256(weights.numpy().tobytes()).hexdigest()
    a = steps[1].metrics["a"]
    assert isinstance(a, TensorDigest) and a.dtype == "int64" and a.shape == [4]
    assert steps[1].metrics["n"] == 3 and steps[1].metrics["f"] == 0.5
    assert context["process.world_size"] == 1 and "determinism.num_threads" in context
    assert "env.ENVLOCK_RECORD" not in context


def _old_tensor_sha256(value: Any) -> str:
    """The digest records were written with before the hash read memory in place: the bytes
    of a clone's storage of the contiguous CPU tensor (kept here as the reference)."""
    import hashlib

    t = value.detach().cpu().contiguous()
    return hashlib.sha256(bytes(t.clone().untyped_storage()) if t.numel() else b"").hexdigest()


def test_a_tensor_digest_is_the_one_older_records_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """The digest is unchanged for every dtype and layout (so a record made before still
    replays bit-identically), and no byte is read through the storage one by one in Python
    (``bytes(storage)`` took about 5 s for 2 MB, which a training loop paid at every call)."""
    import torch

    base = torch.randn(6, 10, generator=torch.Generator().manual_seed(0))
    cplx = torch.complex(base, base.flip(0))
    tensors = {
        "float32": base, "float64": base.double(), "float16": base.half(),
        "bfloat16": base.bfloat16(), "float8_e4m3fn": base.to(torch.float8_e4m3fn),
        "float8_e5m2": base.to(torch.float8_e5m2), "bool": base > 0,
        "int8": (base * 10).to(torch.int8), "uint8": (base.abs() * 10).to(torch.uint8),
        "int64": (base * 1e6).long(), "complex64": cplx, "conjugate view": cplx.conj(),
        "negative view": torch.ops.aten._neg_view(cplx), "transposed": base.t(),
        "strided": base[:, ::3], "offset view": base.reshape(-1)[7:40],
        "expanded": base[0].expand(4, 10), "channels_last": torch.randn(2, 3, 4, 5).to(
            memory_format=torch.channels_last), "zero elements": base[:0], "0 by 3": torch.zeros(0, 3),
        "1-d bfloat16 slice": base.bfloat16().reshape(-1)[1::7],
    }
    expected = {name: _old_tensor_sha256(t) for name, t in tensors.items()}
    reads = []
    original = torch.UntypedStorage.__getitem__

    def counted(self: Any, index: Any) -> Any:
        reads.append(index)
        return original(self, index)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(torch.UntypedStorage, "__getitem__", counted)
    for beside in (0, 1 << 60):  # hashed on a thread beside the mean, and inline
        monkeypatch.setattr(recorder, "_HASH_BESIDE", beside)
        for name, t in tensors.items():
            got = recorder.encode("w", t)
            assert got["sha256"] == expected[name], (name, beside)
            assert got["dtype"] == str(t.dtype).removeprefix("torch.") and got["shape"] == list(t.shape), name
    assert reads == []
    mean = recorder.encode("w", base)["mean"]
    assert math.isclose(mean, float(base.double().mean()), rel_tol=1e-12)


def test_the_mean_of_a_tensor_spans_every_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor longer than the float64 buffer of the mean: each chunk counts, the last one
    short, so the mean is the whole tensor's."""
    import torch

    monkeypatch.setattr(recorder, "_MEAN_CHUNK", 7)
    t = torch.arange(30, dtype=torch.int32).reshape(5, 6)
    assert recorder.encode("w", t)["mean"] == 14.5
    assert recorder.encode("w", torch.ones(3, dtype=torch.bool))["mean"] == 1.0


MEAN_THREADS = """
import os, torch
torch.set_num_threads(2)
from envlock.runtime import recorder
t = torch.frombuffer(bytearray(4 * 2_000_000), dtype=torch.float32)  # made by no torch kernel
before = len(os.listdir("/proc/self/task"))
recorder._tensor_mean(torch, t)
print(before, len(os.listdir("/proc/self/task")))
"""


def test_the_mean_of_a_large_tensor_starts_no_intra_op_thread() -> None:
    """The mean runs on the calling thread alone, beside the hash's thread: a chunk at or above
    torch's parallel grain opened an OpenMP region per op, whose spinning team fought the hash
    for the cores (a 100 MB ``record()`` took 3.3x sha256 on a loaded machine). The first such
    region starts the team's threads, which ``/proc/self/task`` shows; a fresh process, so no
    earlier torch kernel started them."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", MEAN_THREADS], capture_output=True, text=True,
                          env=env, check=True, timeout=120)
    before, after = done.stdout.split()
    assert after == before, done.stdout


def test_record_refuses_what_is_not_a_metric_or_a_step(journal: Path) -> None:
    import envlock

    with pytest.raises(TypeError, match="metric 'name' is a str"):
        envlock.record(0, name="x")
    with pytest.raises(TypeError, match="step must be a non-negative int"):
        envlock.record(-1, loss=1.0)
    with pytest.raises(TypeError, match="step must be"):
        envlock.record(True, loss=1.0)
    with pytest.raises(TypeError, match="step must be a non-negative int, not None"):
        envlock.record(loss=1.0)
    with pytest.raises(TypeError, match="step must be"):
        envlock.record(step=-2, loss=1.0)


def test_the_step_may_be_given_by_name(journal: Path) -> None:
    """``record(step=i, loss=l)``, as other loggers spell it, records what ``record(i, loss=l)``
    does; the twin: a metric named ``step`` beside a positional step stays a metric."""
    import envlock

    envlock.record(step=0, loss=1.5)
    envlock.record(1, loss=1.25)
    envlock.record(2, step=7)
    rows = [json.loads(line) for line in journal.read_text().splitlines()[-3:]]
    assert rows == [{"step": 0, "metrics": {"loss": 1.5}}, {"step": 1, "metrics": {"loss": 1.25}},
                    {"step": 2, "metrics": {"step": 7}}]


def test_only_rank_zero_records(journal: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import envlock

    monkeypatch.setenv("RANK", "1")
    envlock.record(0, loss=1.0)
    assert not journal.exists()


def test_a_torn_last_line_is_left_out_and_a_bad_line_refused(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    path.write_text('{"step": 0, "metrics": {"loss": 1.5}}\n{"step": 1, "metr')
    assert [s.step for s in read_journal(path).steps] == [0]
    path.write_text('{"step": "zero", "metrics": {}}\n{"step": 1, "metrics": {}}\n')
    with pytest.raises(LockInvalid, match="journal, line 1"):
        read_journal(path)


def test_the_record_path_variable_stays_out_of_a_lock() -> None:
    assert not env_allowed("ENVLOCK_RECORD")
    # over-redaction twin: every other envlock variable is still recorded
    assert env_allowed("ENVLOCK_SEED") and env_allowed("ENVLOCK_IMAGE") and env_allowed("ENVLOCK_RECORDS")


# -- inputs --------------------------------------------------------------------------------------

REV1, REV2 = "1" * 40, "2" * 40


def hf_repo(cache: Path, repo: str, rev: str, files: dict[str, str], kind: str = "models") -> Path:
    """The cache layout huggingface_hub writes: refs/main, snapshots/<rev>/ symlinks into blobs/."""
    folder = cache / f"{kind}--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(rev)
    for name, blob in files.items():
        (folder / "blobs").mkdir(exist_ok=True)
        (folder / "blobs" / blob).write_text(name)
        link = folder / "snapshots" / rev / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():
            link.unlink()
        link.symlink_to(os.path.relpath(folder / "blobs" / blob, link.parent))
    return folder


def test_hf_cache_location_follows_the_hub_variables(tmp_path: Path) -> None:
    assert inputs.hf_cache_dir({"HF_HUB_CACHE": "/a", "HF_HOME": "/b"}) == "/a"
    assert inputs.hf_cache_dir({"HUGGINGFACE_HUB_CACHE": "/c"}) == "/c"
    assert inputs.hf_cache_dir({"HF_HOME": "/b"}) == "/b/hub"
    assert inputs.hf_cache_dir({"XDG_CACHE_HOME": "/x"}) == "/x/huggingface/hub"


def test_hf_revision_and_snapshot_are_read_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hf_repo(tmp_path / "hf" / "hub", "org/model", REV1, {"config.json": "c" * 40, "w/model.bin": "d" * 64})
    hf_repo(tmp_path / "hf" / "hub", "org/data", REV1, {"train.csv": "e" * 40}, kind="datasets")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    got = inputs.hf_revision("hf:org/model")
    assert got["revision"] == REV1 and got["files"] == 2 and got["name"] == "hf:models/org/model@main"
    assert inputs.hf_revision("hf:datasets/org/data")["files"] == 1
    assert inputs.hf_revision("hf:org/absent")["revision"] is None
    assert inputs.hf_revision(f"hf:org/model@{REV1}")["files_sha256"] == got["files_sha256"]
    for bad in ("hf:../x", "hf:org/model@../../etc", "hf:", "hf:a/b/c"):
        with pytest.raises(inputs.InputError):
            inputs.parse_hf(bad)


def test_a_moved_revision_and_a_replaced_blob_are_drift(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    folder = hf_repo(cache, "org/model", REV1, {"model.bin": "d" * 64})
    r = Record(record=meta(), inputs=[Input.model_validate(
        {k: v for k, v in inputs.hf_revision("hf:org/model").items() if v is not None})])
    from envlock.replay.make import check_inputs

    assert check_inputs(r, tmp_path).same
    hf_repo(cache, "org/model", REV1, {"model.bin": "f" * 64})  # re-quantised in place
    drift = check_inputs(r, tmp_path).inputs
    assert [(d.name, d.what) for d in drift] == [("hf:models/org/model@main", "snapshot")]
    hf_repo(cache, "org/model", REV2, {"model.bin": "f" * 64})  # main moved
    drift = check_inputs(r, tmp_path).inputs
    assert [(d.what, d.original, d.now) for d in drift] == [("revision", REV1, REV2)]
    (folder / "refs" / "main").unlink()
    assert check_inputs(r, tmp_path).inputs[0].now == "not cached"


def test_data_paths_are_hashed_with_the_stat_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("a")
    (data / "sub" / "b.txt").write_text("b")
    later = lambda: 2**62  # noqa: E731 - a clock far after every file: none of them is racy
    first = inputs.path_digest(str(data), now_ns=later)
    assert first["files"] == 2 and first["size"] == 2
    import hashlib

    assert inputs.path_digest(str(data / "a.txt"))["sha256"] == hashlib.sha256(b"a").hexdigest()
    reads: list[str] = []
    real = deep.record_hash

    def counted(p: str, *a: Any) -> Any:
        reads.append(p)
        return real(p, *a)

    monkeypatch.setattr(inputs, "record_hash", counted)
    assert inputs.path_digest(str(data), now_ns=later)["sha256"] == first["sha256"]
    assert reads == []  # every stat unchanged: nothing read
    (data / "sub" / "b.txt").write_text("B")
    assert inputs.path_digest(str(data), now_ns=later)["sha256"] != first["sha256"]
    assert reads == [str(data / "sub" / "b.txt")]
    assert inputs.path_digest(str(data), cache=False, now_ns=later)["sha256"] != first["sha256"]
    with pytest.raises(inputs.InputError, match="no such file"):
        inputs.path_digest(str(tmp_path / "absent"))


def test_a_racy_file_is_hashed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "f").write_text("x")
    st = os.stat(tmp_path / "f")
    just_after = lambda: max(st.st_mtime_ns, st.st_ctime_ns) + 1  # noqa: E731
    inputs.path_digest(str(tmp_path / "f"), now_ns=just_after)
    reads: list[str] = []
    real = deep.record_hash

    def counted(p: str, *a: Any) -> Any:
        reads.append(p)
        return real(p, *a)

    monkeypatch.setattr(inputs, "record_hash", counted)
    inputs.path_digest(str(tmp_path / "f"), now_ns=just_after)
    assert reads == [str(tmp_path / "f")]


# -- the commands on this host -------------------------------------------------------------------

SCRIPT = """
import os, envlock
x = 0.1
for step in range(4):
    x = x * 1.1 + float(os.environ.get("BUMP", "0"))
    envlock.record(step, loss=x)
open("out.txt", "w").write(repr(x))
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "d.csv").write_text("1,2\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    hf_repo(tmp_path / "hub", "org/model", REV1, {"model.bin": "d" * 64})
    repo = str(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return tmp_path


def test_record_then_replay_on_the_host(project: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    code = main(["record", "run.record", "--output", "out.txt", "--input", "data", "--input",
                 "hf:org/model", "--", sys.executable, "train.py"])
    assert code == 0
    r = load(project / "run.record")
    assert [s.step for s in r.steps] == [0, 1, 2, 3] and r.record.where == "host"
    assert r.outputs[0].sha256 and {i.kind for i in r.inputs} == {"path", "hf"}
    assert main(["replay", "run.record"]) == 0
    assert "OK: the replay reproduced run.record (bit-identical; 4 steps compared)" in capsys.readouterr().out

    monkeypatch.setenv("BUMP", "1e-17")
    assert main(["replay", "run.record"]) == 1
    out = capsys.readouterr().out
    assert "first divergence: step 0, loss" in out and "output out.txt" in out
    assert main(["replay", "run.record", "--atol", "1e-9"]) == 1  # out.txt's bytes still differ
    out = capsys.readouterr().out
    assert "first divergence: output out.txt" in out and "within rtol=0.0 atol=1e-09" in out
    monkeypatch.delenv("BUMP")

    (project / "data" / "d.csv").write_text("1,3\n")
    hf_repo(project / "hub", "org/model", REV2, {"model.bin": "d" * 64})
    assert main(["replay", "run.record", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["divergences"] == []
    assert {(d["name"], d["what"]) for d in doc["inputs"]} == {
        ("data", "content"), ("hf:models/org/model@main", "revision")}


def test_replay_of_a_container_record_points_at_run(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Record(record=meta(where="container", lock="env.lock")).save(project / "c.record")
    assert main(["replay", "c.record"]) == 2
    assert "envlock run env.lock --replay c.record" in capsys.readouterr().err


def test_bad_inputs_and_options_are_exit_2(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "r.record", "--input", "hf:../x", "--", sys.executable, "-c", "pass"]) == 2
    marker = project / "ran"
    assert main(["record", "r.record", "--input", "nothing-here", "--", sys.executable, "-c",
                 f"open({str(marker)!r}, 'w')"]) == 2
    assert "--input nothing-here: no such file or directory" in capsys.readouterr().err
    assert not marker.exists()  # refused before the command ran
    assert main(["record", "r.record"]) == 2
    # without "--" the command starts at the first word that is not an option
    assert main(["record", "r.record", sys.executable, "-c", "pass"]) == 0
    assert main(["record", "r2.record", "--output", "x", sys.executable, "-c", "pass"]) == 0
    assert load(project / "r2.record").outputs[0].path == "x"
    rec([1.0]).save(project / "a.record")
    assert main(["replay", "a.record", "--rtol", "-1"]) == 2
    assert main(["run", "env.lock", "--record", "a", "--replay", "b", "--", "true"]) == 2


def test_a_record_is_made_from_the_journal_with_outputs_and_inputs(project: Path) -> None:
    journal = project / "j.jsonl"
    journal.write_text('{"step": 3, "metrics": {"loss": 0.5}}\n')
    (project / "ckpt").mkdir()
    (project / "ckpt" / "a.bin").write_bytes(b"\0\1")
    r = make_record(journal, command=["x"], exit_code=0, where="host", base=project,
                    outputs=["ckpt", "gone.pt"], inputs=["data"])
    assert r.steps[0].step == 3 and r.outputs[0].sha256 and r.outputs[1].sha256 is None
    assert r.inputs[0].kind == "path" and r.inputs[0].files == 1


def test_a_context_value_the_record_cannot_hold_is_marked_and_the_record_kept(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A numerics library loaded from a path with a terminal control, and a loader path longer
    than a record's text: the capture is a valid lock, but ``[context]`` used to take the values as
    they were and the record was refused after the run. Each is kept as a mark holding its
    sha256, so the record is written and reads back, and a replay that ran another value is
    still told apart."""
    import torch

    from envlock.replay.record import holds

    monkeypatch.setenv("LD_LIBRARY_PATH", ":".join(f"/opt/lib{i:04d}" for i in range(600)))
    line = json.loads(recorder._capture_line(0, 1))
    odd_path = "/opt/blas\x1b]0;build\x07/libopenblas.so.0"
    line["capture"]["native"]["libraries"].append(
        {"name": "libopenblas.so.0", "path": odd_path, "sha256": "a" * 64})
    journal = project / "j.jsonl"
    journal.write_text(json.dumps(line) + "\n" + '{"step": 0, "metrics": {"loss": 0.5}}\n')
    r = make_record(journal, command=["x"], exit_code=0, where="host", base=project)
    r.save(project / "run.record")
    back = load(project / "run.record")
    assert back.context == r.context and back.steps == r.steps and back.steps[0].metrics["loss"] == 0.5
    long_path = back.context["env.LD_LIBRARY_PATH"]
    blas = back.context["native.libraries.libopenblas.so.0"]
    assert isinstance(long_path, str) and isinstance(blas, str)
    assert long_path == unrecordable(os.environ["LD_LIBRARY_PATH"]) and holds(long_path)
    assert blas.startswith(unrecordable("")[:12]) and holds(blas) and "\x1b" not in blas
    assert unrecordable("/other\x1bpath") != unrecordable(odd_path)
    assert back.context["torch.version"] == torch.__version__  # the rest kept as it was


def test_verify_reads_the_record_inputs_again(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capture", "--no-torch", "--python", sys.executable, "-o", "env.lock"]) == 0
    r = make_record(project / "none.jsonl", command=["x"], exit_code=0, where="host", base=project,
                    inputs=["data", "hf:org/model"])
    r.save(project / "run.record")
    capsys.readouterr()
    assert main(["verify", "env.lock", "--no-torch", "--python", sys.executable, "--record", "run.record"]) == 0
    assert "OK: the inputs of run.record are unchanged" in capsys.readouterr().out
    (project / "data" / "d.csv").write_text("changed\n")
    assert main(["verify", "env.lock", "--no-torch", "--python", sys.executable, "--record", "run.record"]) == 1
    assert "DRIFT input data content changed" in capsys.readouterr().out
    assert main(["verify", "env.lock", "--no-torch", "--python", sys.executable, "--json",
                 "--record", "run.record"]) == 1
    assert json.loads(capsys.readouterr().out)["record_inputs"][0]["what"] == "content"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_fuzz_the_journal_reader(tmp_path: Path, data: bytes) -> None:
    """Whatever a process leaves in the journal reaches the JSON reader and the Step model;
    the only failure is LockInvalid (2)."""
    path = tmp_path / "j.jsonl"
    path.write_bytes(b'{"step": 0, "metrics": {"x": 1.5}}\n' + data)
    try:
        steps = read_journal(path).steps
    except LockInvalid:
        return
    assert steps[0].metrics == {"x": 1.5}


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_fuzz_hf_specs_parse_or_raise_input_error(spec: str) -> None:
    try:
        kind, repo, ref = inputs.parse_hf("hf:" + spec)
    except inputs.InputError:
        return
    assert kind in ("models", "datasets", "spaces") and ".." not in repo + ref
    assert not repo.startswith("/") and "\0" not in repo + ref


def test_run_takes_the_record_options_between_the_lock_and_the_command() -> None:
    from envlock.commands._parser import build_parser
    from envlock.commands.run import split_run_args

    args = build_parser().parse_args(["run", "env.lock", "--replay", "r.record", "--rtol", "1e-3",
                                      "--output", "m.pt", "--", "python", "t.py", "--rtol", "9"])
    assert split_run_args(args) == ["python", "t.py", "--rtol", "9"]
    assert (args.replay, args.rtol, args.atol, args.output) == ("r.record", 1e-3, 0.0, ["m.pt"])
    args = build_parser().parse_args(["run", "env.lock", "--record", "r.record", "--input", "hf:o/m",
                                      "python", "t.py"])
    assert split_run_args(args) == ["python", "t.py"] and args.input == ["hf:o/m"]
