"""The comparator: what counts as drift, and how severe."""

from __future__ import annotations

from typing import Any

from helpers import make_lock, probe_doc

from envlock.drift.compare import compare

TORCH: dict[str, Any] = {"version": "2.4.1+cu121", "cuda": "12.1", "cudnn": "9.1.0", "nccl": "2.20.5",
         "git_version": "a" * 40, "cxx11_abi": False}
GPU: dict[str, Any] = {"source": "nvml", "driver": "550.54.15", "cuda_driver": "12.4",
       "devices": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
                    "memory_total_mib": 81559, "uuid_sha256": "1" * 64}]}
DET: dict[str, Any] = {"torch_loaded": True, "deterministic_algorithms": False, "cudnn_benchmark": False,
       "cuda_matmul_allow_tf32": False, "num_threads": 8, "env": {}}


def _paths(a: Any, b: Any) -> dict[str, str]:
    return {d.path: d.severity for d in compare(a, b).differences}


def test_identical_locks_have_no_differences() -> None:
    a = make_lock(torch=TORCH, gpu=GPU, determinism=DET)
    assert compare(a, a).differences == ()
    assert compare(a, a).ok


def test_package_added_removed_changed_are_breaking() -> None:
    base = probe_doc()["packages"]
    a = make_lock()
    added = make_lock(packages=[*base, {"name": "requests", "version": "2.32.3"}])
    removed = make_lock(packages=base[:1])
    changed = make_lock(packages=[base[0], {**base[1], "version": "1.17.0"}])
    assert _paths(a, added) == {"packages.requests": "breaking"}
    assert _paths(a, removed) == {"packages.six": "breaking"}
    cmp = compare(a, changed)
    assert [d.describe() for d in cmp.differences] == ["six 1.16.0 -> 1.17.0"]
    assert not cmp.ok


def test_same_version_other_build_is_a_warning() -> None:
    base = probe_doc()["packages"]
    a = make_lock(packages=[base[0], {**base[1], "record_sha256": "a" * 64}])
    b = make_lock(packages=[base[0], {**base[1], "record_sha256": "b" * 64, "installer": "uv"}])
    assert _paths(a, b) == {"packages.six.record_sha256": "warning", "packages.six.installer": "info"}
    assert compare(a, b).ok


def test_torch_stack_and_driver() -> None:
    a = make_lock(torch=TORCH, gpu=GPU, determinism=DET)
    b = make_lock(torch={**TORCH, "cudnn": "9.3.0"}, determinism=DET,
                  gpu={**GPU, "driver": "560.28.03", "devices": [{**GPU["devices"][0], "uuid_sha256": "2" * 64}]})
    assert _paths(a, b) == {"torch.cudnn": "breaking", "gpu.driver": "warning"}


def test_determinism_flags_and_numerics_env_are_breaking() -> None:
    a = make_lock(torch=TORCH, determinism=DET)
    b = make_lock(torch=TORCH, determinism={**DET, "cudnn_benchmark": True, "num_threads": 4,
                                             "env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}})
    assert _paths(a, b) == {"determinism.cudnn_benchmark": "breaking", "determinism.num_threads": "warning",
                            "determinism.env.CUBLAS_WORKSPACE_CONFIG": "breaking"}


def test_knob_missing_in_one_torch_is_only_a_warning() -> None:
    a = make_lock(torch=TORCH, determinism={**DET, "fp32_precision": "ieee"})
    b = make_lock(torch=TORCH, determinism=DET)
    assert _paths(a, b) == {"determinism.fp32_precision": "warning"}


def test_python_patch_vs_minor() -> None:
    py = probe_doc()["python"]
    a = make_lock()
    assert _paths(a, make_lock(python={**py, "version": "3.11.9"})) == {"python.version": "warning"}
    assert _paths(a, make_lock(python={**py, "version": "3.12.1", "soabi": "cpython-312-x86_64-linux-gnu"})) == {
        "python.version": "breaking", "python.soabi": "breaking"}


def test_image_digest() -> None:
    a = make_lock(image={"source": "env", "in_container": True, "digest": "sha256:" + "a" * 64})
    b = make_lock(image={"source": "env", "in_container": True, "digest": "sha256:" + "b" * 64})
    assert _paths(a, b) == {"image.digest": "breaking"}
    assert compare(a, b, expected_image_change=True).ok
    host = make_lock()
    assert _paths(a, host)["image.digest"] == "warning"


def test_seeds_env_git() -> None:
    a = make_lock(seeds={"seed": 1234, "hash_randomization": True}, env={"CUDA_VISIBLE_DEVICES": "0"},
                  git={"commit": "a" * 40})
    b = make_lock(seeds={"hash_randomization": True}, env={"CUDA_VISIBLE_DEVICES": "1", "LD_PRELOAD": "x.so"},
                  git={"commit": "b" * 40})
    assert _paths(a, b) == {"seeds.seed": "breaking", "env.CUDA_VISIBLE_DEVICES": "info",
                            "env.LD_PRELOAD": "warning", "git.commit": "info"}


def test_canary_mismatch_is_numeric_drift() -> None:
    res = [{"name": "matmul", "device": "cpu", "dtype": "float32", "sha256": "a" * 64}]
    a = make_lock(canary={"results": res})
    b = make_lock(canary={"results": [{**res[0], "sha256": "b" * 64}]})
    cmp = compare(a, b)
    assert [(d.category, d.severity) for d in cmp.differences] == [("canary", "breaking")]
    assert "numeric drift" in cmp.differences[0].describe()


def test_most_severe_first() -> None:
    base = probe_doc()["packages"]
    a = make_lock(git={"commit": "a" * 40})
    b = make_lock(git={"commit": "b" * 40}, packages=base[:1])
    assert [d.severity for d in compare(a, b).differences] == ["breaking", "info"]
