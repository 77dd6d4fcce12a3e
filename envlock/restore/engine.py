"""What restore, run and capture --in-image need from a container engine, and the data it returns.

``ContainerEngine`` is the interface; ``envlock.restore.dockerengine`` implements it for Docker
and Podman through the docker SDK (``connect`` chooses the endpoint). Callers hold an engine in
a ``with`` block, so its connection is closed however the block ends.

Containers an engine creates carry ``org.envlock.owner=<host>/<pid>`` and are removed when the
command ends, interrupted or not (``envlock._signals``: Ctrl-C, SIGTERM and SIGHUP alike, their
removal held off from further signals); a run killed harder than that (SIGKILL) is cleaned up by the
next envlock on that host (``remove_stale``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from envlock.errors import EngineUnavailable
from envlock.probe import imageref

if TYPE_CHECKING:
    from envlock.restore.progress import Progress

LABEL_OWNER = "org.envlock.owner"
_Engine = TypeVar("_Engine", bound="ContainerEngine")


@dataclass(frozen=True)
class ImageInfo:
    id: str
    repo_digests: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    size: int | None = None
    # The image's own variables (its ``ENV``), which a container starts with: what a variable
    # envlock adds to a run (``PYTHONPATH``) must keep.
    env: Mapping[str, str] = field(default_factory=dict)

    def repo_digest(self, wanted_repo: str | None = None, *, pullable: bool = False) -> str | None:
        """The first ``repo@sha256:...`` the engine lists for this image (of ``wanted_repo`` when
        given), or None: an image built locally has none. ``pullable`` passes over Podman's
        ``localhost/`` digests, which exist only on this machine."""
        for rd in self.repo_digests:
            ref = imageref.split(rd)
            if ref.digest is None or (pullable and ref.local):
                continue
            if wanted_repo is None or imageref.same_repo(ref.repo, wanted_repo):
                return rd
        return None


@dataclass(frozen=True)
class BuildMode:
    """How an engine builds: whether its builder reads ``RUN --mount`` (the plan then mounts the
    wheels, ``Plan.mounts``), the builder in words, and a note for the user when it is the slow
    way for want of a better one."""

    mounts: bool = False
    builder: str = "the engine's API"
    note: str | None = None


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
    """What restore, run and capture --in-image need from an engine.

    Failures are typed (``envlock.errors``): ``ImageNotFound`` when an image is neither there
    nor pullable, ``CommandNotFound`` when a container's command is not in its image,
    ``ContainerFailed`` when a container cannot be created or started for another reason,
    ``EngineUnavailable`` for the rest; a command that runs and fails is a ``RunResult``.
    """

    name: str  # "docker" or "podman"

    def __enter__(self: _Engine) -> _Engine:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @abstractmethod
    def image(self, ref: str) -> ImageInfo | None: ...

    @abstractmethod
    def pull(self, ref: str) -> ImageInfo: ...

    @abstractmethod
    def tag(self, image_id: str, ref: str) -> None: ...

    @abstractmethod
    def build(self, context: Path, *, tag: str, labels: Mapping[str, str], log_path: Path,
              progress: Progress, network: bool = True, files: Sequence[str] | None = None,
              dockerfile: str = "Dockerfile", buildargs: Mapping[str, str] | None = None) -> str:
        """Build ``context`` (only ``files`` of it, when given: relative paths) with the
        Dockerfile ``dockerfile`` and the ``ARG`` values ``buildargs``; the image id."""

    @abstractmethod
    def run(self, spec: RunSpec, *, on_stdout: Callable[[bytes], None] | None = None,
            on_stderr: Callable[[bytes], None] | None = None) -> RunResult: ...

    @abstractmethod
    def remove_stale(self) -> int: ...

    def build_mode(self) -> BuildMode:
        """How this engine's ``build`` builds (``BuildMode``); asked before the plan is made."""
        return BuildMode()

    def remove_build_stage(self, build: str) -> None:
        """Remove the images of build stages labelled with ``build`` (``dockerfile._stage_end``)
        and the untagged steps under them; never fails. An engine whose builds keep no stage
        (ch-image builds into one directory image) has nothing to remove."""
        return None

    def save(self, ref: str, dest: Path) -> None:
        """Write ``ref`` as a ``docker load`` archive (docker-archive: manifest.json, layers)."""
        raise EngineUnavailable(f"the {self.name} engine cannot save images")

    def load(self, archive: Path) -> None:
        """Load a docker-archive into the engine: no registry involved."""
        raise EngineUnavailable(f"the {self.name} engine cannot load images")

    def push(self, image_id: str, repo: str, tag: str) -> str:
        """Push ``image_id`` as ``repo:tag``; returns the registry's manifest digest."""
        raise EngineUnavailable(f"the {self.name} engine cannot push images")

    def close(self) -> None:
        return None
