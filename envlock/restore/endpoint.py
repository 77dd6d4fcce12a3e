"""Which engine to talk to: ``--engine``/``ENVLOCK_ENGINE``, Docker's own lookup, Podman's sockets.

Docker: $DOCKER_HOST, else the current docker context, else the default socket, as the docker
CLI does. Podman: $CONTAINER_HOST, else its usual API sockets. An API URL names one directly.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envlock.errors import EngineUnavailable, UsageError
from envlock.restore.dockerengine import DockerEngine

DEFAULT_DOCKER_SOCKET = "unix:///var/run/docker.sock"
PODMAN_SOCKETS = ("{xdg}/podman/podman.sock", "/run/podman/podman.sock", "/run/user/{uid}/podman/podman.sock")
_API_URL_RE = re.compile(r"^(unix|tcp|ssh|npipe|http|https)://")


@dataclass(frozen=True)
class Endpoint:
    """Where an engine listens (``url``, for messages and the socket check) and how to connect:
    ``base_url=None`` lets the SDK read $DOCKER_HOST/$DOCKER_TLS_VERIFY or take the default
    socket; ``tls`` is a docker context's TLS settings."""

    url: str
    base_url: str | None = None
    tls: Any = False

    def client(self, timeout: float) -> Any:
        """A docker SDK client whose requests time out after ``timeout`` seconds (the engine
        lifts it once connected: ``DockerEngine``)."""
        import docker

        if self.base_url is None:
            return docker.from_env(timeout=timeout)
        return docker.DockerClient(base_url=self.base_url, tls=self.tls, timeout=timeout)


def docker_endpoint() -> Endpoint:
    """Where the docker CLI would connect: $DOCKER_HOST, the current docker context, the default."""
    if os.environ.get("DOCKER_HOST"):
        return Endpoint(os.environ["DOCKER_HOST"])
    with contextlib.suppress(Exception):
        from docker.context import ContextAPI

        ctx = ContextAPI.get_current_context()
        if ctx is not None and ctx.Name != "default" and ctx.Host:
            return Endpoint(str(ctx.Host), str(ctx.Host), ctx.TLSConfig)
    return Endpoint(DEFAULT_DOCKER_SOCKET)


def podman_socket() -> str | None:
    """The first Podman API socket that exists: $CONTAINER_HOST, then the usual paths."""
    if os.environ.get("CONTAINER_HOST"):
        return os.environ["CONTAINER_HOST"]
    xdg = os.environ.get("XDG_RUNTIME_DIR", f"/run/user/{os.getuid()}")
    for pattern in PODMAN_SOCKETS:
        path = pattern.format(xdg=xdg, uid=os.getuid())
        if Path(path).exists():
            return "unix://" + path
    return None


def connect(engine: str | None = None) -> DockerEngine:
    """``docker`` (default), ``podman``, or an API URL such as ``unix:///run/podman/podman.sock``."""
    source = "--engine" if engine else "ENVLOCK_ENGINE"
    spec = engine or os.environ.get("ENVLOCK_ENGINE") or "docker"
    if spec == "docker":
        where = docker_endpoint()
    elif spec == "podman":
        url = podman_socket()
        if url is None:
            raise EngineUnavailable(
                "no Podman API socket found ($CONTAINER_HOST, $XDG_RUNTIME_DIR/podman/podman.sock, "
                "/run/podman/podman.sock)",
                hint="start it with `systemctl --user start podman.socket` (or `podman system "
                     "service --time=0 &`), or pass --engine unix:///path/to/podman.sock")
        where = Endpoint(url, url)
    elif _API_URL_RE.match(spec):
        where = Endpoint(spec, spec)
    else:
        raise UsageError(f"{source} must be docker, podman or an API URL, not {spec!r}")
    # A docker command-line client that builds (``clibuild``) finds DOCKER_HOST or its current
    # context by itself, as ``docker_endpoint`` did; an engine named by URL is told to it.
    return DockerEngine(where.client, where.url, cli_host=spec if _API_URL_RE.match(spec) else None)
