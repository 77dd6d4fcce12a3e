"""What every part of the runtime shares: lazy torch/numpy, the variables it exports, the warning.

torch and numpy are found lazily (an already imported module wins), because envlock itself
needs neither and importing torch costs seconds. The ``late`` marker is an environment variable
so that the stdlib-only probe can read it without importing anything of envlock.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

from envlock.errors import TorchMissing
from envlock.probe.rules import quiet

SEED_ENV = "ENVLOCK_SEED"
WORKERS_ENV = "ENVLOCK_SEED_WORKERS"
LATE_ENV = "_ENVLOCK_LATE"  # read by probe.torchstack.collect_determinism; see there for the format
CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_DETERMINISTIC = ":4096:8"
CUBLAS_OK = (":4096:8", ":16:8")  # the two settings cuBLAS documents as deterministic
MAX_SEED = 2**32 - 1  # numpy's legacy seed() rejects anything larger


class ReproducibilityWarning(UserWarning):
    """A knob envlock could not set (or not in time); the run may not be reproducible."""


def _installed(name: str) -> Any:
    """The module if it is installed (already imported wins), else None; nothing else imports."""
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    import importlib
    import importlib.util

    if importlib.util.find_spec(name) is None:
        return None
    return importlib.import_module(name)


def torch_module(required: bool = False) -> Any:
    """torch if it is installed; None, or TorchMissing when required."""
    torch = _installed("torch")
    if torch is None and required:
        raise TorchMissing("this needs torch, which is not installed in this environment")
    return torch


def numpy_module() -> Any:
    """numpy if it is installed, else None: seeding it is optional."""
    return _installed("numpy")


def cuda_initialized(torch: Any) -> bool:
    return bool(quiet(lambda: torch.cuda.is_initialized()))


def distributed_initialized(torch: Any) -> bool:
    """Whether a process group exists; a torch built without distributed has none."""
    dist = getattr(torch, "distributed", None)
    return bool(dist is not None and quiet(lambda: dist.is_available() and dist.is_initialized()))


def rank_and_world() -> tuple[int, int]:
    """(rank, world size): ``torch.distributed``'s when a process group exists, else the
    launcher's variables (``RANK``, ``WORLD_SIZE``), else a single process."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # a half-torn-down process group: fall back to the launcher's variables
        pass
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1


def late_names() -> set[str]:
    """The knobs this process set too late; the pid tag keeps children from inheriting them."""
    pid, _, names = os.environ.get(LATE_ENV, "").partition(":")
    if pid != str(os.getpid()):
        return set()
    return {n for n in names.split(",") if n}


def set_late_names(names: Iterable[str]) -> None:
    names = sorted(set(names))
    if names:
        os.environ[LATE_ENV] = f"{os.getpid()}:{','.join(names)}"
    else:
        os.environ.pop(LATE_ENV, None)


def set_env(name: str, value: str | None) -> None:
    """Set a variable, or remove it for None (the state "unset" a lock can record)."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
