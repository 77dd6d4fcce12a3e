"""Container engines: an abstract ``ContainerEngine`` and one docker-SDK implementation.

Podman serves the Docker API on its socket, so one implementation covers Docker (``DOCKER_HOST``,
docker contexts, the default socket) and Podman (``--engine podman`` or a socket URL); the few
places where Podman differs (GPU devices, ``localhost/`` tag prefixes, build output) are handled
here and nowhere else.

Containers envlock creates carry ``org.envlock.owner=<host>/<pid>`` and are removed in a
``finally`` with Ctrl-C held off, so an interrupt never leaves one behind; a run killed harder
than that (SIGKILL) is cleaned up by the next envlock on that host (``remove_stale``).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import socket
import tarfile
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envlock.errors import BuildFailed, EngineUnavailable, UsageError
from envlock.restore.progress import Progress

LABEL_OWNER = "org.envlock.owner"
LOG_TAIL_LINES = 15
_STEP_RE = re.compile(r"^(?:Step|STEP) (\d+)/(\d+) ?: ?(.*)$")
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Engine chatter between steps: nothing a user needs to see in a failure report.
_NOISE_RE = re.compile(r"^\s*(--->|-->|Removing intermediate container|Running in|Using cache)")
_BUILT_RE = re.compile(r"^Successfully built ([0-9a-f]{12,64})\s*$")
PODMAN_SOCKETS = ("{xdg}/podman/podman.sock", "/run/podman/podman.sock", "/run/user/{uid}/podman/podman.sock")
DOCKER_HINT = ("start Docker (e.g. `sudo systemctl start docker`) or point DOCKER_HOST at a running "
               "engine; for Podman: `systemctl --user start podman.socket` and --engine podman")


@dataclass(frozen=True)
class ImageInfo:
    id: str
    repo_digests: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    size: int | None = None

    def pinned_ref(self, wanted_repo: str | None = None) -> str:
        """``repo@sha256:...`` when the image came from a registry, else its id (local only)."""
        for rd in self.repo_digests:
            repo = rd.split("@", 1)[0]
            if wanted_repo is None or _same_repo(repo, wanted_repo):
                return rd
        return self.id


def _same_repo(a: str, b: str) -> bool:
    def norm(r: str) -> str:
        for prefix in ("docker.io/library/", "docker.io/", "localhost/"):
            if r.startswith(prefix):
                r = r[len(prefix):]
        return r.removeprefix("library/")

    return norm(a) == norm(b)


@dataclass(frozen=True)
class RunSpec:
    """One container: what runs, as whom, with which files, mounts, devices and ports."""

    image: str
    command: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    user: str | None = None
    workdir: str | None = None
    files: Mapping[str, bytes] = field(default_factory=dict)  # absolute path -> content
    mounts: Sequence[tuple[str, str, bool]] = ()  # (host, container, read_only)
    gpus: str | None = None  # None, "all", or "0,1"
    ports: Mapping[str, tuple[str, int]] = field(default_factory=dict)  # "8888/tcp" -> (ip, port)
    network: bool = True


@dataclass(frozen=True)
class RunResult:
    exit_code: int
    stdout: bytes
    stderr: bytes


class ContainerEngine(ABC):
    """What restore, run and capture --in-image need from an engine."""

    name: str  # "docker" or "podman"
    endpoint: str

    @abstractmethod
    def image(self, ref: str) -> ImageInfo | None: ...

    @abstractmethod
    def find_image(self, labels: Mapping[str, str]) -> ImageInfo | None: ...

    @abstractmethod
    def pull(self, ref: str) -> ImageInfo: ...

    @abstractmethod
    def tag(self, image_id: str, ref: str) -> None: ...

    @abstractmethod
    def build(self, context: Path, *, tag: str, labels: Mapping[str, str], log_path: Path,
              progress: Progress) -> str: ...

    @abstractmethod
    def run(self, spec: RunSpec, *, on_stdout: Callable[[bytes], None] | None = None,
            on_stderr: Callable[[bytes], None] | None = None) -> RunResult: ...

    @abstractmethod
    def remove_stale(self) -> int: ...

    def push(self, image_id: str, repo: str, tag: str) -> str:
        """Push ``image_id`` as ``repo:tag``; returns the registry's manifest digest."""
        raise EngineUnavailable(f"the {self.name} engine cannot push images")

    def close(self) -> None:
        return None


