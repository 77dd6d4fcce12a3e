"""``apply(lock)``: make this process match a lock's ``[seeds]`` and ``[determinism]``.

**Never pretend.** A knob that cannot take effect any more (``PYTHONHASHSEED`` after start-up,
``CUBLAS_WORKSPACE_CONFIG`` after CUDA initialised, ``OMP_NUM_THREADS`` after torch loaded) is
reported: a warning, the result object, and ``[determinism].late`` in the next capture.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from envlock.runtime.common import (
    SEED_ENV,
    WORKERS_ENV,
    ReproducibilityWarning,
    cuda_initialized,
    distributed_initialized,
    late_names,
    set_env,
    set_late_names,
    torch_module,
)
from envlock.runtime.knobs import knobs_in, read_state, write_state
from envlock.runtime.seeds import check_seed, seed_all

if TYPE_CHECKING:
    from envlock.lock import Lock

# When a library reads each numerics variable, so that apply() can tell a variable that will
# take effect from one that is merely recorded: "cuda" - at CUDA/cuBLAS initialisation;
# "nccl" - when a communicator is created; "xla" - when XLA starts; "torch" (the default) - when
# torch or a library it loads (OpenMP, MKL, oneDNN) starts, i.e. at import or first use.
_ENV_READ_AT = {
    "CUBLAS_WORKSPACE_CONFIG": "cuda", "CUBLASLT_WORKSPACE_SIZE": "cuda",
    "CUDA_LAUNCH_BLOCKING": "cuda", "NVIDIA_TF32_OVERRIDE": "cuda",
    "NCCL_ALGO": "nccl", "NCCL_PROTO": "nccl", "XLA_FLAGS": "xla",
}
# Handled as seeds (PYTHONHASHSEED cannot be set, ENVLOCK_SEED comes from seed_everything).
_ENV_AS_SEEDS = ("PYTHONHASHSEED", SEED_ENV)


def _too_late(name: str) -> bool:
    stage = _ENV_READ_AT.get(name, "torch")
    torch = sys.modules.get("torch")
    if stage == "xla":
        return "torch_xla" in sys.modules or "jax" in sys.modules
    if torch is None:
        return False
    if stage == "cuda":
        return cuda_initialized(torch)
    if stage == "nccl":
        return distributed_initialized(torch)
    return True


@dataclass(frozen=True)
class Change:
    knob: str
    old: Any
    new: Any


@dataclass(frozen=True)
class NotApplied:
    knob: str
    wanted: Any
    actual: Any
    reason: str


@dataclass(frozen=True)
class ApplyResult:
    """What :func:`apply` changed, and what it could not make match the lock (with why)."""

    changed: tuple[Change, ...] = ()
    not_applied: tuple[NotApplied, ...] = ()
    late: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.not_applied

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "changed": [{"knob": c.knob, "old": c.old, "new": c.new} for c in self.changed],
            "not_applied": [{"knob": n.knob, "wanted": n.wanted, "actual": n.actual,
                             "reason": n.reason} for n in self.not_applied],
            "late": list(self.late),
        }

    def describe(self) -> str:
        lines = [f"changed {c.knob}: {c.old!r} -> {c.new!r}" for c in self.changed]
        lines += [f"NOT applied {n.knob} (wanted {n.wanted!r}, is {n.actual!r}): {n.reason}"
                  for n in self.not_applied]
        return "\n".join(lines) if lines else "nothing to change: the process already matches"


def _apply_seeds(lock: Lock, changed: list[Change], missing: list[NotApplied]) -> None:
    seeds = lock.seeds
    before = os.environ.get(SEED_ENV)
    if seeds.seed is not None:
        seed_all(check_seed(seeds.seed), workers=os.environ.get(WORKERS_ENV, "1") != "0")
        if before != str(seeds.seed):
            changed.append(Change("seeds.seed", before, seeds.seed))
        torch = sys.modules.get("torch")
        if (torch is not None and seeds.torch_initial_seed is not None
                and seeds.torch_initial_seed != seeds.seed):
            # The script seeded torch again after seed_everything; replay that too.
            torch.manual_seed(seeds.torch_initial_seed)
            changed.append(Change("seeds.torch_initial_seed", seeds.seed, seeds.torch_initial_seed))
    elif before is not None:
        os.environ.pop(SEED_ENV, None)
        os.environ.pop(WORKERS_ENV, None)
        changed.append(Change("seeds.seed", before, None))
    current_hash_seed = os.environ.get("PYTHONHASHSEED")
    if seeds.python_hash_seed != current_hash_seed:
        missing.append(NotApplied(
            "seeds.python_hash_seed", seeds.python_hash_seed, current_hash_seed,
            "fixed when the interpreter starts; relaunch with "
            + (f"PYTHONHASHSEED={seeds.python_hash_seed}" if seeds.python_hash_seed is not None
               else "PYTHONHASHSEED unset")))
    if seeds.hash_randomization != bool(sys.flags.hash_randomization):
        missing.append(NotApplied("seeds.hash_randomization", seeds.hash_randomization,
                                  bool(sys.flags.hash_randomization),
                                  "fixed when the interpreter starts (python -R / PYTHONHASHSEED)"))


def _apply_env(lock: Lock, changed: list[Change], late: set[str]) -> None:
    from envlock.probe.rules import numerics_variable

    wanted = lock.determinism.env
    for name in sorted(set(wanted) | {n for n in os.environ if numerics_variable(n)}):
        if name in _ENV_AS_SEEDS:
            continue
        old, new = os.environ.get(name), wanted.get(name)
        if old == new:
            continue
        set_env(name, new)
        changed.append(Change(f"determinism.env.{name}", old, new))
        if _too_late(name):
            late.add(name)
        else:
            late.discard(name)


def _apply_flags(lock: Lock, changed: list[Change], missing: list[NotApplied]) -> None:
    det = lock.determinism
    if not det.torch_loaded:
        return
    torch = torch_module()
    if torch is None:
        missing.append(NotApplied("determinism", "torch flags", None, "torch is not installed"))
        return
    recorded = det.model_dump(exclude={"env", "late", "torch_loaded", "process_env"})
    target = {k: v for k, v in recorded.items() if v is not None}
    before = read_state(torch, target)
    # A knob this torch lacks cannot be set; compare reports it as a warning already. (Not
    # "cannot be read": legacy TF32 getters raise in a mixed state, which the write repairs.)
    exists = {k.name for k in knobs_in(torch)}
    for key in sorted(k for k in target if k not in exists):
        missing.append(NotApplied(f"determinism.{key}", target.pop(key), None,
                                  "this torch has no such knob"))
    failures = write_state(torch, target)
    after = read_state(torch, target)
    for key in sorted(target):
        if before.get(key) != after.get(key):
            changed.append(Change(f"determinism.{key}", before.get(key), after.get(key)))
    for key, why in sorted(failures.items()):
        if key == "num_interop_threads":
            why = "torch fixes it at the first parallel operation or setting; set it at start-up"
        missing.append(NotApplied(f"determinism.{key}", target.get(key), after.get(key), why))


def apply(lock: Lock | str | os.PathLike[str]) -> ApplyResult:
    """Make this process match a lock's ``[seeds]`` and ``[determinism]``, as far as possible.

    Seeds are re-applied with :func:`seed_everything`, numerics variables are set or unset,
    torch flags are written and read back. What cannot match (``PYTHONHASHSEED``, the interop
    thread count once fixed, a variable its library already read) is returned in
    ``not_applied``, warned about, and variables set too late are recorded as ``late`` so that a
    capture taken now does not claim them as in effect.
    """
    if not hasattr(lock, "seeds"):
        from envlock.lock import load

        lock = load(lock)
    assert not isinstance(lock, (str, os.PathLike))
    changed: list[Change] = []
    missing: list[NotApplied] = []
    late = late_names()
    _apply_seeds(lock, changed, missing)
    _apply_env(lock, changed, late)
    _apply_flags(lock, changed, missing)
    new_late = sorted(late - late_names())
    for name in new_late:
        missing.append(NotApplied(f"determinism.env.{name}", lock.determinism.env.get(name),
                                  os.environ.get(name),
                                  "set for child processes, but already read in this one"))
    set_late_names(late)
    result = ApplyResult(tuple(changed), tuple(missing), tuple(sorted(late)))
    if not result.ok:
        warnings.warn("envlock.apply could not make this process match the lock: "
                      + "; ".join(f"{n.knob} ({n.reason})" for n in result.not_applied),
                      ReproducibilityWarning, stacklevel=2)
    return result
