"""Smoke tests for the test infrastructure: the engines can run the base image."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import container_output

PROBE = ["python3", "-c", "import sys; print(tuple(sys.version_info[:2]))"]


def _run(client: Any, image: str, command: list[str], **kwargs: Any) -> str:
    return container_output(client, image, command, **kwargs)


@pytest.mark.integration
def test_docker_runs_base_image(docker_client: Any, base_image: str) -> None:
    assert "(3, 11)" in _run(docker_client, base_image, PROBE)


@pytest.mark.integration
@pytest.mark.podman
def test_podman_runs_base_image(podman_client: Any, podman_base_image: str) -> None:
    assert "(3, 11)" in _run(podman_client, podman_base_image, PROBE)


@pytest.mark.integration
def test_wheelhouse_installs_offline(docker_client: Any, base_image: str, wheelhouse: Path) -> None:
    script = (
        "python3 -m venv /tmp/v && "
        "/tmp/v/bin/pip install -q --no-index --find-links /wheels six==1.17.0 && "
        "/tmp/v/bin/python -c 'import six; print(six.__version__)'"
    )
    out = _run(
        docker_client,
        base_image,
        ["sh", "-c", script],
        volumes={str(wheelhouse): {"bind": "/wheels", "mode": "ro"}},
        network_disabled=True,
    )
    assert "1.17.0" in out