# -- helpers -----------------------------------------------------------------------------------


@contextlib.contextmanager
def _no_interrupt() -> Iterator[None]:
    """Hold SIGINT off while cleaning up, so a second Ctrl-C cannot orphan a container."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending:
            raise KeyboardInterrupt


def tar_files(files: Mapping[str, bytes], root: str) -> bytes:
    """A tar of ``files`` (absolute paths under ``root``) for ``put_archive(root)``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs: set[str] = set()
        for path, data in sorted(files.items()):
            rel = os.path.relpath(path, root)
            if rel.startswith(".."):
                raise ValueError(f"{path} is not under {root}")
            parts = rel.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            info = tarfile.TarInfo(rel)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _no_timeout(sock: Any) -> None:
    """A silent command (pip, a training epoch) must not hit the client's read timeout."""
    for candidate in (sock, getattr(sock, "_sock", None)):
        if candidate is not None and hasattr(candidate, "settimeout"):
            with contextlib.suppress(Exception):
                candidate.settimeout(None)


def _close_socket(sock: Any) -> None:
    """Close a hijacked attach socket for real (the SocketIO wrapper and the socket under it)."""
    real = getattr(sock, "_sock", None)
    for obj in (getattr(sock, "_response", None), sock, real):
        if obj is not None:
            with contextlib.suppress(Exception):
                obj.close()


def _check_unix_socket(endpoint: str) -> None:
    """Fail fast on a dead unix socket, before the docker SDK (which leaks the socket then)."""
    if not endpoint.startswith("unix://"):
        return
    path = endpoint[len("unix://"):]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(10)
        sock.connect(path)
    except OSError as exc:
        raise EngineUnavailable(f"no container engine reachable at {endpoint} ({exc.strerror or exc})",
                                hint=DOCKER_HINT) from None
    finally:
        sock.close()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_label() -> str:
    return f"{socket.gethostname()}/{os.getpid()}"


# -- docker SDK --------------------------------------------------------------------------------


