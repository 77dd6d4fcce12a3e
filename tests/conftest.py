"""Shared pytest fixtures and hooks for the envlock test suite."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import LockFactory, make_lock, unavailable

# A suite started in the background by a non-interactive shell (`bash scripts/test.sh &`, nohup)
# inherits SIGINT as *ignored*, and an ignored signal stays ignored across exec: every envlock
# process a test starts would then ignore the Ctrl-C the interrupt tests send it, and the test
# would wait out its timeout (seen: a venv restore still in pip 120 s after SIGINT, its SigIgn
# mask showing SIGINT). A Python handler is reset to the default on exec, so installing
# Python's own makes the children start as a terminal's would.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# =============================================================================
# Container engines, base image and wheelhouse
#
# `bash scripts/test.sh` provides all of these and exports:
#   DOCKER_HOST               Docker API endpoint (mandatory engine)
#   ENVLOCK_TEST_PODMAN_HOST  Podman API endpoint (optional engine; unset when
#                             Podman does not work on the machine)
#   ENVLOCK_TEST_BASE_IMAGE   Debian bookworm minbase + python3/pip/venv image,
#                             present in Docker (and in Podman, where its name
#                             may read localhost/<name>)
#   ENVLOCK_TEST_WHEELHOUSE   directory of cp311 manylinux x86_64 wheels for
#                             offline `pip install --no-index --find-links`
#                             inside containers (they reach no package index)
#   ENVLOCK_REQUIRE_ENGINE=1  missing Docker/base image/wheelhouse fails the
#                             test instead of skipping it
#   ENVLOCK_REQUIRE_PODMAN=1  likewise for Podman (exported when Podman works)
#
# Without them (a plain pytest), what is missing skips: helpers.unavailable.
#
# This module defines pytest_collection_modifyitems (integration tests run
# last). A second function of that name further down would silently replace
# it: extend this one instead.
# =============================================================================

DEFAULT_BASE_IMAGE = "envlock-test/bookworm-python:1"


def _refuses(url: str) -> str | None:
    """Why a ``unix://`` endpoint accepts no connection (None when it does, or is not unix).

    Checked with a socket closed here, before docker-py connects: docker-py leaks its socket when
    the connect fails, and the leak surfaces at exit as an unraisable ResourceWarning that turns
    an otherwise skipped run into exit 1.
    """
    if not url.startswith("unix://"):
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        try:
            sock.connect(url[len("unix://"):])
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def _close_quietly(client: Any) -> None:
    with contextlib.suppress(Exception):
        client.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run tests marked ``integration`` after all others (stable order otherwise)."""
    items.sort(key=lambda item: item.get_closest_marker("integration") is not None)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A pinged ``docker.DockerClient`` for the Docker engine (``docker.from_env()``)."""
    import docker
    from docker.errors import DockerException

    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    refused = _refuses(where)
    if refused:
        unavailable(f"Docker not reachable at {where}: {refused}")
    try:
        client = docker.from_env()
    except DockerException as exc:
        unavailable(f"Docker not reachable at {where}: {exc}")
    try:
        client.ping()
    except Exception as exc:
        _close_quietly(client)
        unavailable(f"Docker not reachable at {where}: {exc}")
    yield client
    _close_quietly(client)


@pytest.fixture(scope="session")
def podman_client() -> Iterator[Any]:
    """A pinged ``docker.DockerClient`` talking to Podman's Docker-compatible API."""
    import docker
    from docker.errors import DockerException

    url = os.environ.get("ENVLOCK_TEST_PODMAN_HOST")
    if not url:
        unavailable(
            "Podman not available (ENVLOCK_TEST_PODMAN_HOST unset)",
            required_env="ENVLOCK_REQUIRE_PODMAN",
        )
    refused = _refuses(url)
    if refused:
        unavailable(f"Podman not reachable at {url}: {refused}", required_env="ENVLOCK_REQUIRE_PODMAN")
    try:
        client = docker.DockerClient(base_url=url)
    except DockerException as exc:
        unavailable(f"Podman not reachable at {url}: {exc}", required_env="ENVLOCK_REQUIRE_PODMAN")
    try:
        client.ping()
    except Exception as exc:
        _close_quietly(client)
        unavailable(f"Podman not reachable at {url}: {exc}", required_env="ENVLOCK_REQUIRE_PODMAN")
    yield client
    _close_quietly(client)


def _base_image_name() -> str:
    return os.environ.get("ENVLOCK_TEST_BASE_IMAGE") or DEFAULT_BASE_IMAGE


@pytest.fixture(scope="session")
def base_image(docker_client: Any) -> str:
    """Name of the base image (python3 + pip + venv on bookworm) in Docker."""
    from docker.errors import ImageNotFound

    name = _base_image_name()
    try:
        docker_client.images.get(name)
    except ImageNotFound:
        unavailable(f"base image {name} not found in Docker; run scripts/test.sh")
    return name


