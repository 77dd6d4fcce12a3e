"""Comparing two replay records: the first diverging step, metric or output, the inputs that
changed, and the facts of the two processes that can explain a divergence. A replay whose
command failed before it recorded anything is a failed command, not a divergence.

Bit-identical by default: two floats are equal when ``float.hex`` is (so ``-0.0`` differs from
``0.0``, and NaN equals a NaN), two tensors when their sha256 is. With a tolerance
(``rtol``/``atol``, numpy's ``allclose`` rule ``|replay - original| <= atol + rtol *
|original|``) numbers are compared by value and tensors by dtype, shape and mean.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from envlock._compare_native import context_form
from envlock._record import Input, Record, Step, TensorDigest
from envlock._textsafe import plural
from envlock.probe.rules import COMPILE_ENV_PREFIXES

# Which facts of a process can change numbers while every version matches: what the record's
# [context] keeps from the process's capture, as prefixes of flat ``table.field`` keys.
CONTEXT_PREFIXES = (
    # Which interpreter and environment the process ran in (sys.executable, sys.prefix).
    "python.executable", "python.prefix",
    "platform.machine", "platform.cpu_model", "platform.cpu_count",
    "torch.version", "torch.cpu_capability", "torch.cuda", "torch.cudnn", "torch.mkl",
    "torch.mkldnn", "torch.openmp", "torch.build.blas", "torch.build.lapack",
    "torch.build.mkl_version", "torch.build.onednn_version", "torch.build.openmp_version",
    "torch.build.parallel_backend", "torch.build.cuda_runtime", "torch.build.cudnn_version",
    "gpu.driver", "gpu.devices.",
    "determinism.", "seeds.", "env.", "process.",
    "torch.cuda_libraries.", "native.libraries.", "native.runtimes.", "compile.",
)
# Of the recorded variables, those that select threads, kernels, ISAs or devices.
_NUMERICS_ENV_PREFIXES = ("OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "ONEDNN_", "DNNL_", "ATEN_",
                          "CUBLAS", "CUDNN_", "NVIDIA_TF32", "TORCH_", "PYTORCH_", "NCCL_", "XLA_",
                          "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING", "PYTHONHASHSEED",
                          "ENVLOCK_SEED", "LD_LIBRARY_PATH", "LD_PRELOAD", *COMPILE_ENV_PREFIXES)
_NOT_CONTEXT = ("determinism.process_env", "determinism.torch_loaded", "gpu.devices.*.uuid_sha256",
                "gpu.devices.*.index", "seeds.seed_source")


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "l": [{"x": 2}]}`` -> ``{"a.b": 1, "l.0.x": 2}``; a list of scalars is
    one value (joined), as the context stores scalars only."""
    out: dict[str, Any] = {}
    if isinstance(data, Mapping):
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
    elif isinstance(data, list) and any(isinstance(v, (Mapping, list)) for v in data):
        for i, value in enumerate(data):
            out.update(flatten(value, f"{prefix}{i}."))
    elif isinstance(data, list):
        out[prefix[:-1]] = ",".join(str(v) for v in data)
    elif data is not None:
        out[prefix[:-1]] = data
    return out


def _wild(key: str) -> str:
    parts = key.split(".")
    return ".".join("*" if p.isdigit() else p for p in parts)


