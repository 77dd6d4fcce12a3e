"""What the environment is versus what a process set (seeds, flags, variables set at run time).

A shell ``verify`` is a fresh process: it compares the environment and reports the recorded
process state; in-process ``envlock.verify()`` compares everything. The acceptance test runs
the README's own training example and then the README's own check.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, LockFactory, make_lock

from envlock.drift.compare import compare
from envlock.lock import Lock
from envlock.probe import env
from envlock.report.render import verify_text

TRAINED: dict[str, Any] = {
    "determinism": {"torch_loaded": True, "deterministic_algorithms": True,
                    "cudnn_deterministic": True, "env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8",
                                                         "ENVLOCK_SEED": "1234"},
                    "process_env": ["CUBLAS_WORKSPACE_CONFIG", "ENVLOCK_SEED"]},
    "seeds": {"seed": 1234, "seed_source": "envlock", "torch_initial_seed": 1234,
              "hash_randomization": True},
    "env": {"ENVLOCK_SEED": "1234"},
}
FRESH: dict[str, Any] = {
    "determinism": {"torch_loaded": True, "deterministic_algorithms": False,
                    "cudnn_deterministic": False, "env": {}},
    "seeds": {"hash_randomization": True},
    "env": {},
}


def test_shell_verify_reports_process_state_and_passes() -> None:
    cmp = compare(make_lock(**TRAINED), make_lock(**FRESH), process_state="report")
    assert cmp.ok and cmp.differences == ()
    paths = {d.path for d in cmp.process}
    assert {"determinism.deterministic_algorithms", "determinism.cudnn_deterministic",
            "determinism.env.CUBLAS_WORKSPACE_CONFIG", "seeds.seed", "seeds.torch_initial_seed"} <= paths
    # ENVLOCK_SEED is the seed itself: reported once, as seeds.seed, not again as a variable.
    assert not {"env.ENVLOCK_SEED", "determinism.env.ENVLOCK_SEED"} & paths
    text = verify_text(cmp, make_lock(**TRAINED), "env.lock")
    line = next(x for x in text.splitlines() if "process state recorded" in x)
    assert "seed 1234" in line and "deterministic algorithms on" in line
    assert "CUBLAS_WORKSPACE_CONFIG=:4096:8" in line and "envlock.apply()" in line
    assert text.rstrip().endswith("OK: the environment matches the lock")


def test_in_process_verify_still_compares_everything() -> None:
    cmp = compare(make_lock(**TRAINED), make_lock(**FRESH))
    breaking = {d.path for d in cmp.breaking}
    assert {"determinism.deterministic_algorithms", "seeds.seed",
            "determinism.env.CUBLAS_WORKSPACE_CONFIG"} <= breaking
    assert cmp.process == ()


def test_a_variable_set_before_start_is_environment_and_stays_compared() -> None:
    # The over-correction twin: CUBLAS_WORKSPACE_CONFIG exported by the shell (not in
    # process_env) is part of the environment; losing it is drift even from a shell.
    inherited = {**TRAINED, "determinism": {**TRAINED["determinism"], "process_env": ["ENVLOCK_SEED"]}}
    cmp = compare(make_lock(**inherited), make_lock(**FRESH), process_state="report")
    assert not cmp.ok
    assert [d.path for d in cmp.breaking] == ["determinism.env.CUBLAS_WORKSPACE_CONFIG"]
    # ...and so does anything else that is not process state: a package.
    pkgs = [{"name": "six", "version": "1.17.0", "installer": "pip", "requested": True}]
    cmp = compare(make_lock(**TRAINED), make_lock(**FRESH, packages=pkgs), process_state="report")
    assert {d.path for d in cmp.breaking} == {"packages.numpy", "packages.six.version"}


def test_python_hash_seed_is_environment_unless_the_process_set_it() -> None:
    locked = make_lock(seeds={"python_hash_seed": "0", "hash_randomization": False})
    now = make_lock(seeds={"hash_randomization": True})
    cmp = compare(locked, now, process_state="report")
    assert {d.path for d in cmp.breaking} == {"seeds.python_hash_seed", "seeds.hash_randomization"}
    # Fixed at interpreter start: the message says how to start the verify, not "removed".
    hint = next(d for d in cmp.breaking if d.path == "seeds.python_hash_seed")
    assert hint.describe() == "PYTHONHASHSEED=0 in the lock, unset here: run with PYTHONHASHSEED=0"
    diff = compare(locked, now, names=("a.lock", "b.lock"))
    assert next(d for d in diff.breaking if d.path == "seeds.python_hash_seed").describe() == "removed (was 0)"


def test_probe_tells_a_variable_set_at_run_time_from_an_inherited_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    if not os.path.exists("/proc/self/environ"):
        pytest.skip("the start-up environment is only known on Linux")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # set now, in this process
    names = env.process_set_env()
    assert "OMP_NUM_THREADS" in names
    # Inherited and untouched: environment. PATH is not a recorded variable at all.
    child = subprocess.run(
        [sys.executable, "-c", "from envlock.probe import env; print(env.process_set_env())"],
        env={**os.environ, "PYTHONPATH": str(REPO), "NVIDIA_TF32_OVERRIDE": "0"},
        capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "[]"


def _readme_training_code() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## Reproducible training in three lines", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README lost its training example"
    return match.group(1)


@pytest.mark.slow
def test_readme_training_workflow_then_shell_verify_exits_0(tmp_path: Path) -> None:
    import torch  # noqa: F401 - a pinned dev dependency: without it this test would check nothing, so fail

    code = _readme_training_code()
    assert "envlock.seed_everything(1234)" in code and 'envlock.capture().save("env.lock")' in code
    env = {k: v for k, v in os.environ.items()
           if "ENVLOCK_" not in k and k not in ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED")}
    env["PYTHONPATH"] = str(REPO)
    (tmp_path / "train.py").write_text(code)
    train = subprocess.run([sys.executable, "-W", "ignore", "train.py"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert train.returncode == 0, train.stderr
    # The README's next step, from a shell.
    res = subprocess.run([sys.executable, "-m", "envlock", "verify", "env.lock"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "process state recorded" in res.stdout and "seed 1234" in res.stdout
    assert "deterministic algorithms on" in res.stdout
    assert "BREAKING" not in res.stdout


# -- restore and run: the image carries the environment, `envlock run` adds the process state --


def _trained_restore_lock(restore_lock: LockFactory) -> Lock:
    return restore_lock(determinism={"env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "ENVLOCK_SEED": "1234",
                                             "OMP_NUM_THREADS": "4"},
                                     "process_env": ["CUBLAS_WORKSPACE_CONFIG", "ENVLOCK_SEED"]})


def test_image_env_holds_what_was_set_before_start_only(restore_lock: LockFactory) -> None:
    from envlock.restore.context import plan
    from envlock.restore.dockerfile import dockerfile
    from envlock.restore.image import Options, numerics_env

    lock = _trained_restore_lock(restore_lock)
    df = dockerfile(plan(lock, Options(base="python@sha256:" + "a" * 64)))
    assert 'ENV OMP_NUM_THREADS="4"' in df and "CUBLAS_WORKSPACE_CONFIG" not in df
    assert numerics_env(lock, process=True) == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "ENVLOCK_SEED": "1234"}
    assert numerics_env(lock, process=False) == {"OMP_NUM_THREADS": "4"}


@pytest.mark.integration
def test_run_passes_the_recorded_process_variables(restore_lock: LockFactory, docker_client: Any,
                                                   base_image: str, tmp_path: Path,
                                                   capfd: pytest.CaptureFixture[str]) -> None:
    from envlock.restore.endpoint import connect
    from envlock.restore.run import RunOptions, run_in_image

    lock = _trained_restore_lock(restore_lock)
    image_id = docker_client.images.get(base_image).id
    code = "import os; print('env', os.environ.get('CUBLAS_WORKSPACE_CONFIG'), os.environ.get('ENVLOCK_SEED'))"
    engine = connect("docker")
    try:
        rc = run_in_image(engine, lock, image_id, base_image,
                          RunOptions(command=["python3", "-c", code], gpus="none", workspace=tmp_path),
                          python="python3")
    finally:
        engine.close()
    assert rc == 0
    assert "env :4096:8 1234" in capfd.readouterr().out
