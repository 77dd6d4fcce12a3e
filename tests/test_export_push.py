"""Cluster replay through a registry: ``restore --push`` to a real registry on 127.0.0.1
(Debian's ``docker-registry``), the local copies removed, the pulled image run by digest, and
the printed reference accepted by ``export --to k8s``."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import LockFactory, container_output, unavailable
from test_restore_integration import cache_home, capture, small_source  # noqa: F401 (fixtures)

from envlock.commands import main

REGISTRY_BIN = "/usr/bin/docker-registry"


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    if not Path(REGISTRY_BIN).exists():
        unavailable("docker-registry is not installed (scripts/test.sh installs it)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "registry.yml"
    config.write_text(
        "version: 0.1\nlog: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {tmp_path / 'registry-data'}}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n")
    proc = subprocess.Popen([REGISTRY_BIN, "serve", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    addr = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://{addr}/v2/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("docker-registry did not start") from None
                time.sleep(0.1)
        yield addr
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.integration
def test_push_then_run_the_pulled_image_by_digest(
        docker_client: Any, base_image: str, wheelhouse: Path, small_source: str,  # noqa: F811
        tmp_path: Path, cache_home: Path, registry: str, capfd: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    lock = capture(small_source, tmp_path / "env.lock")
    repo = f"{registry}/lab/env"
    capfd.readouterr()
    code = main(["restore", str(tmp_path / "env.lock"), "--base", base_image, "--wheelhouse", str(wheelhouse),
                 "--name", "it-push", "--push", repo])
    out, err = capfd.readouterr()
    assert code == 0, out + err
    line = next(ln for ln in out.splitlines() if ln.startswith("pushed "))
    ref = line.split()[1]
    assert ref.startswith(f"{repo}@sha256:") and len(ref.split("@sha256:")[1]) == 64

    # The registry serves that manifest under the lock's id, with exactly that digest.
    req = urllib.request.Request(f"http://{registry}/v2/lab/env/manifests/{lock.short_id}", method="HEAD",
                                 headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json, "
                                                    "application/vnd.oci.image.manifest.v1+json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.headers["Docker-Content-Digest"] == ref.split("@", 1)[1]

    # No local copy left: what runs next comes from the registry.
    image_id = docker_client.images.get(f"{repo}:{lock.short_id}").id
    docker_client.images.remove(image_id, force=True)
    from docker.errors import ImageNotFound

    with pytest.raises(ImageNotFound):
        docker_client.images.get(image_id)
    docker_client.images.pull(ref)
    printed = container_output(docker_client, ref, ["python", "-c", "import six; print(six.__version__)"])
    assert printed.strip() == "1.16.0"

    job = tmp_path / "job.yaml"
    assert main(["export", str(tmp_path / "env.lock"), "--to", "k8s", "--image", ref,
                 "--command", "python train.py", "-o", str(job)]) == 0
    validate = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent)) or "kubernetes-validate"
    assert subprocess.run([validate, "--strict", "-k", "1.34.0", str(job)], check=False).returncode == 0
    assert json.dumps(ref) in job.read_text()


def test_push_refuses_a_tagged_target(restore_lock: LockFactory, tmp_path: Path) -> None:
    from envlock.errors import UsageError
    from envlock.export.push import push

    with pytest.raises(UsageError, match="without a tag"):
        push(None, "sha256:" + "0" * 64, "registry.example/lab/env:v1", restore_lock())  # type: ignore[arg-type]  # refused before any engine is used
    with pytest.raises(UsageError, match="REGISTRY/REPO"):
        push(None, "sha256:" + "0" * 64, "env", restore_lock())  # type: ignore[arg-type]  # refused before any engine is used
