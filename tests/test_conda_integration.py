"""A conda lock's pack restored into a container image, on Docker and Podman: the prefix at the
lock's own path, installed by py-rattler from the pack in a build stage with no network, checked
inside, and its python and a binary run."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import container_output, remove_image, run_cli


def _restore_into(client: Any, base: str, engine: list[str], conda_channel: Any, tmp_path: Path) -> None:
    res = run_cli("capture", "--python", str(conda_channel.prefix / "bin" / "python"), "--no-torch",
                  "-o", "env.lock", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    res = run_cli("pack", "env.lock", "-o", "pack", "--no-image", "--no-download", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    name = f"it-conda-{os.getpid()}"
    t0 = time.monotonic()
    res = run_cli("restore", "pack", "--base", base, "--name", name, *engine, cwd=tmp_path, timeout=900)
    seconds = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OK: the environment matches the lock" in res.stdout, res.stdout
    tag = next(w for w in res.stdout.split() if w.startswith(f"envlock/{name}:"))
    try:
        prefix = str(conda_channel.prefix)
        ran = container_output(client, tag, [f"{prefix}/bin/footool"], network_mode="none")
        assert ran.strip() == f"footool {prefix}/share/foo"
        ran = container_output(client, tag, ["python", "-c", "import sys, foopy; print(sys.prefix)"],
                               network_mode="none")
        assert ran.strip() == prefix
    finally:
        remove_image(client, client.images.get(tag))
    if os.environ.get("ENVLOCK_REPORT_TIMINGS"):
        sys.stderr.write(f"conda restore into an image ({engine or 'docker'}): {seconds:.1f}s\n")


@pytest.mark.integration
@pytest.mark.slow
def test_conda_pack_restores_into_an_image_docker(docker_client: Any, base_image: str, conda_channel: Any,
                                                   tmp_path: Path) -> None:
    _restore_into(docker_client, base_image, [], conda_channel, tmp_path)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.podman
def test_conda_pack_restores_into_an_image_podman(podman_client: Any, podman_base_image: str,
                                                   conda_channel: Any, tmp_path: Path) -> None:
    _restore_into(podman_client, podman_base_image, ["--engine", os.environ["ENVLOCK_TEST_PODMAN_HOST"]],
                  conda_channel, tmp_path)


@pytest.mark.integration
@pytest.mark.slow
def test_torch_pip_installed_into_a_conda_env_is_restored(conda_channel: Any, wheelhouse: Path,
                                                          tmp_path: Path) -> None:
    """CPU torch pip-installed into a conda prefix (the suite's wheelhouse): captured as the
    conda records plus torch and its dependencies as pip packages, packed, restored offline with
    --target prefix, verified (torch imported by the check), and imported by the prefix's python."""
    import shutil
    import subprocess

    from envlock.lock import load

    prefix = tmp_path / "env"
    shutil.copytree(conda_channel.prefix, prefix, symlinks=True)
    python = str(prefix / "bin" / "python")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index",
                    "--disable-pip-version-check", "--find-links", str(wheelhouse), "torch==2.13.0+cpu"],
                   check=True, capture_output=True, timeout=900)
    res = run_cli("capture", "--python", python, "-o", "env.lock", cwd=tmp_path, timeout=900)
    assert res.returncode == 0, res.stderr
    lock = load(tmp_path / "env.lock")
    assert lock.conda is not None and len(lock.conda.packages) >= 5
    pip_installed = {p.name for p in lock.packages if p.installer == "pip"}
    assert {"torch", "typing-extensions", "sympy"} <= pip_installed
    assert lock.torch is not None and lock.torch.version == "2.13.0+cpu"
    t0 = time.monotonic()
    res = run_cli("pack", "env.lock", "-o", "pack", "--no-image", "--no-download", "--wheelhouse", str(wheelhouse),
                  cwd=tmp_path, timeout=900)
    assert res.returncode == 0, res.stderr
    pack_s = time.monotonic() - t0
    unshare = shutil.which("unshare")
    assert unshare is not None, "unshare (util-linux) is needed to restore with the network off"
    t0 = time.monotonic()
    proc = subprocess.run([unshare, "-n", sys.executable, "-m", "envlock", "restore", "pack", "--target", "prefix",
                           "restored"], capture_output=True, text=True, timeout=900, cwd=tmp_path, check=False)
    restore_s = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: the environment matches the lock" in proc.stdout, proc.stdout
    out = subprocess.run([str(tmp_path / "restored" / "bin" / "python"), "-c",
                          "import torch; print(torch.__version__, torch.ones(2).sum().item())"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert out.split() == ["2.13.0+cpu", "2.0"]
    if os.environ.get("ENVLOCK_REPORT_TIMINGS"):
        sys.stderr.write(f"conda + pip torch: pack {pack_s:.1f}s, restore {restore_s:.1f}s\n")
