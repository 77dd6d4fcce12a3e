"""envlock: make deep-learning experiments replayable.

The package import is kept light (no pydantic, docker or torch) so that ``envlock --help`` and
the probe stay instant; the public API is resolved lazily on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Lock",
    "__version__",
    "apply",
    "canary",
    "capture",
    "compare",
    "dataloader_generator",
    "deterministic",
    "load",
    "seed_everything",
    "verify",
    "worker_init_fn",
]

_LAZY = {
    "Lock": ("envlock.model", "Lock"),
    "capture": ("envlock.capturing", "capture"),
    "verify": ("envlock.capturing", "verify"),
    "load": ("envlock.lockfile", "load"),
    "compare": ("envlock.drift", "compare"),
    "seed_everything": ("envlock.runtime", "seed_everything"),
    "deterministic": ("envlock.runtime", "deterministic"),
    "apply": ("envlock.runtime", "apply"),
    "worker_init_fn": ("envlock.runtime", "worker_init_fn"),
    "dataloader_generator": ("envlock.runtime", "dataloader_generator"),
    "canary": ("envlock.runtime", "canary"),
}

if TYPE_CHECKING:
    from envlock.capturing import capture, verify
    from envlock.drift import compare
    from envlock.lockfile import load
    from envlock.model import Lock
    from envlock.runtime import (
        apply,
        canary,
        dataloader_generator,
        deterministic,
        seed_everything,
        worker_init_fn,
    )


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'envlock' has no attribute {name!r}")
