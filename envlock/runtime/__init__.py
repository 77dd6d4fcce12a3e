"""The in-process API for training code: seeds, determinism flags, ``apply(lock)``, the canary.

Only the training process knows its live seeds and flags, so this is where they are set and
where ``envlock.capture()`` reads them back (through the probe, which reads the live values
rather than trusting anything recorded here). Three rules shape the package:

* **Never pretend.** A knob that cannot take effect any more is reported, not recorded as in
  effect (``replay``, ``determinism``).
* **Read back what was written.** Every flag write is verified by reading the live value
  (``knobs``).
* **TF32 is two APIs in torch >= 2.9**, coupled; the knob table's order keeps them consistent
  (``knobs``).

One module per concern, each importing only the siblings before it, never this facade (which
resolves each name on first use):
``common`` (lazy torch/numpy, the exported variables, the warning) <- ``seeds``, ``knobs`` <-
``determinism``, ``replay`` (``apply``); ``numeric`` runs the canary; ``compilecache`` saves and
loads torch.compile's artifacts; ``recorder`` writes what ``envlock.record()`` is given to the
run's replay journal. torch and numpy are imported lazily: envlock itself does not need either.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envlock.runtime.common import CUBLAS_DETERMINISTIC as CUBLAS_DETERMINISTIC
    from envlock.runtime.common import CUBLAS_ENV as CUBLAS_ENV
    from envlock.runtime.common import LATE_ENV as LATE_ENV
    from envlock.runtime.common import MAX_SEED as MAX_SEED
    from envlock.runtime.common import SEED_ENV as SEED_ENV
    from envlock.runtime.common import WORKERS_ENV as WORKERS_ENV
    from envlock.runtime.common import ReproducibilityWarning
    from envlock.runtime.compilecache import load_compile_cache, save_compile_cache
    from envlock.runtime.determinism import Deterministic, deterministic
    from envlock.runtime.determinism import Mode as Mode
    from envlock.runtime.numeric import canary
    from envlock.runtime.numeric import canary_module as canary_module
    from envlock.runtime.recorder import RECORD_ENV as RECORD_ENV
    from envlock.runtime.recorder import record
    from envlock.runtime.replay import ApplyResult, Change, NotApplied, apply
    from envlock.runtime.seeds import (
        dataloader_generator,
        derive_seed,
        seed_everything,
        worker_init_fn,
    )

# Each name resolved from its module on first use: ``envlock run`` reads one constant of
# ``common`` (``WORKERS_ENV``), and importing a submodule runs this file first; the recorder, the
# replay of knobs and the canary are the training process's, not a command's.
_WHERE = {
    "CUBLAS_DETERMINISTIC": "common",
    "CUBLAS_ENV": "common",
    "LATE_ENV": "common",
    "MAX_SEED": "common",
    "SEED_ENV": "common",
    "WORKERS_ENV": "common",
    "ReproducibilityWarning": "common",
    "load_compile_cache": "compilecache",
    "save_compile_cache": "compilecache",
    "Deterministic": "determinism",
    "deterministic": "determinism",
    "Mode": "determinism",
    "canary": "numeric",
    "canary_module": "numeric",
    "RECORD_ENV": "recorder",
    "record": "recorder",
    "ApplyResult": "replay",
    "Change": "replay",
    "NotApplied": "replay",
    "apply": "replay",
    "dataloader_generator": "seeds",
    "derive_seed": "seeds",
    "seed_everything": "seeds",
    "worker_init_fn": "seeds",
}
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
    "load_compile_cache",
    "record",
    "save_compile_cache",
    "seed_everything",
    "worker_init_fn",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
