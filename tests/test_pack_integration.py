"""End to end: pack a lock, take away everything it came from, restore it offline.

The environment is a venv on this host with two wheels from the test wheelhouse and a package
installed from a local source directory (so its wheel exists nowhere: pip's cache is a fresh
directory). The pack must carry a wheel rebuilt from that package's installed files. The base
image is a copy of the test base with a label of this run, so it has an id of its own and can
be deleted from the engine (the shared test base stays): the restore must load it from the pack
and build with the engine's network ``none``.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envlock.commands import main

DEMO_PYPROJECT = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "envlock-packdemo"
version = "0.3.1"

[project.scripts]
envlock-packdemo = "envlock_packdemo:main"
"""


@pytest.fixture(scope="module")
def host_env(tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path) -> tuple[Path, Path]:
    """(the venv's python, its lock)."""
    root = tmp_path_factory.mktemp("packenv")
    demo = root / "demo"
    (demo / "envlock_packdemo").mkdir(parents=True)
    (demo / "pyproject.toml").write_text(DEMO_PYPROJECT)
    (demo / "envlock_packdemo" / "__init__.py").write_text(
        "VALUE = 42\n\ndef main() -> None:\n    print('packdemo', VALUE)\n")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "PIP_CACHE_DIR": str(root / "pip-cache")}
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                    "--find-links", str(wheelhouse), "six==1.16.0", "idna==3.10", str(demo)],
                   check=True, env=env)
    lock = root / "env.lock"
    assert main(["capture", "--python", str(venv / "bin" / "python"), "--no-torch", "-o", str(lock)]) == 0
    return venv / "bin" / "python", lock


