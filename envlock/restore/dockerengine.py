"""Docker and Podman through the docker SDK: the one ``ContainerEngine`` implementation.

Podman serves the Docker API on its socket, so one implementation covers Docker and Podman
(``envlock.restore.endpoint`` finds the socket and connects); the few places where Podman differs (GPU devices, ``localhost/`` tag prefixes, build output) are handled
here and nowhere else. The engine's answers come back as text and HTTP errors; this module turns
them into ``envlock.errors`` types, so no caller reads an engine's wording.

Containers are removed in a ``finally`` with Ctrl-C held off, so an interrupt never leaves one
behind.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import signal
import socket
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

from envlock._signals import GRACE_SECONDS, GRACE_VAR, deferred
from envlock.errors import (
    BuildFailed,
    CommandNotFound,
    ContainerFailed,
    EngineUnavailable,
    ImageNotFound,
)
from envlock.probe import imageref
from envlock.probe.procs import pid_alive
from envlock.probing.process import seconds_from_env
from envlock.restore import clibuild
from envlock.restore.buildlog import BuildLog, context_sent, shorten
from envlock.restore.engine import (
    LABEL_OWNER,
    BuildMode,
    ContainerEngine,
    ImageInfo,
    RunResult,
    RunSpec,
)
from envlock.restore.progress import Progress, show

# How long an interrupted build's last step may keep its image in use once the build is cancelled.
_CANCEL_SECONDS = 15.0
DOCKER_HINT = ("start Docker (e.g. `sudo systemctl start docker`) or point DOCKER_HOST at a running "
               "engine; for Podman: `systemctl --user start podman.socket` and --engine podman")


# -- helpers -----------------------------------------------------------------------------------


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


def owner_label() -> str:
    return f"{socket.gethostname()}/{os.getpid()}"


def _exposed(ports: Mapping[str, tuple[str, int]]) -> list[tuple[int, str]] | None:
    """``"8888/tcp"`` keys as docker-py wants them: (port, proto). Given the string, docker-py
    appends its own ``/tcp`` and exposes ``8888/tcp/tcp``, and the binding publishes nothing."""
    out = []
    for key in ports:
        port, _, proto = key.partition("/")
        out.append((int(port), proto or "tcp"))
    return out or None


def _short(exc: BaseException) -> str:
    text = str(getattr(exc, "explanation", None) or exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _command_missing(exc: BaseException) -> bool:
    """Whether a failed start means that the command is not in the image.

    The engines say so only in words, and differently: runc's "executable file not found in
    $PATH" or "no such file or directory" (an absolute path), crun's "executable file `x` not
    found"; this is the one place that reads them.
    """
    text = _short(exc).lower()
    return "not found" in text or "no such file" in text


def _unanswered(exc: BaseException) -> bool:
    """Whether a request failed for want of an answer: it timed out, or the connection to the
    engine broke. An HTTP error is an answer (``docker.errors.APIError`` is one of requests'
    own HTTP errors), and stays what it is."""
    import requests

    return isinstance(exc, (requests.exceptions.Timeout, requests.exceptions.ConnectionError))


@contextlib.contextmanager
def _tolerated() -> Iterator[None]:
    """A best-effort cleanup's request: an engine's refusal is let pass, not its silence, so a
    daemon that stopped answering ends the command once, not after a wait per request."""
    try:
        yield
    except Exception as exc:
        if _unanswered(exc):
            raise


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _answered(method: _Method) -> _Method:
    """An engine request that got no answer is ``EngineUnavailable`` (exit 3), in envlock's words
    (``DockerEngine.unanswered``), not a traceback of the HTTP library's."""
    @functools.wraps(method)
    def call(self: DockerEngine, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            if _unanswered(exc):
                raise self.unanswered(exc) from None
            raise
    return cast(_Method, call)


# -- docker SDK --------------------------------------------------------------------------------


CONNECT_TIMEOUT = 15.0  # seconds an engine may take to answer while envlock connects
# Seconds an engine may take to answer one request once connected: an image inspected, listed or
# tagged, a container created or removed. A daemon that stops answering (wedged on its storage,
# a socket whose service hangs) then ends the command with exit 3 instead of holding it forever.
# The long reads lift it for their own request alone (``_long_read``, the SDK's ``timeout=None``):
# a build's output, where pip installing torch prints nothing for minutes; a container's output
# and its exit, where a job may be silent as long; an image pulled, pushed, saved or loaded.
REQUEST_TIMEOUT = 60.0
REQUEST_TIMEOUT_VAR = "ENVLOCK_ENGINE_TIMEOUT"


class DockerEngine(ContainerEngine):
    """Docker or Podman through the docker SDK (Podman's Docker-compatible API)."""

    def __init__(self, make_client: Callable[[float], Any], endpoint: str, *,
                 cli_env: Sequence[tuple[str, str | None]] = ()) -> None:
        """``cli_env``: what a docker command-line client's environment must say to reach this
        engine (``endpoint.Endpoint.cli_env``), so that a build through it (``clibuild``) goes to
        the engine this connection tags and inspects images on, never one a context names."""
        self.request_timeout = seconds_from_env(REQUEST_TIMEOUT_VAR, REQUEST_TIMEOUT)
        self.stop_grace = seconds_from_env(GRACE_VAR, GRACE_SECONDS)
        _check_unix_socket(endpoint)
        # One client, two requests: the SDK asks the engine's API version as it connects (under
        # CONNECT_TIMEOUT, so an engine that accepts and never answers fails here), and the
        # version document names Docker or Podman. A ping, and a second client for the long
        # reads, cost two more round trips on every command.
        client = None
        try:
            client = make_client(CONNECT_TIMEOUT)
            version = client.version()
        except Exception as exc:
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()
            raise EngineUnavailable(
                f"no container engine reachable at {endpoint} ({_short(exc)})", hint=DOCKER_HINT
            ) from None
        components = " ".join(str(c.get("Name", "")) for c in version.get("Components") or [])
        self.name = "podman" if "podman" in components.lower() else "docker"
        self.endpoint = endpoint
        self.server_version = str(version.get("Version") or "")
        self._cli_env = tuple(cli_env)
        self._builder: tuple[clibuild.Client | None, str | None] | None = None
        client.api.timeout = self.request_timeout
        self.client = client
        self.api = self.client.api

    def unanswered(self, exc: BaseException) -> EngineUnavailable:
        """A request that timed out or lost its connection, in words: which engine, how long."""
        import requests

        if isinstance(exc, requests.exceptions.Timeout) or "timed out" in str(exc).lower():
            return EngineUnavailable(
                f"the container engine at {self.endpoint} did not answer within {self.request_timeout:g} s",
                hint=f"is it hung or overloaded? `{self.name} info` tells; {REQUEST_TIMEOUT_VAR}=SECONDS "
                     "waits longer for each request")
        return EngineUnavailable(f"lost the connection to the container engine at {self.endpoint} "
                                 f"({_short(exc)})", hint=DOCKER_HINT)

    @contextlib.contextmanager
    def _long_read(self) -> Iterator[None]:
        """No read timeout for the request made inside (an image pushed, saved or loaded, whose
        answer streams for as long as the transfer takes): the SDK reads ``api.timeout`` as it
        sends a request, so the requests after it have the timeout again."""
        self.api.timeout = None
        try:
            yield
        finally:
            self.api.timeout = self.request_timeout

    # images

    def _info(self, raw: Mapping[str, Any]) -> ImageInfo:
        config = raw.get("Config") or {}
        labels = config.get("Labels") or raw.get("Labels") or {}
        env = {name: value for name, sep, value in (str(e).partition("=") for e in config.get("Env") or ()) if sep}
        return ImageInfo(id=str(raw["Id"]) if str(raw["Id"]).startswith("sha256:") else "sha256:" + str(raw["Id"]),
                         repo_digests=tuple(raw.get("RepoDigests") or ()),
                         tags=tuple(raw.get("RepoTags") or ()), labels=dict(labels),
                         size=raw.get("Size"), env=env)

    @_answered
    def image(self, ref: str) -> ImageInfo | None:
        from docker.errors import NotFound

        candidates = [ref]
        parsed = imageref.split(ref)
        first, slash, _ = parsed.repo.partition("/")
        # Podman lists what it built or tagged locally as localhost/<name> (a name whose first
        # part has a port names a registry, not a local image).
        if self.name == "podman" and slash and ":" not in first and not parsed.local:
            candidates.append(imageref.LOCAL_PREFIX + ref)
        for cand in candidates:
            try:
                return self._info(self.api.inspect_image(cand))
            except NotFound:  # docker.errors.ImageNotFound is one
                continue
        return None

    @_answered
    def pull(self, ref: str) -> ImageInfo:
        from docker.errors import APIError, NotFound

        hint = "check the name and the network, or pass --base with a local image"
        try:
            self.client.images.pull(ref)
        except NotFound as exc:
            raise ImageNotFound(f"cannot pull {ref}: {_short(exc)}", hint=hint) from None
        except APIError as exc:
            raise EngineUnavailable(f"cannot pull {ref}: {_short(exc)}", hint=hint) from None
        info = self.image(ref)
        if info is None:
            raise ImageNotFound(f"pulled {ref}, but the engine does not list it")
        return info

    @_answered
    def tag(self, image_id: str, ref: str) -> None:
        from docker.errors import NotFound

        parsed = imageref.split(ref)
        try:
            self.api.tag(image_id, parsed.repo, parsed.tag)
        except NotFound as exc:
            raise self._missing(image_id, f"cannot tag it {ref}", exc) from None

    def _missing(self, image: str, doing: str, exc: BaseException) -> ImageNotFound:
        """An image this command made or was given is not in the engine (exit 3, in words): a
        build that went to another engine, or a removal meanwhile."""
        return ImageNotFound(f"the engine at {self.endpoint} has no image {shorten(image)}: {doing} "
                             f"({_short(exc)})",
                             hint="was it removed meanwhile, or built on another engine? DOCKER_HOST, "
                                  "DOCKER_CONTEXT and --engine choose one")

    @_answered
    def push(self, image_id: str, repo: str, tag: str) -> str:
        from docker.errors import APIError

        self.api.tag(image_id, repo, tag)
        digest = None
        try:
            with self._long_read():
                pushed = self.api.push(repo, tag=tag, stream=True, decode=True)
            for chunk in pushed:
                if chunk.get("error"):
                    raise EngineUnavailable(f"cannot push {repo}:{tag}: {shorten(str(chunk['error']))}",
                                            hint="is the registry reachable, and are you logged in?")
                aux = chunk.get("aux") or {}
                if isinstance(aux, dict) and isinstance(aux.get("Digest"), str):
                    digest = aux["Digest"]
        except APIError as exc:
            raise EngineUnavailable(f"cannot push {repo}:{tag}: {_short(exc)}") from None
        if digest is None:  # engines that do not report it (Podman) still list it afterwards
            info = self.image(image_id)
            pinned = info.repo_digest(repo) if info else None
            digest = imageref.split(pinned).digest if pinned else None
        if digest is None:
            raise EngineUnavailable(f"pushed {repo}:{tag}, but the engine did not report its digest")
        return str(digest)

    @_answered
    def save(self, ref: str, dest: Path) -> None:
        from docker.errors import APIError, NotFound

        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as fh, self._long_read():
                for chunk in self.api.get_image(ref):
                    fh.write(chunk)
            os.replace(tmp, dest)
        except NotFound as exc:
            raise ImageNotFound(f"cannot save {ref}: {_short(exc)}") from None
        except APIError as exc:
            raise EngineUnavailable(f"cannot save {ref}: {_short(exc)}") from None
        finally:
            tmp.unlink(missing_ok=True)

    @_answered
    def load(self, archive: Path) -> None:
        from docker.errors import APIError

        try:
            with open(archive, "rb") as fh:
                # A file object streams: an image of several GB never sits in memory.
                with self._long_read():
                    loaded = self.api.load_image(fh)
                for _ in loaded:
                    pass
        except APIError as exc:
            raise EngineUnavailable(f"cannot load {archive.name}: {_short(exc)}") from None

    def build_stream(self, context: Path, *, tag: str, labels: Mapping[str, str],
                     network: bool = True, files: Sequence[str] | None = None,
                     dockerfile: str = "Dockerfile", buildargs: Mapping[str, str] | None = None
                     ) -> Iterator[dict[str, Any]]:
        """The engine's build output as the SDK decodes it: what ``buildlog`` reads.

        ``files``: the context's paths (relative, directories whole) that this build is sent, in
        a tar envlock makes; the classic builder receives the whole context on every build, so
        what a build does not use is left out (the torch wheels, once their layer is an image).
        A first line says how much was sent.
        """
        extra: dict[str, Any] = {} if network else {"network_mode": "none"}
        if buildargs:
            extra["buildargs"] = dict(buildargs)
        if dockerfile != "Dockerfile":
            extra["dockerfile"] = dockerfile
        if files is None:
            yield from self.api.build(path=str(context), tag=tag, rm=True, forcerm=True, decode=True,
                                      labels=dict(labels), pull=False, timeout=None, **extra)
            return
        with tempfile.TemporaryFile() as fh:
            with tarfile.open(fileobj=fh, mode="w") as tar:
                for rel in files:
                    # Not dereferenced: the context is envlock's, written without links.
                    tar.add(str(context / rel), arcname=rel, recursive=True)
            size = fh.tell()
            fh.seek(0)
            yield {"stream": context_sent(size)}
            yield from self.api.build(fileobj=fh, custom_context=True, tag=tag, rm=True, forcerm=True,
                                      decode=True, labels=dict(labels), pull=False, timeout=None, **extra)

    def _client(self) -> tuple[clibuild.Client | None, str | None]:
        """The command-line client that builds for this engine (``clibuild.choose``), looked
        for once, when a restore first asks."""
        if self._builder is None:
            self._builder = clibuild.choose(self.name, self.server_version, self.endpoint, self._cli_env)
        return self._builder

    def build_mode(self) -> BuildMode:
        client, note = self._client()
        if client is None:
            return BuildMode(mounts=False, builder="the docker SDK", note=note)
        return BuildMode(mounts=True, builder=client.describe())

    @_answered
    def layers(self, image_id: str) -> tuple[str, ...]:
        """The image's layers (``RootFS.Layers``, diff ids), base first."""
        from docker.errors import NotFound

        try:
            raw = self.api.inspect_image(image_id)
        except NotFound as exc:
            raise self._missing(image_id, "cannot read its layers", exc) from None
        return tuple(str(x) for x in (raw.get("RootFS") or {}).get("Layers") or ())

    @_answered
    def build(self, context: Path, *, tag: str, labels: Mapping[str, str], log_path: Path,
              progress: Progress, network: bool = True, files: Sequence[str] | None = None,
              dockerfile: str = "Dockerfile", buildargs: Mapping[str, str] | None = None) -> str:
        """With the engine's command-line client where ``clibuild`` found one (BuildKit,
        Buildah), else through the SDK's classic builder."""
        client, _ = self._client()
        if client is not None:
            return clibuild.build(client, self, context, tag=tag, labels=labels, log_path=log_path,
                                  progress=progress, network=network, files=files, dockerfile=dockerfile,
                                  buildargs=buildargs)
        from docker.errors import APIError, BuildError

        parsed = BuildLog()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w", encoding="utf-8") as log:
            try:
                for chunk in self.build_stream(context, tag=tag, labels=labels, network=network,
                                               files=files, dockerfile=dockerfile, buildargs=buildargs):
                    fed = parsed.feed(chunk)
                    log.write(fed.log)
                    show(progress, fed.events)
                    if parsed.error is not None:
                        break
            except KeyboardInterrupt:
                # Closing the connection makes the daemon cancel the build; forcerm removes
                # its intermediate containers, and the images its steps committed go here.
                with contextlib.suppress(Exception):
                    self.client.close()
                self.remove_committed(parsed.committed)
                raise
            except (APIError, BuildError) as exc:
                log.write(parsed.fail(_short(exc)))
            finally:
                progress.close()
        parsed.raise_failure(str(log_path))
        info = self.image(parsed.image_id) if parsed.image_id else None
        info = info or self.image(tag)
        if info is None:
            raise BuildFailed("the build finished but the engine does not know the image",
                              log_tail=list(parsed.tail), log_path=str(log_path))
        return info.id

    def remove_committed(self, images: Sequence[str]) -> None:
        """Remove the step images of an interrupted build, newest first, each alone (``noprune``:
        an image that was there before stays) and unforced (an image something else uses stays).
        The step the daemon was running when the build was cancelled keeps its image for a
        moment, until its container is gone: that conflict is waited out, a few seconds at most."""
        from docker.errors import APIError, NotFound

        self._remove_working_containers(images)
        deadline = time.monotonic() + _CANCEL_SECONDS
        for image in reversed(images):
            while True:
                try:
                    self.api.remove_image(image, noprune=True)
                except NotFound:
                    pass
                except APIError as exc:
                    if exc.status_code == 409 and time.monotonic() < deadline:
                        time.sleep(0.2)
                        continue
                    return  # its parents are its parents still: they stay too
                except Exception:
                    return
                break

    def _remove_working_containers(self, images: Sequence[str]) -> None:
        """Podman's service is not stopped by a build whose client is gone: it runs the current
        step to its end, and keeps a working container (Buildah's, listed only with
        ``external``) on each image the build committed, which holds that image. Those
        containers are this build's (its images are), so they go first; the step's process
        then fails to commit and ends. Docker cancels its builds itself."""
        if self.name != "podman" or not images:
            return
        with contextlib.suppress(Exception):
            listed = self.api._result(self.api._get(self.api._url("/libpod/containers/json"),
                                                    params={"all": True, "external": True}), True)
            for container in listed:
                image = str(container.get("ImageID") or "").removeprefix("sha256:")
                if any(image.startswith(short.removeprefix("sha256:")) for short in images):
                    with contextlib.suppress(Exception):
                        self.api._result(self.api._delete(self.api._url("/libpod/containers/{0}", container["Id"]),
                                                          params={"force": True}))

    # containers

    def _create(self, spec: RunSpec) -> str:
        from docker.errors import APIError
        from docker.errors import ImageNotFound as NoSuchImage

        host_kwargs: dict[str, Any] = {}
        if spec.mounts:
            host_kwargs["binds"] = {h: {"bind": c, "mode": "ro" if ro else "rw"} for h, c, ro in spec.mounts}
        if spec.ports:
            host_kwargs["port_bindings"] = dict(spec.ports.items())
        if not spec.network:
            host_kwargs["network_mode"] = "none"
        if spec.gpus:
            host_kwargs.update(self._gpu_kwargs(spec.gpus))
        host_config = self.api.create_host_config(**host_kwargs)
        try:
            created = self.api.create_container(
                spec.image, list(spec.command), environment=dict(spec.env), user=spec.user or "",
                working_dir=spec.workdir, labels={LABEL_OWNER: owner_label()},
                host_config=host_config, ports=_exposed(spec.ports), detach=True, tty=False,
                stdin_open=False)
        except NoSuchImage as exc:
            raise ImageNotFound(f"cannot create a container from {spec.image}: {_short(exc)}") from None
        except APIError as exc:
            raise ContainerFailed(f"cannot create a container from {spec.image}: {_short(exc)}") from None
        return str(created["Id"])

    def _put_files(self, cid: str, spec: RunSpec) -> None:
        """Copy ``spec.files`` into the created container's /tmp.

        Podman copies through a helper process that now and then stops reading before the end
        of the archive (HTTP 500, "passing bulk input to subprocess: write |1: broken pipe");
        the container has not started and the copy replaces the same files, so it is tried once
        more before it is reported as a failure of the engine, with the engine's words."""
        from docker.errors import APIError

        data = tar_files(spec.files, "/tmp")
        for attempt in (1, 2):
            try:
                self.api.put_archive(cid, "/tmp", data)
                return
            except APIError as exc:
                if attempt == 2:
                    raise ContainerFailed(f"cannot copy envlock's probe into a container of "
                                          f"{spec.image}: {_short(exc)}") from None

    @_answered
    def run(self, spec: RunSpec, *, on_stdout: Callable[[bytes], None] | None = None,
            on_stderr: Callable[[bytes], None] | None = None) -> RunResult:
        from docker.errors import APIError
        from docker.utils.socket import STDERR, frames_iter

        api = self.api
        cid = self._create(spec)
        out, err = bytearray(), bytearray()
        try:
            if spec.files:
                self._put_files(cid, spec)
            # Attach before start (as `docker run` does), so no early output is lost.
            sock = api.attach_socket(cid, params={"stdout": 1, "stderr": 1, "stream": 1, "logs": 1})
            try:
                _no_timeout(sock)
                try:
                    api.start(cid)
                except APIError as exc:
                    why = CommandNotFound if _command_missing(exc) else ContainerFailed
                    raise why(f"cannot start {spec.command[0]} in {spec.image}: {_short(exc)}") from None
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
            code = int(api.wait(cid, timeout=None).get("StatusCode", 1))
        except KeyboardInterrupt as exc:
            self._stop(cid, int(getattr(exc, "signum", signal.SIGINT)))
            raise
        finally:
            with deferred(), contextlib.suppress(Exception):
                api.remove_container(cid, force=True)
        return RunResult(code, bytes(out), bytes(err))

    def _stop(self, cid: str, signum: int) -> None:
        """Pass the stop signal envlock got on to the container's command and give it
        ``stop_grace`` seconds to end (to save a checkpoint), as ``docker stop`` does; the
        removal that follows kills what is left. Held off from further signals."""
        with deferred():
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(f"envlock: stopping the container ({signal.Signals(signum).name} sent; "
                                 f"killed after {self.stop_grace:g} s)\n")
                sys.stderr.flush()
            with contextlib.suppress(Exception):
                self.api.kill(cid, signal=signum)
                self.api.wait(cid, timeout=self.stop_grace)

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

    @_answered
    def remove_build_stage(self, build: str) -> None:
        from envlock.restore.dockerfile import LABEL_BUILD_STAGE

        with _tolerated():
            for image in self.api.images(filters={"label": f"{LABEL_BUILD_STAGE}={build}"}):
                # Not forced: an image something else uses (a container, another build on top of
                # it) stays; its untagged parents go with it (the engine's own pruning).
                with _tolerated():
                    self.api.remove_image(image["Id"])

    @_answered
    def remove_stale(self) -> int:
        """Remove containers of envlock processes on this host that died without cleaning up."""
        host = socket.gethostname()
        removed = 0
        with _tolerated():
            for c in self.api.containers(all=True, filters={"label": LABEL_OWNER}):
                owner = str((c.get("Labels") or {}).get(LABEL_OWNER, ""))
                h, _, pid = owner.rpartition("/")
                if h == host and pid.isdigit() and not pid_alive(int(pid)):
                    with _tolerated():
                        self.api.remove_container(c["Id"], force=True)
                        removed += 1
        return removed

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
