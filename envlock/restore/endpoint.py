"""Which engine to talk to: ``--engine``/``ENVLOCK_ENGINE``, Docker's own lookup, Podman's sockets.

Docker: the endpoint is resolved once, here, as the docker CLI resolves it (``resolveContextName``
in docker/cli): $DOCKER_HOST, else the context $DOCKER_CONTEXT names, else the ``currentContext``
of ``$DOCKER_CONFIG/config.json`` (``~/.docker/config.json``), else the default socket. A
context is read from the CLI's store, ``contexts/meta/<sha256 of its name>/meta.json`` in that
directory whether or not it holds a config.json (``config.ContextStoreDir`` in docker/cli; its
TLS files under ``contexts/tls/<same>/docker/``). The SDK connects to what was resolved, and a
command-line client that builds (``clibuild``) is told the same endpoint in its environment
(``Endpoint.cli_env``: DOCKER_HOST set, DOCKER_CONTEXT removed), so the image a restore tags and
the image its build starts from are on one engine. Podman: $CONTAINER_HOST, else its usual API
sockets. An API URL names one directly.

docker-py's own lookup (docker 7.2's ``docker.context.ContextAPI``, which ``from_env`` now uses)
is not the CLI's, so it is not used: it reads the store beside the first config.json that exists
(docker/context/config.py:53, docker/utils/config.py:13-30), ``~/.docker``'s or ``./contexts``
when $DOCKER_CONFIG holds none, and a context it does not find gives the default socket where the
CLI fails (docker/context/api.py:150-152, docker/client.py:105-108). It also skips TLS
verification for a meta.json without ``SkipTLSVerify`` (docker/context/context.py:116), which the
CLI verifies.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envlock.errors import EngineUnavailable, UsageError
from envlock.restore.dockerengine import DockerEngine

DEFAULT_DOCKER_SOCKET = "unix:///var/run/docker.sock"
PODMAN_SOCKETS = ("{xdg}/podman/podman.sock", "/run/podman/podman.sock", "/run/user/{uid}/podman/podman.sock")
_API_URL_RE = re.compile(r"^(unix|tcp|ssh|npipe|http|https)://")
# What a docker client reads to find its engine besides DOCKER_HOST: a context names one, the
# TLS variables say how to reach it. A client given the endpoint is given these as it says.
_CONTEXT_VAR = "DOCKER_CONTEXT"
_TLS_VARS = ("DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")
_META_MAX = 1 << 20  # a context's meta.json is a few hundred bytes


@dataclass(frozen=True)
class Endpoint:
    """Where an engine listens (``url``, for messages and the socket check) and how to connect:
    ``base_url=None`` lets the SDK read $DOCKER_HOST and its TLS variables; ``tls`` is a docker
    context's TLS settings. ``cli_env``: what a docker command-line client's environment must
    say to reach this engine and no other (a value, or None for a variable removed)."""

    url: str
    base_url: str | None = None
    tls: Any = False
    cli_env: tuple[tuple[str, str | None], ...] = ()

    def client(self, timeout: float) -> Any:
        """A docker SDK client whose requests time out after ``timeout`` seconds (the engine
        lifts it once connected: ``DockerEngine``). Without ``base_url`` it is made from
        DOCKER_HOST and its TLS variables alone, not ``docker.from_env``, which since docker 7.2
        also looks a context up by its own rules (see the module's docstring)."""
        import docker
        from docker.utils import kwargs_from_env

        if self.base_url is None:
            return docker.DockerClient(timeout=timeout, **kwargs_from_env())
        return docker.DockerClient(base_url=self.base_url, tls=self.tls, timeout=timeout)


def _told(url: str, tls: tuple[tuple[str, str | None], ...] = ()) -> tuple[tuple[str, str | None], ...]:
    """A client's environment for ``url``: DOCKER_HOST, which the CLI reads before any context,
    and no DOCKER_CONTEXT, so nothing in it names another engine."""
    return (("DOCKER_HOST", url), (_CONTEXT_VAR, None), *tls)


def config_dir(environ: Mapping[str, str]) -> Path:
    """The docker CLI's configuration directory: $DOCKER_CONFIG, else ``~/.docker``."""
    return Path(environ.get("DOCKER_CONFIG") or Path.home() / ".docker")


def _json(path: Path) -> Any:
    """A JSON file of the docker CLI's, read up to ``_META_MAX`` bytes (OSError, ValueError)."""
    with open(path, "rb") as fh:
        return json.loads(fh.read(_META_MAX))


def _current_context(where: Path) -> str:
    """``currentContext`` of the CLI's ``config.json`` ("" when it has none or is unreadable,
    as the CLI then takes the default)."""
    try:
        data = _json(where / "config.json")
    except (OSError, ValueError):
        return ""
    value = data.get("currentContext") if isinstance(data, dict) else None
    return value if isinstance(value, str) else ""


def context_endpoint(name: str, where: Path, source: str) -> Endpoint:
    """The docker endpoint of the context ``name`` in the CLI's store under ``where``."""
    key = hashlib.sha256(name.encode("utf-8")).hexdigest()
    meta = where / "contexts" / "meta" / key / "meta.json"
    try:
        data = _json(meta)
    except FileNotFoundError:
        raise EngineUnavailable(f"docker context {name!r} ({source}) does not exist in {where}",
                                hint="`docker context ls` lists the contexts; unset DOCKER_CONTEXT, or "
                                     "`docker context use default`") from None
    except (OSError, ValueError) as exc:
        raise EngineUnavailable(f"cannot read docker context {name!r} ({meta}): {exc}") from None
    endpoints = data.get("Endpoints") if isinstance(data, dict) else None
    docker_ep = endpoints.get("docker") if isinstance(endpoints, dict) else None
    docker_ep = docker_ep if isinstance(docker_ep, dict) else {}
    host = docker_ep.get("Host") if isinstance(docker_ep.get("Host"), str) else ""
    host = host or DEFAULT_DOCKER_SOCKET
    tls_dir = where / "contexts" / "tls" / key / "docker"
    files = {n: tls_dir / f"{n}.pem" for n in ("ca", "cert", "key")}
    if not all(f.is_file() for f in files.values()):
        return Endpoint(host, host, False, _told(host, tuple((v, None) for v in _TLS_VARS)))
    from docker.tls import TLSConfig

    verify = not bool(docker_ep.get("SkipTLSVerify"))
    tls = TLSConfig(client_cert=(str(files["cert"]), str(files["key"])), ca_cert=str(files["ca"]),
                    verify=verify)
    return Endpoint(host, host, tls, _told(host, (("DOCKER_CERT_PATH", str(tls_dir)),
                                                  ("DOCKER_TLS_VERIFY", "1" if verify else None))))


def docker_endpoint(environ: Mapping[str, str] | None = None) -> Endpoint:
    """Where the docker CLI would connect: $DOCKER_HOST, the context $DOCKER_CONTEXT names, the
    config's current context, the default socket; the order of docker/cli's
    ``resolveContextName``. A context that does not exist is an error, as it is to the CLI."""
    env = os.environ if environ is None else environ
    if env.get("DOCKER_HOST"):
        return Endpoint(env["DOCKER_HOST"], None, False, _told(env["DOCKER_HOST"]))
    where = config_dir(env)
    if env.get(_CONTEXT_VAR):
        name, source = env[_CONTEXT_VAR], "from $DOCKER_CONTEXT"
    else:
        name, source = _current_context(where), f"the currentContext of {where / 'config.json'}"
    if name and name != "default":
        return context_endpoint(name, where, source)
    return Endpoint(DEFAULT_DOCKER_SOCKET, None, False, _told(DEFAULT_DOCKER_SOCKET))


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


def resolve(engine: str | None = None) -> Endpoint:
    """The one endpoint of this command: ``docker`` (default), ``podman``, or an API URL such
    as ``unix:///run/podman/podman.sock``."""
    source = "--engine" if engine else "ENVLOCK_ENGINE"
    spec = engine or os.environ.get("ENVLOCK_ENGINE") or "docker"
    if spec == "docker":
        return docker_endpoint()
    if spec == "podman":
        url = podman_socket()
        if url is None:
            raise EngineUnavailable(
                "no Podman API socket found ($CONTAINER_HOST, $XDG_RUNTIME_DIR/podman/podman.sock, "
                "/run/podman/podman.sock)",
                hint="start it with `systemctl --user start podman.socket` (or `podman system "
                     "service --time=0 &`), or pass --engine unix:///path/to/podman.sock")
        return Endpoint(url, url, False, _told(url))
    if _API_URL_RE.match(spec):
        return Endpoint(spec, spec, False, _told(spec))
    raise UsageError(f"{source} must be docker, podman or an API URL, not {spec!r}")


def connect(engine: str | None = None) -> DockerEngine:
    """The engine of ``resolve(engine)``, whose builds through a command-line client go to it too."""
    where = resolve(engine)
    return DockerEngine(where.client, where.url, cli_env=where.cli_env)
