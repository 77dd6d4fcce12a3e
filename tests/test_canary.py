"""The numeric canary: stable bytes in one environment, drift caught where versions match."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import run_cli

from envlock import lock as lockio
from envlock import runtime
from envlock.check.local import verify
from envlock.drift.compare import compare
from envlock.lock import Canary, Lock, seal
from envlock.probe import kernels
from envlock.probe.collect import run_canary
from envlock.probing.capture import capture
from envlock.runtime import knobs

CANARY_PATH = Path(__file__).resolve().parent.parent / "envlock" / "probe" / "kernels.py"
KERNELS = {("matmul", "float32"), ("matmul_large", "float32"), ("matmul", "bfloat16"),
           ("matmul_large", "bfloat16"), ("conv2d", "float32"), ("conv2d", "bfloat16"),
           ("softmax", "float32"), ("layer_norm", "float32"), ("sum", "float32"),
           ("sum_dim", "float32")}


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Knobs, variables and RNG put back after the test; an empty cwd so captures skip git."""
    env = dict(os.environ)
    flags = knobs.read_state(torch)
    rng = torch.get_rng_state()
    mkldnn = torch.backends.mkldnn.enabled
    monkeypatch.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.environ.clear()
        os.environ.update(env)
        torch.backends.mkldnn.enabled = mkldnn
        assert not knobs.write_state(torch, flags)
        torch.set_rng_state(rng)


def _hashes(c: Canary) -> dict[tuple[str, str, str], str]:
    return {(r.name, r.device, r.dtype): r.sha256 for r in c.results}


def test_canary_covers_every_kernel_on_cpu_and_is_bit_identical_across_runs() -> None:
    # Its cost is measured by `python benchmarks/inproc.py canary`, not asserted here: a timed
    # assertion fails on a loaded machine and says nothing about correctness.
    first = runtime.canary(["cpu"])
    assert {(r.name, r.dtype) for r in first.results} == KERNELS
    assert {r.device for r in first.results} == {"cpu"} and not first.errors
    assert first.torch == torch.__version__ and first.version == 1
    assert first.settings["num_threads"] == torch.get_num_threads()
    assert first.settings["mkldnn_enabled"] is True
    for _ in range(2):
        assert _hashes(runtime.canary(["cpu"])) == _hashes(first)
    # The probe's own entry point (what capture --canary runs) gives the same bytes.
    doc = run_canary(torch)
    assert doc is not None
    assert {k: v for k, v in _hashes(Canary.model_validate(doc)).items() if k[1] == "cpu"} == _hashes(first)


def test_canary_leaves_the_process_as_it_found_it() -> None:
    rng = torch.get_rng_state()
    flags = knobs.read_state(torch)
    runtime.canary(["cpu"])
    assert torch.equal(torch.get_rng_state(), rng)
    assert knobs.read_state(torch) == flags


def test_a_device_that_fails_is_reported_not_fatal() -> None:
    if torch.cuda.is_available():
        pytest.skip("needs a torch without usable CUDA")
    c = runtime.canary(["cpu", "cuda:0"])
    assert {r.device for r in c.results} == {"cpu"}
    # Every kernel of the failed device is listed, with why, so no hash goes missing unexplained.
    assert len(c.errors) == len(KERNELS) and all("[cuda:0," in key for key in c.errors)


def test_canary_file_is_stdlib_and_torch_only_and_python38_syntax() -> None:
    source = CANARY_PATH.read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imports = {n.names[0].name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)}
    imports |= {n.module.split(".")[0] for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}  # not the probe's own
    assert imports - set(sys.stdlib_module_names) == {"torch"}


