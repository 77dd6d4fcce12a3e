"""envlock: make deep-learning experiments replayable.

The package import is kept light (no pydantic, docker or torch): a training script that only
seeds pays for nothing else, and the command line imports what each command uses. The public
API and the public submodules are resolved lazily on first use (PEP 562), and ``dir(envlock)``
lists them for tab completion.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from envlock._version import __version__

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
    "load_compile_cache",
    "record",
    "save_compile_cache",
    "seed_everything",
    "verify",
    "worker_init_fn",
]

_LAZY = {
    "Lock": ("envlock.lock", "Lock"),
    "capture": ("envlock.probing.capture", "capture"),
    "verify": ("envlock.check.local", "verify"),
    "load": ("envlock.lock", "load"),
    "compare": ("envlock.drift.compare", "compare"),
    "seed_everything": ("envlock.runtime", "seed_everything"),
    "deterministic": ("envlock.runtime", "deterministic"),
    "apply": ("envlock.runtime", "apply"),
    "worker_init_fn": ("envlock.runtime", "worker_init_fn"),
    "dataloader_generator": ("envlock.runtime", "dataloader_generator"),
    "canary": ("envlock.runtime", "canary"),
    "record": ("envlock.runtime", "record"),
    "save_compile_cache": ("envlock.runtime", "save_compile_cache"),
    "load_compile_cache": ("envlock.runtime", "load_compile_cache"),
}

# Submodules users reach as ``envlock.X`` after a plain ``import envlock`` (the README's
# ``envlock.distributed.check()``); each is imported on first attribute access.
_SUBMODULES = (
    "distributed",
    "errors",
    "lock",
    "restore",
    "runtime",
)

if TYPE_CHECKING:
    from envlock import distributed as distributed
    from envlock import errors as errors
    from envlock import lock as lock
    from envlock import restore as restore
    from envlock import runtime as runtime
    from envlock.check.local import verify
    from envlock.drift.compare import compare
    from envlock.lock import Lock, load
    from envlock.probing.capture import capture
    from envlock.runtime import (
        apply,
        canary,
        dataloader_generator,
        deterministic,
        load_compile_cache,
        record,
        save_compile_cache,
        seed_everything,
        worker_init_fn,
    )


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        # import_module binds the submodule on this package, so __getattr__ runs once per name.
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'envlock' has no attribute {name!r}")


def __dir__() -> list[str]:
    hidden = {"TYPE_CHECKING", "Any", "annotations", "importlib"}
    return sorted((set(globals()) - hidden) | set(__all__) | set(_SUBMODULES))
