"""The runtime end to end, in fresh processes, as a training job and a later check would run.

1. a training process seeds, goes deterministic and captures;
2. ``envlock verify`` from a shell (a fresh process: no seed, default flags) exits 0 and
   reports the seed and flags as recorded process state;
3. a fresh process that calls ``envlock.apply(lock)`` then passes the strict in-process
   ``envlock.verify``, which fails without ``apply``;
4. the example trains bit-identically twice with one seed, and differently with another.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch  # noqa: F401 - a pinned dev dependency: without it these tests would check nothing
from helpers import REPO

from envlock import lock as lockio

# Each test runs training scripts in fresh interpreters that import torch: tens of seconds.
pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "train_mnist_like.py"

CAPTURE = """
import envlock
envlock.seed_everything(1234)
envlock.deterministic()
envlock.capture(canary=True).save("env.lock")
"""

APPLY = """
import json, warnings
import envlock
lock = envlock.load("env.lock")
with warnings.catch_warnings():
    warnings.simplefilter("error")  # apply must not need to warn: everything can be matched
    result = envlock.apply(lock)
print(json.dumps({"apply": result.to_dict(), "verify": envlock.verify(lock).to_dict()}))
"""

NO_APPLY = """
import json
import envlock
print(json.dumps(envlock.verify("env.lock").to_dict()))
"""


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without anything the runtime sets, as a fresh login shell would have."""
    drop = ("PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "RANK")
    env = {k: v for k, v in os.environ.items() if k not in drop and "ENVLOCK_" not in k}
    env.update(extra)
    return env


def _start(argv: list[str], cwd: Path, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, cwd=cwd, env=_clean_env(**extra), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_capture_then_verify_in_a_fresh_process_then_apply(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", CAPTURE], cwd=tmp_path, env=_clean_env(),
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    assert "PYTHONHASHSEED" in out.stderr  # warned once: it cannot be set from inside
    lock = lockio.load(tmp_path / "env.lock")
    assert lock.seeds.seed == 1234 and lock.seeds.torch_initial_seed == 1234
    det = lock.determinism
    assert det.deterministic_algorithms is True and det.deterministic_warn_only is False
    assert det.cudnn_deterministic is True and det.cudnn_benchmark is False
    assert det.cuda_matmul_allow_tf32 is False and det.cudnn_allow_tf32 is False
    assert det.float32_matmul_precision == "highest"
    assert det.env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and det.late == []

    verify = _start([sys.executable, "-m", "envlock", "verify", "env.lock", "--json"], tmp_path)
    apply = _start([sys.executable, "-c", APPLY], tmp_path)
    strict = _start([sys.executable, "-c", NO_APPLY], tmp_path)
    verify_out, verify_err = verify.communicate(timeout=240)
    apply_out, apply_err = apply.communicate(timeout=240)
    strict_out, strict_err = strict.communicate(timeout=240)

    # The shell compares the environment; what the training process set is reported.
    assert verify.returncode == 0, verify_out + verify_err
    report = json.loads(verify_out)
    assert report["ok"] is True and report["counts"]["breaking"] == 0, report["differences"]
    recorded = {d["path"] for d in report["process_state"]}
    assert {"determinism.deterministic_algorithms", "determinism.cudnn_deterministic",
            "determinism.env.CUBLAS_WORKSPACE_CONFIG", "seeds.seed"} <= recorded
    # deterministic() changes flags, not CPU bytes: the canary agrees (see docs/runtime.md).
    assert not {d["path"] for d in report["differences"]
                if d["path"].startswith("canary") and d["severity"] != "info"}

    # In-process, without apply(): strict, so the missing seed and flags are drift.
    assert strict.returncode == 0, strict_err
    strict_report = json.loads(strict_out)
    breaking = {d["path"] for d in strict_report["differences"] if d["severity"] == "breaking"}
    assert strict_report["ok"] is False
    assert {"determinism.deterministic_algorithms", "seeds.seed"} <= breaking

    assert apply.returncode == 0, apply_err
    report = json.loads(apply_out)
    assert report["apply"]["ok"] is True and report["apply"]["not_applied"] == []
    assert report["verify"]["ok"] is True, report["verify"]["differences"]


def test_example_is_bit_identical_per_seed(tmp_path: Path) -> None:
    # One thread each: three runs share two cores; the thread count is the same in all three.
    runs = [(seed, _start([sys.executable, str(EXAMPLE), "--seed", str(seed), "--epochs", "1",
                           *extra], tmp_path, OMP_NUM_THREADS="1"))
            for seed, extra in ((7, ["--lock", "run.lock"]), (7, []), (8, []))]
    hashes = []
    for seed, proc in runs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        result = json.loads(out)
        assert result["seed"] == seed
        hashes.append(result["weights_sha256"])
    assert hashes[0] == hashes[1]
    assert hashes[2] != hashes[0]
    lock = lockio.load(tmp_path / "run.lock")
    assert lock.seeds.seed == 7 and lock.determinism.deterministic_algorithms is True