class DockerEngine(ContainerEngine):
    """Docker or Podman through the docker SDK (Podman's Docker-compatible API)."""

    def __init__(self, make_client: Callable[[float | None], Any], endpoint: str) -> None:
        self.endpoint = endpoint
        _check_unix_socket(endpoint)
        probe = None
        try:
            probe = make_client(15.0)
            probe.ping()
            version = probe.version()
        except Exception as exc:
            raise EngineUnavailable(
                f"no container engine reachable at {endpoint} ({_short(exc)})", hint=DOCKER_HINT
            ) from None
        finally:
            if probe is not None:
                with contextlib.suppress(Exception):
                    probe.close()
        components = " ".join(str(c.get("Name", "")) for c in version.get("Components") or [])
        self.name = "podman" if "podman" in components.lower() else "docker"
        self.version = str(version.get("Version", ""))
        # No read timeout: pip installing torch prints nothing for minutes, and so may a job.
        self.client = make_client(None)
        self.api = self.client.api

    # images

    def _info(self, raw: Mapping[str, Any]) -> ImageInfo:
        labels = (raw.get("Config") or {}).get("Labels") or raw.get("Labels") or {}
        return ImageInfo(id=str(raw["Id"]) if str(raw["Id"]).startswith("sha256:") else "sha256:" + str(raw["Id"]),
                         repo_digests=tuple(raw.get("RepoDigests") or ()),
                         tags=tuple(raw.get("RepoTags") or ()), labels=dict(labels),
                         size=raw.get("Size"))

    def image(self, ref: str) -> ImageInfo | None:
        from docker.errors import ImageNotFound, NotFound

        candidates = [ref]
        if self.name == "podman" and not ref.startswith(("sha256:", "localhost/")) and "/" in ref.split(":")[0]:
            candidates.append("localhost/" + ref)
        for cand in candidates:
            try:
                return self._info(self.api.inspect_image(cand))
            except (ImageNotFound, NotFound):
                continue
        return None

    def find_image(self, labels: Mapping[str, str]) -> ImageInfo | None:
        # One label in the engine's filter, the rest checked here: Podman 4's Docker API
        # answers nothing at all when given two label filters.
        first = next(iter(labels.items()), None)
        filters = {"label": [f"{first[0]}={first[1]}"]} if first else {}
        for raw in self.api.images(filters=filters):
            info = self.image(str(raw["Id"]))
            if info and all(info.labels.get(k) == v for k, v in labels.items()):
                return info
        return None

    def pull(self, ref: str) -> ImageInfo:
        from docker.errors import APIError

        try:
            self.client.images.pull(ref)
        except APIError as exc:
            raise EngineUnavailable(f"cannot pull {ref}: {_short(exc)}",
                                    hint="check the name and the network, or pass --base with a local image") from None
        info = self.image(ref)
        if info is None:
            raise EngineUnavailable(f"pulled {ref}, but the engine does not list it")
        return info

    def tag(self, image_id: str, ref: str) -> None:
        repo, _, tag = ref.rpartition(":")
        self.api.tag(image_id, repo, tag)

    def push(self, image_id: str, repo: str, tag: str) -> str:
        from docker.errors import APIError

        self.api.tag(image_id, repo, tag)
        digest = None
        try:
            for chunk in self.api.push(repo, tag=tag, stream=True, decode=True):
                if chunk.get("error"):
                    raise EngineUnavailable(f"cannot push {repo}:{tag}: {_shorten(str(chunk['error']))}",
                                            hint="is the registry reachable, and are you logged in?")
                aux = chunk.get("aux") or {}
                if isinstance(aux, dict) and isinstance(aux.get("Digest"), str):
                    digest = aux["Digest"]
        except APIError as exc:
            raise EngineUnavailable(f"cannot push {repo}:{tag}: {_short(exc)}") from None
        if digest is None:  # engines that do not report it (Podman) still list it afterwards
            info = self.image(image_id)
            pinned = info.pinned_ref(repo) if info else ""
            digest = pinned.split("@", 1)[1] if "@" in pinned else None
        if digest is None:
            raise EngineUnavailable(f"pushed {repo}:{tag}, but the engine did not report its digest")
        return str(digest)

    def build(self, context: Path, *, tag: str, labels: Mapping[str, str], log_path: Path,
              progress: Progress) -> str:
        from docker.errors import APIError, BuildError

        tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        step: str | None = None
        image_id: str | None = None
        error: str | None = None
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w", encoding="utf-8") as log:
            try:
                chunks = self.api.build(path=str(context), tag=tag, rm=True, forcerm=True,
                                        decode=True, labels=dict(labels), pull=False)
                for chunk in chunks:
                    if "error" in chunk or "errorDetail" in chunk:
                        detail = chunk.get("errorDetail") or {}
                        error = str(chunk.get("error") or detail.get("message") or "build failed")
                        log.write(error + "\n")
                        tail.append(error)
                        break
                    aux = chunk.get("aux")
                    if isinstance(aux, dict) and aux.get("ID"):
                        image_id = str(aux["ID"])
                    text = chunk.get("stream") or chunk.get("status") or ""
                    if not isinstance(text, str) or not text:
                        continue
                    text = _ANSI_RE.sub("", text)
                    log.write(text if text.endswith("\n") else text + "\n")
                    for raw_line in text.splitlines():
                        line = raw_line.rstrip()
                        if not line:
                            continue
                        m = _STEP_RE.match(line)
                        if m:
                            step = f"{m.group(1)}/{m.group(2)}: {m.group(3)}"
                            progress.step(int(m.group(1)), int(m.group(2)), m.group(3))
                            continue
                        built = _BUILT_RE.match(line)
                        if built and image_id is None:
                            image_id = built.group(1)
                        if not _NOISE_RE.match(line):
                            tail.append(line)
                        progress.line(line)
            except KeyboardInterrupt:
                # Closing the connection makes the daemon cancel the build; forcerm removes
                # its intermediate containers.
                with contextlib.suppress(Exception):
                    self.client.close()
                raise
            except (APIError, BuildError) as exc:
                error = _short(exc)
                log.write(error + "\n")
                tail.append(error)
            finally:
                progress.close()
        if error is not None:
            where = f" at step {_shorten(step)}" if step else ""
            # pip and most tools say what went wrong in their last ERROR line; the engine's own
            # message only says that the command failed.
            cause = next((t for t in reversed(tail) if t.startswith(("ERROR", "error:", "envlock:"))), error)
            raise BuildFailed(f"image build failed{where}: {cause}", step=step, log_tail=list(tail),
                              log_path=str(log_path),
                              hint=f"full build log: {log_path}")
        info = self.image(image_id) if image_id else None
        info = info or self.image(tag)
        if info is None:
            raise BuildFailed("the build finished but the engine does not know the image",
                              log_tail=list(tail), log_path=str(log_path))
        return info.id

    # containers

    def run(self, spec: RunSpec, *, on_stdout: Callable[[bytes], None] | None = None,
            on_stderr: Callable[[bytes], None] | None = None) -> RunResult:
        from docker.errors import APIError
        from docker.utils.socket import STDERR, frames_iter

        api = self.api
        host_kwargs: dict[str, Any] = {}
        if spec.mounts:
            host_kwargs["binds"] = {h: {"bind": c, "mode": "ro" if ro else "rw"} for h, c, ro in spec.mounts}
        if spec.ports:
            host_kwargs["port_bindings"] = {k: v for k, v in spec.ports.items()}
        if not spec.network:
            host_kwargs["network_mode"] = "none"
        if spec.gpus:
            host_kwargs.update(self._gpu_kwargs(spec.gpus))
        host_config = api.create_host_config(**host_kwargs)
        try:
            created = api.create_container(
                spec.image, list(spec.command), environment=dict(spec.env), user=spec.user or "",
                working_dir=spec.workdir, labels={LABEL_OWNER: owner_label()},
                host_config=host_config, ports=_exposed(spec.ports), detach=True, tty=False,
                stdin_open=False)
        except APIError as exc:
            raise EngineUnavailable(f"cannot create a container from {spec.image}: {_short(exc)}") from None
        cid = str(created["Id"])
        out, err = bytearray(), bytearray()
        try:
            by_root: dict[str, dict[str, bytes]] = {}
            for path, data in spec.files.items():
                by_root.setdefault("/tmp", {})[path] = data
            for root, files in by_root.items():
                api.put_archive(cid, root, tar_files(files, root))
            # Attach before start (as `docker run` does), so no early output is lost.
            sock = api.attach_socket(cid, params={"stdout": 1, "stderr": 1, "stream": 1, "logs": 1})
            try:
                _no_timeout(sock)
                try:
                    api.start(cid)
                except APIError as exc:
                    raise EngineUnavailable(
                        f"cannot start {spec.command[0]} in {spec.image}: {_short(exc)}") from None
                for stream_id, data in frames_iter(sock, False):
                    if stream_id == STDERR:
                        err += data
                        if on_stderr:
                            on_stderr(data)
                    else:
                        out += data
                        if on_stdout:
                            on_stdout(data)
            finally:
                _close_socket(sock)
            code = int(api.wait(cid).get("StatusCode", 1))
        finally:
            with _no_interrupt(), contextlib.suppress(Exception):
                api.remove_container(cid, force=True)
        return RunResult(code, bytes(out), bytes(err))

    def _gpu_kwargs(self, gpus: str) -> dict[str, Any]:
        ids = [] if gpus == "all" else [g.strip() for g in gpus.split(",") if g.strip()]
        if self.name == "podman":
            # Podman's Docker API ignores DeviceRequests; it takes CDI device names.
            names = ["nvidia.com/gpu=all"] if not ids else [f"nvidia.com/gpu={i}" for i in ids]
            return {"devices": [f"{n}:{n}:rwm" for n in names]}
        from docker.types import DeviceRequest

        if ids:
            return {"device_requests": [DeviceRequest(device_ids=ids, capabilities=[["gpu"]])]}
        return {"device_requests": [DeviceRequest(count=-1, capabilities=[["gpu"]])]}

    def remove_stale(self) -> int:
        """Remove containers of envlock processes on this host that died without cleaning up."""
        host = socket.gethostname()
        removed = 0
        with contextlib.suppress(Exception):
            for c in self.api.containers(all=True, filters={"label": LABEL_OWNER}):
                owner = str((c.get("Labels") or {}).get(LABEL_OWNER, ""))
                h, _, pid = owner.rpartition("/")
                if h == host and pid.isdigit() and not _pid_alive(int(pid)):
                    with contextlib.suppress(Exception):
                        self.api.remove_container(c["Id"], force=True)
                        removed += 1
        return removed

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()


