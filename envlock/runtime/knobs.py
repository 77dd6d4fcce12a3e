"""The determinism knobs as one table, and reading and writing the live state through it.

**TF32 is two APIs in torch >= 2.9.** The legacy ``allow_tf32`` / ``float32_matmul_precision``
flags and the ``fp32_precision`` tree are coupled, and reading a legacy getter after the two
disagree *raises* (``Context::allowTF32CuBLAS``/``allowTF32CuDNN``). Writes therefore go legacy
first (each legacy setter also rewrites the matching new-API leaf), then the new tree from the
root (generic) down to the leaves, so the state ends consistent and readable. That order is the
order of :data:`KNOBS`.

Every write is verified by reading the live value back: torch silently ignores some writes (an
invalid precision string only warns) and couples others.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from envlock.probe import quiet


class Knob(NamedTuple):
    """One torch setting that changes numerics, by its ``[determinism]`` field name.

    ``read(torch)`` and ``write(torch, value)`` may raise (a knob this torch lacks, a legacy
    TF32 getter while the two TF32 APIs disagree); callers go through ``quiet`` or catch.
    ``strict`` is what ``deterministic()`` sets it to, None for a knob it leaves alone (only
    ``apply(lock)`` writes those). ``fp32_api`` marks the ``fp32_precision`` tree, which exists
    only where torch has it (torch >= 2.9).
    """

    name: str
    read: Callable[[Any], Any]
    write: Callable[[Any, Any], None]
    strict: Any = None
    fp32_api: bool = False


def _attr(path: str) -> tuple[Callable[[Any], Any], Callable[[Any, Any], None]]:
    """Reader and writer of ``torch.<path>``, a plain attribute such as a backend flag."""
    parent, _, name = path.rpartition(".")

    def owner(torch: Any) -> Any:
        return functools.reduce(getattr, parent.split("."), torch)

    def read(torch: Any) -> Any:
        return getattr(owner(torch), name)

    def write(torch: Any, value: Any) -> None:
        setattr(owner(torch), name, value)

    return read, write


def _fp32(backend: str, op: str) -> tuple[Callable[[Any], Any], Callable[[Any, Any], None]]:
    """Reader and writer of one node of the ``fp32_precision`` tree, through torch's C API.

    The C setter rather than the Python properties: ``torch.backends.mkldnn.fp32_precision``'s
    setter writes the *generic* root in torch 2.9-2.13, not the mkldnn node.
    """
    return (lambda t: t._C._get_fp32_precision_getter(backend, op),
            lambda t, v: t._C._set_fp32_precision_setter(backend, op, v))


def _deterministic_utils() -> Any:
    import torch.utils.deterministic  # a lazily loaded submodule

    return torch.utils.deterministic


def _set_fill_uninitialized(torch: Any, value: Any) -> None:
    _deterministic_utils().fill_uninitialized_memory = value


def _set_algorithms(torch: Any, value: Any) -> None:
    # One torch call sets both halves of the algorithms switch; each writer keeps the other.
    torch.use_deterministic_algorithms(
        value, warn_only=torch.is_deterministic_algorithms_warn_only_enabled())


def _set_warn_only(torch: Any, value: Any) -> None:
    torch.use_deterministic_algorithms(torch.are_deterministic_algorithms_enabled(),
                                       warn_only=value)


# In the order writes must happen: the algorithms switch, then the legacy TF32 flags, then the
# fp32_precision tree from the root down ("none" on a node means "ask the parent"). "ieee"
# rather than "none" in strict mode, because "none" defers to the parent node, which a library
# may have set to tf32 or bf16 (oneDNN uses bf16 for fp32 matmuls on AMX CPUs when allowed).
# Threads, SDPA backends and reduced-precision reductions have no strict value: deterministic()
# leaves them alone (docs/runtime.md says why), only apply(lock) writes them.
KNOBS: tuple[Knob, ...] = (
    Knob("deterministic_algorithms", lambda t: t.are_deterministic_algorithms_enabled(),
         _set_algorithms, strict=True),
    Knob("deterministic_warn_only", lambda t: t.is_deterministic_algorithms_warn_only_enabled(),
         _set_warn_only, strict=False),  # deterministic("warn") sets it True
    Knob("fill_uninitialized_memory", lambda t: _deterministic_utils().fill_uninitialized_memory,
         _set_fill_uninitialized, strict=True),
    Knob("cudnn_enabled", *_attr("backends.cudnn.enabled")),
    Knob("mkldnn_enabled", *_attr("backends.mkldnn.enabled")),
    Knob("cudnn_deterministic", *_attr("backends.cudnn.deterministic"), strict=True),
    Knob("cudnn_benchmark", *_attr("backends.cudnn.benchmark"), strict=False),
    Knob("cuda_matmul_allow_tf32", *_attr("backends.cuda.matmul.allow_tf32"), strict=False),
    Knob("float32_matmul_precision", lambda t: t.get_float32_matmul_precision(),
         lambda t, v: t.set_float32_matmul_precision(v), strict="highest"),
    Knob("cudnn_allow_tf32", *_attr("backends.cudnn.allow_tf32"), strict=False),
    Knob("fp32_precision", *_fp32("generic", "all"), strict="ieee", fp32_api=True),
    Knob("cuda_fp32_precision", *_fp32("cuda", "all"), strict="ieee", fp32_api=True),
    Knob("mkldnn_fp32_precision", *_fp32("mkldnn", "all"), strict="ieee", fp32_api=True),
    Knob("cuda_matmul_fp32_precision", *_fp32("cuda", "matmul"), strict="ieee", fp32_api=True),
    Knob("cudnn_conv_fp32_precision", *_fp32("cuda", "conv"), strict="ieee", fp32_api=True),
    Knob("cudnn_rnn_fp32_precision", *_fp32("cuda", "rnn"), strict="ieee", fp32_api=True),
    Knob("mkldnn_matmul_fp32_precision", *_fp32("mkldnn", "matmul"), strict="ieee", fp32_api=True),
    Knob("mkldnn_conv_fp32_precision", *_fp32("mkldnn", "conv"), strict="ieee", fp32_api=True),
    Knob("mkldnn_rnn_fp32_precision", *_fp32("mkldnn", "rnn"), strict="ieee", fp32_api=True),
    Knob("cuda_matmul_allow_fp16_reduced_precision_reduction",
         *_attr("backends.cuda.matmul.allow_fp16_reduced_precision_reduction")),
    Knob("cuda_matmul_allow_bf16_reduced_precision_reduction",
         *_attr("backends.cuda.matmul.allow_bf16_reduced_precision_reduction")),
    Knob("sdpa_flash", lambda t: t.backends.cuda.flash_sdp_enabled(),
         lambda t, v: t.backends.cuda.enable_flash_sdp(v)),
    Knob("sdpa_mem_efficient", lambda t: t.backends.cuda.mem_efficient_sdp_enabled(),
         lambda t, v: t.backends.cuda.enable_mem_efficient_sdp(v)),
    Knob("sdpa_math", lambda t: t.backends.cuda.math_sdp_enabled(),
         lambda t, v: t.backends.cuda.enable_math_sdp(v)),
    Knob("sdpa_cudnn", lambda t: t.backends.cuda.cudnn_sdp_enabled(),
         lambda t, v: t.backends.cuda.enable_cudnn_sdp(v)),
    Knob("num_threads", lambda t: t.get_num_threads(), lambda t, v: t.set_num_threads(v)),
    Knob("num_interop_threads", lambda t: t.get_num_interop_threads(),
         lambda t, v: t.set_num_interop_threads(v)),
)
# What deterministic() owns and its context manager puts back.
OWNED: tuple[str, ...] = tuple(k.name for k in KNOBS if k.strict is not None)


def knobs_in(torch: Any) -> list[Knob]:
    """The knobs this torch has, in write order: the fp32_precision tree only from torch 2.9.

    Keyed on which knobs *exist*, not which read back: a legacy TF32 getter raises while the
    two TF32 APIs disagree, and that is exactly the state whose legacy flag must be written.
    """
    tree = hasattr(getattr(torch, "_C", None), "_get_fp32_precision_getter")
    return [k for k in KNOBS if tree or not k.fp32_api]


def read_state(torch: Any, keys: Iterable[str] | None = None) -> dict[str, Any]:
    """The live value of every knob this torch has (or of ``keys``); unreadable ones omitted."""
    wanted = None if keys is None else set(keys)
    state: dict[str, Any] = {}
    for knob in knobs_in(torch):
        if wanted is not None and knob.name not in wanted:
            continue
        value = quiet(functools.partial(knob.read, torch))
        if isinstance(value, (bool, int, str)):
            state[knob.name] = value
    return state


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
