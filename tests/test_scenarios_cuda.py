"""Scenario matrix f: the CUDA build of torch (PyPI's default torch==2.13.0, CUDA 13.0 with its
nvidia-* wheels) captured on a host without a GPU.

The ~4.8 GB venv is made once by scripts/test.sh outside the repository (``ENVLOCK_TEST_TORCH_CUDA_VENV``,
under the test cache, with a stamp) and never modified here. The lock must hold what that
venv's torch itself reports; the rendered restore must put torch's CUDA wheels in torch's layer.
The image is rendered, not built: it would copy ~4.8 GB of wheels into an image that, without a
GPU, can only import torch, so verify inside and run are not done here (scenario g covers the GPU
side of run with a stand-in driver).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib
from helpers import unavailable
from scenario_steps import Steps, build_nvml_standin, envlock, ok

from envlock.drift.native import mismatch

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ASK_TORCH = """
import json, torch
print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda,
                  "cudnn": torch.backends.cudnn.version(), "nccl": list(torch.cuda.nccl.version()),
                  "arch_list": torch.cuda.get_arch_list()}))
"""


@pytest.fixture(scope="module")
def cuda_venv() -> Path:
    raw = os.environ.get("ENVLOCK_TEST_TORCH_CUDA_VENV")
    if not raw or not (Path(raw) / "bin" / "python").exists():
        unavailable("ENVLOCK_TEST_TORCH_CUDA_VENV is not set or holds no venv; run scripts/test.sh")
    return Path(raw)


def _cudnn(v: int) -> str:
    # cuDNN >= 9 encodes its version as major * 10000 + minor * 100 + patch.
    assert v >= 90000, v
    return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"


def test_f_cuda_torch_on_a_cpu_host(cuda_venv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    steps = Steps("f CUDA torch", capsys)
    steps.not_applicable("setup", f"cached venv {cuda_venv} (made by scripts/test.sh, ~90 s once)")
    reported = json.loads(subprocess.run([str(cuda_venv / "bin" / "python"), "-c", ASK_TORCH], capture_output=True,
                                         text=True, check=True, timeout=300).stdout)
    assert reported["cuda"] == "13.0" and reported["version"] == "2.13.0+cu130"
    lock = tmp_path / "env.lock"
    with steps.step("capture"):
        ok(envlock("capture", "--python", str(cuda_venv), "-o", str(lock), cwd=tmp_path))
    doc = tomllib.loads(lock.read_text())
    torch = doc["torch"]
    assert torch["version"] == reported["version"]
    assert torch["cuda"] == reported["cuda"]
    assert torch["cudnn"] == _cudnn(reported["cudnn"])
    assert torch["nccl"] == ".".join(str(n) for n in reported["nccl"])
    assert torch["arch_list"] == reported["arch_list"]
    assert torch["cuda_available"] is False  # no GPU here; the build is what is locked
    nvidia = sorted(p["name"] for p in doc["packages"] if p["name"].startswith("nvidia-"))
    installed = sorted(d.name.split("-")[0].replace("_", "-") for d in
                       (cuda_venv / "lib").glob("python3*/site-packages/nvidia_*.dist-info"))
    assert nvidia == installed and len(nvidia) >= 10, nvidia
    with steps.step("verify"):
        assert "OK: the environment matches the lock" in ok(
            envlock("verify", str(lock), "--python", str(cuda_venv), cwd=tmp_path))
    with steps.step("change + verify"):
        # The venv is a shared cache and stays untouched: the change is a variable that changes
        # CUDA numerics (TF32 on Ampere and newer), set in the environment verify runs in.
        out = ok(envlock("verify", str(lock), "--python", str(cuda_venv), cwd=tmp_path,
                         env={"NVIDIA_TF32_OVERRIDE": "0"}), 1)
        assert "NVIDIA_TF32_OVERRIDE" in out, out
    context = tmp_path / "context"
    with steps.step("restore (render)"):
        ok(envlock("restore", str(lock), "--dockerfile-only", str(context), "--allow-unpinned-base", cwd=tmp_path))
    torch_layer = _pins(context / "requirements" / "torch.txt")
    others = _pins(context / "requirements" / "packages.txt")
    assert set(nvidia) <= set(torch_layer), sorted(set(nvidia) - set(torch_layer))
    assert torch_layer["torch"] == "2.13.0" and {"triton", "cuda-toolkit"} <= set(torch_layer)
    assert not [n for n in others if n.startswith(("nvidia-", "cuda-"))], others
    dockerfile = (context / "Dockerfile").read_text()
    # The torch layer comes first (cached apart from the rest) and from the installer's default
    # index (PyPI), where this CUDA build is the default: no index of PyTorch's for a version
    # without a local label, and no index written at all.
    assert dockerfile.index("requirements/torch.txt") < dockerfile.index("requirements/packages.txt")
    assert "index-url" not in dockerfile
    why = ("the CUDA image is rendered, not built: ~4.8 GB of wheels, and no GPU here to run it "
           "(scenario g covers run --gpus with a stand-in driver)")
    steps.not_applicable("verify inside", why)
    steps.not_applicable("run", why)


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.strip()] = version.split()[0] if version else ""
    return pins


def test_f_device_against_build_and_cuda_libraries_as_loaded(cuda_venv: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The CUDA build against the NVML stand-in's GPUs: one the build has no kernels for (7.0,
    Volta, dropped by cu130), one it has (8.9 runs sm_86 cubins); the CUDA libraries torch
    loaded against those it was built with; a cuDNN preloaded from another file; and a
    requirements check on a driver too old for the build."""
    steps = Steps("f device against build", capsys)
    standin = build_nvml_standin(tmp_path)
    gpus = {"LD_LIBRARY_PATH": str(standin), "ENVLOCK_NVML_TIMEOUT": "5", "STANDIN_NVML_CC": "7.0,8.9"}
    lock = tmp_path / "gpu.lock"
    python = str(cuda_venv / "bin" / "python")
    with steps.step("capture"):
        ok(envlock("capture", "--python", python, "--no-cache", "-o", str(lock), cwd=tmp_path, env=gpus))
    doc = tomllib.loads(lock.read_text())
    assert [(d["compute_capability"], d["torch_kernels"]) for d in doc["gpu"]["devices"]] == [
        ("7.0", "none"), ("8.9", "native")]
    cuda = doc["torch"]["cuda_libraries"]
    assert cuda["cudart"] == {"built": "13.0", "loaded": "13.0"}
    assert cuda["cudnn"]["built"] == cuda["cudnn"]["loaded"] == doc["torch"]["cudnn"]
    # torch.nccl is the nccl.h torch was compiled with; the loaded libnccl says the same here.
    assert cuda["nccl"]["built"] == cuda["nccl"]["loaded"] == doc["torch"]["nccl"]
    # cuBLAS and the other math libraries: "built" is what the installed cuda-toolkit pins for
    # the extras torch asks of it (torch pins cuda-toolkit[cublas,...]==13.0.3), "loaded" what
    # the library mapped into the process says (cublasGetProperty: major.minor.patch).
    toolkit = next((cuda_venv / "lib").glob("python3*/site-packages/cuda_toolkit-*.dist-info"))
    pin = re.search(r"(?m)^Requires-Dist: nvidia-cublas==([0-9.]+?)\.\*;.*extra == 'cublas'$",
                    (toolkit / "METADATA").read_text())
    assert pin is not None and cuda["cublas"]["built"] == pin.group(1)
    assert cuda["cublas"]["loaded"].startswith("13.") and cuda["cublas"]["built"].startswith(cuda["cublas"]["loaded"])
    assert set(cuda) == {"cudart", "cudnn", "nccl", "cublas", "cufft", "curand", "cusolver", "cusparse",
                         "cusparselt", "nvrtc"}, cuda
    assert [name for name, lib in cuda.items() if mismatch(lib["built"], lib["loaded"]) is not None] == [], cuda
    libs = {entry["name"]: entry for entry in doc["native"]["libraries"]}
    assert libs["libcudnn.so.9"]["distribution"] == "nvidia-cudnn-cu13"
    assert libs["libcudnn.so.9"]["file"] == "nvidia/cudnn/lib/libcudnn.so.9"
    assert libs["libcudart.so.13"]["distribution"].startswith("nvidia-cuda-runtime")
    # This venv has no threadpoolctl: the OpenMP runtime is named from its file alone.
    assert doc["native"]["runtimes_source"] == "maps"
    assert [(r["api"], r["library"]) for r in doc["native"]["runtimes"]] == [("openmp", "libgomp.so.1")]
    assert doc["requires"]["cuda_driver"] == "13.0" and doc["requires"]["gpu_archs"] == doc["torch"]["arch_list"]
    with steps.step("verify (a GPU without kernels)"):
        out = ok(envlock("verify", str(lock), "--python", python, cwd=tmp_path, env=gpus), 1)
        assert "gpu.devices[0].torch_kernels" in out and "has no kernels for it" in out, out
    with steps.step("verify --requirements (old driver)"):
        out = ok(envlock("verify", str(lock), "--requirements", "--python", python, cwd=tmp_path,
                         env={**gpus, "STANDIN_NVML_CUDA": "12040"}), 1)
        assert "FAIL          NVIDIA driver supporting CUDA >= 13.0: the driver supports CUDA 12.4" in out, out
        assert "GPU 0 (NVIDIA A100-SXM4-80GB, compute capability 7.0): the build has no kernels" in out
        assert "ok            GPU architecture" in out and "compute capability 8.9): native kernels" in out
    with steps.step("verify (cuDNN preloaded from another file)"):
        # A copy of the wheel's libcudnn.so.9 elsewhere (its engines beside it, as links): what
        # a cluster's module would put in front; torch's RPATH would win over LD_LIBRARY_PATH.
        other = tmp_path / "cluster-cudnn"
        other.mkdir()
        wheel = Path(libs["libcudnn.so.9"]["path"])
        shutil.copy(wheel, other / wheel.name)
        for sub in wheel.parent.glob("libcudnn_*"):
            (other / sub.name).symlink_to(sub)
        out = ok(envlock("verify", str(lock), "--python", python, cwd=tmp_path,
                         env={**gpus, "STANDIN_NVML_CC": "8.0,8.9", "LD_PRELOAD": str(other / wheel.name)}), 1)
        assert "native.libraries.libcudnn.so.9" in out, out
        assert f"{wheel} (distribution nvidia-cudnn-cu13) in the lock" in out
        assert f"{other / wheel.name} (no package vouches for it" in out
