"""The numeric canary run in this process, under its current flags.

The kernels are the probe package's own ``kernels`` module, the file restore copies into
containers with the rest of the probe, so a canary computed here and one computed in a
restored image are the same code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from envlock.runtime.common import torch_module

if TYPE_CHECKING:
    from envlock.lock import Canary


def canary_module() -> Any:
    """The canary's kernels: ``envlock/probe/kernels.py``, as the probe imports it."""
    from envlock.probe import kernels

    return kernels


def canary(devices: list[str] | None = None) -> Canary:
    """Run the numeric canary in this process, under its current flags; a ``[canary]`` table."""
    from envlock.lock import Canary
    from envlock.probe.scrub import scrub_document, secret_values

    torch = torch_module(required=True)
    # The settings carry numerics variables verbatim (any may hold a URL): the same
    # scrub as every other string that enters a lock.
    return Canary.model_validate(scrub_document(canary_module().run(torch, devices), secret_values()))
