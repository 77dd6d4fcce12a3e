"""The README's training workflow, as written, end to end, with a real engine and real torch (CPU).

A project with ``.venv`` and envlock installed from a checkout into it (``pip install
/path/to/envlock``, and ``pip install -e``), the README's example as ``train.py``; every command
is the venv's ``envlock`` console script, run as a researcher would: ``capture`` at the project's
root, ``verify`` and ``restore`` from a subdirectory (the lock is found upward), then ``envlock run
env.lock --record run.record --output model.pt -- python train.py ...`` and ``envlock run env.lock
--replay run.record``: exit 0, every loss bit-identical, and the host's ``env.lock`` byte for byte
as it was, although train.py saves its own capture to ``env.lock``. A replay with one numerics
change (another thread count) exits 1 and names the first diverging step and the lock difference
beside it. ``envlock bundle`` of the lock needs no ``--skip-local``: envlock's own wheel goes in.
The seconds of capture, restore, run --record and replay are printed.

The options beside the README's commands are this machine's, not the workflow's: the test base
image (the host's Python differs from any image's, so the venv goes onto a base) and the offline
wheelhouse (containers reach no index).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomllib
from helpers import REPO
from test_one_id_integration import purge
from test_replay_integration import numerics_change
from test_replay_workflow_integration import house  # noqa: F401  (module fixture)
from test_setups_integration import Steps, checkout, shell_env, wheels  # noqa: F401  (module fixtures)

from envlock.replay.record import load as load_record

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _envlock(venv: Path, *args: str, cwd: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    """The venv's ``envlock`` console script, as typed in a shell in ``cwd`` (not activated:
    the project's ``.venv`` is found from the working directory)."""
    env = {**shell_env(cwd), "XDG_CACHE_HOME": str(cache), "ENVLOCK_PLAIN_PROGRESS": "1"}
    return subprocess.run([str(venv / "bin" / "envlock"), *args], cwd=cwd, env=env, timeout=1800,
                          capture_output=True, text=True, check=False)


def _project(tmp_path: Path, house: Path, checkout: Path, install: str) -> tuple[Path, Path]:  # noqa: F811
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q", str(project)], check=True, timeout=60)
    venv = project / ".venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
           "--disable-pip-version-check", "--find-links", str(house)]
    subprocess.run([*pip, "torch==2.13.0+cpu", "setuptools>=68"], check=True, timeout=1200,
                   env=shell_env(project))
    how = ["--no-build-isolation", "-e", str(checkout)] if install == "editable" else [str(checkout)]
    subprocess.run([*pip, *how], check=True, timeout=600, env=shell_env(project))
    shutil.copy(REPO / "examples" / "train_mnist_like.py", project / "train.py")
    return project, venv


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("install", ["checkout", "editable"])
def test_the_readme_workflow_records_and_replays_bit_identically(
        install: str, tmp_path: Path, house: Path, checkout: Path, base_image: str,  # noqa: F811
        docker_client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    steps = Steps(f"README workflow, envlock installed from a checkout{' (-e)' if install == 'editable' else ''}")
    cache = tmp_path / "cache"
    name = f"r19flow-readme-{install}"
    with steps("setup"):
        project, venv = _project(tmp_path, house, checkout, install)
    sub = project / "experiments"
    sub.mkdir()

    def envlock(*args: str, cwd: Path = project) -> subprocess.CompletedProcess[str]:
        return _envlock(venv, *args, cwd=cwd, cache=cache)

    # 1. envlock capture, in the project's venv, at its root.
    with steps("capture"):
        res = envlock("capture")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "locked ./.venv (.venv in the working directory)" in res.stdout, res.stdout
    lock = project / "env.lock"
    source = {p["name"]: p.get("source") for p in tomllib.loads(lock.read_text())["packages"]}
    assert source["envlock-ml"] == ("editable" if install == "editable" else "local")
    original = _sha256(lock)

    # From a subdirectory: the project's lock, named, and no second lock there.
    res = envlock("verify", cwd=sub)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "envlock: reading ../env.lock" in res.stderr

    # envlock bundle, without --skip-local: envlock's own wheel goes in, as restore builds it.
    res = envlock("bundle", "-o", "../bundle", "--wheelhouse", str(house), cwd=sub)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "envlock: reading ../env.lock" in res.stderr and "a wheel of the envlock that bundles" in res.stderr
    assert list((project / "bundle").glob("envlock_ml-*.whl")) and list((project / "bundle").glob("torch-*.whl"))

    machine = ["--base", base_image, "--wheelhouse", str(house), "--name", name]
    purge(docker_client, name)
    try:
        # 2. envlock restore (no lock argument: found upward), verified inside.
        with steps("restore"):
            res = envlock("restore", *machine, cwd=sub)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "envlock: reading ../env.lock" in res.stderr
        assert "OK: the environment matches the lock" in res.stdout, res.stdout
        assert not (sub / "env.lock").exists()

        # 3. envlock run env.lock --record ... -- python train.py: train.py saves its own
        # capture to env.lock at the end, as the README shows.
        train = ["python", "train.py", "--save", "model.pt", "--lock", "env.lock"]
        with steps("run --record"):
            res = envlock("run", "env.lock", *machine, "--gpus", "none", "--record", "run.record",
                          "--output", "model.pt", "--", *train)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "recorded 16 steps, 1 output and 0 inputs in run.record" in res.stderr, res.stderr
        record = load_record(project / "run.record")
        assert record.record.where == "container" and record.record.command == train
        assert [s.step for s in record.steps] == list(range(16))
        assert record.outputs[0].path == "model.pt" and record.outputs[0].sha256 == _sha256(project / "model.pt")
        assert _sha256(lock) == original, "the run replaced the host's env.lock"
        assert (project / ".envlock-replay" / "env.lock").is_file()  # where train.py's capture went
        result = json.loads(res.stdout.strip().splitlines()[-1])

        # 4. the replay: the recorded command, outputs and inputs; every loss bit-identical.
        with steps("replay"):
            res = envlock("run", "env.lock", *machine, "--gpus", "none", "--replay", "run.record")
        assert res.returncode == 0, res.stdout + res.stderr
        assert "OK: the replay reproduced run.record (bit-identical; 16 steps compared)" in res.stdout, res.stdout
        assert json.loads(res.stdout.split("OK: the replay", 1)[0].strip().splitlines()[-1]) == result
        assert _sha256(lock) == original, "the replay replaced the host's env.lock"

        # The twin: one numerics change diverges, named with the lock difference beside it.
        change, effect = numerics_change(record.context)
        res = envlock("run", "env.lock", *machine, "--gpus", "none", "--replay", "run.record", "-e", change)
        assert res.returncode == 1, res.stdout + res.stderr
        assert "DIVERGED from run.record" in res.stdout and "first divergence: step " in res.stdout, res.stdout
        explained = res.stdout.split("lock differences that can explain it", 1)[1]
        assert change.split("=")[0] in explained and effect in explained, res.stdout
        assert _sha256(lock) == original
    finally:
        purge(docker_client, name)
    steps.print(capsys)
    timings = {label: round(s, 1) for label, s in steps.rows}
    with capsys.disabled():
        print(f"[readme-replay] {install}: {json.dumps(timings)} on {os.cpu_count()} cpus")
