"""The numeric canary: a fixed, seeded set of small kernels whose output bytes are hashed.

Versions say which code is installed; they do not say which code *runs*. The BLAS picks a
kernel by CPU ISA, oneDNN by its own dispatcher, cuBLAS by GPU and workspace, and a flag such as
``float32_matmul_precision("medium")`` quietly routes fp32 matmuls through bf16 on CPUs that
have AMX. Hashing the bytes of a few representative outputs catches all of those at once.

This module travels with the probe into containers that have nothing of envlock installed, so
it is stdlib + torch only (and the probe's own rules and scrub) and keeps Python 3.8 syntax. It
must not disturb the caller: inputs come from a private generator (the global RNG is
untouched) and no flag is changed, because the whole point is to measure the numerics under the
settings the process is actually using.
"""

import ctypes
import hashlib
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

# One setting; a knob missing in this torch (or raising on a mixed TF32 state) is None.
from .rules import numerics_variable
from .rules import quiet as _read
from .scrub import env_value

# Bump when a kernel, a shape or the input recipe changes: hashes of different versions are
# not comparable, and compare reports that instead of a false numeric drift.
CANARY_VERSION = 1
SEED = 20240531



def _bytes_of(torch: Any, t: Any) -> bytes:
    """The raw bytes of a tensor, without numpy (torch may be installed without it)."""
    t = t.detach().contiguous().cpu()
    if t.dim() == 0:
        t = t.reshape(1)
    n = t.numel() * t.element_size()
    return ctypes.string_at(t.data_ptr(), n) if n else b""


def _digest(torch: Any, t: Any) -> str:
    h = hashlib.sha256()
    # Shape and dtype are part of the identity: the same bytes in another shape are a change.
    h.update(("%s%s;" % (t.dtype, tuple(t.shape))).encode("ascii"))
    h.update(_bytes_of(torch, t))
    return h.hexdigest()


def _inputs(torch: Any) -> Dict[str, Any]:
    """All inputs, drawn on the CPU from a private generator, so every device sees the same."""
    g = torch.Generator(device="cpu")
    g.manual_seed(SEED)

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, generator=g, dtype=torch.float32)

    return {
        "a": randn(96, 160), "b": randn(160, 112),
        # Large enough for the BLAS to block and pick an ISA-specific micro-kernel.
        "A": randn(256, 1024), "B": randn(1024, 256),
        "x": randn(2, 8, 24, 24), "w": randn(16, 8, 3, 3), "cb": randn(16),
        "s": randn(64, 257), "lw": randn(257), "lb": randn(257),
        # 2**20 elements: past every parallel grain size, so a reduction is split into chunks.
        "r": randn(1 << 20),
    }


def _kernels(torch: Any) -> List[Tuple[str, str, Callable[[Dict[str, Any]], Any]]]:
    import torch.nn.functional as F

    bf16 = torch.bfloat16
    return [
        ("matmul", "float32", lambda i: i["a"] @ i["b"]),
        ("matmul_large", "float32", lambda i: i["A"] @ i["B"]),
        ("matmul", "bfloat16", lambda i: i["a"].to(bf16) @ i["b"].to(bf16)),
        ("matmul_large", "bfloat16", lambda i: i["A"].to(bf16) @ i["B"].to(bf16)),
        ("conv2d", "float32", lambda i: F.conv2d(i["x"], i["w"], i["cb"], padding=1)),
        ("conv2d", "bfloat16",
         lambda i: F.conv2d(i["x"].to(bf16), i["w"].to(bf16), i["cb"].to(bf16), padding=1)),
        ("softmax", "float32", lambda i: torch.softmax(i["s"], dim=-1)),
        ("layer_norm", "float32", lambda i: F.layer_norm(i["s"], (257,), i["lw"], i["lb"])),
        ("sum", "float32", lambda i: i["r"].sum()),
        ("sum_dim", "float32", lambda i: i["r"].view(1024, 1024).sum(dim=0)),
    ]


