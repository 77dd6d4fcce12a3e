"""Image builds through the engines' own command-line clients, which read ``RUN --mount``.

The docker SDK's ``images.build`` drives Docker's classic builder, which has no ``RUN --mount``:
the wheels then reach pip through a build stage whose venv is copied into the image, and the
engine commits that venv (1 GB with torch) twice. The engines' own clients build with BuildKit
(``docker buildx build``, or ``DOCKER_BUILDKIT=1 docker build`` with a 20.10 to 22.x client, which
has BuildKit built in) or with Buildah (``podman --url URL build``), and bind-mount the wheels
into the one ``RUN`` that installs them (``dockerfile``, ``Plan.mounts``).

Which builder: ``ENVLOCK_BUILDER`` (``choose``): ``auto`` takes a client when one fits the
engine, else the SDK with a note that says why the restore is slower; ``cli`` insists on a
client; ``sdk`` takes the SDK. Everything else (inspect, run, load, push) stays the SDK's.

A build (``build``) runs the client in a process group of its own, talking to the endpoint of
the SDK's connection, which it is told (DOCKER_HOST, no DOCKER_CONTEXT: ``endpoint``), never one
it would find by itself; its output goes line by line through ``buildlog`` into the build log and
the progress display, as the SDK's chunks do, and a failure is the same ``BuildFailed``. Ctrl-C
or SIGTERM stops the client, which makes the engine cancel the build: BuildKit then exports
nothing, and the steps Podman had committed are removed, as the SDK path removes its own.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal, Protocol

from envlock._signals import deferred
from envlock.errors import BuildFailed, EngineUnavailable, UsageError
from envlock.restore.buildlog import BuildLog, context_sent
from envlock.restore.engine import ImageInfo
from envlock.restore.progress import Progress, show

BUILDER_ENV = "ENVLOCK_BUILDER"
BUILDERS = ("auto", "cli", "sdk")
INSTALL_HINT = ("install a docker client that builds with BuildKit (the buildx plugin, or Debian "
                "12's docker.io, whose 20.10 client has it built in), or podman 4 or later for a "
                "Podman engine")
_PROBE_SECONDS = 20.0
# How long a stopped client may take to cancel its build before it is killed.
_STOP_SECONDS = 20.0
_IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
# The name a build argument gives an image that has no tag (BuildKit needs a name).
BY_ID_REPO = "envlock/by-id"


class Engine(Protocol):
    """What a build needs of the engine's API connection (``dockerengine.DockerEngine``)."""

    def image(self, ref: str) -> ImageInfo | None: ...
    def tag(self, image_id: str, ref: str) -> None: ...
    def layers(self, image_id: str) -> tuple[str, ...]: ...
    def remove_committed(self, images: Sequence[str]) -> None: ...


@dataclass(frozen=True)
class Client:
    """A command-line client that builds with ``RUN --mount``: the words that start a build
    (its options follow), what it needs in its environment (a value, or None for a variable
    it must not see), and which kind it is."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str | None], ...]
    kind: Literal["buildx", "buildkit", "podman"]

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` (this process's environment) as the client must see it."""
        return with_changes(base, self.env)

    def describe(self) -> str:
        """The builder in words, for messages: ``BuildKit (DOCKER_BUILDKIT=1 /usr/bin/docker)``."""
        if self.kind == "podman":
            return f"Buildah ({self.argv[0]} build)"
        if self.kind == "buildx":
            return f"BuildKit ({self.argv[0]} buildx)"
        return f"BuildKit (DOCKER_BUILDKIT=1 {self.argv[0]})"

    @property
    def takes_ids(self) -> bool:
        """Whether FROM takes an image id: Buildah's does; BuildKit reads one as a registry name."""
        return self.kind == "podman"


def setting() -> str:
    """``ENVLOCK_BUILDER``: auto (the default), cli or sdk; anything else is a usage error."""
    raw = os.environ.get(BUILDER_ENV, "").strip().lower() or "auto"
    if raw not in BUILDERS:
        raise UsageError(f"{BUILDER_ENV} must be auto, cli or sdk, not {raw[:40]!r}")
    return raw


def with_changes(base: Mapping[str, str], changes: Sequence[tuple[str, str | None]]) -> dict[str, str]:
    """A copy of ``base`` with each (name, value) set, or removed where the value is None."""
    out = dict(base)
    for name, value in changes:
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out


