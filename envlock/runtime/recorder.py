"""``envlock.record(step, **metrics)``: what a training run produced, at full precision.

The process learns where to write from ``ENVLOCK_RECORD`` (``envlock run --record`` and
``envlock record`` set it to a journal file); without it every call does nothing, so training
code keeps its ``record`` lines when it runs outside envlock. Each call appends one JSON line
and flushes it: a crash keeps every step recorded before it, and nothing is held in memory.
``envlock`` turns the journal into the sealed TOML record when the command has exited.

Values keep their exact bits: a Python float is written by ``json`` with ``repr``, which reads
back to the same double; a 0-d tensor or numpy scalar becomes its Python number (``.item()``:
a float32 widens to a double exactly); a tensor or array becomes the sha256 of its raw bytes
with dtype, shape and mean, because a bit-identical comparison needs the bytes and a
tolerance needs a number.

The first call also probes this process (the probe, in-process, as ``envlock.capture()``
does): threads, determinism flags, the CPU capability torch dispatches to and the GPUs are live
state, and a replay that diverges names which of them differ. With it go the sha256 of the
workspace files the process has loaded (the script, the project's modules: ``probe.code``), so
an edited script is named. Only rank 0 records metrics (``RANK`` unset or 0, or
``torch.distributed``'s rank); every other rank writes its own capture once, to a file of its
own beside the journal (``rank_journal``), so that a cause on one rank only (a variable set on
rank 1) can be named with its rank.

Under ``--save-compile-cache`` the first call also arranges for rank 0 to save what it compiled
when it exits (``compilecache.arm_save_at_exit``), so a recorded run needs no line of its own
for that.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import sys
import threading
from typing import Any, TextIO

from envlock.probe.rules import METRIC_NAME, rank_journal
from envlock.probe.trace import TRACE_ENV, paused
from envlock.probe.trace import start as start_trace
from envlock.runtime.common import rank_and_world
from envlock.runtime.compilecache import arm_save_at_exit

RECORD_ENV = "ENVLOCK_RECORD"
# The directory the command runs in (the workspace), set with ``RECORD_ENV`` by envlock: what
# ``probe.code`` hashes files from. Without it, the process's working directory.
WORKSPACE_ENV = "ENVLOCK_WORKSPACE"
# ``path`` and ``fh``: rank 0's journal; ``ranked``: the journal another rank wrote its capture
# beside (once per process).
_state: dict[str, Any] = {"path": None, "fh": None, "ranked": None}


def _tensor(value: Any) -> dict[str, Any] | None:
    """A torch tensor or numpy array as {sha256, dtype, shape, mean}; None for anything else."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        # On the CPU, in row-major order, with a conjugate or negative view's bits resolved:
        # the bytes a clone's storage holds, which is what records have always hashed.
        t = value.detach().cpu().resolve_conj().resolve_neg().contiguous()
        digest = hashlib.sha256()
        data = _element_bytes(t)
        # Both read every byte: the hash (hashlib lets go of the GIL) runs beside the mean, so
        # a large tensor costs about one pass over its memory, not two. Joined whatever the
        # mean does: the thread reads ``t``'s memory, which must outlive it.
        hasher = None
        if len(data) >= _HASH_BESIDE:
            hasher = threading.Thread(target=digest.update, args=(data,), daemon=True)
            hasher.start()
        else:
            digest.update(data)
        try:
            mean = _tensor_mean(torch, t) if t.numel() and not t.is_complex() else None
        finally:
            if hasher is not None:
                hasher.join()
        return _digest(digest, str(t.dtype).removeprefix("torch."), list(t.shape), mean)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        a = numpy.ascontiguousarray(value)
        mean = (float(a.astype("float64").mean())
                if a.size and a.dtype.kind in "biuf" else None)
        return _digest(hashlib.sha256(a.tobytes()), str(a.dtype), list(a.shape), mean)
    return None


def _element_bytes(t: Any) -> memoryview:
    """A contiguous CPU tensor's element bytes, in place, whatever the dtype.

    The memory is read through a ``ctypes`` view of ``data_ptr()`` (which includes the
    storage offset of a view) rather than copied: ``bytes(storage)`` went element by element in
    Python (about 5 s for 2 MB), and ``tensor.numpy()`` would need numpy (a restored image need
    not have it) and has no bfloat16 or float8. The caller holds ``t`` while the view is read.
    """
    size = t.numel() * t.element_size()
    if not size:
        return memoryview(b"")
    return memoryview((ctypes.c_char * size).from_address(t.data_ptr())).cast("B")


# From this many bytes a tensor is hashed on a thread of its own beside the mean: below it,
# starting a thread costs more than the overlap saves.
_HASH_BESIDE = 1 << 20

# Elements converted to float64 at a time for the mean, into one reused buffer (``t.double()``
# allocated and faulted in eight bytes per element, which cost twice the hash). Below torch's
# parallel grain (``at::internal::GRAIN_SIZE``, 32768 elements) a CPU kernel runs on the calling
# thread and opens no OpenMP region: with 1 Mi-element chunks each of the two ops per chunk
# started the intra-op team, whose threads spin at a barrier, so on a loaded machine the mean
# waited on descheduled threads and fought the hash for its core (a 100 MB record() took 3.3x
# sha256). One element under the grain: torch versions differ in whether the grain itself splits.
_MEAN_CHUNK = (1 << 15) - 1


