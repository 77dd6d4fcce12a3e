"""The setups people have, with real tools: capture -> verify -> change -> verify -> restore ->
verify inside -> run (README "Supported setups", rows a and b).

a. a project with ``.venv`` inside it and envlock installed in it, run from the project root, a
   subdirectory and ``/``: one fingerprint;
b. envlock in its own tool venv (as pipx or ``uv tool`` make one), the project venv activated,
   and not activated with ``.venv`` in the working directory: the project is locked.

Everything installs offline from one wheel directory: envlock built from this checkout with its
dependencies, the pip/setuptools that ``python -m venv`` seeds, and small wheels of the test
wheelhouse; ``restore`` takes the same directory. No torch: small venvs keep this fast. Every
step's seconds are printed (the closing notes' table is made from them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import tomllib
from helpers import REPO, remove_image

pytestmark = pytest.mark.integration


class Steps:
    """Seconds per step of one scenario, printed at the end of the test."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rows: list[tuple[str, float]] = []

    @contextmanager
    def __call__(self, label: str) -> Iterator[None]:
        t0 = time.monotonic()
        yield
        self.rows.append((label, time.monotonic() - t0))

    def print(self, capsys: pytest.CaptureFixture[str]) -> None:
        with capsys.disabled():
            print(f"\n[setups] {self.name}: " + ", ".join(f"{k} {v:.1f}s" for k, v in self.rows))


def _seed_wheels() -> list[Path]:
    """The pip and setuptools wheels ``python -m venv`` installs (ensurepip's, or Debian's)."""
    import ensurepip

    for folder in (Path(ensurepip.__file__).parent / "_bundled", Path("/usr/share/python-wheels")):
        found = sorted(folder.glob("*.whl"))
        if found:
            return found
    pytest.fail("no ensurepip wheels found to restore a venv's pip and setuptools offline")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What a build of this checkout needs, copied: a build leaves build/ and *.egg-info behind."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src)
    shutil.copytree(REPO / "envlock", src / "envlock", ignore=shutil.ignore_patterns("__pycache__"))
    return src


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path, checkout: Path) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
                    "-w", str(out), str(checkout)], check=True, timeout=600, env=shell_env(checkout))
    # setuptools from the wheelhouse: building the checkout offline needs setuptools >= 68.
    extra = [*wheelhouse.glob("six-1.17.0-*.whl"), *wheelhouse.glob("idna-3.10-*.whl"),
             *wheelhouse.glob("setuptools-*.whl")]
    for whl in [*_seed_wheels(), *extra]:
        shutil.copy(whl, out)
    assert list(out.glob("envlock_ml-*.whl")), sorted(p.name for p in out.iterdir())
    return out


def make_venv(path: Path, wheels: Path, *packages: str) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    if packages:
        pip(path, wheels, *packages)
    return path


def pip(venv: Path, wheels: Path, *packages: str) -> None:
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                    "--disable-pip-version-check", "--find-links", str(wheels), *packages],
                   check=True, timeout=300, env=shell_env(venv))


