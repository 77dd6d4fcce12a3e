"""Seeds: ``seed_everything``, per-rank DataLoader worker seeds, a dedicated data-order generator.

The seed travels as ``ENVLOCK_SEED`` in the environment: the probe reads it from there (it
trusts live state, not a record kept here), and child processes inherit it.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import warnings
from typing import Any

from envlock.errors import UsageError
from envlock.runtime.common import (
    MAX_SEED,
    SEED_ENV,
    WORKERS_ENV,
    ReproducibilityWarning,
    distributed_initialized,
    numpy_module,
    torch_module,
)

_hash_seed_warned = False


def derive_seed(seed: int, *keys: object) -> int:
    """A 63-bit seed derived from ``seed`` and ``keys`` (rank, worker, purpose).

    Hash-based rather than ``seed + rank``: additive offsets make rank 1's stream start where a
    neighbouring seed's does, and a run with seed 1235 would share data with rank 1 of seed 1234.
    """
    text = ":".join(str(part) for part in (seed, *keys))
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") >> 1


def check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UsageError(f"a seed must be an int, not {type(seed).__name__}")
    if not 0 <= seed <= MAX_SEED:
        raise UsageError(f"a seed must be between 0 and {MAX_SEED} (numpy's limit), not {seed}")
    return seed


def env_seed() -> int | None:
    raw = os.environ.get(SEED_ENV)
    if raw is None:
        return None
    try:
        return check_seed(int(raw))
    except (ValueError, UsageError):
        raise UsageError(f"{SEED_ENV}={raw!r} is not a seed between 0 and {MAX_SEED}") from None


def seed_all(seed: int, workers: bool) -> None:
    random.seed(seed)
    np = numpy_module()
    if np is not None:
        np.random.seed(seed)
    torch = torch_module()
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
        seed = env_seed()
        if seed is None:
            raise UsageError(f"seed_everything() needs a seed, or {SEED_ENV} in the environment")
    seed = check_seed(seed)
    seed_all(seed, workers)
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
    if torch is not None and distributed_initialized(torch):
        return int(torch.distributed.get_rank())
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
    torch = torch_module(required=True)
    seed = derive_seed(int(torch.initial_seed()), "rank", _rank(), "worker", worker_id)
    torch.manual_seed(seed)
    random.seed(seed)
    np = numpy_module()
    if np is not None:
        np.random.seed(seed % (MAX_SEED + 1))


def dataloader_generator(seed: int | None = None) -> Any:
    """A ``torch.Generator`` for ``DataLoader(generator=...)``, seeded from the envlock seed.

    A dedicated generator makes the data order independent of how many random numbers model
    initialisation consumed from the global one, so changing the model does not reshuffle data.
    """
    torch = torch_module(required=True)
    if seed is None:
        seed = env_seed()
        if seed is None:
            raise UsageError(f"call seed_everything() first, or pass a seed (no {SEED_ENV} set)")
    g = torch.Generator()
    g.manual_seed(derive_seed(check_seed(seed), "dataloader"))
    return g