def version(text: str) -> tuple[int, int, int] | None:
    """The first ``X.Y[.Z]`` of a version string (``20.10.24+dfsg1``, ``podman version 4.3.1``)."""
    m = _VERSION.search(text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def _quiet(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """A probe's stdout, or None when it fails, is missing or hangs."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, errors="replace", env=dict(env),
                              stdin=subprocess.DEVNULL, timeout=_PROBE_SECONDS, check=False,
                              start_new_session=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def on_path(name: str) -> list[str]:
    """Every executable ``name`` on PATH, in order, each file once (``type -a``)."""
    found: dict[str, str] = {}
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        path = Path(directory or ".") / name
        if path.is_file() and os.access(path, os.X_OK):
            found.setdefault(os.path.realpath(path), str(path))
    return list(found.values())


def docker_client(env: Mapping[str, str]) -> Client | None:
    """The first docker client on PATH that builds with BuildKit on the engine of ``env``: one
    with the buildx plugin whose builder is the engine's own (driver ``docker``: a builder in a
    container of its own would not see the engine's images), else a 20.10 to 22.x client, which
    has BuildKit built in (from 23.0 on, ``DOCKER_BUILDKIT=1`` needs the plugin)."""
    for path in on_path("docker"):
        inspect = _quiet([path, "buildx", "inspect"], env)
        if inspect is not None and re.search(r"^Driver:\s*docker\s*$", inspect, re.MULTILINE):
            return Client((path, "buildx", "build", "--load", "--progress", "plain"), (), "buildx")
        said = _quiet([path, "--version"], env)
        found = version(said) if said else None
        if found is not None and (20, 10) <= found[:2] < (23, 0):
            return Client((path, "build", "--progress", "plain"), (("DOCKER_BUILDKIT", "1"),), "buildkit")
    return None


def podman_client(url: str) -> Client | None:
    """``podman --url URL build`` with a podman of 4.0 or later (Buildah's ``RUN --mount``)."""
    path = shutil.which("podman")
    said = _quiet([path, "--version"], os.environ) if path else None
    found = version(said) if said else None
    if path is None or found is None or found < (4, 0, 0):
        return None
    return Client((path, "--url", url, "build", "--format", "docker"), (), "podman")


def choose(engine: str, server: str, url: str, cli_env: Sequence[tuple[str, str | None]]
           ) -> tuple[Client | None, str | None]:
    """The client that builds for this engine, or None for the SDK; and a note when the SDK is
    the slower way for want of a client. ``server``: the engine's version; ``url``: its API
    endpoint; ``cli_env``: what a docker client's environment must say to reach that engine
    (``endpoint.Endpoint.cli_env``), used to look for the client and given to the one found."""
    wanted = setting()
    if wanted == "sdk":
        return None, None
    served = version(server)
    if engine == "podman":
        why = "the engine is Podman before 4.0, whose builds have no RUN --mount"
        client = podman_client(url) if served is not None and served >= (4, 0, 0) else None
        if served is not None and served >= (4, 0, 0) and client is None:
            why = "no podman client of version 4 or later on PATH"
    else:
        why = "the engine is Docker before 20.10, whose builder has no RUN --mount without a frontend image"
        client = None
        if served is not None and served[:2] >= (20, 10):
            client = docker_client(with_changes(os.environ, cli_env))
            why = "no docker client on PATH builds with BuildKit (the buildx plugin, or a 20.10 to 22.x client)"
    if client is not None:
        if engine != "podman":
            client = Client(client.argv, (*client.env, *cli_env), client.kind)
        return client, None
    if wanted == "cli":
        raise EngineUnavailable(f"{BUILDER_ENV}=cli, but {why}", hint=INSTALL_HINT)
    return None, (f"{why}: building with the docker SDK's classic builder, which is slower (the "
                  f"wheels go through a build stage whose venv is copied into the image); "
                  f"{BUILDER_ENV}=sdk says so without this note")


# -- a build -------------------------------------------------------------------------------------


def build(client: Client, engine: Engine, context: Path, *, tag: str, labels: Mapping[str, str],
          log_path: Path, progress: Progress, network: bool = True, files: Sequence[str] | None = None,
          dockerfile: str = "Dockerfile", buildargs: Mapping[str, str] | None = None) -> str:
    """Build with ``client``, as ``ContainerEngine.build`` does; the image id.

    ``files``: the context's paths (relative, directories whole) this build is sent; they are
    hard-linked into a directory of their own (the context is envlock's, on one file system),
    so the client sends exactly them, as the SDK path's tar does."""
    parsed = BuildLog()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".envlock-build-", dir=context.parent) as tmp:
        work = Path(tmp)
        root, size = (context, None) if files is None else _linked(context, files, work / "context")
        args, named = _local_names(client, engine, buildargs or {})
        iid = work / "iid"
        argv = [*client.argv, "-f", str(root / dockerfile), "-t", tag, "--iidfile", str(iid)]
        for key, value in sorted(labels.items()):
            argv += ["--label", f"{key}={value}"]
        for key, value in sorted(args.items()):
            argv += ["--build-arg", f"{key}={value}"]
        if not network:
            argv += ["--network", "none"]
        argv.append(str(root))
        with open(log_path, "w", encoding="utf-8") as log:
            try:
                if size is not None:
                    _feed(parsed, context_sent(size), log, progress)
                code, last = _stream(argv, client.environ(os.environ), parsed, log, progress, engine)
                if code != 0:  # the client's last line says why (it is in the log already)
                    said = parsed.fail(last or f"{client.describe()} exited with status {code}")
                    log.write("" if last else said)
            finally:
                progress.close()
        parsed.raise_failure(str(log_path))
        image_id = iid.read_text(encoding="utf-8").strip() if iid.is_file() else ""
    if not _IMAGE_ID.fullmatch(image_id):
        raise BuildFailed(f"{client.describe()} finished but wrote no image id",
                          log_tail=list(parsed.tail), log_path=str(log_path))
    _check_bases(engine, image_id, named)
    return image_id


def _feed(parsed: BuildLog, text: str, log: IO[str], progress: Progress) -> None:
    fed = parsed.feed({"stream": text})
    log.write(fed.log)
    show(progress, fed.events)


def _stream(argv: Sequence[str], env: Mapping[str, str], parsed: BuildLog, log: IO[str],
            progress: Progress, engine: Engine) -> tuple[int, str]:
    """Run the client, its output (stdout and stderr, as a terminal shows them) fed as it
    comes; (exit status, its last line). Interrupted, it is stopped and the steps it committed
    are removed before the interrupt goes on."""
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=dict(env), text=True, errors="replace",
                                start_new_session=True)
    except OSError as exc:
        raise EngineUnavailable(f"cannot run {argv[0]}: {exc.strerror or exc}", hint=INSTALL_HINT) from None
    assert proc.stdout is not None
    last = ""
    try:
        for line in proc.stdout:
            if line.strip():
                last = line.strip()
            _feed(parsed, line, log, progress)
        return proc.wait(), last
    except KeyboardInterrupt:
        with deferred():
            stop(proc)
            engine.remove_committed(parsed.committed)
        raise
    finally:
        if proc.poll() is None:  # an error of our own while it ran
            stop(proc)
        proc.stdout.close()


def stop(proc: subprocess.Popen[str]) -> None:
    """Stop a client as Ctrl-C on a terminal would (SIGINT to its process group: it cancels its
    build), and kill it if it has not gone ``_STOP_SECONDS`` later."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=_STOP_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _linked(context: Path, files: Sequence[str], dest: Path) -> tuple[Path, int]:
    """``files`` of ``context`` hard-linked (copied across file systems) under ``dest``; links
    are taken as links, never followed. (dest, bytes in it)."""
    size = 0
    for rel in files:
        src = context / rel
        if src.is_dir() and not src.is_symlink():
            paths = []
            for top, _, names in os.walk(src):
                (dest / Path(top).relative_to(context)).mkdir(parents=True, exist_ok=True)
                paths += [Path(top) / name for name in names]
        else:
            paths = [src]
        for path in paths:
            target = dest / path.relative_to(context)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target, follow_symlinks=False)
            except OSError:
                shutil.copy2(path, target, follow_symlinks=False)
            size += path.lstat().st_size
    return dest, size


def _local_names(client: Client, engine: Engine, buildargs: Mapping[str, str]
                 ) -> tuple[dict[str, str], dict[str, str]]:
    """The build arguments as the client needs them: BuildKit reads an image id in FROM as a
    Docker Hub name (and would go to the registry), so an id becomes a tag of that image in the
    engine, or ``envlock/by-id:<id>`` when it has none. Buildah takes ids. Also the ids given
    a name, by argument, to check the build against (``_check_bases``)."""
    out = dict(buildargs)
    named: dict[str, str] = {}
    if client.takes_ids:
        return out, named
    for key, value in buildargs.items():
        if not _IMAGE_ID.fullmatch(value):
            continue
        info = engine.image(value)
        if info is None:
            continue  # the build says that it is missing
        name = next((t for t in info.tags if t and "<none>" not in t), None)
        if name is None:
            name = f"{BY_ID_REPO}:{value.removeprefix('sha256:')[:32]}"
            engine.tag(info.id, name)
        out[key] = name
        named[key] = info.id
    return out, named


def _check_bases(engine: Engine, image_id: str, named: Mapping[str, str]) -> None:
    """The image must stand on the image each name stood for when it was given: a tag moved
    during the build (a pull of a newer base under the same tag) would otherwise go unnoticed."""
    built = engine.layers(image_id)
    for key, base in named.items():
        layers = engine.layers(base)
        if built[:len(layers)] != layers:
            raise BuildFailed(f"the image built does not start from the image {base[:19]}... given as "
                              f"{key}: its tag moved during the build", hint="restore again")