def _exposed(ports: Mapping[str, tuple[str, int]]) -> list[tuple[int, str]] | None:
    """``"8888/tcp"`` keys as docker-py wants them: (port, proto). Given the string, docker-py
    appends its own ``/tcp`` and exposes ``8888/tcp/tcp``, and the binding publishes nothing."""
    out = []
    for key in ports:
        port, _, proto = key.partition("/")
        out.append((int(port), proto or "tcp"))
    return out or None


def _shorten(text: str, limit: int = 110) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short(exc: BaseException) -> str:
    text = str(getattr(exc, "explanation", None) or exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


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


def _docker_endpoint() -> str:
    """Where the docker SDK will connect: $DOCKER_HOST, the current docker context, the default."""
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    with contextlib.suppress(Exception):
        from docker.context import ContextAPI

        ctx = ContextAPI.get_current_context()
        if ctx is not None and ctx.Name != "default" and ctx.Host:
            return str(ctx.Host)
    return "unix:///var/run/docker.sock"


def _docker_context_client(timeout: float | None) -> Any:
    """A client for $DOCKER_HOST, else the current docker context, else the default socket."""
    import docker

    if not os.environ.get("DOCKER_HOST"):
        with contextlib.suppress(Exception):
            from docker.context import ContextAPI

            ctx = ContextAPI.get_current_context()
            if ctx is not None and ctx.Name != "default" and ctx.Host:
                return docker.DockerClient(base_url=ctx.Host, tls=ctx.TLSConfig, timeout=timeout)
    kwargs: dict[str, Any] = {}
    if timeout is not None:
        kwargs["timeout"] = timeout
    client = docker.from_env(**kwargs)
    if timeout is None:
        client.api.timeout = None
    return client


def connect(engine: str | None = None) -> ContainerEngine:
    """``docker`` (default), ``podman``, or an API URL such as ``unix:///run/podman/podman.sock``."""
    import docker

    source = "--engine" if engine else "ENVLOCK_ENGINE"
    spec = engine or os.environ.get("ENVLOCK_ENGINE") or "docker"
    if spec == "docker":
        return DockerEngine(_docker_context_client, _docker_endpoint())
    if spec == "podman":
        url = podman_socket()
        if url is None:
            raise EngineUnavailable(
                "no Podman API socket found ($CONTAINER_HOST, $XDG_RUNTIME_DIR/podman/podman.sock, "
                "/run/podman/podman.sock)",
                hint="start it with `systemctl --user start podman.socket` (or `podman system "
                     "service --time=0 &`), or pass --engine unix:///path/to/podman.sock")
    elif re.match(r"^(unix|tcp|ssh|npipe|http|https)://", spec):
        url = spec
    else:
        raise UsageError(f"{source} must be docker, podman or an API URL, not {spec!r}")

    def make(timeout: float | None) -> Any:
        client = docker.DockerClient(base_url=url, timeout=timeout if timeout is not None else 60)
        if timeout is None:
            client.api.timeout = None
        return client

    return DockerEngine(make, url)
