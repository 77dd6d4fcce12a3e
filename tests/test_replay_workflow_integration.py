"""The README's training workflow, replayed as written, with a real engine:

project venv with envlock installed from a checkout -> ``envlock capture`` -> ``envlock restore``
-> ``envlock run env.lock -- python train.py`` (which ends with ``envlock.capture().save(...)``).

One test per promise: envlock itself is restorable whatever its source; a replay leaves the
host's locks byte for byte as they were; restore's check and a verify inside the image give one
verdict; one environment has one id from a shell, in-process and in its restored image; a
subdirectory reads the project's lock. Every step's seconds are printed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomllib
from helpers import REPO
from test_setups_integration import (  # noqa: F401  (module fixtures, used by name)
    Steps,
    _purge,
    checkout,
    envlock,
    fingerprint,
    make_venv,
    shell_env,
    wheels,
)

pytestmark = pytest.mark.integration


def _remove_tree(client: Any, image_id: str) -> None:
    """An image and every image built on it (the classic builder keeps a build stage's image,
    which holds its base), children first."""
    from docker.errors import NotFound

    for child in client.images.list(all=True):
        if child.attrs.get("Parent") == image_id:
            _remove_tree(client, child.id)
    try:
        client.images.remove(image_id, force=True)
    except NotFound:
        pass


def _purge_tree(client: Any, name: str) -> None:
    for image in client.images.list(name=f"envlock/{name}"):
        _remove_tree(client, image.id)


def _source(lock: Path, name: str) -> str:
    return next(str(p.get("source", "index")) for p in tomllib.loads(lock.read_text())["packages"]
                if p["name"] == name)


@pytest.fixture(scope="module")
def house(tmp_path_factory: pytest.TempPathFactory, wheels: Path, wheelhouse: Path) -> Path:  # noqa: F811
    """One offline wheelhouse: envlock's dependencies and the torch stack (restore refuses links
    that leave it, so the files are copied)."""
    out = tmp_path_factory.mktemp("house")
    for whl in [*wheelhouse.glob("*.whl"), *wheels.glob("*.whl")]:
        if not (out / whl.name).exists():
            shutil.copy(whl, out)
    return out


def _project(tmp_path: Path, house: Path, *packages: str) -> tuple[Path, Path]:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(project)], check=True, timeout=60)
    venv = project / ".venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                    "--disable-pip-version-check", "--find-links", str(house), *packages],
                   check=True, timeout=900, env=shell_env(venv))
    return project, venv


def test_readme_training_workflow_replays_as_written(tmp_path: Path, house: Path, checkout: Path,  # noqa: F811
                                                    base_image: str, docker_client: Any,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    steps = Steps("README workflow: envlock from a checkout, torch, train.py")
    name = "h19a-readme"
    with steps("setup"):
        # envlock installed from a checkout (a directory): source = "local" in the lock.
        project, venv = _project(tmp_path, house, "torch==2.13.0+cpu", str(checkout))
        shutil.copy(REPO / "examples" / "train_mnist_like.py", project / "train.py")
    with steps("capture"):
        res = envlock(venv, "capture", cwd=project)
    assert res.returncode == 0, res.stdout + res.stderr
    lock = project / "env.lock"
    assert _source(lock, "envlock-ml") == "local"
    original = lock.read_bytes()
    common = ["env.lock", "--base", base_image, "--wheelhouse", str(house), "--name", name]
    _purge(docker_client, name)
    try:
        with steps("restore"):
            res = envlock(venv, "restore", *common, cwd=project)
        # 1. restorable as is, envlock inside built from the envlock that restores.
        assert res.returncode == 0, res.stdout + res.stderr
        assert "OK: the environment matches the lock" in res.stdout
        assert "envlock-ml 0.1.0: installed from a wheel of the envlock that restores" in res.stderr
        with steps("run train.py"):
            res = envlock(venv, "run", *common, "--gpus", "none", "--", "python", "train.py",
                          "--lock", "env.lock", "--epochs", "1", cwd=project)
        assert res.returncode == 0, res.stdout + res.stderr
        result = json.loads(res.stdout.strip().splitlines()[-1])
        assert len(result["weights_sha256"]) == 64
        # 2. the replay's capture went beside the lock; the host's lock is untouched.
        assert lock.read_bytes() == original
        replayed = project / ".envlock-replay" / "env.lock"
        assert replayed.is_file() and "stays as it is" in res.stderr, res.stderr
        assert result["lock_id"] == fingerprint(replayed).split(":")[1][:12]
        # ... and nothing else the command runs can replace it either.
        res = envlock(venv, "run", *common, "--gpus", "none", "--", "python", "-c",
                      "open('env.lock', 'w').write('x')", cwd=project)
        assert res.returncode != 0 and lock.read_bytes() == original
        # 3. one verdict: `envlock verify` inside the image says what restore said.
        with steps("verify inside"):
            res = envlock(venv, "run", *common, "--gpus", "none", "--", "envlock", "verify",
                          "env.lock", "--json", cwd=project)
        assert res.returncode == 0, res.stdout + res.stderr
        inside = json.loads(res.stdout)
        assert inside["ok"] is True
        own = [d for d in inside["differences"] if d["path"].startswith("packages.envlock-ml")]
        assert own and {d["severity"] for d in own} == {"info"}, own
        code = ("import envlock, sys; c = envlock.verify('env.lock'); "
                "print('in-process', c.ok, [d.path for d in c.differences if d.severity == 'breaking']); "
                "sys.exit(not c.ok)")
        res = envlock(venv, "run", *common, "--gpus", "none", "--", "python", "-c", code, cwd=project)
        assert res.returncode == 0 and "in-process True []" in res.stdout, res.stdout + res.stderr
        # 5. from a subdirectory, the project's lock is read and named.
        with steps("verify from src/"):
            res = envlock(venv, "verify", cwd=project / "src")
        assert res.returncode == 0, res.stdout + res.stderr
        assert "reading ../env.lock" in res.stderr and not (project / "src" / "env.lock").exists()
        assert lock.read_bytes() == original
    finally:
        _purge(docker_client, name)
    steps.print(capsys)
    with capsys.disabled():
        total = sum(s for label, s in steps.rows if label in ("capture", "restore", "run train.py"))
        print(f"[replay] capture -> restore -> run train.py: {total:.1f}s")


def test_editable_envlock_is_restored_from_its_source(tmp_path: Path, house: Path, checkout: Path,  # noqa: F811
                                                      base_image: str, docker_client: Any) -> None:
    name = "h19a-editable"
    project, venv = _project(tmp_path, house, "setuptools>=68", "six==1.17.0")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                    "--no-build-isolation", "--find-links", str(house), "-e", str(checkout)],
                   check=True, timeout=600, env=shell_env(venv))
    assert envlock(venv, "capture", cwd=project).returncode == 0
    assert _source(project / "env.lock", "envlock-ml") == "editable"
    common = ["env.lock", "--base", base_image, "--wheelhouse", str(house), "--name", name]
    _purge(docker_client, name)
    try:
        res = envlock(venv, "restore", *common, cwd=project)
        assert res.returncode == 0, res.stdout + res.stderr
        res = envlock(venv, "run", *common, "--gpus", "none", "--", "envlock", "verify", "env.lock",
                      cwd=project)
        assert res.returncode == 0 and "OK" in res.stdout, res.stdout + res.stderr
    finally:
        _purge(docker_client, name)


def test_one_id_from_a_shell_in_process_and_in_the_restored_image(
        tmp_path: Path, house: Path, base_image: str, docker_client: Any) -> None:
    """Inside a restored image, a shell capture and an in-process one (seeded) share the id, and
    restoring that lock again (from its own image) and capturing inside gives it once more."""
    project, venv = _project(tmp_path, house, "envlock-ml", "six==1.17.0")
    inner = project / "inner"
    inner.mkdir()
    assert envlock(venv, "capture", cwd=project).returncode == 0
    first, second = "h19a-id-1", "h19a-id-2"
    _purge_tree(docker_client, first)
    try:
        common = ["--wheelhouse", str(house), "--gpus", "none"]
        res = envlock(venv, "run", "env.lock", "--base", base_image, "--name", first, *common, "--",
                      "envlock", "capture", "-o", "inner/shell.lock", cwd=project)
        assert res.returncode == 0, res.stdout + res.stderr
        code = ("import envlock; envlock.seed_everything(7); "
                "envlock.capture().save('inner/process.lock')")
        res = envlock(venv, "run", "env.lock", "--base", base_image, "--name", first, *common, "--",
                      "python", "-c", code, cwd=project)
        assert res.returncode == 0, res.stdout + res.stderr
        shell_lock, process_lock = inner / "shell.lock", inner / "process.lock"
        assert tomllib.loads(process_lock.read_text())["seeds"]["seed"] == 7
        assert fingerprint(shell_lock) == fingerprint(process_lock)
        # diff compares what verify compares; the seed is process state, listed apart.
        res = envlock(venv, "diff", str(shell_lock), str(process_lock), cwd=project)
        assert res.returncode == 0 and "process state differs" in res.stdout, res.stdout
        assert envlock(venv, "diff", str(shell_lock), str(process_lock), "--process-state",
                       cwd=project).returncode == 1
        # The inner lock names its image (the first restore's); restored from it, captured inside.
        res = envlock(venv, "run", "inner/shell.lock", "--name", second, *common, "--",
                      "envlock", "capture", "-o", "inner/restored.lock", cwd=project)
        assert res.returncode == 0, res.stdout + res.stderr
        restored = tomllib.loads((inner / "restored.lock").read_text())
        assert restored["image"]["id"] != tomllib.loads(shell_lock.read_text())["image"]["id"]
        assert fingerprint(inner / "restored.lock") == fingerprint(shell_lock)
    finally:
        _purge_tree(docker_client, first)  # the second was built FROM it
