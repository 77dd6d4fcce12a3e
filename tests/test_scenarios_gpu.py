"""Scenario matrix g: a GPU host, simulated with a stand-in libnvidia-ml.so.1.

tests/nvml_standin.c is built with gcc at test time and loaded through LD_LIBRARY_PATH (two
devices, the first in MIG mode). The probe runs in a fresh venv without nvidia-ml-py, so it
takes the ctypes path that restored containers take; then nvidia-ml-py is installed there and
the other path must give the same facts. The lock's [gpu] must be the stand-in's;
a hanging nvmlInit is bounded by ENVLOCK_NVML_TIMEOUT and a failing one is reported in NVML's
words; ``envlock run --gpus all`` finds the stand-in's driver and sends the engine a GPU request.
The real request cannot be satisfied here (no NVIDIA runtime): the engine's refusal, which
quotes the request, is the assertion, together with the request object itself.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from scenario_steps import Steps, build_nvml_standin, envlock, ok, uv_install, uv_venv

pytestmark = pytest.mark.integration

DRIVER = "580.82.07"  # mirrors tests/nvml_standin.c
EXPECTED_GPU = {
    "source": "nvml", "driver": DRIVER, "cuda_driver": "13.0",
    "devices": [
        {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0",
         "memory_total_mib": 81920, "mig_mode": True,
         "uuid_sha256": hashlib.sha256(b"GPU-11111111-2222-3333-4444-555555555555").hexdigest()},
        {"index": 1, "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
         "memory_total_mib": 81559, "mig_mode": False,
         "uuid_sha256": hashlib.sha256(b"GPU-66666666-7777-8888-9999-000000000000").hexdigest()},
    ],
}


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory holding the freshly built stand-in libnvidia-ml.so.1."""
    return build_nvml_standin(tmp_path_factory.mktemp("nvml"))


def _gpu_env(standin: Path, **extra: str) -> dict[str, str]:
    path = os.environ.get("LD_LIBRARY_PATH")
    return {"LD_LIBRARY_PATH": f"{standin}:{path}" if path else str(standin), "ENVLOCK_NVML_TIMEOUT": "3",
            **extra}