@pytest.fixture
def fresh_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No cache of this machine helps: pip's is empty, envlock's is new."""
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip-cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("ENVLOCK_PLAIN_PROGRESS", "1")
    yield


def _own_base(client: Any, base: str) -> str:
    """A copy of ``base`` with an id of its own, which this test may delete."""
    tag = f"envlock-test/packbase:{uuid.uuid4().hex[:12]}"
    dockerfile = f"FROM {base}\nLABEL org.envlock.test.pack={tag.rsplit(':', 1)[1]}\n"
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    return tag


def _remove(client: Any, *refs: str) -> None:
    for ref in refs:
        try:
            client.images.remove(ref, force=True)
        except Exception:
            pass


def _pack_restore_offline(client: Any, base: str, host_env: tuple[Path, Path], wheelhouse: Path,
                          out: Path, engine: list[str], capfd: pytest.CaptureFixture[str]) -> dict[str, float]:
    python, lock_path = host_env
    from envlock.lock import load

    lock = load(lock_path)
    own = _own_base(client, base)
    base_id = client.images.get(own).id
    timings: dict[str, float] = {}
    restored: list[str] = []
    try:
        t0 = time.monotonic()
        assert main(["pack", str(lock_path), "-o", str(out), *engine, "--wheelhouse", str(wheelhouse),
                     "--python", str(python), "--base", own, "--no-download"]) == 0
        timings["pack"] = time.monotonic() - t0
        got, err = capfd.readouterr()
        assert "rebuilt from installed files (envlock-packdemo" in got, got + err

        # Everything the pack came from is gone: the base image (by id) and every cache.
        _remove(client, own)
        from docker.errors import ImageNotFound

        with pytest.raises(ImageNotFound):
            client.images.get(base_id)
        for image in client.images.list(filters={"label": f"org.envlock.fingerprint={lock.envlock.fingerprint}"}):
            _remove(client, image.id)

        t0 = time.monotonic()
        code = main(["restore", str(out), *engine, "--name", "it-pack"])
        timings["restore"] = time.monotonic() - t0
        got, err = capfd.readouterr()
        assert code == 0, got + err
        assert "loaded the base image" in err and "OK: the environment matches the lock" in got, got + err
        assert client.images.get(base_id).id == base_id
        tag = f"envlock/it-pack:{lock.short_id}"
        restored.append(tag)
        ran = client.containers.run(tag, ["python", "-c", "import envlock_packdemo as d, six; "
                                          "print(d.VALUE, six.__version__)"],
                                    # network "none", not NetworkDisabled: Podman's Docker API
                                    # ignores the latter and rootless Podman then needs slirp4netns.
                                    remove=True, network_mode="none").decode()
        assert ran.split() == ["42", "1.16.0"]
    finally:
        _remove(client, *restored, f"envlock-pack/base:{lock.short_id}", own, base_id)
    return timings


@pytest.mark.integration
@pytest.mark.slow
def test_pack_then_restore_with_no_network_docker(docker_client: Any, base_image: str, wheelhouse: Path,
                                                  host_env: tuple[Path, Path], tmp_path: Path,
                                                  fresh_caches: None, capfd: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pack"
    timings = _pack_restore_offline(docker_client, base_image, host_env, wheelhouse, out, [], capfd)
    assert (out / "image" / "base.docker.tar").is_file() and (out / "README.md").is_file()
    import shutil

    assert (out / "image" / "base.oci.tar").is_file() == bool(shutil.which("skopeo"))
    if os.environ.get("ENVLOCK_REPORT_TIMINGS"):
        sys.stderr.write(f"pack+restore (docker): {timings}\n")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.podman
def test_pack_as_tar_then_restore_with_no_network_podman(podman_client: Any, podman_base_image: str,
                                                         wheelhouse: Path, host_env: tuple[Path, Path],
                                                         tmp_path: Path, fresh_caches: None,
                                                         capfd: pytest.CaptureFixture[str]) -> None:
    url = os.environ["ENVLOCK_TEST_PODMAN_HOST"]
    out = tmp_path / "pack.tar"
    timings = _pack_restore_offline(podman_client, podman_base_image, host_env, wheelhouse, out,
                                    ["--engine", url], capfd)
    assert out.is_file()
    if os.environ.get("ENVLOCK_REPORT_TIMINGS"):
        sys.stderr.write(f"pack+restore (podman): {timings}\n")


@pytest.mark.slow
def test_pack_then_venv_target_passes_verify_deep(host_env: tuple[Path, Path], wheelhouse: Path,
                                                  tmp_path: Path, fresh_caches: None,
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    python, lock_path = host_env
    out = tmp_path / "pack"
    assert main(["pack", str(lock_path), "-o", str(out), "--no-image", "--wheelhouse", str(wheelhouse),
                 "--python", str(python), "--no-download"]) == 0
    capfd.readouterr()
    venv = tmp_path / "restored"
    t0 = time.monotonic()
    code = main(["restore", str(out), "--target", "venv", str(venv), "--python", sys.executable])
    seconds = time.monotonic() - t0
    got, err = capfd.readouterr()
    assert code == 0 and "OK: the environment matches the lock" in got, got + err
    ran = subprocess.run([str(venv / "bin" / "envlock-packdemo")], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "packdemo 42"  # the console script came back from entry_points.txt
    assert main(["verify", str(lock_path), "--python", str(venv / "bin" / "python"), "--deep"]) == 0, \
        capfd.readouterr()
    # Into an existing venv it never installs.
    assert main(["restore", str(out), "--target", "venv", str(venv)]) == 2
    if os.environ.get("ENVLOCK_REPORT_TIMINGS"):
        sys.stderr.write(f"venv target: {seconds:.1f}s\n")


ROOTLESS_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "podman-rootless.sh"


@pytest.fixture
def rootless_podman() -> Iterator[tuple[Any, str]]:
    """A rootless Podman service: an unprivileged user's ``podman system service`` on a socket
    in its own XDG_RUNTIME_DIR (``scripts/podman-rootless.sh``, which needs root to create the
    user); (client, API URL). Skipped where it cannot be set up, unless
    ENVLOCK_REQUIRE_PODMAN_ROOTLESS=1 asks for it."""
    import shutil

    import docker

    def unavailable(why: str) -> None:
        if os.environ.get("ENVLOCK_REQUIRE_PODMAN_ROOTLESS") == "1":
            pytest.fail(why)
        pytest.skip(why)

    if os.geteuid() != 0 or not shutil.which("podman"):
        unavailable("rootless Podman is set up by root with podman installed")
    proc = subprocess.run(["bash", str(ROOTLESS_SCRIPT), "start"], capture_output=True, text=True,
                          timeout=600, check=False)
    urls = [line.split("=", 1)[1] for line in proc.stdout.splitlines()
            if line.startswith("export ENVLOCK_TEST_PODMAN_ROOTLESS_HOST=")]
    if proc.returncode != 0 or not urls:
        unavailable(f"rootless Podman could not start: {proc.stderr.strip()[-600:]}")
    client = docker.DockerClient(base_url=urls[0])
    try:
        yield client, urls[0]
    finally:
        client.close()
        subprocess.run(["bash", str(ROOTLESS_SCRIPT), "stop"], capture_output=True, timeout=120, check=False)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.podman
def test_pack_then_restore_with_no_network_rootless_podman(rootless_podman: tuple[Any, str], base_image: str,
                                                           wheelhouse: Path, host_env: tuple[Path, Path],
                                                           tmp_path: Path, fresh_caches: None,
                                                           capfd: pytest.CaptureFixture[str]) -> None:
    """The same offline restore through a plain user's Podman: the image loaded from the pack,
    built with network none and verified inside, all without root."""
    client, url = rootless_podman
    timings = _pack_restore_offline(client, f"localhost/{base_image}", host_env, wheelhouse,
                                    tmp_path / "pack", ["--engine", url], capfd)
    if os.environ.get("ENVLOCK_REPORT_TIMINGS"):
        sys.stderr.write(f"pack+restore (rootless podman): {timings}\n")