def _flip_mkldnn() -> set[tuple[str, str]]:
    """Turn oneDNN off; the (kernel, dtype) pairs that must drift on this CPU.

    fp32 conv2d goes through oneDNN whenever it is on (batch 2 > 1 meets ATen's rule for using
    it on any x86-64), and ATen's own im2col path sums in another order, so it drifts on every
    x86-64. bf16 matmuls go through oneDNN only where torch's bf16 check passes (AVX-512 core or
    newer: AVX-512 Xeons, AMD Zen 4); on an AVX2-only CPU they never used oneDNN, so turning it
    off cannot move them.
    """
    expected = {("conv2d", "float32")}
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        expected |= {("matmul", "bfloat16"), ("matmul_large", "bfloat16")}
    mkldnn: Any = torch.backends.mkldnn  # torch types `enabled` as its descriptor, not as a bool
    mkldnn.enabled = False
    return expected


def _full_sum(threads: int) -> float:
    torch.set_num_threads(threads)
    return float(kernels._inputs(torch)["r"].sum())  # a finite float: equal means same bits


def _threads_that_change_sum() -> set[tuple[str, str]]:
    """Set a thread count under which the canary's full sum gives other bytes than now.

    torch splits that reduction into per-thread chunks, so the bytes follow the thread count,
    but which counts agree depends on the vector width (with AVX2 and AVX-512 1, 2, 4, 8 and 16
    agree, 3 and 5 do not, see docs/runtime.md) and the host's default count differs per CI
    machine. So the count is chosen by summing the canary's own input directly, not through
    the canary or verify, which are what the test checks.
    """
    now = torch.get_num_threads()
    here = _full_sum(now)
    for n in (3, 5, 7, 6, 2, 1):
        if n != now and _full_sum(n) != here:
            return {("sum", "float32")}  # n threads stay set
    torch.set_num_threads(now)
    pytest.fail(f"no thread count changes the full sum's bytes from {now} threads")


@pytest.mark.parametrize(("knob", "also_breaking"), [
    # The thread count is only a warning (defaults differ per host): the canary alone fails.
    (_threads_that_change_sum, set()),
    # mkldnn.enabled is a recorded flag too, so verify names it beside the numeric drift.
    (_flip_mkldnn, {"determinism.mkldnn_enabled"}),
])
def test_verify_catches_numeric_drift_that_versions_miss(
        isolated: Path, knob: Any, also_breaking: set[str]) -> None:
    lock = capture(canary=True)
    drifting: set[tuple[str, str]] = knob()
    cmp = verify(lock)
    assert not cmp.ok
    # Every version still matches; the bytes do not.
    numeric = [d for d in cmp.breaking if d.category == "canary"]
    assert {d.path for d in cmp.breaking if d.category != "canary"} == also_breaking
    # canary.<kernel>[<device>,<dtype>]
    seen = {(d.path.split(".")[1].split("[")[0], d.path.split(",")[-1].rstrip("]")) for d in numeric}
    assert drifting <= seen, (drifting, seen, torch.backends.cpu.get_cpu_capability())
    assert all(d.message.startswith("numeric drift:") for d in numeric)
    assert "settings differ" in numeric[0].message


