"""The probe's NVML code against the stand-in libnvidia-ml.so.1, without containers (fast).

Each case runs in its own interpreter: LD_LIBRARY_PATH is read when a process starts. A
``pynvml`` module that fails to import is put first on the path, so the ctypes path is the one
exercised whatever the test venv holds (scenario g covers nvidia-ml-py too).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO
from scenario_steps import build_nvml_standin

from envlock.probe import gpu

QUERY = """
import json, sys, time
from envlock.probe.gpu import collect_gpu
from envlock.restore.run import host_driver
t0 = time.monotonic()
info, error = collect_gpu(None, float(sys.argv[1]))
print(json.dumps({"info": info, "error": error, "seconds": time.monotonic() - t0,
                  "driver": host_driver() if sys.argv[2] == "driver" else None}))
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    lib = build_nvml_standin(tmp_path_factory.mktemp("nvml"))
    shadow = tmp_path_factory.mktemp("no-pynvml")
    (shadow / "pynvml.py").write_text("raise ImportError('nvidia-ml-py is hidden for this test')\n")
    path = os.pathsep.join(filter(None, [str(shadow), str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "LD_LIBRARY_PATH": str(lib), "PYTHONPATH": path, "ENVLOCK_NVML_TIMEOUT": "1"}


def _query(env: dict[str, str], timeout: float = 5, driver: bool = False, **extra: str) -> dict[str, object]:
    res = subprocess.run([sys.executable, "-c", QUERY, str(timeout), "driver" if driver else "-"],
                         env={**env, **extra}, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    out: dict[str, object] = json.loads(res.stdout)
    return out


def test_two_devices_one_in_mig_mode(env: dict[str, str]) -> None:
    out = _query(env, driver=True)
    info = out["info"]
    assert isinstance(info, dict) and out["error"] is None
    assert (info["source"], info["driver"], info["cuda_driver"]) == ("nvml", "580.82.07", "13.0")
    assert [(d["name"], d["compute_capability"], d["memory_total_mib"], d["mig_mode"]) for d in info["devices"]] == [
        ("NVIDIA A100-SXM4-80GB", "8.0", 81920, True), ("NVIDIA H100 80GB HBM3", "9.0", 81559, False)]
    assert all("uuid" not in d and len(d["uuid_sha256"]) == 64 for d in info["devices"])
    assert out["driver"] == "580.82.07"  # what `envlock run` checks against the lock's CUDA


def test_a_failing_init_is_reported_in_nvmls_words(env: dict[str, str]) -> None:
    out = _query(env, STANDIN_NVML_MODE="fail")
    assert out["info"] is None
    assert out["error"] == "NVML unavailable: nvmlInit: Driver Not Loaded (NVML error 9)"


@pytest.mark.slow
def test_a_hanging_init_is_cut_off_at_the_timeout(env: dict[str, str]) -> None:
    out = _query(env, timeout=1, driver=True, STANDIN_NVML_MODE="hang")
    assert out["info"] is None and out["error"] == "NVML did not answer within 1s"
    assert out["driver"] is None  # nor does a wedged driver hang `envlock run`'s check


def test_no_library_at_all(env: dict[str, str], tmp_path: Path) -> None:
    out = _query({**env, "LD_LIBRARY_PATH": str(tmp_path)})
    assert out["info"] is None
    if os.path.exists(gpu.DRIVER_PROC):  # a driver without its library: worth saying
        assert str(out["error"]).startswith("NVML unavailable: OSError: libnvidia-ml.so.1")
    else:  # a host without an NVIDIA driver: no GPU, quietly
        assert out["error"] is None


@pytest.mark.parametrize("driver", [False, True])
def test_a_missing_library_is_quiet_only_without_a_driver(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, driver: bool) -> None:
    proc = tmp_path / "version"
    if driver:
        proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.82.07\n")
    monkeypatch.setattr(gpu, "DRIVER_PROC", str(proc))

    def missing() -> None:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(gpu, "_nvml_query", missing)
    info, error = gpu.collect_gpu(None, 5)
    assert info is None
    assert (error is not None and error.startswith("NVML unavailable: OSError")) if driver else error is None


def test_the_standin_reports_other_gpus_and_driver_cuda_when_asked(env: dict[str, str]) -> None:
    """What the device-against-build checks run on: another GPU generation, an older driver."""
    out = _query(env, STANDIN_NVML_CC="7.0,12.1", STANDIN_NVML_CUDA="12040")
    info = out["info"]
    assert isinstance(info, dict) and info["cuda_driver"] == "12.4"
    assert [d["compute_capability"] for d in info["devices"]] == ["7.0", "12.1"]
