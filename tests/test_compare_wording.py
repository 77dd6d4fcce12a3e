"""What compare() says: diff speaks of A and B, --strict agrees with itself, nothing twice,
and only what was probed is compared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers import make_lock, probe_doc, run_cli

from envlock import lock as lockio
from envlock.drift.compare import compare
from envlock.lock import Lock
from envlock.report.render import verify_text

TORCH = {"version": "2.4.1", "git_version": "a" * 40}
DET = {"torch_loaded": True, "deterministic_algorithms": False, "num_threads": 8,
       "num_interop_threads": 8, "env": {}}
GPU = {"source": "nvml", "driver": "550.54.15",
       "devices": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]}
CANARY = {"version": 1, "results": [{"name": "matmul", "device": "cpu", "dtype": "float32", "sha256": "1" * 64}]}
VERIFY_WORDS = ("installed", "the lock", "this environment", "this capture", " here", " now")


def test_diff_speaks_of_a_and_b() -> None:
    base = probe_doc()["packages"]
    a = make_lock(torch=TORCH, determinism=DET, gpu=GPU, canary=CANARY,
                  image={"source": "cli", "digest": "sha256:" + "a" * 64})
    b = make_lock(packages=[base[0], {"name": "requests", "version": "2.32.3"}],
                  canary={**CANARY, "results": [], "errors": {"matmul[cpu,float32]": "boom"}})
    cmp = compare(a, b, names=("a.lock", "b.lock"))
    messages = {d.path: d.describe() for d in cmp.differences}
    assert messages["packages.requests"] == "requests 2.32.3 only in b.lock"
    assert messages["packages.six"] == "six 1.16.0 only in a.lock"
    assert messages["image.digest"] == "a.lock names an image, b.lock names none"
    assert messages["gpu"] == "no GPU in b.lock"
    assert messages["canary.matmul[cpu,float32]"] == "matmul on cpu (float32) failed in b.lock: boom"
    assert messages["torch"] == "removed (was 2.4.1)"
    for message in messages.values():
        assert not any(w in message for w in VERIFY_WORDS), message
    # verify keeps its own words
    plain = {d.path: d.describe() for d in compare(a, b).differences}
    assert plain["packages.requests"] == "requests 2.32.3 is installed but not in the lock"


def test_diff_cli_names_the_files(tmp_path: Path) -> None:
    base = probe_doc()["packages"]
    a = lockio.save(make_lock(), tmp_path / "a.lock")
    b = lockio.save(make_lock(packages=[*base, {"name": "requests", "version": "2.32.3"}]), tmp_path / "b.lock")
    res = run_cli("diff", "a.lock", "b.lock", cwd=tmp_path)
    assert res.returncode == 1 and "requests 2.32.3 only in b.lock" in res.stdout
    assert "installed" not in res.stdout
    assert a.exists() and b.exists()


def test_strict_verdict_agrees_with_itself() -> None:
    a = make_lock(gpu=GPU)
    b = make_lock(gpu={**GPU, "driver": "560.28.03"})
    lenient, strict = compare(a, b), compare(a, b, strict=True)
    assert lenient.ok and not strict.ok
    assert strict.to_dict()["ok"] is False and strict.to_dict()["strict"] is True
    text = verify_text(strict, a, "env.lock")
    assert "OK" not in text and "DRIFT" in text and "--strict" in text
    assert "OK: the environment matches the lock" in verify_text(lenient, a, "env.lock")


def test_verify_strict_cli_prints_what_it_exits(tmp_path: Path) -> None:
    res = run_cli("capture", "--no-torch", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    path = tmp_path / "env.lock"
    lock = lockio.load(path)
    # A warning-level difference: same libc family, another release.
    edited = lock.model_copy(update={"platform": lock.platform.model_copy(update={"libc_version": "0.1"})})
    lockio.save(edited, path)
    res = run_cli("verify", "--no-torch", "--strict", cwd=tmp_path)
    assert res.returncode == 1 and "OK" not in res.stdout and "DRIFT" in res.stdout, res.stdout
    js = run_cli("verify", "--no-torch", "--strict", "--json", cwd=tmp_path)
    assert js.returncode == 1 and json.loads(js.stdout)["ok"] is False
    lenient = run_cli("verify", "--no-torch", cwd=tmp_path)
    assert lenient.returncode == 0 and "OK" in lenient.stdout


def test_no_torch_compares_only_what_was_probed() -> None:
    a = make_lock(torch=TORCH, determinism=DET,
                  seeds={"seed": 1, "seed_source": "envlock", "torch_initial_seed": 1, "hash_randomization": True})
    b = make_lock(determinism={"torch_loaded": False, "env": {}},
                  seeds={"seed": 1, "seed_source": "envlock", "hash_randomization": True},
                  probe={"version": 1, "errors": {"torch": "skipped (--no-torch)"}})
    paths = sorted(d.path for d in compare(a, b).differences)
    assert paths == ["determinism", "torch"]
    assert compare(a, b).ok


def test_no_torch_cli_on_a_torch_lock(tmp_path: Path) -> None:
    import torch  # noqa: F401  # a pinned dev dependency: missing is a failure, not a skip

    assert run_cli("capture", cwd=tmp_path).returncode == 0
    res = run_cli("verify", "--no-torch", "--all", cwd=tmp_path)
    assert res.returncode == 0, res.stdout
    assert "num_threads" not in res.stdout and "torch_initial_seed" not in res.stdout


def test_a_variable_is_reported_once() -> None:
    env_a = {"OMP_NUM_THREADS": "4", "NCCL_DEBUG": "INFO"}
    canary_a = {**CANARY, "settings": {"env.OMP_NUM_THREADS": "4", "num_threads": 4, "mkl_available": True}}
    canary_b = {**CANARY, "settings": {"num_threads": 8, "mkl_available": False}}
    a = make_lock(torch=TORCH, env=env_a, determinism={**DET, "num_threads": 4, "env": {"OMP_NUM_THREADS": "4"}},
                  canary=canary_a)
    b = make_lock(torch=TORCH, env={"NCCL_DEBUG": "INFO"}, determinism={**DET, "num_threads": 8}, canary=canary_b)
    paths = [d.path for d in compare(a, b).differences]
    assert [p for p in paths if "OMP_NUM_THREADS" in p] == ["determinism.env.OMP_NUM_THREADS"]
    assert [p for p in paths if "num_threads" in p and "env" not in p] == ["determinism.num_threads"]
    # a setting recorded nowhere else is still reported
    assert "canary.settings.mkl_available" in paths


def test_seed_variables_are_reported_once_as_seeds() -> None:
    def lock(seed: int, hash_seed: str) -> Lock:
        env = {"PYTHONHASHSEED": hash_seed, "ENVLOCK_SEED": str(seed)}
        return make_lock(env={**env, "ENVLOCK_SEED_SOURCE": "envlock"},
                         determinism={"torch_loaded": False, "env": env},
                         seeds={"seed": seed, "seed_source": "envlock", "python_hash_seed": hash_seed,
                                "hash_randomization": False})
    paths = sorted(d.path for d in compare(lock(5, "1"), lock(6, "2")).differences)
    assert paths == ["seeds.python_hash_seed", "seeds.seed"]


def test_a_count_of_one_is_singular(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    """"1 outputs", "1 breaking difference(s)", "0 warning": every count reads as English."""
    import sys

    from envlock.commands import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["record", "r.record", "--output", "x", "--", sys.executable, "-c", "open('x', 'w').write('1')"]) == 0
    assert "envlock: recorded 0 steps, 1 output and 0 inputs in r.record" in capsys.readouterr().err
    old = make_lock(packages=[{"name": "six", "version": "1.16.0"}])
    text = verify_text(compare(old, make_lock(packages=[{"name": "six", "version": "1.17.0"}])), old, "env.lock")
    assert text.splitlines()[0].endswith(": 1 breaking, 0 warnings, 0 info")
    assert text.splitlines()[-1] == "DRIFT: 1 breaking difference"
    assert "# 1 distribution, sorted by name." in lockio.dumps(old)
    # twin: other counts keep their plural
    two = make_lock(packages=[{"name": "six", "version": "1.16.0"}, {"name": "idna", "version": "3.10"}])
    assert "# 2 distributions, sorted by name." in lockio.dumps(two)
    text = verify_text(compare(two, make_lock()), two, "env.lock")
    assert text.splitlines()[-1] == "DRIFT: 2 breaking differences"
