"""The docker-SDK engine against a fake API: build streaming, failures, cleanup, GPUs."""

from __future__ import annotations

import io
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import LockFactory

from envlock.errors import (
    EXIT_ENV,
    BuildFailed,
    ContainerFailed,
    EngineUnavailable,
    ImageNotFound,
    UsageError,
)
from envlock.restore.dockerengine import DockerEngine, tar_files
from envlock.restore.endpoint import connect
from envlock.restore.engine import RunSpec
from envlock.restore.image import LABEL_CONTEXT, LABEL_OPTIONS, LABEL_SHORT_ID, Options, options_key
from envlock.restore.progress import PlainProgress

IMAGE_ID = "sha256:" + "cd" * 32


def fake_attach_socket(frames: list[tuple[int, bytes]]) -> socket.socket:
    """A real socket carrying a multiplexed attach stream (8-byte header per frame), then EOF."""
    reader, writer = socket.socketpair()
    writer.sendall(b"".join(struct.pack(">BxxxL", sid, len(d)) + d for sid, d in frames))
    writer.close()
    return reader


class FakeAPI:
    def __init__(self, chunks: list[dict[str, Any]] | None = None,
                 frames: list[Any] | None = None, exit_code: int = 7) -> None:
        self.chunks = chunks or []
        self.frames = frames or []
        self.exit_code = exit_code
        self.removed: list[str] = []
        self.archives: list[tuple[str, str, bytes]] = []
        self.host_config: dict[str, Any] = {}
        self.created: dict[str, Any] = {}

    def build(self, **kw: Any) -> Iterator[dict[str, Any]]:
        self.build_kwargs = kw
        yield from self.chunks

    def inspect_image(self, ref: str) -> dict[str, Any]:
        return {"Id": IMAGE_ID, "RepoTags": ["envlock/x:1"], "Config": {"Labels": {"a": "b"}}, "Size": 5}

    def create_host_config(self, **kw: Any) -> dict[str, Any]:
        self.host_config = kw
        return kw

    def create_container(self, image: str, command: list[str], **kw: Any) -> dict[str, str]:
        self.created = {"image": image, "command": command, **kw}
        return {"Id": "c" * 64}

    def put_archive(self, cid: str, path: str, data: bytes) -> None:
        self.archives.append((cid, path, data))

    def attach_socket(self, cid: str, params: dict[str, Any]) -> socket.socket:
        self.sock = fake_attach_socket(self.frames)
        return self.sock

    def start(self, cid: str) -> None:
        pass

    def wait(self, cid: str, timeout: float | None = 60.0) -> dict[str, int]:
        self.wait_timeout = timeout
        return {"StatusCode": self.exit_code}

    def remove_container(self, cid: str, force: bool = False) -> None:
        self.removed.append(cid)

    def containers(self, **kw: Any) -> list[dict[str, Any]]:
        return []


class FakeClient:
    def __init__(self, api: FakeAPI, podman: bool = False) -> None:
        self.api = api
        self.podman = podman

    def ping(self) -> bool:
        return True

    def version(self) -> dict[str, Any]:
        name = "Podman Engine" if self.podman else "Engine"
        return {"Version": "1", "Components": [{"Name": name}]}

    def close(self) -> None:
        pass


def engine(api: FakeAPI, podman: bool = False) -> DockerEngine:
    return DockerEngine(lambda timeout: FakeClient(api, podman), "fake://")


def test_build_streams_steps_and_returns_the_image(tmp_path: Path) -> None:
    api = FakeAPI([{"stream": "Step 1/2 : FROM x\n"}, {"stream": " ---> abc\n"},
                   {"stream": "Step 2/2 : RUN [\"true\"]\n"}, {"aux": {"ID": IMAGE_ID}},
                   {"stream": "Successfully built cdcdcdcdcdcd\n"}])
    log = tmp_path / "build.log"
    image_id = engine(api).build(tmp_path, tag="envlock/x:1", labels={"org.envlock.context": "k"},
                                 log_path=log, progress=PlainProgress(io.StringIO()))
    assert image_id == IMAGE_ID
    assert api.build_kwargs["decode"] is True and api.build_kwargs["labels"] == {"org.envlock.context": "k"}
    assert "Step 2/2" in log.read_text()