def context_of(form: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The explanatory facts of a lock's canonical form (``extra``: ``process.*`` facts)."""
    flat = flatten(context_form(dict(form)))
    flat.update({f"process.{k}": v for k, v in (extra or {}).items()})
    return {k: v for k, v in sorted(flat.items())
            if k.startswith(CONTEXT_PREFIXES) and not _wild(k).startswith(_NOT_CONTEXT)
            and (not k.startswith("env.") or k[4:].startswith(_NUMERICS_ENV_PREFIXES))
            and isinstance(v, (bool, int, float, str)) and v != "" and len(k) <= 200}


@dataclass(frozen=True)
class Tolerance:
    rtol: float = 0.0
    atol: float = 0.0

    @property
    def exact(self) -> bool:
        return self.rtol == 0.0 and self.atol == 0.0


@dataclass(frozen=True)
class Divergence:
    """One place where the replay differs: ``what`` is "step", "output", "exit code" or
    "steps" (a count); ``where`` names it (``step 12, loss``; ``model.pt``)."""

    what: str
    where: str
    original: str
    replay: str


@dataclass(frozen=True)
class ContextChange:
    key: str
    original: Any
    replay: Any


@dataclass(frozen=True)
class InputDrift:
    name: str
    what: str  # "revision", "content", "missing", "snapshot"
    original: str
    now: str


@dataclass(frozen=True)
class ReplayComparison:
    """``failed``: the replay's exit code when its command failed before it recorded a step
    (nothing was compared: there is nothing to compare, and the two processes' facts would
    explain nothing)."""

    divergences: tuple[Divergence, ...] = ()
    inputs: tuple[InputDrift, ...] = ()
    context: tuple[ContextChange, ...] = ()
    steps_compared: int = 0
    tolerance: Tolerance = field(default_factory=Tolerance)
    failed: int | None = None

    @property
    def same(self) -> bool:
        return not self.divergences and not self.inputs and self.failed is None

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "same": self.same,
            "failed": self.failed,
            "steps_compared": self.steps_compared,
            "tolerance": {"rtol": self.tolerance.rtol, "atol": self.tolerance.atol},
            "divergences": [vars(d) for d in self.divergences],
            "inputs": [vars(d) for d in self.inputs],
            "context": [{"key": c.key, "original": c.original, "replay": c.replay}
                        for c in self.context],
        }


def show(value: Any) -> str:
    """A metric as a reader checks bits: repr and float.hex for floats."""
    if isinstance(value, TensorDigest):
        mean = f", mean {value.mean!r}" if value.mean is not None else ""
        return f"{value.dtype}{list(value.shape)} sha256 {value.sha256[:12]}{mean}"
    if isinstance(value, float):
        return f"{value!r} ({value.hex()})"
    return repr(value)


def _close(a: float, b: float, tol: Tolerance) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(b - a) <= tol.atol + tol.rtol * abs(a)


def metric_equal(a: Any, b: Any, tol: Tolerance) -> bool:
    if isinstance(a, TensorDigest) or isinstance(b, TensorDigest):
        if not (isinstance(a, TensorDigest) and isinstance(b, TensorDigest)):
            return False
        if a.sha256 == b.sha256:
            return True
        if tol.exact or a.dtype != b.dtype or a.shape != b.shape or a.mean is None or b.mean is None:
            return False
        return _close(a.mean, b.mean, tol)
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if tol.exact:
        if isinstance(a, float) or isinstance(b, float):
            return isinstance(a, float) and isinstance(b, float) and a.hex() == b.hex()
        return bool(a == b)
    return _close(float(a), float(b), tol)


def _steps(original: list[Step], replay: list[Step], tol: Tolerance) -> list[Divergence]:
    for i, (a, b) in enumerate(zip(original, replay)):  # noqa: B905 - lengths compared below
        if a.step != b.step:
            return [Divergence("step", f"row {i + 1}", f"step {a.step}", f"step {b.step}")]
        for name in list(a.metrics) + [n for n in b.metrics if n not in a.metrics]:
            if name not in b.metrics:
                return [Divergence("step", f"step {a.step}, {name}", show(a.metrics[name]), "not recorded")]
            if name not in a.metrics:
                return [Divergence("step", f"step {b.step}, {name}", "not recorded", show(b.metrics[name]))]
            if not metric_equal(a.metrics[name], b.metrics[name], tol):
                return [Divergence("step", f"step {a.step}, {name}", show(a.metrics[name]),
                                   show(b.metrics[name]))]
    if len(original) != len(replay):
        n = min(len(original), len(replay))
        nxt = original[n] if len(original) > n else replay[n]
        return [Divergence("steps", f"step {nxt.step} (row {n + 1})",
                           f"{plural(len(original), 'step')} recorded", f"{plural(len(replay), 'step')} recorded")]
    return []


