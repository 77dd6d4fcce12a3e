"""Reading and writing the live determinism knobs through the one table, ``probe.rules.KNOBS``.

**TF32 is two APIs in torch >= 2.9.** The legacy ``allow_tf32`` / ``float32_matmul_precision``
flags and the ``fp32_precision`` tree are coupled, and reading a legacy getter after the two
disagree *raises* (``Context::allowTF32CuBLAS``/``allowTF32CuDNN``). Writes therefore go legacy
first (each legacy setter also rewrites the matching new-API leaf), then the new tree from the
root (generic) down to the leaves, so the state ends consistent and readable. That order is the
order of ``probe.rules.KNOBS``.

Every write is verified by reading the live value back: torch silently ignores some writes (an
invalid precision string only warns) and couples others.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from envlock.probe.rules import KNOBS, Knob, knobs_in, quiet, read_knobs

__all__ = ["KNOBS", "OWNED", "Knob", "knobs_in", "read_state", "write_state"]


# What deterministic() owns and its context manager puts back.
OWNED: tuple[str, ...] = tuple(k.name for k in KNOBS if k.strict is not None)


def read_state(torch: Any, keys: Iterable[str] | None = None) -> dict[str, Any]:
    """The live value of every knob this torch has (or of ``keys``); unreadable ones omitted."""
    return read_knobs(torch, None if keys is None else list(keys))


def write_state(torch: Any, target: Mapping[str, Any]) -> dict[str, str]:
    """Bring the live knobs to ``target``; return {key: why} for those that did not take.

    Each knob is compared with its live value right before the write, since an earlier write
    may already have moved it (the legacy/new TF32 coupling). The sequence is repeated until a
    pass writes nothing: the probe records resolved values, not the raw tree, so a leaf it does
    not record (mkldnn.matmul) can leave a legacy getter unreadable until the legacy setter runs
    once more after the tree is in place. Torch's own warnings about the legacy TF32 API are
    silenced: the order is deliberate, and every value is read back at the end.
    """
    failures: dict[str, str] = {}
    knobs = [k for k in knobs_in(torch) if target.get(k.name) is not None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            wrote = False
            for knob in knobs:
                wanted = target[knob.name]
                if knob.name in failures or quiet(functools.partial(knob.read, torch)) == wanted:
                    continue
                try:
                    knob.write(torch, wanted)
                    wrote = True
                except Exception as exc:
                    text = str(exc).splitlines()[0] if str(exc) else ""
                    failures[knob.name] = f"{type(exc).__name__}: {text}"
            if not wrote:
                break
    live = read_state(torch, target)
    for key, value in target.items():
        if value is not None and key not in failures and live.get(key) != value:
            failures[key] = f"torch kept {live.get(key)!r} after the write"
    return failures