def test_build_error_chunk_names_the_step_and_keeps_the_log(tmp_path: Path) -> None:
    api = FakeAPI([{"stream": "Step 6/9 : RUN [\"pip\", \"install\"]\n"},
                   {"stream": "\x1b[91mERROR: No matching distribution found for six==9.9.9\n\x1b[0m"},
                   {"stream": " ---> Running in 123\n"},
                   {"error": "The command returned a non-zero code: 1",
                    "errorDetail": {"message": "The command returned a non-zero code: 1"}}])
    log = tmp_path / "ctx" / "build.log"
    with pytest.raises(BuildFailed) as exc:
        engine(api).build(tmp_path, tag="t:1", labels={}, log_path=log,
                          progress=PlainProgress(io.StringIO()))
    err = exc.value
    assert err.exit_code == 3
    assert err.step is not None and err.step.startswith("6/9: RUN")
    assert "six==9.9.9" in err.message and "step 6/9" in err.message
    assert err.log_path == str(log) and "non-zero code" in log.read_text()
    assert all("Running in" not in line and "\x1b" not in line for line in err.log_tail)


def test_run_streams_demuxed_output_and_always_removes_the_container() -> None:
    api = FakeAPI(frames=[(1, b"out\n"), (2, b"err\n")])
    seen: list[bytes] = []
    result = engine(api).run(RunSpec(image=IMAGE_ID, command=["python3", "-c", "x"],
                                     files={"/tmp/envlock-probe/probe.py": b"print(1)"}, network=False),
                             on_stdout=seen.append)
    assert (result.exit_code, result.stdout, result.stderr) == (7, b"out\n", b"err\n")
    assert seen == [b"out\n"]
    assert api.removed == ["c" * 64] and api.sock.fileno() == -1
    assert api.archives[0][1] == "/tmp"
    assert api.host_config["network_mode"] == "none"
    assert "org.envlock.owner" in api.created["labels"]


class FlakyCopyAPI(FakeAPI):
    """Podman's archive copy failing ``fails`` times, as it does now and then."""

    def __init__(self, fails: int) -> None:
        super().__init__(frames=[(1, b"{}")], exit_code=0)
        self.fails = fails

    def put_archive(self, cid: str, path: str, data: bytes) -> None:
        from docker.errors import APIError

        if self.fails:
            self.fails -= 1
            raise APIError("500 Server Error: passing bulk input to subprocess: write |1: broken pipe")
        super().put_archive(cid, path, data)


def test_a_copy_the_engine_drops_once_is_tried_again() -> None:
    api = FlakyCopyAPI(fails=1)
    spec = RunSpec(image=IMAGE_ID, command=["python3", "/tmp/p"], files={"/tmp/p": b"print(1)"})
    assert engine(api, podman=True).run(spec).exit_code == 0
    assert len(api.archives) == 1 and api.removed == ["c" * 64]


def test_a_copy_that_keeps_failing_is_the_engines_failure_in_one_line() -> None:
    api = FlakyCopyAPI(fails=2)
    spec = RunSpec(image=IMAGE_ID, command=["python3", "/tmp/p"], files={"/tmp/p": b"print(1)"})
    with pytest.raises(ContainerFailed, match=r"cannot copy envlock's probe into a container .*broken pipe"):
        engine(api, podman=True).run(spec)
    assert api.archives == [] and api.removed == ["c" * 64]


def test_interrupt_during_a_run_still_removes_the_container() -> None:
    api = FakeAPI(frames=[(1, b"partial")])

    def ctrl_c(data: bytes) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        engine(api).run(RunSpec(image=IMAGE_ID, command=["sleep", "100"]), on_stdout=ctrl_c)
    assert api.removed == ["c" * 64]
    assert api.sock.fileno() == -1  # the attach socket is closed too


def test_gpus_use_device_requests_on_docker_and_cdi_on_podman() -> None:
    api = FakeAPI()
    engine(api).run(RunSpec(image=IMAGE_ID, command=["x"], gpus="all"))
    req = api.host_config["device_requests"][0]
    assert req["Count"] == -1 and req["Capabilities"] == [["gpu"]]
    engine(api).run(RunSpec(image=IMAGE_ID, command=["x"], gpus="0,1"))
    assert api.host_config["device_requests"][0]["DeviceIDs"] == ["0", "1"]
    pod = engine(api, podman=True)
    assert pod.name == "podman"
    pod.run(RunSpec(image=IMAGE_ID, command=["x"], gpus="all"))
    assert api.host_config["devices"] == ["nvidia.com/gpu=all:nvidia.com/gpu=all:rwm"]
    assert "device_requests" not in api.host_config