@pytest.fixture(scope="module")
def canary_lock(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lock with a canary, captured by the CLI in a fresh process."""
    where = tmp_path_factory.mktemp("canary-lock")
    out = run_cli("capture", "--canary", "-o", "env.lock", cwd=where)
    assert out.returncode == 0, out.stderr
    return where / "env.lock"


def _envlock(*args: str, cwd: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "envlock", *args], cwd=cwd, text=True,
                            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_cli_verify_reports_numeric_drift_from_a_cpu_isa_override(canary_lock: Path) -> None:
    """ATEN_CPU_CAPABILITY picks torch's vectorised kernels, as a host with another CPU would."""
    lock = lockio.load(canary_lock)
    assert lock.canary is not None and len(lock.canary.results) >= len(KERNELS)
    # Two fresh processes at once: the canary as-is, and verify under the override.
    same = _envlock("canary", "--against", canary_lock.name, cwd=canary_lock.parent)
    drift = _envlock("verify", canary_lock.name, "--json", cwd=canary_lock.parent,
                     ATEN_CPU_CAPABILITY="default")
    same_out, _ = same.communicate(timeout=240)
    drift_out, _ = drift.communicate(timeout=240)
    assert same.returncode == 0, same_out  # bit-identical in another process
    assert "OK: same bytes" in same_out
    assert drift.returncode == 1
    breaking = [d for d in json.loads(drift_out)["differences"] if d["severity"] == "breaking"]
    # Same packages, same torch: the canary sees the numbers move, and the recorded variable
    # says why.
    assert {d["category"] for d in breaking} == {"canary", "determinism"}
    assert [d["path"] for d in breaking if d["category"] == "determinism"] == [
        "determinism.env.ATEN_CPU_CAPABILITY"]
    numeric = [d for d in breaking if d["category"] == "canary"]
    assert "softmax" in {d["path"].split(".")[1].split("[")[0] for d in numeric}
    # The message names the settings that explain it.
    assert "cpu_capability" in numeric[0]["message"]
    assert "env.ATEN_CPU_CAPABILITY - -> default" in numeric[0]["message"]


@pytest.mark.slow
def test_cli_canary_against_a_lock(canary_lock: Path, tmp_path: Path) -> None:
    drift = _envlock("canary", "--against", str(canary_lock), "--json", cwd=tmp_path,
                     ATEN_CPU_CAPABILITY="default")
    plain = capture(torch=False, cwd=str(tmp_path))
    plain.save(tmp_path / "plain.lock")
    out = run_cli("canary", "--against", "plain.lock", cwd=tmp_path)
    assert out.returncode == 2 and "no [canary] table" in out.stderr
    drift_out, _ = drift.communicate(timeout=240)
    assert drift.returncode == 1
    doc = json.loads(drift_out)
    assert Canary.model_validate(doc["canary"]).settings["env.ATEN_CPU_CAPABILITY"] == "default"
    assert doc["comparison"]["ok"] is False
    assert {d["category"] for d in doc["comparison"]["differences"]} == {"canary"}


def _with_canary(lock: Lock, canary: Canary) -> Lock:
    return seal(lock.model_copy(update={"canary": canary}))


def test_compare_canary_versions_errors_and_lock_round_trip() -> None:
    base = capture(torch=False, cwd="/")
    c = runtime.canary(["cpu"])
    old = _with_canary(base, c)
    newer = _with_canary(base, c.model_copy(update={"version": 2, "results": []}))
    [diff] = compare(old, newer).differences
    assert (diff.severity, diff.path) == ("warning", "canary.version")
    failed = c.model_copy(update={"results": c.results[1:], "errors": {
        f"{c.results[0].name}[cpu,{c.results[0].dtype}]": "RuntimeError: not supported"}})
    [diff] = compare(old, _with_canary(base, failed)).differences
    assert diff.severity == "warning" and "failed here: RuntimeError" in diff.message
    # The [canary] table, errors included, survives TOML.
    again = lockio.loads(lockio.dumps(_with_canary(base, failed)))
    assert again.canary == failed


def test_canary_in_a_lock_is_outside_the_fingerprint() -> None:
    base = capture(torch=False, cwd="/")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = _with_canary(base, runtime.canary(["cpu"]))
    assert a.envlock.fingerprint == seal(base).envlock.fingerprint


def test_cli_canary_runs_in_the_environment_capture_would_lock(tmp_path: Path) -> None:
    # Installed as a tool, envlock's own venv is not the project's: `envlock canary` must pick
    # the project's .venv as capture does. This one has no torch, so the canary cannot run there
    # (before, it ran in envlock's own interpreter and hashed that torch instead).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / ".venv")], check=True)
    out = run_cli("canary", cwd=tmp_path, env={"VIRTUAL_ENV": ""})
    assert out.returncode == 3, out.stdout + out.stderr
    assert "./.venv (.venv in the working directory)" in out.stderr