def test_g_simulated_gpu_host(tmp_path: Path, standin: Path, base_image: str, wheelhouse: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    steps = Steps("g GPU host (stand-in NVML)", capsys)
    venv = tmp_path / ".venv"
    with steps.step("setup"):
        uv_venv(venv)
        uv_install(venv, wheelhouse, "six==1.16.0")
        # The ctypes path is the one under test: nvidia-ml-py must not be importable there.
        res = subprocess.run([str(venv / "bin" / "python"), "-c", "import pynvml"], capture_output=True,
                             text=True, check=False, timeout=60)
        assert res.returncode != 0
    lock = tmp_path / "env.lock"
    gpu = _gpu_env(standin)
    with steps.step("capture"):
        ok(envlock("capture", "--python", str(venv), "-o", str(lock), cwd=tmp_path, env=gpu))
    doc = tomllib.loads(lock.read_text())
    assert doc["gpu"] == EXPECTED_GPU
    assert "gpu" not in doc.get("probe", {}).get("errors", {})
    with steps.step("verify"):
        assert "OK: the environment matches the lock" in ok(
            envlock("verify", str(lock), "--python", str(venv), cwd=tmp_path, env=gpu))
    with steps.step("change + verify"):
        # A driver update is a warning (numbers rarely change); --strict makes it drift.
        newer = _gpu_env(standin, STANDIN_NVML_DRIVER="590.10.01")
        out = ok(envlock("verify", str(lock), "--python", str(venv), cwd=tmp_path, env=newer))
        assert "gpu.driver" in out and "590.10.01" in out, out
        out = ok(envlock("verify", str(lock), "--strict", "--python", str(venv), cwd=tmp_path, env=newer), 1)
        assert "gpu.driver" in out, out

    with steps.step("nvmlInit hangs"):
        # Bounded by ENVLOCK_NVML_TIMEOUT (3 s here); the subprocess timeout is only the guard
        # that turns a hang into a failure instead of a stuck suite.
        hang = tmp_path / "hang.lock"
        ok(envlock("capture", "--python", str(venv), "-o", str(hang), cwd=tmp_path,
                   env=_gpu_env(standin, STANDIN_NVML_MODE="hang"), timeout=120))
        hung = tomllib.loads(hang.read_text())
        assert "gpu" not in hung
        assert hung["probe"]["errors"]["gpu"] == "NVML did not answer within 3s"
    with steps.step("nvmlInit fails"):
        failed = tmp_path / "failed.lock"
        ok(envlock("capture", "--python", str(venv), "-o", str(failed), cwd=tmp_path,
                   env=_gpu_env(standin, STANDIN_NVML_MODE="fail")))
        error = tomllib.loads(failed.read_text())["probe"]["errors"]["gpu"]
        assert error == "NVML unavailable: nvmlInit: Driver Not Loaded (NVML error 9)"
    with steps.step("nvidia-ml-py path"):
        # Where nvidia-ml-py is installed (the `gpu` extra) the probe uses it: same facts, same words.
        uv_install(venv, wheelhouse, "nvidia-ml-py")
        with_pynvml = tmp_path / "pynvml.lock"
        ok(envlock("capture", "--python", str(venv), "-o", str(with_pynvml), cwd=tmp_path, env=gpu))
        assert tomllib.loads(with_pynvml.read_text())["gpu"] == EXPECTED_GPU
        ok(envlock("capture", "--python", str(venv), "-o", str(with_pynvml), "--force", cwd=tmp_path,
                   env=_gpu_env(standin, STANDIN_NVML_MODE="fail")))
        error = tomllib.loads(with_pynvml.read_text())["probe"]["errors"]["gpu"]
        assert error == "NVML unavailable: Driver Not Loaded (NVML error 9)"

    common = [str(lock), "--base", base_image, "--wheelhouse", str(wheelhouse), "--name", "scenario-g"]
    with steps.step("restore"):
        assert "built in" in ok(envlock("restore", *common, "--no-cache", "--no-verify", cwd=tmp_path))
    with steps.step("verify inside"):
        # The container has no GPU and no driver library: the lock's GPUs are reported as not
        # visible (a warning), the software stack matches.
        out = ok(envlock("restore", *common, cwd=tmp_path))
        assert "OK: the environment matches the lock" in out and "no GPU visible now" in out, out
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    with steps.step("run --gpus none"):
        out = ok(envlock("run", *common, "--workspace", str(workspace), "--gpus", "none", "--", "python", "-c",
                         "import six; print('six', six.__version__)", cwd=tmp_path))
        assert "six 1.16.0" in out
    with steps.step("run --gpus all"):
        if Path("/proc/driver/nvidia/version").exists():
            pytest.fail("this host has a real NVIDIA driver; the stand-in cannot be what run finds")
        # Without a driver, --gpus all is refused before any container exists.
        res = envlock("run", *common, "--workspace", str(workspace), "--gpus", "all", "--", "true",
                      cwd=tmp_path)
        assert res.returncode == 3 and "no NVIDIA driver" in res.stderr, res.stderr
        # With the stand-in's driver the check passes and the request reaches the engine, which
        # (no NVIDIA container runtime here) refuses it, quoting the request.
        res = envlock("run", *common, "--workspace", str(workspace), "--gpus", "all", "--", "true",
                      cwd=tmp_path, env=gpu)
        assert res.returncode == 3, res.stdout + res.stderr
        assert "no NVIDIA driver" not in res.stderr
        assert 'could not select device driver "" with capabilities: [[gpu]]' in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
    with steps.step("driver check against CUDA 13.0"):
        _driver_check(lock, standin)


DRIVER_CHECK = """
import sys
from envlock.lock import load
from envlock.lock import TorchInfo
from envlock.errors import HostIncompatible
from envlock.restore.run import host_driver, resolve_gpus

# The captured lock, as if its venv held torch built for CUDA 13.0.
lock = load(sys.argv[1]).model_copy(update={"torch": TorchInfo(version="2.13.0+cu130", cuda="13.0")})
driver = host_driver()
try:
    print("driver", driver, "request", resolve_gpus(lock, "all", driver))
except HostIncompatible as exc:
    print("driver", driver, "refused:", exc.message)
"""


def _driver_check(lock: Path, standin: Path) -> None:
    """host_driver() reads the stand-in through NVML; CUDA 13.0 needs driver >= 580.65.06."""
    def check(**extra: str) -> str:
        # LD_LIBRARY_PATH is read when a process starts, so this runs in its own interpreter.
        env = {**os.environ, **_gpu_env(standin, **extra)}
        res = subprocess.run([sys.executable, "-c", DRIVER_CHECK, str(lock)], capture_output=True,
                             text=True, env=env, timeout=120, check=False)
        assert res.returncode == 0, res.stderr
        return res.stdout.strip()

    assert check() == f"driver {DRIVER} request ('all', [])"
    old = check(STANDIN_NVML_DRIVER="575.57.08")
    assert old.startswith("driver 575.57.08 refused:") and "cannot run CUDA 13.0" in old, old
    assert "580.65.06" in old


def test_g_gpu_requests_per_engine(docker_client: object) -> None:
    """What `--gpus` becomes for each engine: a DeviceRequest for Docker, CDI names for Podman."""
    from docker.types import DeviceRequest

    from envlock.restore.dockerengine import DockerEngine
    from envlock.restore.endpoint import connect

    engine = connect("docker")
    try:
        assert engine.name == "docker" and isinstance(engine, DockerEngine)
        assert engine._gpu_kwargs("all") == {"device_requests": [DeviceRequest(count=-1, capabilities=[["gpu"]])]}
        assert engine._gpu_kwargs("0,1") == {
            "device_requests": [DeviceRequest(device_ids=["0", "1"], capabilities=[["gpu"]])]}
    finally:
        engine.close()
    url = os.environ.get("ENVLOCK_TEST_PODMAN_HOST")
    if not url:
        return  # the Podman half needs Podman; the suite runs it wherever test.sh set Podman up
    podman = connect(url)
    try:
        assert podman.name == "podman" and isinstance(podman, DockerEngine)
        assert podman._gpu_kwargs("all") == {"devices": ["nvidia.com/gpu=all:nvidia.com/gpu=all:rwm"]}
    finally:
        podman.close()