def _settings(torch: Any, devices: List[str]) -> Dict[str, Any]:
    b = torch.backends
    readers = {
        "num_threads": lambda: torch.get_num_threads(),
        "num_interop_threads": lambda: torch.get_num_interop_threads(),
        "cpu_capability": lambda: b.cpu.get_cpu_capability(),
        "mkldnn_enabled": lambda: bool(b.mkldnn.enabled),
        "mkl_available": lambda: bool(b.mkl.is_available()),
        "float32_matmul_precision": lambda: torch.get_float32_matmul_precision(),
        "fp32_precision": lambda: b.fp32_precision,
        "mkldnn_matmul_fp32_precision": lambda: b.mkldnn.matmul.fp32_precision,
        "mkldnn_conv_fp32_precision": lambda: b.mkldnn.conv.fp32_precision,
        "deterministic_algorithms": lambda: torch.are_deterministic_algorithms_enabled(),
    }
    out: Dict[str, Any] = {}
    for key, read in readers.items():
        value = _read(read)
        if isinstance(value, (bool, int, float, str)):
            out[key] = value
    if any(d.startswith("cuda") for d in devices):
        cuda_readers = {
            "cuda_matmul_fp32_precision": lambda: b.cuda.matmul.fp32_precision,
            "cudnn_conv_fp32_precision": lambda: b.cudnn.conv.fp32_precision,
            "cudnn_enabled": lambda: bool(b.cudnn.enabled),
            "cudnn_benchmark": lambda: bool(b.cudnn.benchmark),
            "cudnn_deterministic": lambda: bool(b.cudnn.deterministic),
            "cudnn_version": lambda: b.cudnn.version(),
        }
        for key, read in cuda_readers.items():
            value = _read(read)
            if isinstance(value, (bool, int, float, str)):
                out[key] = value
        for dev in devices:
            if dev.startswith("cuda"):
                props = _read(lambda: torch.cuda.get_device_properties(torch.device(dev)))  # noqa: B023 - called at once
                if props is not None:
                    out["%s.name" % dev] = str(props.name)
                    out["%s.capability" % dev] = "%d.%d" % (props.major, props.minor)
    # The variables that change numerics (the one rule of rules.numerics_variable; none shows in
    # a version number), next to the hashes they explain, scrubbed as the lock's [env] is.
    for name, value in sorted(os.environ.items()):
        if numerics_variable(name):
            out["env.%s" % name] = env_value(name, value)
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""


def default_devices(torch: Any) -> List[str]:
    devices = ["cpu"]
    if _read(lambda: torch.cuda.is_available()):
        devices += ["cuda:%d" % i for i in range(torch.cuda.device_count())]
    return devices


def run(torch: Any, devices: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run every kernel on every device; a JSON-ready ``[canary]`` table.

    ``devices`` defaults to the CPU and each visible CUDA device. A kernel that fails on a
    device (bf16 on an old GPU) is listed under ``errors`` instead of failing the canary.
    """
    start = time.perf_counter()
    if devices is None:
        devices = default_devices(torch)
    cpu_inputs = _inputs(torch)
    results: List[Dict[str, Any]] = []
    errors: Dict[str, str] = {}
    with torch.no_grad():
        for device in devices:
            try:
                inputs = cpu_inputs if device == "cpu" else {
                    k: v.to(device) for k, v in cpu_inputs.items()}
            except Exception as exc:
                # One entry per kernel, so every missing hash is explained under its own name.
                why = "%s: %s" % (type(exc).__name__, _first_line(exc))
                for name, dtype, _ in _kernels(torch):
                    errors["%s[%s,%s]" % (name, device, dtype)] = why
                continue
            for name, dtype, kernel in _kernels(torch):
                try:
                    sha = _digest(torch, kernel(inputs))
                except Exception as exc:
                    errors["%s[%s,%s]" % (name, device, dtype)] = "%s: %s" % (
                        type(exc).__name__, _first_line(exc))
                    continue
                results.append({"name": name, "device": device, "dtype": dtype, "sha256": sha})
    doc: Dict[str, Any] = {
        "version": CANARY_VERSION,
        "torch": str(torch.__version__),
        "settings": _settings(torch, devices),
        "results": results,
        "duration_ms": round((time.perf_counter() - start) * 1000, 1),
    }
    if errors:
        doc["errors"] = errors
    return doc
