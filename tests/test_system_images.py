"""System-Python images end to end: capture --in-image, restore onto the bare base, run.

Two images stand for the seeds' environments (scripts/test.sh builds and caches them):

* ``ngc-style``: the base plus the CPU torch wheel pip-installed into ``/usr/bin/python3``, the
  way NGC's PyTorch images carry torch;
* ``debian-torch``: the base plus Debian's ``python3-torch`` from apt (torch 1.13 and ~300
  OS packages).

For each: the lock records torch, the Python distributions (the OS-owned ones as ``system``
with their package) and the OS packages; ``restore --base <bare base>`` rebuilds it (apt at
the recorded versions, then pip into the system Python) and the check inside passes; ``run``
imports the locked torch. Timings go to the test report (``-rP`` / the junit properties).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import unavailable

from envlock.commands import main
from envlock.lock import load, save

pytestmark = [pytest.mark.integration, pytest.mark.slow]

IMAGES = {"ngc": "ENVLOCK_TEST_NGC_IMAGE", "debian": "ENVLOCK_TEST_DEBIAN_TORCH_IMAGE"}


@pytest.fixture(params=sorted(IMAGES))
def system_image(request: pytest.FixtureRequest, docker_client: Any) -> tuple[str, str]:
    ref = os.environ.get(IMAGES[request.param])
    if not ref:
        unavailable(f"{IMAGES[request.param]} is not set; run through scripts/test.sh (it builds the image)")
    docker_client.images.get(ref)
    return request.param, ref


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("ENVLOCK_PLAIN_PROGRESS", "1")
    yield tmp_path / "cache"


def _capture(ref: str, path: Path, *extra: str) -> tuple[Any, float]:
    t0 = time.monotonic()
    assert main(["capture", "--in-image", ref, "-o", str(path), *extra]) == 0
    return load(path), time.monotonic() - t0


def test_system_image_captures_restores_and_runs(
        system_image: tuple[str, str], docker_client: Any, base_image: str, wheelhouse: Path,
        tmp_path: Path, cache_home: Path, capfd: pytest.CaptureFixture[str],
        record_property: Any) -> None:
    kind, ref = system_image
    lock, t_capture = _capture(ref, tmp_path / "env.lock")
    again, t_capture_python = _capture(ref, tmp_path / "python.lock", "--python", "/usr/bin/python3")
    # The interpreter given by path is the one found on PATH: one environment, one id.
    assert again.envlock.fingerprint == lock.envlock.fingerprint
    assert lock.python.prefix_kind == "system" and lock.python.executable == "/usr/bin/python3"
    assert lock.os_packages is not None and lock.os_packages.manager == "dpkg"
    os_names = {spec.split(":", 1)[0] for spec in lock.os_packages.packages}
    assert {"libc6", "python3.11", "python3-pip"} <= os_names
    pip = lock.package("pip")
    assert pip is not None and pip.source == "system" and pip.os_package == "python3-pip"
    torch = lock.package("torch")
    # torch.__version__ as imported; Debian's metadata says 1.13.0a0+gitunknown, torch 1.13.0a0.
    assert torch is not None and lock.torch is not None and torch.version.startswith(lock.torch.version)
    if kind == "ngc":
        assert torch.version == "2.13.0+cpu" and torch.source == "index" and torch.installer == "pip"
        assert torch.os_package is None
    else:
        assert torch.source == "system" and torch.os_package == "python3-torch"
        assert torch.os_package_version and torch.os_package_version.startswith("1.13")
        assert "python3-torch" in os_names and len(os_names) > 300
    capfd.readouterr()

    base_id = docker_client.images.get(base_image).id
    common = [str(tmp_path / "env.lock"), "--base", base_id, "--name", f"it-sys-{kind}"]
    if kind == "ngc":
        common += ["--wheelhouse", str(wheelhouse)]  # pip's part offline; apt reaches its mirror
    assert main(["restore", *common, "--dockerfile-only", str(tmp_path / "ctx")]) == 0
    dockerfile = (tmp_path / "ctx" / "Dockerfile").read_text()
    assert '"apt-get", "install"' in dockerfile and f"FROM {base_id}" in dockerfile
    assert (kind == "debian") == ("python3-torch=" in dockerfile)
    capfd.readouterr()
    t0 = time.monotonic()
    code = main(["restore", *common])
    t_restore = time.monotonic() - t0
    out, err = capfd.readouterr()
    assert code == 0, out + err
    assert "OK: the environment matches the lock" in out, out
    built = "cache hit" not in out  # a warm engine reuses the image built from this context

    ws = tmp_path / "ws"
    ws.mkdir()
    code = main(["run", *common, "--workspace", str(ws), "--gpus", "none", "--",
                 "python3", "-c", "import torch; print('torch', torch.__version__)"])
    out, err = capfd.readouterr()
    assert code == 0, err
    assert f"torch {lock.torch.version}\n" in out

    figures = {"capture_s": round(t_capture, 1), "capture_python_s": round(t_capture_python, 1),
               "restore_s": round(t_restore, 1), "restore_built": built, "os_packages": len(lock.os_packages.packages),
               "python_dists": len(lock.packages),
               "system_dists": sum(1 for p in lock.packages if p.source == "system")}
    for key, value in figures.items():
        record_property(f"{kind}_{key}", value)
    with capfd.disabled():
        print(f"\n[system-images] {kind}: {figures}")


def test_unavailable_os_package_versions_fail_naming_each_with_exit_3(
        docker_client: Any, base_image: str, wheelhouse: Path, tmp_path: Path, cache_home: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    ref = os.environ.get(IMAGES["ngc"])
    if not ref:
        unavailable("ENVLOCK_TEST_NGC_IMAGE is not set; run through scripts/test.sh (it builds the image)")
    lock, _ = _capture(ref, tmp_path / "env.lock", "--no-torch")
    assert lock.os_packages is not None
    gone = {"tzdata", "adduser"}
    specs = [s.split("=", 1)[0] + "=0.0.1-envlock" if s.split(":", 1)[0] in gone else s
             for s in lock.os_packages.packages]
    table = lock.os_packages.model_copy(update={"packages": specs})
    save(lock.model_copy(update={"os_packages": table}), tmp_path / "bad.lock")
    capfd.readouterr()
    code = main(["restore", str(tmp_path / "bad.lock"), "--base", docker_client.images.get(base_image).id,
                 "--wheelhouse", str(wheelhouse), "--name", "it-sys-gone",
                 "--context-dir", str(tmp_path / "work")])
    err = capfd.readouterr().err
    assert code == 3, err
    assert ("OS package versions no longer available: adduser:all=0.0.1-envlock, "
            "tzdata:all=0.0.1-envlock") in err