def test_tar_files_builds_a_tree_under_its_root() -> None:
    import tarfile

    data = tar_files({"/tmp/envlock-probe/probe.py": b"x", "/tmp/envlock-probe/kernels.py": b"yy"}, "/tmp")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
    assert names == ["envlock-probe", "envlock-probe/kernels.py", "envlock-probe/probe.py"]
    with pytest.raises(ValueError):
        tar_files({"/etc/passwd": b""}, "/tmp")


def test_unreachable_engine_is_exit_3_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(EngineUnavailable) as exc:
        connect(f"unix://{tmp_path}/nothing.sock")
    assert exc.value.exit_code == 3 and "DOCKER_HOST" in (exc.value.hint or "")


def test_podman_without_a_socket_says_how_to_start_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from envlock.restore import endpoint as eng

    monkeypatch.delenv("CONTAINER_HOST", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(eng, "PODMAN_SOCKETS", ("{xdg}/podman/podman.sock",))
    with pytest.raises(EngineUnavailable) as exc:
        connect("podman")
    assert "podman.socket" in (exc.value.hint or "")
    (tmp_path / "podman").mkdir()
    (tmp_path / "podman" / "podman.sock").touch()
    assert eng.podman_socket() == f"unix://{tmp_path}/podman/podman.sock"


def test_bad_engine_name_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        connect("kubernetes")


class Images(FakeAPI):
    """An engine's image store: images listed newest first (as Docker lists them), inspected by
    id or tag, tagged, and built: a build's image has the labels it was given and the
    Dockerfile's own ``LABEL``s, as an engine's final stage has."""

    def __init__(self) -> None:
        super().__init__()
        self.store: dict[str, dict[str, Any]] = {}  # id -> {"tags": [...], "labels": {...}}, oldest first
        self.builds = 0

    def add(self, tags: list[str], labels: dict[str, str]) -> str:
        image_id = f"sha256:{len(self.store) + 1:064x}"
        self.store[image_id] = {"tags": tags, "labels": dict(labels)}
        return image_id

    def images(self, filters: dict[str, Any] | None = None) -> list[dict[str, str]]:
        want = [f.split("=", 1) for f in ((filters or {}).get("label") or [])]
        return [{"Id": i} for i, image in reversed(self.store.items())
                if all(image["labels"].get(k) == v for k, v in want)]

    def inspect_image(self, ref: str) -> dict[str, Any]:
        from docker.errors import NotFound

        for image_id, image in self.store.items():
            if ref == image_id or ref in image["tags"]:
                return {"Id": image_id, "RepoTags": image["tags"], "Config": {"Labels": image["labels"]},
                        "Size": 5}
        raise NotFound(ref)

    def tag(self, image_id: str, repo: str, tag: str) -> None:
        for image in self.store.values():  # a tag names one image
            image["tags"] = [t for t in image["tags"] if t != f"{repo}:{tag}"]
        self.store[image_id]["tags"].append(f"{repo}:{tag}")

    def build(self, **kw: Any) -> Iterator[dict[str, Any]]:
        import re

        self.builds += 1
        text = (Path(kw["path"]) / "Dockerfile").read_text()
        own = dict(re.findall(r'"(org\.envlock\.[a-z-]+)"="([^"]*)"', text))
        image_id = self.add([], {**own, **kw["labels"]})
        self.tag(image_id, *kw["tag"].split(":"))
        yield {"aux": {"ID": image_id}}


def test_a_cache_hit_is_the_image_envlock_tagged_not_one_that_inherits_its_labels(
        restore_lock: LockFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's image built FROM the restored one carries every label of it and is newer; so
    does Podman's labelled build stage carry the context label. The cache hit is the image the
    lock's tag names, checked by its labels: never the user's image (tagged as the lock's and
    given its verdict). With the lock's tag gone, the restore builds again."""
    from envlock.restore.restore import restore

    monkeypatch.setenv("ENVLOCK_BUILDER", "sdk")
    lock = restore_lock(image={"reference": "a/b", "digest": "sha256:" + "ab" * 32}, packages=[("six", "1.17.0")])
    api = Images()
    eng = engine(api)

    def again() -> tuple[str, bool]:
        done = restore(lock, Options(), engine=eng, name="proj", workdir=tmp_path / "w", verify=False,
                       progress=PlainProgress(io.StringIO()))
        return done.image_id, done.cached

    built, cached = again()
    tag = f"envlock/proj:{lock.short_id}"
    assert not cached and api.builds == 1 and api.store[built]["tags"] == [tag]
    labels = api.store[built]["labels"]
    assert LABEL_CONTEXT in labels and labels[LABEL_SHORT_ID] == lock.short_id
    # Podman's build stage, then the user's `FROM envlock/proj:<id>` image with a file of its own.
    api.add([], {LABEL_CONTEXT: labels[LABEL_CONTEXT]})
    mine = api.add(["me/app:1"], labels)
    assert again() == (built, True) and api.builds == 1
    assert api.store[mine]["tags"] == ["me/app:1"] and api.store[built]["tags"] == [tag]
    # `docker rmi envlock/proj:<id>` untags the lock's image (the user's image keeps it as its
    # parent): nothing carries the lock's tag, so the restore builds, and never takes the user's.
    api.store[built]["tags"] = []
    rebuilt, cached = again()
    assert not cached and api.builds == 2 and rebuilt not in (built, mine)
    assert api.store[rebuilt]["tags"] == [tag] and api.store[mine]["tags"] == ["me/app:1"]


def test_a_bad_engine_choice_names_where_it_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    from envlock.errors import UsageError

    monkeypatch.setenv("ENVLOCK_ENGINE", "bogus")
    with pytest.raises(UsageError, match=r"^ENVLOCK_ENGINE must be docker, podman or an API URL, not 'bogus'$"):
        connect()
    with pytest.raises(UsageError, match=r"^--engine must be"):
        connect("nerdctl")


def test_a_failed_restore_points_at_the_image_restored_with_other_options() -> None:
    from docker.errors import ImageNotFound

    from envlock.commands.restore import hint_earlier_image
    from envlock.errors import EngineUnavailable, UsageError

    earlier = Options(base="envlock-test/base@sha256:" + "a" * 64, wheelhouse=Path("/srv/wheels"))
    bare = Options()

    class Restored(FakeAPI):
        """The lock's image, built with ``earlier``'s options (the label restore sets)."""

        def __init__(self, labels: dict[str, str]) -> None:
            super().__init__()
            self.labels = labels

        def inspect_image(self, ref: str) -> dict[str, Any]:
            return {"Id": IMAGE_ID, "RepoTags": [ref], "Config": {"Labels": self.labels}, "Size": 5}

    tag = "envlock/proj:0123456789ab"
    # restore --base X --wheelhouse W, then a bare `run` whose own restore fails: said.
    exc = EngineUnavailable("cannot pull python:3.11-slim-bookworm", hint="check the network")
    hint_earlier_image(exc, engine(Restored({LABEL_OPTIONS: options_key(earlier)})), tag, bare)
    assert exc.hint is not None and exc.hint.startswith(f"check the network; {tag} exists")
    assert "same --base/--wheelhouse" in exc.hint
    # `envlock run` reuses the options of the last restore of the lock: not asked to repeat them.
    assert "give `envlock run`" not in exc.hint and "reuses those of the last `envlock restore`" in exc.hint

    # The same options as the image's (a --no-cache rebuild that failed for another reason),
    # an image without the label (its options are unknown), or no image: nothing is added.
    for api, opts in ((Restored({LABEL_OPTIONS: options_key(earlier)}), earlier),
                      (Restored({"a": "b"}), bare)):
        other = EngineUnavailable("no space left on device", hint="free some space")
        hint_earlier_image(other, engine(api), tag, opts)
        assert other.hint == "free some space"

    class NoImages(FakeAPI):
        def inspect_image(self, ref: str) -> dict[str, Any]:
            raise ImageNotFound(ref)

    quiet = EngineUnavailable("cannot pull x", hint="check the network")
    hint_earlier_image(quiet, engine(NoImages()), tag, bare)
    assert quiet.hint == "check the network"  # no image of the lock: nothing to point at
    usage = UsageError("bad option")
    hint_earlier_image(usage, engine(Restored({LABEL_OPTIONS: options_key(earlier)})), tag, bare)
    assert usage.hint is None


def test_the_options_key_names_the_options_not_the_paths_spelling(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w").mkdir()
    same = options_key(Options(wheelhouse=Path("w"))) == options_key(Options(wheelhouse=tmp_path / "w"))
    assert same and options_key(Options()) != options_key(Options(wheelhouse=Path("w")))
    assert options_key(Options(base="b")) != options_key(Options())
    key = options_key(Options(wheelhouse=tmp_path / "w", index_url="http://127.0.0.1:1/simple"))
    assert str(tmp_path) not in key and "127.0.0.1" not in key  # a digest: no path in a label


# What Docker (runc) answers, recorded from a real engine, for the typed failures below.
NO_EXECUTABLE = ('failed to create shim task: OCI runtime create failed: runc create failed: unable to '
                 'start container process: exec: "python9": executable file not found in $PATH: unknown')
NO_FILE = ('failed to create shim task: OCI runtime create failed: runc create failed: unable to start '
           'container process: exec: "/usr/bin/nope": stat /usr/bin/nope: no such file or directory: unknown')


def test_engine_failures_are_typed_and_the_container_still_goes() -> None:
    from docker.errors import APIError
    from docker.errors import ImageNotFound as NoSuchImage

    from envlock.errors import CommandNotFound, ImageNotFound

    class Start(FakeAPI):
        def __init__(self, explanation: str) -> None:
            super().__init__()
            self.explanation = explanation

        def start(self, cid: str) -> None:
            raise APIError("400 Client Error", explanation=self.explanation)

    for answer in (NO_EXECUTABLE, NO_FILE):
        api = Start(answer)
        with pytest.raises(CommandNotFound, match="cannot start python9 in "):
            engine(api).run(RunSpec(image=IMAGE_ID, command=["python9"]))
        assert api.removed == ["c" * 64]
    api = Start("driver failed programming external connectivity: port is already allocated")
    with pytest.raises(ContainerFailed) as exc:
        engine(api).run(RunSpec(image=IMAGE_ID, command=["python3"]))
    assert not isinstance(exc.value, CommandNotFound) and exc.value.exit_code == 3

    class NoImage(FakeAPI):
        def create_container(self, image: str, command: list[str], **kw: Any) -> dict[str, str]:
            raise NoSuchImage(f"No such image: {image}")

    with pytest.raises(ImageNotFound) as missing:
        engine(NoImage()).run(RunSpec(image=IMAGE_ID, command=["python3"]))
    assert isinstance(missing.value, EngineUnavailable) and missing.value.exit_code == 3


def test_a_missing_interpreter_is_interpreter_not_found_by_type_not_wording() -> None:
    from docker.errors import APIError

    from envlock.errors import InterpreterNotFound
    from envlock.restore.verify import probe_in_image

    class NoPython(FakeAPI):
        def start(self, cid: str) -> None:
            raise APIError("400 Client Error", explanation=NO_EXECUTABLE)

    with pytest.raises(InterpreterNotFound, match=r"^python9 not found in "):
        probe_in_image(engine(NoPython()), IMAGE_ID, python="python9")
    # The command ran: a shell's "not found" exit status says the same.
    with pytest.raises(InterpreterNotFound):
        probe_in_image(engine(FakeAPI(exit_code=127)), IMAGE_ID, python="/opt/py/bin/python")


def test_an_engine_is_closed_when_its_with_block_ends() -> None:
    closed: list[bool] = []

    class Client(FakeClient):
        def close(self) -> None:
            closed.append(True)

    with pytest.raises(KeyboardInterrupt), DockerEngine(lambda timeout: Client(FakeAPI()), "fake://") as eng:
        assert eng.name == "docker" and closed == []  # one client, kept for the whole command
        raise KeyboardInterrupt
    assert closed == [True]


def test_build_of_a_recorded_failing_stream_names_pips_error(tmp_path: Path) -> None:
    import json

    stream = Path(__file__).parent / "fixtures" / "buildlogs" / "pip-fails.jsonl"
    chunks = [json.loads(line) for line in stream.read_text(encoding="utf-8").splitlines()]
    progress = io.StringIO()
    log = tmp_path / "build.log"
    with pytest.raises(BuildFailed) as exc:
        engine(FakeAPI(chunks)).build(tmp_path, tag="t:1", labels={}, log_path=log,
                                      progress=PlainProgress(progress, log))
    assert exc.value.message.endswith(": ERROR: No matching distribution found for six==9.9.9")
    assert exc.value.step is not None and exc.value.step.startswith("4/6: RUN")
    # envlock's progress shows the steps; the builder's own lines are in the log (and in the
    # failure's tail), not on the terminal.
    shown = progress.getvalue()
    assert "[4/6] RUN" in shown and "\n    before the install" not in shown and "before the install\n" in log.read_text()
    assert all(line.startswith(("[", "envlock: build: ")) for line in shown.splitlines()), shown
    assert shown.endswith(f"of output (all in {log})\n")
    assert any("No matching distribution" in line for line in exc.value.log_tail)
    assert log.read_text().endswith("returned a non-zero code: 1\n")


def test_a_build_stage_is_removed_by_its_build_id_after_the_build_whatever_its_outcome() -> None:
    from envlock.restore.dockerfile import BUILD_STAGE_ARG
    from envlock.restore.restore import build_stage

    class Stages(FakeAPI):
        def __init__(self) -> None:
            super().__init__()
            self.stages: dict[str, list[str]] = {}
            self.gone: list[str] = []

        def images(self, filters: dict[str, str]) -> list[dict[str, str]]:
            key, _, build = filters["label"].partition("=")
            assert key == "org.envlock.build-stage"
            return [{"Id": i} for i in self.stages.get(build, [])]

        def remove_image(self, image: str, force: bool = False, noprune: bool = False) -> None:
            assert not force and not noprune  # untagged parents go; a used image stays
            if image == "in-use":
                raise RuntimeError("conflict: image is being used by a running container")
            self.gone.append(image)

    api = Stages()
    eng = engine(api)
    kw: dict[str, Any] = {"buildargs": {"ENVLOCK_TORCH_LAYER": "sha256:1"}}
    with build_stage(eng, kw, True):
        build = kw["buildargs"][BUILD_STAGE_ARG]
        api.stages[build] = ["in-use", "stage"]
    assert kw["buildargs"]["ENVLOCK_TORCH_LAYER"] == "sha256:1"
    assert api.gone == ["stage"]  # the image in use stays, quietly
    kw = {}
    with pytest.raises(BuildFailed), build_stage(eng, kw, True):
        api.stages[kw["buildargs"][BUILD_STAGE_ARG]] = ["failed-stage"]
        raise BuildFailed("pip failed")
    assert api.gone == ["stage", "failed-stage"]
    assert len(build) == 16 and kw["buildargs"][BUILD_STAGE_ARG] != build  # one id per build
    kw = {}
    with build_stage(eng, kw, False):  # no stage in that Dockerfile: no argument, nothing removed
        pass
    assert kw == {} and api.gone == ["stage", "failed-stage"]


def test_an_interrupted_build_removes_the_images_its_steps_committed(tmp_path: Path) -> None:
    """Ctrl-C (or SIGTERM) during a build: the engine cancels it when the connection closes, and
    the images its steps had committed go, newest first, each alone; the base and a step taken
    from the cache stay. The step that was running holds its parent until its container is gone:
    that conflict is waited out."""
    from docker.errors import APIError

    class Interrupted(FakeAPI):
        def __init__(self) -> None:
            super().__init__([{"stream": "Step 1/5 : FROM base\n"}, {"stream": " ---> 0123456789ab\n"},
                              {"stream": "Step 2/5 : USER root\n"}, {"stream": " ---> Using cache\n"},
                              {"stream": " ---> 1111111111aa\n"},
                              {"stream": "Step 3/5 : COPY wheels /tmp/w\n"}, {"stream": " ---> 2222222222bb\n"},
                              {"stream": "Step 4/5 : RUN pip install\n"},
                              {"stream": " ---> Running in c0ffee\n"}, {"stream": " ---> 3333333333cc\n"},
                              {"stream": "Step 5/5 : RUN sleep 600\n"}, {"stream": " ---> Running in beef\n"}])
            self.calls: list[tuple[str, bool, bool]] = []
            self.busy = 2  # the cancelled step's container is removed after two tries

        def build(self, **kw: Any) -> Iterator[dict[str, Any]]:
            yield from self.chunks
            raise KeyboardInterrupt

        def remove_image(self, image: str, force: bool = False, noprune: bool = False) -> None:
            self.calls.append((image, force, noprune))
            if image == "3333333333cc" and self.busy:
                self.busy -= 1
                raise APIError("conflict", response=type("R", (), {"status_code": 409, "reason": "Conflict"})())

    api = Interrupted()
    with pytest.raises(KeyboardInterrupt):
        engine(api).build(tmp_path, tag="t:1", labels={}, log_path=tmp_path / "build.log",
                          progress=PlainProgress(io.StringIO()))
    assert api.calls == [("3333333333cc", False, True)] * 3 + [("2222222222bb", False, True)]


class _Engine:
    """A unix socket that speaks just enough of the engine API, with the docker SDK on the other
    end: ``answer=False`` accepts and never answers (a wedged daemon)."""

    def __init__(self, path: Path, *, answer: bool, answers: int | None = None) -> None:
        """``answers``: how many requests are answered before it goes silent (a daemon that
        stops answering once a command is connected)."""
        import threading

        self.answers = answers
        self.requests: list[str] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(8)
        self.answer = answer
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import json

        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.held.append(conn)
            if not self.answer or (self.answers is not None and len(self.requests) >= self.answers):
                continue
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
            if not data:
                continue
            self.requests.append(data.split(b" ")[1].decode())
            body = json.dumps({"Version": "27.0", "ApiVersion": "1.43",
                               "Components": [{"Name": "Engine"}]}).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            conn.close()

    def close(self) -> None:
        self.server.close()
        for conn in self.held:
            conn.close()


def test_connecting_asks_the_engine_twice_and_keeps_a_timeout_for_each_request(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command connects: the API version (the SDK's own question) and the version
    document (Docker or Podman) are all it asks, and the client it keeps has a read timeout for
    every request (``ENVLOCK_ENGINE_TIMEOUT``, else the default); a bad value is a usage error."""
    from envlock.restore.dockerengine import REQUEST_TIMEOUT

    monkeypatch.delenv("ENVLOCK_ENGINE_TIMEOUT", raising=False)
    fake = _Engine(tmp_path / "engine.sock", answer=True)
    try:
        with connect(f"unix://{tmp_path / 'engine.sock'}") as eng:
            assert eng.name == "docker" and eng.server_version == "27.0"
            assert eng.api.timeout == REQUEST_TIMEOUT == 60
        assert [r.rsplit("/", 1)[-1] for r in fake.requests] == ["version", "version"]
        monkeypatch.setenv("ENVLOCK_ENGINE_TIMEOUT", "7.5")
        with connect(f"unix://{tmp_path / 'engine.sock'}") as eng:
            assert eng.api.timeout == 7.5
        for bad in ("0", "-1", "inf", "a minute"):
            monkeypatch.setenv("ENVLOCK_ENGINE_TIMEOUT", bad)
            with pytest.raises(UsageError, match="ENVLOCK_ENGINE_TIMEOUT must be a number of seconds"):
                connect(f"unix://{tmp_path / 'engine.sock'}")
    finally:
        fake.close()


def _bounded(call: Callable[[], Any], seconds: float = 5.0) -> Any:
    """``call()``'s result or the exception it raised, in a thread given ``seconds``: a call that
    would wait forever fails the test instead of hanging it."""
    import threading

    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # handed to the test
            box["result"] = exc

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting for the engine after {seconds} s"
    return box["result"]


def test_an_engine_that_stops_answering_ends_the_command_with_exit_3_not_a_hang(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_lock: LockFactory,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A real socket that answers the two requests of connecting, then accepts and never
    answers: each request after them (an image looked up, stale containers listed, what a
    restore asks first) is the engine's failure within the timeout, in words, not a wait
    forever and not the HTTP library's traceback."""
    from envlock.commands import main
    from envlock.errors import EXIT_ENV

    monkeypatch.setenv("ENVLOCK_ENGINE_TIMEOUT", "0.3")
    url = f"unix://{tmp_path / 'engine.sock'}"
    fake = _Engine(tmp_path / "engine.sock", answer=True, answers=2)
    try:
        with connect(url) as eng:
            for ask in (lambda: eng.image("envlock/x:1"), eng.remove_stale, lambda: eng.layers(IMAGE_ID)):
                err = _bounded(ask)
                assert isinstance(err, EngineUnavailable) and err.exit_code == EXIT_ENV, repr(err)
                assert str(err) == f"the container engine at {url} did not answer within 0.3 s"
                assert "ENVLOCK_ENGINE_TIMEOUT" in (err.hint or "")
        fake.answers = len(fake.requests) + 2  # the next command connects, then the silence again
        restore_lock(image={"reference": "a/b", "digest": "sha256:" + "ab" * 32}).save(tmp_path / "env.lock")
        capsys.readouterr()
        assert _bounded(lambda: main(["restore", str(tmp_path / "env.lock"), "--engine", url,
                                      "--no-verify"])) == EXIT_ENV
        err_text = capsys.readouterr().err
        assert f"the container engine at {url} did not answer within 0.3 s" in err_text
        assert "Traceback" not in err_text
    finally:
        fake.close()


def test_the_long_reads_lift_the_timeout_for_their_own_request_alone(tmp_path: Path) -> None:
    """A build's output, a container's exit, an image pushed, saved or loaded may take longer
    than any request should: those requests go without a read timeout, and the next request has
    it again."""
    class Long(FakeAPI):
        timeout: float | None = 60.0

        def __init__(self) -> None:
            super().__init__([{"aux": {"ID": IMAGE_ID}}], exit_code=0)
            self.seen: dict[str, float | None] = {}

        def build(self, **kw: Any) -> Iterator[dict[str, Any]]:
            self.seen["build"] = kw["timeout"]
            yield from super().build(**kw)

        def get_image(self, ref: str) -> Iterator[bytes]:
            self.seen["save"] = self.timeout
            yield b"archive"

        def load_image(self, fh: Any) -> Iterator[dict[str, str]]:
            self.seen["load"] = self.timeout
            return iter([{"stream": "Loaded image"}])

        def tag(self, image_id: str, repo: str, tag: str) -> None:
            self.seen["tag"] = self.timeout

        def push(self, repo: str, tag: str, stream: bool, decode: bool) -> Iterator[dict[str, Any]]:
            self.seen["push"] = self.timeout
            return iter([{"aux": {"Digest": "sha256:" + "ee" * 32}}])

    api = Long()
    eng = engine(api)
    assert api.timeout == 60.0  # the engine's request timeout, set as it connected
    eng.build(tmp_path, tag="t:1", labels={}, log_path=tmp_path / "build.log", progress=PlainProgress(io.StringIO()))
    eng.save("t:1", tmp_path / "image.tar")
    eng.load(tmp_path / "image.tar")
    eng.push(IMAGE_ID, "registry.example/t", "1")
    assert eng.run(RunSpec(image="t:1", command=("true",))).exit_code == 0
    assert api.seen == {"build": None, "save": None, "load": None, "tag": 60.0, "push": None}
    assert api.wait_timeout is None and api.timeout == 60.0


def test_an_engine_that_accepts_and_never_answers_is_unavailable_not_a_hang(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from envlock.restore import dockerengine

    monkeypatch.setattr(dockerengine, "CONNECT_TIMEOUT", 0.5)
    fake = _Engine(tmp_path / "engine.sock", answer=False)
    try:
        with pytest.raises(EngineUnavailable, match="no container engine reachable"):
            connect(f"unix://{tmp_path / 'engine.sock'}")
    finally:
        fake.close()


def test_an_image_gone_from_the_engine_is_exit_3_in_words_never_the_sdks_error() -> None:
    """A build's image checked, or a base tagged, on an engine that does not have it (a build
    that went to another engine, a removal meanwhile): envlock's ImageNotFound naming the
    engine, not docker-py's 404, which reached the user as an HTTP error or an internal one."""
    from docker.errors import ImageNotFound as NoSuchImage

    class Gone(FakeAPI):
        def inspect_image(self, ref: str) -> dict[str, Any]:
            raise NoSuchImage(f"No such image: {ref}")

        def tag(self, image: str, repo: str, tag: str | None = None) -> bool:
            raise NoSuchImage(f"No such image: {image}")

    eng = engine(Gone())
    calls: list[Callable[[], object]] = [lambda: eng.layers(IMAGE_ID), lambda: eng.tag(IMAGE_ID, "envlock/by-id:ab")]
    for call in calls:
        with pytest.raises(ImageNotFound) as exc:
            call()
        assert exc.value.exit_code == EXIT_ENV and "the engine at fake:// has no image" in str(exc.value)
        assert "DOCKER_CONTEXT" in (exc.value.hint or "")


def test_an_images_own_variables_are_read_so_a_run_can_keep_its_pythonpath() -> None:
    """``run --record`` puts the trace's start-up hook in front of the image's ``PYTHONPATH``
    (a variable given to a container replaces the image's): the engine reports the image's
    ``ENV``, a value holding ``=`` whole."""
    from envlock.commands.run import _pythonpath

    class WithEnv(FakeAPI):
        def inspect_image(self, ref: str) -> dict[str, Any]:
            return {"Id": IMAGE_ID, "Config": {"Env": ["PATH=/usr/bin", "PYTHONPATH=/opt/lib:/opt/x=1", "BARE"]}}

    eng = engine(WithEnv())
    info = eng.image("envlock/x:1")
    assert info is not None and info.env == {"PATH": "/usr/bin", "PYTHONPATH": "/opt/lib:/opt/x=1"}
    assert _pythonpath(eng, IMAGE_ID, {}) == "/opt/lib:/opt/x=1"
    assert _pythonpath(eng, IMAGE_ID, {"PYTHONPATH": "/workspace/src"}) == "/workspace/src"  # -e wins, as in the run
    assert _pythonpath(engine(FakeAPI()), IMAGE_ID, {}) is None