def _tensor_mean(torch: Any, t: Any) -> float:
    """The mean of a contiguous real tensor, accumulated in float64 a chunk at a time, on this
    thread alone (``_MEAN_CHUNK``), while the hash runs on another.

    The mean serves a comparison within a tolerance only (bit-identity is the sha256), so the
    order of the float64 additions (per chunk, then the chunks' sums) may differ from a
    whole-tensor reduction in the last bits without changing what a replay finds.
    """
    flat = t.reshape(-1)
    n = int(flat.numel())
    buf = torch.empty(min(n, _MEAN_CHUNK), dtype=torch.float64)
    total = torch.zeros((), dtype=torch.float64)
    for start in range(0, n, _MEAN_CHUNK):
        part = flat[start:start + _MEAN_CHUNK]
        chunk = buf[:part.numel()]
        chunk.copy_(part)
        total += chunk.sum()
    return float(total) / n


def _digest(digest: Any, dtype: str, shape: list[int], mean: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"sha256": digest.hexdigest(), "dtype": dtype, "shape": shape}
    if mean is not None and math.isfinite(mean):
        out["mean"] = mean
    return out


def encode(name: str, value: Any) -> Any:
    """One metric as the journal stores it (exact), or TypeError naming what is not a metric."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    shape = getattr(value, "shape", None)
    if shape is not None and tuple(shape) == () and hasattr(value, "item"):
        return encode(name, value.item())  # a 0-d tensor or numpy scalar: its exact number
    digest = _tensor(value)
    if digest is not None:
        return digest
    if hasattr(value, "item") and not hasattr(value, "shape"):
        return encode(name, value.item())  # numpy scalar types without a shape
    raise TypeError(f"envlock.record: metric {name!r} is a {type(value).__name__}; "
                    "give a number, a tensor or an array")


def _capture_line(rank: int, world: int) -> str:
    """This process's capture, its rank and world size, and (rank 0) its workspace files.
    What the capture reads (every variable, many files) is envlock's, not the run's: the
    trace is paused meanwhile."""
    from envlock.probe.code import workspace_files
    from envlock.probe.collect import collect, gc_paused
    from envlock.probe.statcache import file_cache_allowed

    with gc_paused(), paused():
        # No git: the record's context keeps none (envlock reads the workspace's git state).
        doc = collect(torch="auto" if "torch" in sys.modules else "no",
                      hash_cache=file_cache_allowed(), git=False)
        line: dict[str, Any] = {"capture": doc, "world_size": world, "rank": rank}
        if rank == 0:
            line["code"] = workspace_files(os.environ.get(WORKSPACE_ENV) or os.getcwd())
        return json.dumps(line) + "\n"


def _open(path: str, world: int) -> TextIO:
    fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the process's life
    if fh.tell() == 0:
        fh.write(_capture_line(0, world))
    return fh


def _capture_rank(path: str, rank: int, world: int) -> None:
    """Another rank's capture, once per process, in its own file (never rank 0's journal:
    lines of several processes would interleave)."""
    if _state.get("ranked") == path:
        return
    _state["ranked"] = path
    with open(rank_journal(path, rank), "a", encoding="utf-8") as fh:
        if fh.tell() == 0:
            fh.write(_capture_line(rank, world))


def _trace(rank: int) -> None:
    """Start the trace of what this process reads (``probe.trace``) when the run is traced
    and the start-up hook did not start it already (a container's run, an interpreter started
    with ``-S``), and take the process facts at this first step; once per process."""
    if _state.get("traced") or not os.environ.get(TRACE_ENV):
        return
    _state["traced"] = True
    found = start_trace(late=True)
    if found is not None:
        found.recorded = found.recorded or rank == 0
        found.take_state()


def record(step: int | None = None, /, **metrics: Any) -> None:
    """Append one step's metrics to the run's record (nothing when not recording).

    ``step`` is a non-negative int, given first or as ``step=`` (how ``wandb.log(..., step=)``
    and the loggers users come from spell it: a positional-only step made that call a
    TypeError that stopped the training run); each metric a number (bool, int, float), a 0-d
    tensor, or a tensor/array (kept as the sha256 of its bytes, dtype, shape and mean).
    """
    if step is None and "step" in metrics:
        step = metrics.pop("step")
    arm_save_at_exit()
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise TypeError(f"envlock.record: step must be a non-negative int, not {step!r}")
    # The record's own rule, checked at the call that breaks it (found only when the record is
    # written, a bad name failed the run after it ended), and on every rank, so that no rank is
    # left waiting in a collective for rank 0.
    for name in metrics:
        if not METRIC_NAME.fullmatch(name):
            raise ValueError(f"envlock.record: metric name {name!r} cannot be recorded: a name is a "
                             "letter or '_', then at most 127 letters, digits or '_' '.' '/' '-'")
    with paused():  # envlock's own lookups (RANK, WORLD_SIZE) are not the run's
        rank, world = rank_and_world()
    _trace(rank)
    if rank != 0:
        _capture_rank(path, rank, world)
        return
    row = {"step": int(step), "metrics": {name: encode(name, v) for name, v in metrics.items()}}
    if _state["path"] != path:
        if _state["fh"] is not None:
            _state["fh"].close()
        _state["fh"], _state["path"] = _open(path, world), path
    fh: TextIO = _state["fh"]
    fh.write(json.dumps(row) + "\n")
    fh.flush()