@pytest.fixture(scope="session")
def podman_base_image(podman_client: Any) -> str:
    """Name under which the base image is known to Podman (may be ``localhost/...``)."""
    from docker.errors import ImageNotFound

    name = _base_image_name()
    for candidate in (name, f"localhost/{name}"):
        try:
            podman_client.images.get(candidate)
        except ImageNotFound:
            continue
        return candidate
    unavailable(
        f"base image {name} not found in Podman; run scripts/test.sh",
        required_env="ENVLOCK_REQUIRE_PODMAN",
    )


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    """Directory of wheels to install offline inside containers.

    Mount it read-only and install with
    ``pip install --no-index --find-links /wheels ...`` (the containers reach
    no package index).
    """
    raw = os.environ.get("ENVLOCK_TEST_WHEELHOUSE")
    if not raw:
        unavailable("ENVLOCK_TEST_WHEELHOUSE is not set; run scripts/test.sh")
    path = Path(raw)
    if not path.is_dir() or not any(path.glob("*.whl")):
        unavailable(f"wheelhouse {path} is missing or holds no wheels; run scripts/test.sh")
    return path


# =============================================================================
# End of the container-engine section.
# =============================================================================


# =============================================================================
# Restore (envlock/restore): lock builders shared by tests/test_restore_*.py
# =============================================================================


# What the restore tests lock unless told otherwise: a venv at /opt/venv (the path restore
# recreates) on Debian's Python 3.11.2, with the three distributions a fresh venv holds.
RESTORE_DEFAULTS: dict[str, Any] = {
    "platform": {"os": "Linux", "machine": "x86_64", "libc": "glibc", "libc_version": "2.36"},
    "python": {"version": "3.11.2", "implementation": "cpython", "prefix_kind": "venv",
               "prefix": "/opt/venv", "soabi": "cpython-311-x86_64-linux-gnu"},
    "packages": [("six", "1.16.0"), ("pip", "23.0.1"), ("setuptools", "66.1.1")],
}


@pytest.fixture(params=["cli", "sdk"])
def builder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """ENVLOCK_BUILDER for a restore test that must pass on both build paths: the engine's own
    command-line client (BuildKit, Buildah: the wheels mounted) and the docker SDK's classic
    builder (a build stage). ``scripts/test.sh`` installs the clients."""
    monkeypatch.setenv("ENVLOCK_BUILDER", request.param)
    return str(request.param)


@pytest.fixture
def restore_lock() -> LockFactory:
    """``helpers.make_lock`` with RESTORE_DEFAULTS: ``restore_lock(image={...}, packages=[...])``."""
    return functools.partial(make_lock, **RESTORE_DEFAULTS)


# =============================================================================
# End of the restore section.
# =============================================================================


# =============================================================================
# Which environment: capture/verify follow VIRTUAL_ENV and CONDA_PREFIX (envlock/target.py).
# The tests must not lock whatever environment the developer's shell has activated.
# =============================================================================


@pytest.fixture(autouse=True)
def _no_activated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV"):
        monkeypatch.delenv(name, raising=False)


# PyTorch's wheel index is configuration (ENVLOCK_TORCH_INDEX_URL): unset unless a test asks
# for one, and then an address under .example, never a real registry's.
TORCH_INDEX = "https://torch-index.example/whl"


@pytest.fixture(autouse=True)
def _no_configured_torch_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENVLOCK_TORCH_INDEX_URL", raising=False)


@pytest.fixture
def torch_index(monkeypatch: pytest.MonkeyPatch) -> str:
    """ENVLOCK_TORCH_INDEX_URL set to a stand-in base; the value."""
    monkeypatch.setenv("ENVLOCK_TORCH_INDEX_URL", TORCH_INDEX)
    return TORCH_INDEX


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated sys.path holding only the fake distributions a test writes."""
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [str(site)])
    return site


# =============================================================================
# pip's and uv's configuration (export, bundle, pack read it: envlock/export/config.py).
# =============================================================================


@pytest.fixture
def installer_clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No pip or uv configuration, variable or cache of this machine takes part; the working
    directory is an empty project (returned)."""
    for var in list(os.environ):
        if var.startswith(("PIP_", "UV_")):
            monkeypatch.delenv(var)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "etc-xdg"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip-cache"))
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "envlock-cache"))
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    return project


@pytest.fixture(scope="session")
def conda_channel(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A local conda channel of hand-built packages (tests/condapkgs.py) and a prefix py-rattler
    installed from it, built once: py-rattler, gcc and patchelf come from scripts/test.sh, and
    without them every test using this fails."""
    from condapkgs import make_channel

    return make_channel(tmp_path_factory.mktemp("conda"))
