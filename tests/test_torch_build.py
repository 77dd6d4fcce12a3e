"""[torch.build]: readable build facts from torch.__config__, and host facts kept out of identity."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from helpers import make_lock
from hypothesis import given, settings
from hypothesis import strategies as st

from envlock.drift.compare import compare
from envlock.lock import TorchBuild, fingerprint
from envlock.probe import torchstack
from envlock.probe.collect import collect
from envlock.probing.capture import build_lock
from envlock.probing.process import PROBE_PATH, parse_document

# The shape of a CUDA wheel's torch.__config__.show() (torch 2.x on Linux).
CUDA_SHOW = """PyTorch built with:
  - GCC 9.3
  - C++ Version: 201703
  - Intel(R) oneAPI Math Kernel Library Version 2022.2-Product Build 20220804 for Intel(R) 64 architecture applications
  - Intel(R) MKL-DNN v3.1.1 (Git Hash 64f6bcbcbab628e96f33a62c3e975f8535a7bde4)
  - OpenMP 201511 (a.k.a. OpenMP 4.5)
  - LAPACK is enabled (usually provided by MKL)
  - NNPACK is enabled
  - CPU capability usage: AVX2
  - CUDA Runtime 12.1
  - NVCC architecture flags: -gencode;arch=compute_50,code=sm_50;-gencode;arch=compute_90,code=sm_90
  - CuDNN 8.9.2
  - Magma 2.6.1
  - Build settings: BLAS_INFO=mkl, BUILD_TYPE=Release, CUDA_VERSION=12.1, CUDNN_VERSION=8.9.2, CXX_COMPILER=/opt/rh/devtoolset-9/root/usr/bin/c++, CXX_FLAGS= -D_GLIBCXX_USE_CXX11_ABI=0 -Wl,--no-as-needed -O2, LAPACK_INFO=mkl, PERF_WITH_AVX=1, TORCH_VERSION=2.1.0, COMMIT_SHA=abc, USE_CUDA=ON, USE_NCCL=1,
"""
ROCM_SHOW = """PyTorch built with:
  - clang 17.0.0
  - CPU capability usage: NO AVX
  - HIP Runtime 6.0.32830
  - MIOpen 3.0.0
  - Build settings: BLAS_INFO=open, BUILD_TYPE=Release, USE_ROCM=ON,
