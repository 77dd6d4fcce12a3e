"""One environment, one id: captured from a shell, in-process, and inside its restored image.

The original environment is a project venv made inside a container of the test base image, so its
Python is the base's (a host venv's Python never matches an image's, and the id covers it), with
envlock installed from this checkout's wheel. There, ``envlock capture`` (a shell) and
``envlock.capture().save(...)`` in a seeded process give one id; restored onto the same base by
an envlock installed from the same wheel, ``envlock capture`` inside the image gives it again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import tomllib
from test_setups_integration import (  # noqa: F401  (module fixtures, used by name)
    Steps,
    checkout,
    envlock,
    fingerprint,
    tool_venv,
    wheels,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# In the base image, as a researcher would type it: a project venv, envlock into it, a shell
# capture and an in-process one (seeded: process state stays outside the id).
_ORIGINAL = """
set -e
mkdir -p /tmp/project && cd /tmp/project
python3 -m venv .venv
.venv/bin/python -m pip install -q --no-index --find-links /wheels envlock-ml six==1.17.0
.venv/bin/envlock capture -o /out/shell.lock
.venv/bin/python -c 'import envlock; envlock.seed_everything(7); envlock.capture().save("/out/process.lock")'
"""


def test_one_id_from_a_shell_in_process_and_inside_the_restored_image(
        tmp_path: Path, wheels: Path, tool_venv: Path, base_image: str,  # noqa: F811
        docker_client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    steps = Steps("one id: shell, in-process, restored image")
    work = tmp_path / "work"
    (work / "inner").mkdir(parents=True)
    with steps("original venv + two captures in the base"):
        container = docker_client.containers.run(
            base_image, ["sh", "-c", _ORIGINAL], detach=True, network_disabled=True,
            user=f"{os.getuid()}:{os.getgid()}", environment={"HOME": "/tmp"},
            volumes={str(wheels): {"bind": "/wheels", "mode": "ro"},
                     str(work): {"bind": "/out", "mode": "rw"}})
        try:
            status = container.wait(timeout=900)["StatusCode"]
            logs = container.logs().decode(errors="replace")
        finally:
            container.remove(force=True)
    assert status == 0, logs
    shell, process = work / "shell.lock", work / "process.lock"
    assert tomllib.loads(process.read_text())["seeds"]["seed"] == 7
    assert tomllib.loads(shell.read_text())["python"]["prefix"] == "/tmp/project/.venv"
    assert fingerprint(shell) == fingerprint(process), (shell.read_text(), process.read_text())

    name = "r19flow-one-id"
    common = ["--base", base_image, "--wheelhouse", str(wheels), "--name", name]
    purge(docker_client, name)
    try:
        with steps("restore"):
            res = envlock(tool_venv, "restore", "shell.lock", *common, cwd=work)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "OK: the environment matches the lock" in res.stdout, res.stdout
        with steps("capture inside"):
            res = envlock(tool_venv, "run", "shell.lock", *common, "--gpus", "none", "--",
                          "envlock", "capture", "-o", "inner/restored.lock", cwd=work)
        assert res.returncode == 0, res.stdout + res.stderr
    finally:
        purge(docker_client, name)
    restored = work / "inner" / "restored.lock"
    inside = tomllib.loads(restored.read_text())
    assert inside["image"]["reference"] == f"envlock/{name}:{fingerprint(shell).split(':')[1][:12]}"
    assert inside["python"]["prefix"] == "/tmp/project/.venv" and inside["os_packages"]["packages"]
    ids = {p.name: fingerprint(p) for p in (shell, process, restored)}
    assert len(set(ids.values())) == 1, (ids, envlock(tool_venv, "diff", str(shell), str(restored),
                                                      cwd=work).stdout)
    steps.print(capsys)
    with capsys.disabled():
        print(f"[one-id] {fingerprint(shell).split(':')[1][:12]} from the shell, in-process and "
              "inside the restored image")


def purge(client: Any, name: str) -> None:
    """Every image tagged ``envlock/<name>``, and every image built on one, children first.

    Through the engine's list, not one inspect per image: the engine is shared, and an image
    another job removes meanwhile is not an error here."""
    from docker.errors import NotFound

    def remove(image_id: str) -> None:
        for row in client.api.images(all=True):
            if row.get("ParentId") == image_id:
                remove(row["Id"])
        try:
            client.api.remove_image(image_id, force=True)
        except NotFound:
            pass

    for row in client.api.images(name=f"envlock/{name}"):
        remove(row["Id"])
