"""Scenario matrix c and e: a venv made and filled by uv; an editable src-layout project plus a
package installed from a local git commit. Each is walked capture → verify → change → verify →
restore → verify inside → run (tests/scenario_steps.py); packages come from the offline test
wheelhouse, as everywhere in the suite.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib
from scenario_steps import (
    Steps,
    debian_python,
    envlock,
    ok,
    restore_verify_run,
    uv_install,
    uv_venv,
)

pytestmark = pytest.mark.integration

SMALL = ["six==1.16.0", "idna==3.10", "packaging==24.2"]


def _run(*argv: str, cwd: Path | None = None) -> str:
    res = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, f"{argv}: exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res.stdout


def _packages(lock: Path) -> dict[str, dict[str, object]]:
    return {p["name"]: p for p in tomllib.loads(lock.read_text())["packages"]}


def test_c_uv_venv(tmp_path: Path, base_image: str, wheelhouse: Path,
                   capsys: pytest.CaptureFixture[str]) -> None:
    steps = Steps("c uv venv", capsys)
    venv = tmp_path / "proj" / ".venv"
    with steps.step("setup"):
        uv_venv(venv)
        uv_install(venv, wheelhouse, *SMALL)
        # uv makes venvs without pip; the lock must not need it either.
        assert not list((venv / "lib").glob("python3*/site-packages/pip"))
    lock = tmp_path / "env.lock"
    # The lock is written next to the project; running from the project root itself (where the
    # venv lies under the working directory) is scenario a's subject.
    with steps.step("capture"):
        ok(envlock("capture", "--python", str(venv), "-o", str(lock), cwd=tmp_path))
    pkgs = _packages(lock)
    assert "pip" not in pkgs and "setuptools" not in pkgs
    assert {n: (p["version"], p["installer"]) for n, p in pkgs.items()} == {
        "six": ("1.16.0", "uv"), "idna": ("3.10", "uv"), "packaging": ("24.2", "uv")}
    with steps.step("verify"):
        assert "OK: the environment matches the lock" in ok(
            envlock("verify", str(lock), "--python", str(venv), cwd=tmp_path))
    with steps.step("change + verify"):
        uv_install(venv, wheelhouse, "six==1.17.0")
        out = ok(envlock("verify", str(lock), "--python", str(venv), cwd=tmp_path), 1)
        assert "six 1.16.0 -> 1.17.0" in out
    restore_verify_run(steps, lock, base=base_image, wheelhouse=wheelhouse, name="scenario-c",
                       code="import six, idna, packaging; print('versions', six.__version__, "
                            "idna.__version__, packaging.__version__)",
                       expect="versions 1.16.0 3.10 24.2")


def _git(repo: Path, *args: str) -> str:
    return _run("git", "-c", "user.name=t", "-c", "user.email=t@example.org",
                "-c", "init.defaultBranch=main", *args, cwd=repo).strip()


def _project(root: Path, name: str, version: str, *, src: bool) -> None:
    pkg = root / "src" / name if src else root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"VERSION = {version!r}\n")
    where = '\n[tool.setuptools.packages.find]\nwhere = ["src"]\n' if src else ""
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\n{where}')


def test_e_editable_src_layout_and_local_git_commit(tmp_path: Path, base_image: str, wheelhouse: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    steps = Steps("e editable + git", capsys)
    venv, proj, gitpkg = tmp_path / "venv", tmp_path / "proj", tmp_path / "gitpkg"
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
           "--no-index", "--find-links", str(wheelhouse)]
    with steps.step("setup"):
        _run(debian_python(), "-m", "venv", str(venv))
        _project(proj, "mypkg", "0.1.0", src=True)
        _project(gitpkg, "gitpkg", "1.0.0", src=False)
        _git(gitpkg, "init", "-q")
        _git(gitpkg, "add", ".")
        _git(gitpkg, "commit", "-q", "-m", "one")
        first = _git(gitpkg, "rev-parse", "HEAD")
        _run(*pip, "six==1.16.0", "-e", str(proj), f"git+file://{gitpkg}@{first}")
    lock = tmp_path / "env.lock"
    with steps.step("capture"):
        ok(envlock("capture", "--python", str(venv), "-o", str(lock), cwd=tmp_path))
    doc = tomllib.loads(lock.read_text())
    pkgs = {p["name"]: p for p in doc["packages"]}
    assert pkgs["mypkg"]["source"] == "editable" and pkgs["mypkg"]["version"] == "0.1.0"
    assert pkgs["gitpkg"]["source"] == "vcs" and pkgs["gitpkg"]["commit"] == first
    assert pkgs["gitpkg"]["url"] == f"file://{gitpkg}"
    # A src-layout editable install leaves src/NAME.egg-info beside the real entry: no
    # [[duplicates]] entry may come of it.
    assert not doc.get("duplicates")
    with steps.step("verify"):
        ok(envlock("verify", str(lock), "--python", str(venv), cwd=tmp_path))
    with steps.step("change + verify"):
        (gitpkg / "gitpkg" / "__init__.py").write_text("VERSION = '1.0.0'\nSECOND = True\n")
        _git(gitpkg, "commit", "-q", "-am", "two")
        second = _git(gitpkg, "rev-parse", "HEAD")
        _run(*pip, "--force-reinstall", "--no-deps", f"git+file://{gitpkg}@{second}")
        out = ok(envlock("verify", str(lock), "--python", str(venv), cwd=tmp_path), 1)
        assert "gitpkg" in out and first[:12] in out, out
    # Containers reach no git server and no host path: the git commit is restored from a wheel
    # built from exactly that commit (restore notes the replacement), and the editable project is
    # what `envlock run` mounts as its workspace (--skip-local leaves it out of the image).
    restore_wh = tmp_path / "restore-wheels"
    restore_wh.mkdir()
    for wheel in wheelhouse.glob("six-1.16.0-*.whl"):
        shutil.copy2(wheel, restore_wh)
    _run(str(venv / "bin" / "python"), "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
         "--find-links", str(wheelhouse), "-w", str(restore_wh), f"git+file://{gitpkg}@{first}")
    shutil.copytree(proj, tmp_path / "workspace")
    restore_verify_run(steps, lock, base=base_image, wheelhouse=restore_wh, name="scenario-e",
                       extra=("--skip-local",), run_extra=("--env", "PYTHONPATH=/workspace/src"),
                       code="import six, gitpkg, mypkg; print('versions', six.__version__, gitpkg.VERSION, "
                            "hasattr(gitpkg, 'SECOND'), mypkg.VERSION, mypkg.__file__)",
                       expect="versions 1.16.0 1.0.0 False 0.1.0 /workspace/src/mypkg/__init__.py")
