"""The in-process API for training code: seeds, determinism flags, ``apply(lock)``, the canary.

Only the training process knows its live seeds and flags, so this is where they are set and
where ``envlock.capture()`` reads them back (through the probe, which reads the live values
rather than trusting anything recorded here). Three rules shape the module:

* **Never pretend.** A knob that cannot take effect any more (``PYTHONHASHSEED`` after start-up,
  ``CUBLAS_WORKSPACE_CONFIG`` after CUDA initialised, ``OMP_NUM_THREADS`` after torch loaded)
  is reported: a warning, the result object, and ``[determinism].late`` in the next capture.
* **Read back what was written.** Every flag write is verified by reading the live value; torch
  silently ignores some writes (an invalid precision string only warns) and couples others.
* **TF32 is two APIs in torch >= 2.9.** The legacy ``allow_tf32`` / ``float32_matmul_precision``
  flags and the ``fp32_precision`` tree are coupled, and reading a legacy getter after the two
  disagree *raises* (``Context::allowTF32CuBLAS``/``allowTF32CuDNN``). Writes therefore go
  legacy first (each legacy setter also rewrites the matching new-API leaf), then the new tree
  from the root (generic) down to the leaves, so the state ends consistent and readable.

torch and numpy are imported lazily: envlock itself does not need either.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from envlock.errors import TorchMissing, UsageError
from envlock.probe.rules import quiet as _quiet

if TYPE_CHECKING:
    from envlock.model import Canary, Lock

SEED_ENV = "ENVLOCK_SEED"
WORKERS_ENV = "ENVLOCK_SEED_WORKERS"
LATE_ENV = "_ENVLOCK_LATE"  # read by probe.collect_determinism; see there for the format
CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_DETERMINISTIC = ":4096:8"
_CUBLAS_OK = (":4096:8", ":16:8")  # the two settings cuBLAS documents as deterministic
MAX_SEED = 2**32 - 1  # numpy's legacy seed() rejects anything larger

Mode = Literal["strict", "warn"]


class ReproducibilityWarning(UserWarning):
    """A knob envlock could not set (or not in time); the run may not be reproducible."""


# -- small helpers -----------------------------------------------------------------------------


def _torch(required: bool = False) -> Any:
    """torch if it is installed (already imported wins); None, or TorchMissing when required."""
    mod = sys.modules.get("torch")
    if mod is not None:
        return mod
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        if required:
            raise TorchMissing("this needs torch, which is not installed in this environment")
        return None
    import torch

    return torch


def _numpy() -> Any:
    mod = sys.modules.get("numpy")
    if mod is not None:
        return mod
    import importlib.util

    if importlib.util.find_spec("numpy") is None:
        return None
    import numpy

    return numpy


def derive_seed(seed: int, *keys: object) -> int:
    """A 63-bit seed derived from ``seed`` and ``keys`` (rank, worker, purpose).

    Hash-based rather than ``seed + rank``: additive offsets make rank 1's stream start where a
    neighbouring seed's does, and a run with seed 1235 would share data with rank 1 of seed 1234.
    """
    text = ":".join(str(part) for part in (seed, *keys))
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") >> 1


def _late_names() -> set[str]:
    pid, _, names = os.environ.get(LATE_ENV, "").partition(":")
    if pid != str(os.getpid()):
        return set()
    return {n for n in names.split(",") if n}


def _set_late_names(names: Iterable[str]) -> None:
    names = sorted(set(names))
    if names:
        os.environ[LATE_ENV] = f"{os.getpid()}:{','.join(names)}"
    else:
        os.environ.pop(LATE_ENV, None)


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


# -- seeds -------------------------------------------------------------------------------------

_hash_seed_warned = False


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UsageError(f"a seed must be an int, not {type(seed).__name__}")
    if not 0 <= seed <= MAX_SEED:
        raise UsageError(f"a seed must be between 0 and {MAX_SEED} (numpy's limit), not {seed}")
    return seed


def _env_seed() -> int | None:
    raw = os.environ.get(SEED_ENV)
    if raw is None:
        return None
    try:
        return _check_seed(int(raw))
    except (ValueError, UsageError):
        raise UsageError(f"{SEED_ENV}={raw!r} is not a seed between 0 and {MAX_SEED}") from None


def _seed_all(seed: int, workers: bool) -> None:
    random.seed(seed)
    np = _numpy()
    if np is not None:
        np.random.seed(seed)
    torch = _torch()
    if torch is not None:
        # Seeds the CPU generator and every CUDA device; CUDA is seeded lazily, so this does not
        # initialise CUDA (which would make a later CUBLAS_WORKSPACE_CONFIG too late).
        torch.manual_seed(seed)
    # The probe reads the seed from here, and children (spawned DataLoader workers, subprocesses,
    # torchrun ranks calling seed_everything()) inherit it.
    os.environ[SEED_ENV] = str(seed)
    os.environ[WORKERS_ENV] = "1" if workers else "0"


def seed_everything(seed: int | None = None, *, workers: bool = True) -> int:
    """Seed ``random``, numpy's global state, torch (CPU and every CUDA device); return the seed.

    The seed is exported as ``ENVLOCK_SEED`` so that ``envlock.capture()`` records it and child
    processes can call ``seed_everything()`` without an argument to get the same one. With
    ``workers`` (the default) :func:`worker_init_fn` gives every DataLoader worker of every rank
    its own seed derived from this one; with ``workers=False`` it leaves torch's defaults alone.

    ``PYTHONHASHSEED`` cannot be changed once the interpreter runs (str and bytes hashes, hence
    set iteration order, are fixed at start-up), so a mismatch is warned about once per process.
    """
    global _hash_seed_warned
    if seed is None:
        seed = _env_seed()
        if seed is None:
            raise UsageError(f"seed_everything() needs a seed, or {SEED_ENV} in the environment")
    seed = _check_seed(seed)
    _seed_all(seed, workers)
    current = os.environ.get("PYTHONHASHSEED")
    if current != str(seed) and not _hash_seed_warned:
        _hash_seed_warned = True
        state = f"PYTHONHASHSEED is {current}" if current else "PYTHONHASHSEED is not set"
        warnings.warn(
            f"{state}, not {seed}: str/bytes hashing (and with it set iteration order) is fixed "
            f"when Python starts and cannot be changed now; launch with PYTHONHASHSEED={seed} "
            "to pin it",
            ReproducibilityWarning,
            stacklevel=2,
        )
    return seed


def _rank() -> int:
    torch = sys.modules.get("torch")
    if torch is not None:
        dist = getattr(torch, "distributed", None)
        if dist is not None and _quiet(lambda: dist.is_available() and dist.is_initialized()):
            return int(dist.get_rank())
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def worker_init_fn(worker_id: int) -> None:
    """``DataLoader(worker_init_fn=envlock.worker_init_fn)``: distinct, reproducible worker seeds.

    torch already gives worker ``i`` the seed ``base_seed + i`` (``base_seed`` drawn from the
    loader's generator), but every rank draws the same ``base_seed`` when all ranks are seeded
    alike, so rank 0's worker 0 and rank 1's worker 0 would produce identical augmentations.
    Mixing the rank in keeps them apart; ``random`` and numpy's global state follow.
    """
    if os.environ.get(WORKERS_ENV, "1") == "0":
        return
    torch = _torch(required=True)
    seed = derive_seed(int(torch.initial_seed()), "rank", _rank(), "worker", worker_id)
    torch.manual_seed(seed)
    random.seed(seed)
    np = _numpy()
    if np is not None:
        np.random.seed(seed % (MAX_SEED + 1))


def dataloader_generator(seed: int | None = None) -> Any:
    """A ``torch.Generator`` for ``DataLoader(generator=...)``, seeded from the envlock seed.

    A dedicated generator makes the data order independent of how many random numbers model
    initialisation consumed from the global one, so changing the model does not reshuffle data.
    """
    torch = _torch(required=True)
    if seed is None:
        seed = _env_seed()
        if seed is None:
            raise UsageError(f"call seed_everything() first, or pass a seed (no {SEED_ENV} set)")
    g = torch.Generator()
    g.manual_seed(derive_seed(_check_seed(seed), "dataloader"))
    return g


# -- determinism flags -------------------------------------------------------------------------

# The four (backend, op) nodes of the fp32_precision tree below the root; the probe records
# only some, but deterministic() sets and restores them all.
# fp32_precision nodes below the root and the per-backend "all" nodes, by their lock names.
_FP32_NODES = ("cuda_fp32_precision", "mkldnn_matmul_fp32_precision", "mkldnn_conv_fp32_precision",
               "mkldnn_rnn_fp32_precision")


def _fp32_get(torch: Any, backend: str, op: str) -> Callable[[], Any]:
    return lambda: torch._C._get_fp32_precision_getter(backend, op)


def _fp32_set(torch: Any, backend: str, op: str) -> Callable[[Any], None]:
    return lambda v: torch._C._set_fp32_precision_setter(backend, op, v)


def _knobs(torch: Any) -> list[tuple[str, Callable[[], Any], Callable[[Any], None]]]:
    """(key, read, write) in the order writes must happen; keys are the probe's where it has one.

    Order: legacy TF32 flags first, because each legacy setter also rewrites new-API leaves
    (``set_float32_matmul_precision`` sets cuda.matmul *and* mkldnn.matmul); then the new tree
    from the root down, because a node that reads "none" resolves to its parent. Note that
    ``torch.backends.mkldnn.fp32_precision``'s setter writes the *generic* root in torch
    2.9-2.13, so the mkldnn node is written through the C setter directly.
    """
    b = torch.backends

    def du() -> Any:
        import torch.utils.deterministic  # a lazily loaded submodule

        return torch.utils.deterministic

    knobs: list[tuple[str, Callable[[], Any], Callable[[Any], None]]] = [
        ("fill_uninitialized_memory", lambda: du().fill_uninitialized_memory,
         lambda v: setattr(du(), "fill_uninitialized_memory", v)),
        ("cudnn_enabled", lambda: b.cudnn.enabled, lambda v: setattr(b.cudnn, "enabled", v)),
        ("mkldnn_enabled", lambda: b.mkldnn.enabled, lambda v: setattr(b.mkldnn, "enabled", v)),
        ("cudnn_deterministic", lambda: b.cudnn.deterministic,
         lambda v: setattr(b.cudnn, "deterministic", v)),
        ("cudnn_benchmark", lambda: b.cudnn.benchmark, lambda v: setattr(b.cudnn, "benchmark", v)),
        ("cuda_matmul_allow_tf32", lambda: b.cuda.matmul.allow_tf32,
         lambda v: setattr(b.cuda.matmul, "allow_tf32", v)),
        ("float32_matmul_precision", torch.get_float32_matmul_precision,
         torch.set_float32_matmul_precision),
        ("cudnn_allow_tf32", lambda: b.cudnn.allow_tf32, lambda v: setattr(b.cudnn, "allow_tf32", v)),
    ]
    if hasattr(torch._C, "_get_fp32_precision_getter"):
        knobs += [
            ("fp32_precision", _fp32_get(torch, "generic", "all"), _fp32_set(torch, "generic", "all")),
            ("cuda_fp32_precision", _fp32_get(torch, "cuda", "all"), _fp32_set(torch, "cuda", "all")),
            ("mkldnn_fp32_precision", _fp32_get(torch, "mkldnn", "all"),
             _fp32_set(torch, "mkldnn", "all")),
            ("cuda_matmul_fp32_precision", _fp32_get(torch, "cuda", "matmul"),
             _fp32_set(torch, "cuda", "matmul")),
            ("cudnn_conv_fp32_precision", _fp32_get(torch, "cuda", "conv"),
             _fp32_set(torch, "cuda", "conv")),
            ("cudnn_rnn_fp32_precision", _fp32_get(torch, "cuda", "rnn"),
             _fp32_set(torch, "cuda", "rnn")),
            ("mkldnn_matmul_fp32_precision", _fp32_get(torch, "mkldnn", "matmul"),
             _fp32_set(torch, "mkldnn", "matmul")),
            ("mkldnn_conv_fp32_precision", _fp32_get(torch, "mkldnn", "conv"), _fp32_set(torch, "mkldnn", "conv")),
            ("mkldnn_rnn_fp32_precision", _fp32_get(torch, "mkldnn", "rnn"), _fp32_set(torch, "mkldnn", "rnn")),
        ]
    knobs += [
        ("cuda_matmul_allow_fp16_reduced_precision_reduction",
         lambda: b.cuda.matmul.allow_fp16_reduced_precision_reduction,
         lambda v: setattr(b.cuda.matmul, "allow_fp16_reduced_precision_reduction", v)),
        ("cuda_matmul_allow_bf16_reduced_precision_reduction",
         lambda: b.cuda.matmul.allow_bf16_reduced_precision_reduction,
         lambda v: setattr(b.cuda.matmul, "allow_bf16_reduced_precision_reduction", v)),
        ("sdpa_flash", b.cuda.flash_sdp_enabled, b.cuda.enable_flash_sdp),
        ("sdpa_mem_efficient", b.cuda.mem_efficient_sdp_enabled, b.cuda.enable_mem_efficient_sdp),
        ("sdpa_math", b.cuda.math_sdp_enabled, b.cuda.enable_math_sdp),
        ("sdpa_cudnn", lambda: b.cuda.cudnn_sdp_enabled(), lambda v: b.cuda.enable_cudnn_sdp(v)),
        ("num_threads", torch.get_num_threads, torch.set_num_threads),
        ("num_interop_threads", torch.get_num_interop_threads, torch.set_num_interop_threads),
    ]
    return knobs


# The flags deterministic() owns, in addition to the algorithms switch; the rest of _knobs()
# (threads, SDPA backends, reduced-precision reductions) only apply(lock) touches.
_OWNED = {
    "fill_uninitialized_memory", "cudnn_deterministic", "cudnn_benchmark", "cuda_matmul_allow_tf32",
    "float32_matmul_precision", "cudnn_allow_tf32", "fp32_precision", "mkldnn_fp32_precision",
    "cuda_matmul_fp32_precision", "cudnn_conv_fp32_precision", "cudnn_rnn_fp32_precision",
} | set(_FP32_NODES)
_ALGORITHMS = ("deterministic_algorithms", "deterministic_warn_only")


def _read_state(torch: Any, keys: Iterable[str] | None = None) -> dict[str, Any]:
    """The live value of every knob this torch has (or of ``keys``); unreadable ones omitted."""
    wanted = None if keys is None else set(keys)
    state: dict[str, Any] = {}
    if wanted is None or wanted & set(_ALGORITHMS):
        algo = _quiet(torch.are_deterministic_algorithms_enabled)
        warn_only = _quiet(torch.is_deterministic_algorithms_warn_only_enabled)
        if algo is not None:
            state["deterministic_algorithms"] = bool(algo)
        if warn_only is not None:
            state["deterministic_warn_only"] = bool(warn_only)
    for key, read, _ in _knobs(torch):
        if wanted is not None and key not in wanted:
            continue
        value = _quiet(read)
        if isinstance(value, (bool, int, str)):
            state[key] = value
    return state


def _write_state(torch: Any, target: Mapping[str, Any]) -> dict[str, str]:
    """Bring the live knobs to ``target``; return {key: why} for those that did not take.

    Each knob is compared with its live value right before the write, since an earlier write
    may already have moved it (the legacy/new TF32 coupling). The sequence is repeated until a
    pass writes nothing: the probe records resolved values, not the raw tree, so a leaf it does
    not record (mkldnn.matmul) can leave a legacy getter unreadable until the legacy setter runs
    once more after the tree is in place. Torch's own warnings about the legacy TF32 API are
    silenced: the order is deliberate, and every value is read back at the end.
    """
    failures: dict[str, str] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            wrote = False
            if "deterministic_algorithms" in target:
                algo = bool(target["deterministic_algorithms"])
                warn_only = bool(target.get("deterministic_warn_only", False))
                now = (_quiet(torch.are_deterministic_algorithms_enabled),
                       _quiet(torch.is_deterministic_algorithms_warn_only_enabled))
                if now != (algo, warn_only):
                    torch.use_deterministic_algorithms(algo, warn_only=warn_only)
                    wrote = True
            for key, read, write in _knobs(torch):
                if key not in target or target[key] is None or key in failures:
                    continue
                if _quiet(read) == target[key]:
                    continue
                try:
                    write(target[key])
                    wrote = True
                except Exception as exc:
                    text = str(exc).splitlines()[0] if str(exc) else ""
                    failures[key] = f"{type(exc).__name__}: {text}"
            if not wrote:
                break
    live = _read_state(torch, target)
    for key, value in target.items():
        if value is not None and key not in failures and live.get(key) != value:
            failures[key] = f"torch kept {live.get(key)!r} after the write"
    return failures


def _cuda_initialized(torch: Any) -> bool:
    return bool(_quiet(lambda: torch.cuda.is_initialized()))


def _strict_target(torch: Any, mode: Mode) -> dict[str, Any]:
    # Keyed on which knobs *exist*, not which read back: a legacy getter raises while the two
    # TF32 APIs disagree, and that is exactly the state whose legacy flag must be written.
    exists = {key for key, _, _ in _knobs(torch)}
    live = _read_state(torch)
    target: dict[str, Any] = {
        "deterministic_algorithms": True,
        "deterministic_warn_only": mode == "warn",
        "fill_uninitialized_memory": True,
        "cudnn_deterministic": True,
        "cudnn_benchmark": False,
        "cuda_matmul_allow_tf32": False,
        "float32_matmul_precision": "highest",
        "cudnn_allow_tf32": False,
    }
    # The new API, where this torch has it: IEEE fp32 everywhere. "ieee" rather than "none",
    # because "none" defers to the parent node, which a library may have set to tf32 or bf16
    # (oneDNN uses bf16 for fp32 matmuls on AMX CPUs when allowed).
    for key in ("fp32_precision", "mkldnn_fp32_precision", "cuda_matmul_fp32_precision",
                "cudnn_conv_fp32_precision", "cudnn_rnn_fp32_precision",
                *_FP32_NODES):
        if key in exists:
            target[key] = "ieee"
    if "fill_uninitialized_memory" not in live:  # torch < 2.1
        del target["fill_uninitialized_memory"]
    return target


class Deterministic:
    """What :func:`deterministic` did; as a context manager, it restores the previous state.

    ``changed`` lists the knobs whose value changed, ``late`` those set too late to be trusted
    (they are also recorded in the lock's ``[determinism].late``), ``not_applied`` the ones torch
    refused, with the reason.
    """

    def __init__(self, mode: Mode, previous: dict[str, Any], previous_env: str | None,
                 previous_late: set[str], changed: tuple[str, ...], late: tuple[str, ...],
                 not_applied: dict[str, str]) -> None:
        self.mode = mode
        self.changed = changed
        self.late = late
        self.not_applied = dict(not_applied)
        self._previous = previous
        self._previous_env = previous_env
        self._previous_late = previous_late
        self._restored = False

    def restore(self) -> None:
        """Put back every knob deterministic() owns, ``CUBLAS_WORKSPACE_CONFIG`` and ``late``."""
        if self._restored:
            return
        self._restored = True
        torch = _torch(required=True)
        failures = _write_state(torch, self._previous)
        _set_env(CUBLAS_ENV, self._previous_env)
        _set_late_names(self._previous_late)
        if failures:
            warnings.warn(f"envlock could not restore {', '.join(sorted(failures))}",
                          ReproducibilityWarning, stacklevel=2)

    def __enter__(self) -> Deterministic:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.restore()

    def __repr__(self) -> str:
        return (f"Deterministic(mode={self.mode!r}, changed={list(self.changed)}, "
                f"late={list(self.late)}, not_applied={self.not_applied})")


def deterministic(mode: Mode = "strict") -> Deterministic:
    """Make torch deterministic now; use the result as a context manager to undo it on exit.

    ``"strict"`` makes a nondeterministic op raise; ``"warn"`` only warns (torch's
    ``warn_only``). Either way: cuDNN deterministic and not benchmarking, TF32 and reduced
    fp32 precision off through both the legacy flags and the ``fp32_precision`` API (whichever
    exist), and ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, which cuBLAS reads when it creates a
    handle: set after CUDA initialised it may be too late, which is warned about and recorded.
    """
    if mode not in ("strict", "warn"):
        raise UsageError(f"mode must be 'strict' or 'warn', not {mode!r}")
    torch = _torch(required=True)
    target = _strict_target(torch, mode)
    previous = _read_state(torch, [*_OWNED, *_ALGORITHMS])
    previous_env = os.environ.get(CUBLAS_ENV)
    previous_late = _late_names()
    failures = _write_state(torch, target)
    after = _read_state(torch, previous)
    changed = [k for k in sorted(previous) if previous.get(k) != after.get(k)]
    late: list[str] = []
    if previous_env not in _CUBLAS_OK:
        os.environ[CUBLAS_ENV] = CUBLAS_DETERMINISTIC
        changed.append(CUBLAS_ENV)
        if _cuda_initialized(torch):
            late.append(CUBLAS_ENV)
            _set_late_names(previous_late | {CUBLAS_ENV})
    if late or failures:
        parts = []
        if late:
            parts.append("CUBLAS_WORKSPACE_CONFIG was set after CUDA initialised, so cuBLAS "
                         "handles that already exist keep a nondeterministic workspace; call "
                         "envlock.deterministic() before the first CUDA operation")
        if failures:
            parts.append("torch did not accept " + ", ".join(f"{k} ({v})" for k, v in sorted(failures.items())))
        warnings.warn("; ".join(parts), ReproducibilityWarning, stacklevel=2)
    return Deterministic(mode, previous, previous_env, previous_late, tuple(changed),
                         tuple(late), failures)


# -- apply(lock) -------------------------------------------------------------------------------

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
        return _cuda_initialized(torch)
    if stage == "nccl":
        dist = getattr(torch, "distributed", None)
        return bool(dist is not None and _quiet(lambda: dist.is_available() and dist.is_initialized()))
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
        _seed_all(_check_seed(seeds.seed), workers=os.environ.get(WORKERS_ENV, "1") != "0")
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
    from envlock.probe.rules import NUMERICS_ENV

    wanted = lock.determinism.env
    for name in sorted(set(wanted) | {n for n in NUMERICS_ENV if n in os.environ}):
        if name in _ENV_AS_SEEDS:
            continue
        old, new = os.environ.get(name), wanted.get(name)
        if old == new:
            continue
        _set_env(name, new)
        changed.append(Change(f"determinism.env.{name}", old, new))
        if _too_late(name):
            late.add(name)
        else:
            late.discard(name)


def _apply_flags(lock: Lock, changed: list[Change], missing: list[NotApplied]) -> None:
    det = lock.determinism
    if not det.torch_loaded:
        return
    torch = _torch()
    if torch is None:
        missing.append(NotApplied("determinism", "torch flags", None, "torch is not installed"))
        return
    recorded = det.model_dump(exclude={"env", "late", "torch_loaded", "process_env"})
    target = {k: v for k, v in recorded.items() if v is not None}
    before = _read_state(torch, target)
    # A knob this torch lacks cannot be set; compare reports it as a warning already. (Not
    # "cannot be read": legacy TF32 getters raise in a mixed state, which the write repairs.)
    exists = {key for key, _, _ in _knobs(torch)} | set(_ALGORITHMS)
    for key in sorted(k for k in target if k not in exists):
        missing.append(NotApplied(f"determinism.{key}", target.pop(key), None,
                                  "this torch has no such knob"))
    failures = _write_state(torch, target)
    after = _read_state(torch, target)
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
        from envlock.lockfile import load

        lock = load(lock)
    assert not isinstance(lock, (str, os.PathLike))
    changed: list[Change] = []
    missing: list[NotApplied] = []
    late = _late_names()
    _apply_seeds(lock, changed, missing)
    _apply_env(lock, changed, late)
    _apply_flags(lock, changed, missing)
    new_late = sorted(late - _late_names())
    for name in new_late:
        missing.append(NotApplied(f"determinism.env.{name}", lock.determinism.env.get(name),
                                  os.environ.get(name),
                                  "set for child processes, but already read in this one"))
    _set_late_names(late)
    result = ApplyResult(tuple(changed), tuple(missing), tuple(sorted(late)))
    if not result.ok:
        warnings.warn("envlock.apply could not make this process match the lock: "
                      + "; ".join(f"{n.knob} ({n.reason})" for n in result.not_applied),
                      ReproducibilityWarning, stacklevel=2)
    return result


# -- canary ------------------------------------------------------------------------------------


def canary_module() -> Any:
    """kernels.py, loaded by path exactly as the probe loads it."""
    from envlock.probe.collect import load_kernels

    try:
        return load_kernels()
    except RuntimeError as exc:
        raise UsageError(str(exc)) from None


def canary(devices: list[str] | None = None) -> Canary:
    """Run the numeric canary in this process, under its current flags; a ``[canary]`` table."""
    from envlock.model import Canary
    from envlock.probe.scrub import scrub_document, secret_values

    torch = _torch(required=True)
    # The settings carry numerics variables verbatim (any may hold a URL): the same
    # scrub as every other string that enters a lock.
    return Canary.model_validate(scrub_document(canary_module().run(torch, devices), secret_values()))


__all__ = [
    "ApplyResult",
    "Change",
    "Deterministic",
    "NotApplied",
    "ReproducibilityWarning",
    "apply",
    "canary",
    "dataloader_generator",
    "derive_seed",
    "deterministic",
    "seed_everything",
    "worker_init_fn",
]
