"""``deterministic()``: deterministic kernels, TF32 off, ``CUBLAS_WORKSPACE_CONFIG``, undoable.

The values come from the ``strict`` column of the knob table; what this module adds is the
cuBLAS variable, which is read when a handle is created, so setting it after CUDA initialised
is reported as late rather than recorded as in effect.
"""

from __future__ import annotations

import os
import warnings
from types import TracebackType
from typing import Any, Literal

from envlock.errors import UsageError
from envlock.runtime.common import (
    CUBLAS_DETERMINISTIC,
    CUBLAS_ENV,
    CUBLAS_OK,
    ReproducibilityWarning,
    cuda_initialized,
    late_names,
    set_env,
    set_late_names,
    torch_module,
)
from envlock.runtime.knobs import OWNED, knobs_in, read_state, write_state

Mode = Literal["strict", "warn"]


def strict_target(torch: Any, mode: Mode) -> dict[str, Any]:
    """The strict value of every knob this torch has, warn_only following ``mode``."""
    target = {k.name: k.strict for k in knobs_in(torch) if k.strict is not None}
    target["deterministic_warn_only"] = mode == "warn"
    if not read_state(torch, ["fill_uninitialized_memory"]):  # torch < 2.1
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
        torch = torch_module(required=True)
        failures = write_state(torch, self._previous)
        set_env(CUBLAS_ENV, self._previous_env)
        set_late_names(self._previous_late)
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
    torch = torch_module(required=True)
    target = strict_target(torch, mode)
    previous = read_state(torch, OWNED)
    previous_env = os.environ.get(CUBLAS_ENV)
    previous_late = late_names()
    failures = write_state(torch, target)
    after = read_state(torch, previous)
    changed = [k for k in sorted(previous) if previous.get(k) != after.get(k)]
    late: list[str] = []
    if previous_env not in CUBLAS_OK:
        os.environ[CUBLAS_ENV] = CUBLAS_DETERMINISTIC
        changed.append(CUBLAS_ENV)
        if cuda_initialized(torch):
            late.append(CUBLAS_ENV)
            set_late_names(previous_late | {CUBLAS_ENV})
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
