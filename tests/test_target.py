"""Which environment capture and verify look at without --python (envlock/target.py).

Real virtual environments (``python -m venv --without-pip``: a fraction of a second each), real
directory layouts; the rule is VIRTUAL_ENV, CONDA_PREFIX, a .venv here or above, envlock's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, make_dist, run_cli

from envlock.probing.target import choose, display_path, recorded_prefix_hint


def venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path


def site_packages(prefix: Path) -> Path:
    return next((prefix / "lib").glob("python3*/site-packages"))


@pytest.fixture(scope="module")
def envs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("envs")
    project = root / "project"
    (project / "src" / "pkg").mkdir(parents=True)
    out = {"project": project, "dot": venv(project / ".venv"), "active": venv(root / "active"),
           "conda_named": venv(root / "miniconda" / "envs" / "ml"), "root": root}
    base = venv(root / "miniconda")
    (base / "condabin").mkdir()
    out["conda_base"] = base
    return out


def test_virtual_env_wins(envs: dict[str, Path]) -> None:
    t = choose(cwd=envs["project"], environ={"VIRTUAL_ENV": str(envs["active"]),
                                             "CONDA_PREFIX": str(envs["conda_named"])})
    assert t.reason == "VIRTUAL_ENV" and Path(t.prefix) == envs["active"]
    assert Path(t.python).parent == envs["active"] / "bin"
    assert t.describe(envs["root"]) == "./active (VIRTUAL_ENV)"


def test_conda_prefix_before_dot_venv(envs: dict[str, Path]) -> None:
    t = choose(cwd=envs["project"], environ={"CONDA_PREFIX": str(envs["conda_named"]),
                                             "CONDA_DEFAULT_ENV": "ml"})
    assert t.reason == "CONDA_PREFIX" and Path(t.prefix) == envs["conda_named"]


def test_conda_base_gives_way_to_a_project_venv(envs: dict[str, Path]) -> None:
    t = choose(cwd=envs["project"], environ={"CONDA_PREFIX": str(envs["conda_base"]),
                                             "CONDA_DEFAULT_ENV": "base"})
    assert t.reason == ".venv in the working directory" and Path(t.prefix) == envs["dot"]
    # Without a project venv, base is what is active, and it is taken.
    t = choose(cwd=envs["root"], environ={"CONDA_PREFIX": str(envs["conda_base"])})
    assert t.reason == "CONDA_PREFIX"


def test_dot_venv_from_the_project_root_and_below(envs: dict[str, Path]) -> None:
    at_root = choose(cwd=envs["project"], environ={})
    below = choose(cwd=envs["project"] / "src" / "pkg", environ={})
    assert Path(at_root.prefix) == Path(below.prefix) == envs["dot"]
    assert at_root.describe(envs["project"]) == "./.venv (.venv in the working directory)"
    assert below.reason == ".venv in a parent directory"


def test_a_directory_named_dot_venv_that_is_no_venv_is_ignored(tmp_path: Path) -> None:
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    t = choose(cwd=tmp_path, environ={})
    assert t.reason == "the interpreter envlock runs in" and t.prefix == sys.prefix


def test_stale_virtual_env_is_ignored_with_a_note(envs: dict[str, Path], tmp_path: Path) -> None:
    t = choose(cwd=envs["project"], environ={"VIRTUAL_ENV": str(tmp_path / "gone")})
    assert Path(t.prefix) == envs["dot"]
    t = choose(cwd=tmp_path, environ={"VIRTUAL_ENV": str(tmp_path / "gone")})
    assert t.warning and "has no python; ignored" in t.warning


def test_python_option_overrides_everything(envs: dict[str, Path]) -> None:
    t = choose(str(envs["active"]), cwd=envs["project"], environ={"VIRTUAL_ENV": str(envs["dot"])})
    assert t.reason == "--python" and Path(t.prefix) == envs["active"]
    t = choose(str(envs["active"] / "bin" / "python"), cwd=envs["project"], environ={})
    assert Path(t.prefix) == envs["active"]


def test_own_tool_venv_is_locked_with_a_warning(tmp_path: Path) -> None:
    tool = venv(tmp_path / "tools" / "envlock")
    (tool / "uv-receipt.toml").write_text('[tool]\nrequirements = [{ name = "envlock-ml" }]\n')
    code = "from envlock.probing.target import choose; t = choose(); print(t.reason); print(t.warning)"
    out = subprocess.run([str(tool / "bin" / "python"), "-c", code], cwd=tmp_path, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
    reason, warning = out.stdout.splitlines()
    assert reason == "the interpreter envlock runs in"
    assert "envlock's own tool environment" in warning and "--python" in warning
    # The twin: an ordinary venv envlock runs in is not a tool venv.
    plain = venv(tmp_path / "plain")
    out = subprocess.run([str(plain / "bin" / "python"), "-c", code], cwd=tmp_path, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
    assert out.stdout.splitlines()[1] == "None"


def test_display_path(tmp_path: Path) -> None:
    assert display_path(str(tmp_path / ".venv"), tmp_path) == "./.venv"
    assert display_path(str(tmp_path), tmp_path) == "."
    assert display_path("/opt/venv", tmp_path) == "/opt/venv"
    assert display_path("/opt/venv", Path("/")) == "/opt/venv"  # not "./opt/venv"


def test_recorded_prefix_hint_only_for_an_environment_that_exists_here(envs: dict[str, Path]) -> None:
    t = choose(cwd=envs["project"], environ={})
    assert recorded_prefix_hint(str(envs["active"]), t) == str(envs["active"])
    assert recorded_prefix_hint(str(envs["dot"]), t) is None  # the one chosen
    assert recorded_prefix_hint("/nonexistent/venv", t) is None  # another machine's path
    assert recorded_prefix_hint(None, t) is None


def test_capture_says_which_environment_and_verify_uses_the_same_rule(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    (project / "sub").mkdir(parents=True)
    dot = venv(project / ".venv")
    make_dist(site_packages(dot), "demo-pkg", "1.0")
    res = run_cli("capture", "--no-torch", "-o", "env.lock", cwd=project / "sub")
    assert res.returncode == 0, res.stderr
    assert "locked " in res.stdout and "(.venv in a parent directory)" in res.stdout
    text = (project / "sub" / "env.lock").read_text()
    assert 'name = "demo-pkg"' in text and 'name = "pydantic"' not in text
    res = run_cli("verify", "--no-torch", cwd=project / "sub")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "against " in res.stdout and ".venv in a parent directory" in res.stdout
    res = run_cli("verify", "--no-torch", cwd=project / "sub",
                  env={"VIRTUAL_ENV": str(dot)})
    assert res.returncode == 0 and "(VIRTUAL_ENV)" in res.stdout


def test_lock_of_another_env_verified_without_python_says_so_in_one_line(tmp_path: Path) -> None:
    other = venv(tmp_path / "other")
    make_dist(site_packages(other), "demo-pkg", "1.0")
    work = tmp_path / "work"
    work.mkdir()
    res = run_cli("capture", "--no-torch", "--python", str(other), "-o", "env.lock", cwd=work)
    assert res.returncode == 0, res.stderr
    assert f"locked {other} (--python)" in res.stdout
    # Without --python this verify checks the interpreter envlock runs in: everything differs.
    res = run_cli("verify", "--no-torch", cwd=work)
    assert res.returncode == 1
    lines = res.stdout.splitlines()
    hint = [x for x in lines if "was captured from" in x]
    assert hint == [f"  env.lock was captured from {other}, not from the environment checked here: "
                    f"run `envlock verify env.lock --python {other}`"]
    assert len(lines) < 20, res.stdout  # the summary, not a line per package
    assert not any(x.lstrip().startswith("BREAKING") for x in lines)
    res = run_cli("verify", "--no-torch", "--python", str(other), cwd=work)
    assert res.returncode == 0, res.stdout


def test_python_launcher_is_described_by_the_environment_it_runs(tmp_path: Path) -> None:
    # A pyenv shim or wrapper script: the environment is where the interpreter says it lives,
    # not the launcher's parent directory (pyenv's shims/python3 printed "locked ~/.pyenv").
    env = venv(tmp_path / "real-env")
    launcher = tmp_path / "shims" / "python3"
    launcher.parent.mkdir()
    launcher.write_text(f'#!/bin/sh\nexec "{env}/bin/python" "$@"\n')
    launcher.chmod(0o755)
    res = run_cli("capture", "--no-torch", "--python", str(launcher), "-o", "env.lock", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "locked ./real-env (--python)" in res.stdout, res.stdout
    res = run_cli("verify", "--no-torch", "--python", str(launcher), cwd=tmp_path)
    assert res.returncode == 0 and "against ./real-env (--python)" in res.stdout, res.stdout