def shell_env(cwd: Path, activate: Path | None = None) -> dict[str, str]:
    """The environment a login shell would give a command run in ``cwd``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH", "PYTHONHOME")}
    env["PWD"] = str(cwd)  # as a shell sets it; the lock must still hold the real paths
    if activate is not None:
        env["VIRTUAL_ENV"] = str(activate)
        env["PATH"] = f"{activate / 'bin'}:{env.get('PATH', '')}"
    return env


def envlock(tool: Path, *args: str, cwd: Path, activate: Path | None = None,
            timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tool / "bin" / "envlock"), *args], cwd=cwd, timeout=timeout,
                          env=shell_env(cwd, activate), capture_output=True, text=True, check=False)


def fingerprint(path: Path) -> str:
    return str(tomllib.loads(path.read_text())["envlock"]["fingerprint"])


def packages(path: Path) -> set[str]:
    return {p["name"] for p in tomllib.loads(path.read_text()).get("packages", [])}


def restore_and_run(tool: Path, lock: Path, cwd: Path, base: str, wheels: Path, name: str,
                    steps: Steps, activate: Path | None = None, *, verify_in_process: bool = False) -> None:
    """restore (the probe verifies inside), then `envlock run` imports the changed package.

    ``verify_in_process``: the lock's environment has envlock itself, so a process in the
    container can call ``envlock.verify()`` as training code would (the venv went onto another
    base: OS packages differ by design and must not fail it)."""
    common = [str(lock), "--base", base, "--wheelhouse", str(wheels), "--name", name]
    with steps("restore+verify inside"):
        res = envlock(tool, "restore", *common, cwd=cwd, activate=activate)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OK: the environment matches the lock" in res.stdout
    with steps("run"):
        res = envlock(tool, "run", *common, "--gpus", "none", "--", "python", "-c",
                      "import six; print('six', six.__version__)", cwd=cwd, activate=activate)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "six 1.17.0" in res.stdout
    if verify_in_process:
        code = ("import envlock, json, sys; c = envlock.verify('env.lock'); "
                "print('in-process verify ok' if c.ok else json.dumps(c.to_dict())); sys.exit(not c.ok)")
        with steps("envlock.verify() inside"):
            res = envlock(tool, "run", *common, "--gpus", "none", "--", "python", "-c", code,
                          cwd=cwd, activate=activate)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "in-process verify ok" in res.stdout


def change_and_verify(tool: Path, venv: Path, wheels: Path, cwd: Path, steps: Steps,
                      activate: Path | None = None) -> None:
    with steps("verify (0)"):
        res = envlock(tool, "verify", cwd=cwd, activate=activate)
    assert res.returncode == 0, res.stdout + res.stderr
    with steps("change"):
        pip(venv, wheels, "six==1.17.0")
    with steps("verify (1)"):
        res = envlock(tool, "verify", cwd=cwd, activate=activate)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "six 1.17.0 is installed but not in the lock" in res.stdout


def _purge(client: Any, name: str) -> None:
    """Remove earlier restores of this scenario, so that restore really builds."""
    for image in client.images.list(name=f"envlock/{name}"):
        remove_image(client, image)


def test_a_project_venv_with_envlock_inside(tmp_path: Path, wheels: Path, base_image: str,
                                            docker_client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    steps = Steps("a. project/.venv with envlock in it")
    project = tmp_path / "project"
    sub = project / "src" / "model"
    sub.mkdir(parents=True)
    with steps("setup"):
        venv = make_venv(project / ".venv", wheels, "envlock-ml")
    with steps("capture x3"):
        runs = {where: envlock(venv, "capture", "-o", str(tmp_path / f"{name}.lock"), cwd=where)
                for name, where in (("root", project), ("sub", sub), ("slash", Path("/")))}
    for res in runs.values():
        assert res.returncode == 0, res.stdout + res.stderr
    assert "locked ./.venv (.venv in the working directory)" in runs[project].stdout
    assert "(.venv in a parent directory)" in runs[sub].stdout
    assert "(the interpreter envlock runs in)" in runs[Path("/")].stdout
    prints = {fingerprint(tmp_path / f"{n}.lock") for n in ("root", "sub", "slash")}
    assert len(prints) == 1, prints
    lock = tomllib.loads((tmp_path / "root.lock").read_text())
    assert lock["python"]["prefix"] == str(venv) and "envlock-ml" in packages(tmp_path / "root.lock")
    shutil.copy(tmp_path / "root.lock", project / "env.lock")

    change_and_verify(venv, venv, wheels, project, steps)
    with steps("capture"):
        assert envlock(venv, "capture", "-o", "env.lock", cwd=project).returncode == 0
    _purge(docker_client, "scenario-a")
    restore_and_run(venv, project / "env.lock", project, base_image, wheels, "scenario-a", steps,
                    verify_in_process=True)
    steps.print(capsys)


@pytest.fixture(scope="module")
def tool_venv(tmp_path_factory: pytest.TempPathFactory, wheels: Path) -> Path:
    """envlock in a venv of its own, as pipx and ``uv tool install`` make one."""
    return make_venv(tmp_path_factory.mktemp("tools") / "envlock", wheels, "envlock-ml")


@pytest.mark.parametrize("activated", [True, False], ids=["activated", "dot-venv"])
def test_b_envlock_in_its_own_tool_venv(activated: bool, tmp_path: Path, wheels: Path, tool_venv: Path,
                                        base_image: str, docker_client: Any,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    steps = Steps(f"b. tool venv, project {'activated' if activated else '.venv in cwd'}")
    project = tmp_path / "project"
    project.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    tool = tool_venv
    with steps("setup"):
        venv = make_venv(project / ".venv", wheels, "idna==3.10")
    # Activated: run from another directory, so VIRTUAL_ENV alone decides.
    cwd, activate = (elsewhere, venv) if activated else (project, None)
    with steps("capture"):
        res = envlock(tool, "capture", cwd=cwd, activate=activate)
    assert res.returncode == 0, res.stdout + res.stderr
    why = "(VIRTUAL_ENV)" if activated else "(.venv in the working directory)"
    assert why in res.stdout, res.stdout
    lock = cwd / "env.lock"
    names = packages(lock)
    assert "idna" in names and "envlock-ml" not in names and "pydantic" not in names
    assert tomllib.loads(lock.read_text())["python"]["prefix"] == str(venv)

    change_and_verify(tool, venv, wheels, cwd, steps, activate)
    with steps("capture"):
        assert envlock(tool, "capture", cwd=cwd, activate=activate).returncode == 0
    name = f"scenario-b-{'act' if activated else 'dot'}"
    _purge(docker_client, name)
    restore_and_run(tool, lock, cwd, base_image, wheels, name, steps, activate)
    steps.print(capsys)


def _readme_first_command() -> str:
    text = (REPO / "README.md").read_text()
    block = text.split("```bash\n", 1)[1]
    return block.splitlines()[0].split("  #", 1)[0].strip()


def test_readme_first_command_on_debian_system_python(wheels: Path, checkout: Path, base_image: str,
                                                      docker_client: Any,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Debian's python3 refuses `pip install` (PEP 668); the README's first command works there.

    Run as written in a checkout inside the Debian base image; the index is replaced by the
    offline wheel directory through pip's own variables (containers reach no index).
    """
    steps = Steps("README first command on Debian python3")
    command = _readme_first_command()
    assert command.startswith("python3 -m venv .venv"), command
    script = ("cp -r /mnt/src /tmp/envlock && cd /tmp/envlock && "
              "{ python3 -m pip install . >/tmp/pep668.txt 2>&1; echo \"system pip: $?\"; "
              "grep -o externally-managed-environment /tmp/pep668.txt | head -n1; } && " + command)
    with steps("install+capture"):
        container = docker_client.containers.run(
            base_image, ["sh", "-c", script], detach=True, network_disabled=True,
            environment={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/wheels",
                         "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
            volumes={str(checkout): {"bind": "/mnt/src", "mode": "ro"},
                     str(wheels): {"bind": "/wheels", "mode": "ro"}})
        try:
            status = container.wait(timeout=600)["StatusCode"]
            logs = container.logs().decode(errors="replace")
        finally:
            container.remove(force=True)
    assert "system pip: 0" not in logs and "externally-managed-environment" in logs, logs
    assert status == 0, logs
    assert "wrote env.lock" in logs and "locked ./.venv (.venv in the working directory)" in logs, logs
    steps.print(capsys)