"""
PARALLEL = "ATen/Parallel:\n\tat::get_num_threads() : 8\nATen parallel backend: OpenMP\n"


def test_cuda_build_fields() -> None:
    build = torchstack.parse_torch_config(CUDA_SHOW, PARALLEL)
    assert build["compiler"] == "GCC 9.3" and build["cxx_standard"] == "201703"
    assert build["mkl_version"] == "2022.2" and build["onednn_version"] == "3.1.1"
    assert build["openmp_version"] == "201511" and build["parallel_backend"] == "OpenMP"
    assert (build["cuda_runtime"], build["cudnn_version"], build["magma_version"]) == ("12.1", "8.9.2", "2.6.1")
    assert build["cuda_arch_flags"] == ["arch=compute_50,code=sm_50", "arch=compute_90,code=sm_90"]
    assert (build["blas"], build["lapack"], build["build_type"]) == ("mkl", "mkl", "Release")
    # A flag value with commas in it stays whole; version and commit are recorded elsewhere.
    assert build["options"]["CXX_FLAGS"] == "-D_GLIBCXX_USE_CXX11_ABI=0 -Wl,--no-as-needed -O2"
    assert build["options"]["USE_NCCL"] == "1"
    assert "TORCH_VERSION" not in build["options"] and "COMMIT_SHA" not in build["options"]
    assert build["cpu_capability"] == "AVX2"
    TorchBuild.model_validate({k: v for k, v in build.items() if k != "cpu_capability"})


def test_rocm_build_fields() -> None:
    build = torchstack.parse_torch_config(ROCM_SHOW)
    assert build["compiler"] == "clang 17.0.0"
    assert (build["hip_runtime"], build["miopen_version"], build["blas"]) == ("6.0.32830", "3.0.0", "open")
    assert build["options"] == {"USE_ROCM": "ON"}


def test_config_hash_ignores_the_host_cpu_line() -> None:
    avx512 = CUDA_SHOW.replace("CPU capability usage: AVX2", "CPU capability usage: AVX512")
    assert torchstack.config_identity(avx512) == torchstack.config_identity(CUDA_SHOW)
    assert torchstack.config_identity(CUDA_SHOW.replace("GCC 9.3", "GCC 11.2")) != torchstack.config_identity(CUDA_SHOW)


def test_real_torch_build_is_read() -> None:
    import torch

    info = torchstack.collect_torch(torch)
    build = info["build"]
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert "cpu_capability" not in build
    assert build["compiler"].split()[0] in ("GCC", "clang", "MSVC", "Apple")
    assert ("openmp_version" in build) == bool(torch.backends.openmp.is_available())  # type: ignore[no-untyped-call]  # unannotated in torch
    assert ("cuda_runtime" in build) == (torch.version.cuda is not None)
    assert (build["options"].get("USE_MKLDNN") in ("ON", "1")) == torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]  # unannotated in torch
    lock = build_lock(collect(torch="auto"))
    assert lock.torch is not None and lock.torch.build is not None
    assert lock.torch.build.blas == build.get("blas")


def _probe_torch(capability: str | None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability
    out = subprocess.run([sys.executable, str(PROBE_PATH)], env=env, capture_output=True,
                         text=True, check=True, timeout=300)
    doc: dict[str, Any] = parse_document(out.stdout.encode(), "")
    return doc


@pytest.mark.slow
def test_same_torch_on_another_cpu_isa_has_the_same_fingerprint() -> None:
    """The dispatcher's ISA is a host fact: AVX512, AVX2 and scalar-only hosts must share one id.
    The scalar kernels (``default``) run on any CPU, so every host with a vector ISA compares."""
    import torch  # noqa: F401 - a pinned dev dependency: without it this test would check nothing, so fail

    native, scalar = _probe_torch(None), _probe_torch("default")
    assert native["torch"]["cpu_capability"] != scalar["torch"]["cpu_capability"] == "DEFAULT", \
        "this CPU has no vector ISA for torch to compare with its scalar kernels"
    assert native["torch"]["config_sha256"] == scalar["torch"]["config_sha256"]
    assert native["torch"]["build"] == scalar["torch"]["build"]
    # Same host otherwise: only the torch section swapped, so only a host fact differs.
    a = build_lock(native)
    b = build_lock({**native, "torch": scalar["torch"]})
    assert fingerprint(a) == fingerprint(b)
    assert [(d.path, d.severity) for d in compare(a, b).differences] == [("torch.cpu_capability", "info")]


TORCH: dict[str, Any] = {"version": "2.4.1", "git_version": "a" * 40, "config_sha256": "1" * 64,
         "build": {"blas": "mkl", "onednn_version": "3.4.2", "options": {"USE_CUDA": "OFF"}}}


def test_diff_names_the_build_field_not_the_hash() -> None:
    a = make_lock(torch=TORCH)
    b = make_lock(torch={**TORCH, "config_sha256": "2" * 64,
                         "build": {**TORCH["build"], "onednn_version": "3.5.3", "options": {"USE_CUDA": "ON"}}})
    got = {d.path: (d.old, d.new, d.severity) for d in compare(a, b).differences}
    assert got == {"torch.build.onednn_version": ("3.4.2", "3.5.3", "warning"),
                   "torch.build.options.USE_CUDA": ("OFF", "ON", "warning")}
    hash_only = make_lock(torch={**TORCH, "config_sha256": "2" * 64})
    (diff,) = compare(a, hash_only).differences
    assert diff.path == "torch.config_sha256" and "does not parse" in diff.describe()


# -- fuzz: whatever torch prints, the parser returns fields the model accepts ----------------

KNOWN_LINES = [
    "  - GCC 13.3", "  - C++ Version: 202002", "  - OpenMP 201511 (a.k.a. OpenMP 4.5)",
    "  - CPU capability usage: AVX512", "  - CUDA Runtime 12.8", "  - CuDNN 9.7",
    "  - NVCC architecture flags: -gencode;arch=compute_90,code=sm_90",
    "  - Intel(R) MKL-DNN v3.7.1 (Git Hash 8d263e693366ef8db40acc569cc7d8edf644556d)",
    "  - Build settings: BLAS_INFO=mkl, USE_CUDA=ON, CXX_FLAGS= -O2 -Wl,-z,now, ",
]
lines = st.one_of(st.sampled_from(KNOWN_LINES), st.text(max_size=80),
                  st.builds(lambda k, v: f"  - {k}: {v}", st.text(max_size=20), st.text(max_size=40)))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(lines, max_size=25), st.text(max_size=200))
def test_fuzz_parser_never_raises_and_output_validates(show_lines: list[str], parallel: str) -> None:
    text = "PyTorch built with:\n" + "\n".join(show_lines)
    build = torchstack.parse_torch_config(text, parallel)
    capability = build.pop("cpu_capability", None)
    assert capability is None or isinstance(capability, str)
    TorchBuild.model_validate(build)
    if "  - Build settings: BLAS_INFO=mkl, USE_CUDA=ON, CXX_FLAGS= -O2 -Wl,-z,now, " in show_lines:
        assert "USE_CUDA" in build["options"] and "blas" in build
    if "  - CuDNN 9.7" in show_lines:
        assert "cudnn_version" in build
    torchstack.config_identity(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400), st.text(max_size=400))
def test_fuzz_parser_on_arbitrary_text(show: str, parallel: str) -> None:
    build = torchstack.parse_torch_config(show, parallel)
    build.pop("cpu_capability", None)
    TorchBuild.model_validate(build)