def _outputs(original: Record, replay: Record) -> list[Divergence]:
    found = {o.path: o for o in replay.outputs}
    out = []
    for o in original.outputs:
        r = found.get(o.path)
        a = o.sha256 or "missing"
        b = (r.sha256 or "missing") if r is not None else "not declared"
        if a != b:
            out.append(Divergence("output", o.path, a, b))
    return out


def input_drift(recorded: Iterable[Input], now: Mapping[str, Input | str]) -> list[InputDrift]:
    """Recorded inputs against the same inputs read now (an ``Input``, or why it could not be
    read); one not read now is left out (``--input`` chose others)."""
    out = []
    for rec in recorded:
        cur = now.get(rec.name)
        if cur is None:
            continue
        if isinstance(cur, str):
            out.append(InputDrift(rec.name, "missing", rec.sha256 or rec.revision or "?", cur))
        elif rec.kind == "hf" and rec.revision != cur.revision:
            out.append(InputDrift(rec.name, "revision", rec.revision or "not cached",
                                  cur.revision or "not cached"))
        elif rec.kind == "hf" and rec.files_sha256 != cur.files_sha256:
            out.append(InputDrift(rec.name, "snapshot", rec.files_sha256 or "missing",
                                  cur.files_sha256 or "missing"))
        elif rec.kind == "path" and rec.sha256 != cur.sha256:
            out.append(InputDrift(rec.name, "content", rec.sha256 or "?", cur.sha256 or "?"))
    return out


def recorded_input_drift(original: Record, other: Record) -> list[InputDrift]:
    """The inputs two records read, each as it was recorded: changed, or read by one only."""
    theirs = {i.name: i for i in other.inputs}
    ours = {i.name for i in original.inputs}
    out = input_drift(original.inputs, theirs)
    out += [InputDrift(i.name, "missing", i.sha256 or i.revision or "?", "not recorded")
            for i in original.inputs if i.name not in theirs]
    out += [InputDrift(i.name, "added", "not recorded", i.sha256 or i.revision or "?")
            for i in other.inputs if i.name not in ours]
    return out


def command_failed(original: Record, replay: Record) -> bool:
    """The replay's command failed before it recorded a step (a missing module, a bad
    interpreter, a crash at start), where the original did not end the same way."""
    code = replay.record.exit_code
    return code != 0 and not replay.steps and code != original.record.exit_code


def context_changes(original: Mapping[str, Any], replay: Mapping[str, Any]) -> list[ContextChange]:
    keys = sorted(set(original) | set(replay))
    return [ContextChange(k, original.get(k), replay.get(k)) for k in keys
            if original.get(k) != replay.get(k)]


def compare_records(original: Record, replay: Record, tol: Tolerance | None = None,
                    inputs_now: Mapping[str, Input | str] | None = None) -> ReplayComparison:
    """The replay against the original: steps first (the first divergence only: everything
    after it follows from it), then the exit code, then every output. The inputs are the
    original's read again (``inputs_now``), or without it the two records' own."""
    tol = tol or Tolerance()
    drift = (input_drift(original.inputs, inputs_now) if inputs_now is not None
             else recorded_input_drift(original, replay))
    if command_failed(original, replay):
        return ReplayComparison(inputs=tuple(drift), tolerance=tol, failed=replay.record.exit_code)
    div = _steps(original.steps, replay.steps, tol)
    if original.record.exit_code != replay.record.exit_code:
        div.append(Divergence("exit code", "the command", str(original.record.exit_code),
                              str(replay.record.exit_code)))
    div += _outputs(original, replay)
    return ReplayComparison(tuple(div), tuple(drift),
                            tuple(context_changes(original.context, replay.context)),
                            min(len(original.steps), len(replay.steps)), tol)
