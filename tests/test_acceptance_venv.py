"""The researcher's path, end to end, in a fresh virtual environment with torch and numpy.

pip install torch==2.13.0 numpy envlock -> envlock capture -> verify 0 -> pip install one
more package or another version -> verify 1 naming it -> hand edit -> verify 2 -> fmt.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, run_cli

pytestmark = pytest.mark.slow


def _pip(venv: Path, *args: str) -> None:
    extra = []
    wheelhouse = os.environ.get("ENVLOCK_TEST_WHEELHOUSE")
    if wheelhouse and Path(wheelhouse).is_dir():
        extra = ["--find-links", wheelhouse]
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                    "--disable-pip-version-check", *extra, *args], check=True, timeout=900)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    _pip(root, "torch==2.13.0", "numpy", str(REPO))
    return root


def _envlock(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / "envlock"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, check=False)


def test_researcher_flow(venv: Path, tmp_path: Path) -> None:
    import tomllib

    res = _envlock(venv, "capture", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lock = tomllib.loads((tmp_path / "env.lock").read_text())
    numpy_version = subprocess.run([str(venv / "bin" / "python"), "-c", "import numpy; print(numpy.__version__)"],
                                   capture_output=True, text=True, check=True).stdout.strip()
    py_version = subprocess.run([str(venv / "bin" / "python"), "-c", "import platform; print(platform.python_version())"],
                                capture_output=True, text=True, check=True).stdout.strip()
    packages = {p["name"]: p for p in lock["packages"]}
    assert lock["torch"]["version"] == "2.13.0+cpu"
    assert packages["torch"]["version"] == "2.13.0+cpu"
    assert packages["numpy"]["version"] == numpy_version
    assert lock["python"]["version"] == py_version and lock["python"]["prefix_kind"] == "venv"
    det = lock["determinism"]
    assert det["torch_loaded"] is True
    assert det["deterministic_algorithms"] is False and det["cudnn_benchmark"] is False
    assert det["float32_matmul_precision"] == "highest"

    assert _envlock(venv, "verify", cwd=tmp_path).returncode == 0

    # the same environment probed from another interpreter (`--python`, venv directory form)
    other = run_cli("capture", "--python", str(venv), "-o", "other.lock", cwd=tmp_path)
    assert other.returncode == 0, other.stderr
    assert run_cli("diff", "env.lock", "other.lock", cwd=tmp_path).returncode == 0

    # one more package
    _pip(venv, "six==1.16.0")
    res = _envlock(venv, "verify", cwd=tmp_path)
    assert res.returncode == 1, res.stdout
    assert "six 1.16.0 is installed but not in the lock" in res.stdout

    # a changed version
    assert _envlock(venv, "capture", cwd=tmp_path).returncode == 0
    _pip(venv, "six==1.17.0")
    res = _envlock(venv, "verify", cwd=tmp_path)
    assert res.returncode == 1 and "six 1.16.0 -> 1.17.0" in res.stdout

    # a hand edit inside the lock
    path = tmp_path / "env.lock"
    text = path.read_text()
    path.write_text(text.replace(f'version = "{numpy_version}"', 'version = "1.0.0"', 1))
    res = _envlock(venv, "verify", cwd=tmp_path)
    assert res.returncode == 2 and "edited after capture" in res.stderr
    assert "Traceback" not in res.stderr
    res = _envlock(venv, "fmt", cwd=tmp_path)
    assert res.returncode == 0
    res = _envlock(venv, "verify", cwd=tmp_path)
    assert res.returncode == 1 and "numpy 1.0.0 ->" in res.stdout
