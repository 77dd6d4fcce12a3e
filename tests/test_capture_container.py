"""Capture inside a real container: the probe runs with the image's own python, nothing installed."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import pytest

from envlock.drift.compare import compare
from envlock.probing.capture import build_lock
from envlock.probing.process import parse_document
from envlock.restore.verify import PROBE_DIR, probe_files

pytestmark = pytest.mark.integration


def _probe_tar() -> bytes:
    buf = io.BytesIO()
    # What restore ships into an image: the probe and the modules it loads from beside itself.
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data in probe_files().items():
            info = tarfile.TarInfo(path.removeprefix("/tmp/"))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _probe_in(client: Any, image: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    container = client.containers.create(image, command=["sleep", "300"], environment=env or {},
                                         network_disabled=True, labels={"org.envlock.test": "1"})
    try:
        container.start()
        assert container.put_archive("/tmp", _probe_tar())
        code, out = container.exec_run(["python3", PROBE_DIR], workdir="/tmp", demux=True)
        stdout, stderr = out
        assert code == 0, stderr
        doc: dict[str, Any] = parse_document(stdout, "")
        # The Debian image's own package database is read by the shipped parsers.
        assert "os_packages" not in doc["probe"]["errors"], doc["probe"]["errors"]
        assert doc["os_packages"]["manager"] == "dpkg" and doc["os_packages"]["packages"]
        # Nothing was installed: the image still has no envlock or pydantic.
        code, _ = container.exec_run(["python3", "-c", "import pydantic"])
        assert code != 0
        return doc
    finally:
        container.remove(force=True)


def test_probe_inside_container(docker_client: Any, base_image: str) -> None:
    doc = _probe_in(docker_client, base_image)
    lock = build_lock(doc)
    assert lock.image.in_container is True
    assert lock.image.engine == "docker" and lock.image.source in ("dockerenv", "mountinfo")
    assert lock.platform.os_id == "debian" and lock.platform.os_version_id == "12"
    assert lock.python.version.startswith("3.11.") and lock.python.prefix_kind == "system"
    assert lock.torch is None and lock.probe.errors["torch"] == "torch is not installed"
    assert lock.git is None  # /tmp in the container is not a repository, and git is absent
    assert lock.package("pip") is not None


def test_injected_image_identity_and_stable_fingerprint(docker_client: Any, base_image: str) -> None:
    image = docker_client.images.get(base_image)
    env = {"ENVLOCK_IMAGE": base_image, "ENVLOCK_IMAGE_ID": image.id}
    first = build_lock(_probe_in(docker_client, base_image, env))
    second = build_lock(_probe_in(docker_client, base_image, env))
    assert first.image.source == "env" and first.image.id == image.id
    assert first.image.container_id != second.image.container_id
    # Two containers of one image are one environment: same fingerprint, nothing breaking.
    assert first.envlock.fingerprint == second.envlock.fingerprint
    assert compare(first, second).ok
