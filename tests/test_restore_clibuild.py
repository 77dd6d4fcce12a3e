"""Which command-line client builds, and how a build through one is run (``restore.clibuild``).

The choice is tested with stand-in clients on PATH that answer ``--version`` and ``buildx
inspect`` as the real ones do (the words are Docker's and Podman's own); the builds themselves
run the real clients in the integration tests (tests/test_restore_integration.py).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from envlock.errors import EXIT_ENV, EXIT_USAGE, BuildFailed, EngineUnavailable, UsageError
from envlock.restore import clibuild, endpoint
from envlock.restore.engine import ImageInfo
from envlock.restore.progress import QuietProgress

FIXTURES = Path(__file__).parent / "fixtures" / "buildlogs"
ID = "sha256:" + "ab" * 32
BASE_LAYERS = ("sha256:" + "01" * 32, "sha256:" + "02" * 32)


def _client(bin_dir: Path, name: str, *, version: str, buildx_driver: str | None = None) -> Path:
    """A stand-in ``docker``/``podman``: ``--version`` says ``version``; ``buildx inspect`` says
    the builder's driver when there is a plugin, else fails as a client without it does."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    buildx = (f'printf "Name:          default\\nDriver:        {buildx_driver}\\n"; exit 0'
              if buildx_driver else 'echo "docker: \'buildx\' is not a docker command." >&2; exit 1')
    path.write_text(f'#!/bin/sh\nif [ "$1" = "buildx" ]; then {buildx}; fi\n'
                    f'if [ "$1" = "--version" ]; then echo "{version}"; exit 0; fi\nexit 2\n')
    path.chmod(0o755)
    return path


@pytest.fixture
def path_of(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """PATH holds only the stand-ins written under the returned directory (a/, b/: in order)."""
    monkeypatch.setenv("PATH", f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}")
    monkeypatch.delenv("ENVLOCK_BUILDER", raising=False)
    return tmp_path


def test_the_setting_is_auto_cli_or_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENVLOCK_BUILDER", raising=False)
    assert clibuild.setting() == "auto"
    for value, want in (("CLI", "cli"), (" sdk ", "sdk"), ("", "auto")):
        monkeypatch.setenv("ENVLOCK_BUILDER", value)
        assert clibuild.setting() == want
    monkeypatch.setenv("ENVLOCK_BUILDER", "buildkit\x1b[2J")
    with pytest.raises(UsageError) as err:
        clibuild.setting()
    assert err.value.exit_code == EXIT_USAGE and "\x1b" not in str(err.value)


def test_a_docker_23_without_buildx_is_passed_over_for_the_2010_client_behind_it(path_of: Path) -> None:
    """As on a machine with a static Docker 28 in /usr/local/bin and Debian's docker.io: the
    first has no BuildKit without the plugin, the second has it built in."""
    _client(path_of / "a", "docker", version="Docker version 28.2.2, build e6534b4")
    second = _client(path_of / "b", "docker", version="Docker version 20.10.24+dfsg1, build 297e128")
    client, note = clibuild.choose("docker", "20.10.24+dfsg1", "unix:///run/d.sock", ())
    assert note is None and client is not None
    assert client.kind == "buildkit" and client.argv == (str(second), "build", "--progress", "plain")
    assert dict(client.env) == {"DOCKER_BUILDKIT": "1"}
    assert client.describe() == f"BuildKit (DOCKER_BUILDKIT=1 {second})"


def test_buildx_is_taken_when_its_builder_is_the_engines_own(path_of: Path) -> None:
    first = _client(path_of / "a", "docker", version="Docker version 28.2.2", buildx_driver="docker")
    told = endpoint.resolve("tcp://10.0.0.1:2375").cli_env  # an engine named by URL
    client, _ = clibuild.choose("docker", "28.2.2", "tcp://10.0.0.1:2375", told)
    assert client is not None and client.kind == "buildx"
    assert client.argv == (str(first), "buildx", "build", "--load", "--progress", "plain")
    assert dict(client.env) == {"DOCKER_HOST": "tcp://10.0.0.1:2375", "DOCKER_CONTEXT": None}
    seen = client.environ({"DOCKER_CONTEXT": "other", "HOME": "/h"})
    assert seen == {"DOCKER_HOST": "tcp://10.0.0.1:2375", "HOME": "/h"}
    # A builder in a container of its own cannot see the engine's images: not that one.
    _client(path_of / "a", "docker", version="Docker version 28.2.2", buildx_driver="docker-container")
    assert clibuild.choose("docker", "28.2.2", "unix:///run/d.sock", ())[0] is None


def test_without_a_client_auto_notes_why_cli_fails_and_sdk_says_nothing(
        path_of: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _client(path_of / "a", "docker", version="Docker version 28.2.2, build e6534b4")
    client, note = clibuild.choose("docker", "28.2.2", "unix:///run/d.sock", ())
    assert client is None and note is not None
    assert note.startswith("no docker client on PATH builds with BuildKit") and "slower" in note
    monkeypatch.setenv("ENVLOCK_BUILDER", "cli")
    with pytest.raises(EngineUnavailable) as err:
        clibuild.choose("docker", "28.2.2", "unix:///run/d.sock", ())
    assert err.value.exit_code == EXIT_ENV and str(err.value).startswith("ENVLOCK_BUILDER=cli, but no docker")
    assert err.value.hint == clibuild.INSTALL_HINT
    monkeypatch.setenv("ENVLOCK_BUILDER", "sdk")
    _client(path_of / "b", "docker", version="Docker version 20.10.24")
    assert clibuild.choose("docker", "28.2.2", "unix:///run/d.sock", ()) == (None, None)


def test_an_engine_too_old_for_run_mount_builds_with_the_sdk(path_of: Path) -> None:
    _client(path_of / "a", "docker", version="Docker version 20.10.24")
    client, note = clibuild.choose("docker", "19.03.15", "unix:///run/d.sock", ())
    assert client is None and note is not None and "before 20.10" in note


def test_podman_builds_with_its_own_client_at_the_same_url(path_of: Path) -> None:
    podman = _client(path_of / "b", "podman", version="podman version 4.3.1")
    _client(path_of / "a", "docker", version="Docker version 20.10.24")  # not for a Podman engine
    client, note = clibuild.choose("podman", "4.3.1", "unix:///run/p.sock", ())
    assert note is None and client is not None and client.takes_ids
    assert client.argv == (str(podman), "--url", "unix:///run/p.sock", "build", "--format", "docker")
    assert client.describe() == f"Buildah ({podman} build)"
    _client(path_of / "b", "podman", version="podman version 3.4.4")
    client, note = clibuild.choose("podman", "4.3.1", "unix:///run/p.sock", ())
    assert client is None and note is not None and note.startswith("no podman client of version 4")
    client, note = clibuild.choose("podman", "3.4.4", "unix:///run/p.sock", ())
    assert client is None and note is not None and "Podman before 4.0" in note


def test_on_path_lists_each_executable_once_in_order(path_of: Path) -> None:
    a = _client(path_of / "a", "docker", version="x")
    b = _client(path_of / "b", "docker", version="y")
    (path_of / "b" / "other").write_text("")  # not executable: not a candidate either
    assert clibuild.on_path("docker") == [str(a), str(b)]
    os.environ["PATH"] += os.pathsep + str(path_of / "a")
    assert clibuild.on_path("docker") == [str(a), str(b)]


# -- image ids for BuildKit --------------------------------------------------------------------


class Images:
    """The part of an engine a build asks: images by reference, tags, layers, removals."""

    def __init__(self, tags: Sequence[str]) -> None:
        self.tags = list(tags)
        self.tagged: list[tuple[str, str]] = []
        self.removed: list[str] = []
        self.built_layers = (*BASE_LAYERS, "sha256:" + "03" * 32)

    def image(self, ref: str) -> ImageInfo | None:
        return ImageInfo(id=ID, tags=tuple(self.tags)) if ref == ID else None

    def tag(self, image_id: str, ref: str) -> None:
        self.tagged.append((image_id, ref))

    def layers(self, image_id: str) -> tuple[str, ...]:
        return BASE_LAYERS if image_id == ID else self.built_layers

    def remove_committed(self, images: Sequence[str]) -> None:
        self.removed += images


BUILDKIT = clibuild.Client(("docker", "build"), (("DOCKER_BUILDKIT", "1"),), "buildkit")
PODMAN = clibuild.Client(("podman", "--url", "unix:///p", "build"), (), "podman")


def test_buildkit_gets_a_name_for_an_image_id_and_buildah_the_id() -> None:
    engine = Images(["<none>:<none>", "envlock-test/bookworm-python:1"])
    args = {"ENVLOCK_BASE": ID, "OTHER": "a/b@" + ID, "ENVLOCK_BUILD_STAGE": "0123"}
    named, ids = clibuild._local_names(BUILDKIT, engine, args)
    assert named == {**args, "ENVLOCK_BASE": "envlock-test/bookworm-python:1"} and ids == {"ENVLOCK_BASE": ID}
    assert clibuild._local_names(PODMAN, engine, args) == (args, {})
    # An image with no tag at all gets one, derived from its id: BuildKit needs a name.
    bare = Images([])
    named, _ = clibuild._local_names(BUILDKIT, bare, {"ENVLOCK_BASE": ID})
    assert named["ENVLOCK_BASE"] == f"envlock/by-id:{'ab' * 16}" and bare.tagged == [(ID, named["ENVLOCK_BASE"])]


def test_an_image_that_does_not_start_from_the_named_base_is_refused() -> None:
    engine = Images(["b:1"])
    clibuild._check_bases(engine, "sha256:" + "cd" * 32, {"ENVLOCK_BASE": ID})
    engine.built_layers = ("sha256:" + "09" * 32, *BASE_LAYERS)
    with pytest.raises(BuildFailed, match="its tag moved during the build"):
        clibuild._check_bases(engine, "sha256:" + "cd" * 32, {"ENVLOCK_BASE": ID})


def test_a_build_is_sent_exactly_its_files_linked_not_copied(tmp_path: Path) -> None:
    context = tmp_path / "context"
    (context / "wheels" / "torch").mkdir(parents=True)
    (context / "wheels" / "torch" / "t.whl").write_bytes(b"w" * 1000)
    (context / "wheels" / "six").mkdir()
    (context / "wheels" / "six" / "s.whl").write_bytes(b"s")
    (context / "wheels" / "empty").mkdir()
    (context / "Dockerfile").write_text("FROM x\n")
    root, size = clibuild._linked(context, ["Dockerfile", "wheels/torch", "wheels/empty"], tmp_path / "sent")
    got = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert got == ["Dockerfile", "wheels", "wheels/empty", "wheels/torch", "wheels/torch/t.whl"]
    assert size == 1000 + len("FROM x\n")
    assert (root / "wheels/torch/t.whl").stat().st_ino == (context / "wheels/torch/t.whl").stat().st_ino


# -- a client's run ------------------------------------------------------------------------------


def _replaying_client(tmp_path: Path, fixture: str, code: int) -> clibuild.Client:
    """A client that prints the lines a real one printed (a recorded fixture) and exits ``code``."""
    lines = [json.loads(line)["stream"] for line in (FIXTURES / f"{fixture}.jsonl").read_text().splitlines()]
    script = tmp_path / "client.py"
    script.write_text(f"import sys\nsys.stdout.write({''.join(lines)!r})\nsys.exit({code})\n")
    return clibuild.Client((sys.executable, str(script)), (), "buildkit")


@pytest.mark.parametrize("fixture", ["buildkit-pip-fails", "podman-cli-pip-fails"])
def test_a_failed_client_build_is_the_same_build_failure_as_the_sdks(tmp_path: Path, fixture: str) -> None:
    context = tmp_path / "work" / "context"
    context.mkdir(parents=True)
    (context / "Dockerfile").write_text("FROM x\n")
    log = tmp_path / "work" / "build.log"
    with open(os.devnull, "w") as stream, pytest.raises(BuildFailed) as err:
        clibuild.build(_replaying_client(tmp_path, fixture, 1), Images([]), context, tag="t:1", labels={},
                       log_path=log, progress=QuietProgress(stream))
    assert err.value.exit_code == EXIT_ENV and err.value.log_path == str(log)
    assert str(err.value).endswith(": ERROR: No matching distribution found for six==9.9.9")
    assert err.value.step is not None and 'RUN ["env", "PIP_BREAK_SYSTEM_PACKAGES=1"' in err.value.step
    text = log.read_text()
    assert "ERROR: No matching distribution found for six==9.9.9" in text
    assert text.splitlines().count(err.value.log_tail[-1]) == 1  # the client's last line, once
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["build.log", "context"]


def test_a_client_that_writes_no_image_id_fails_the_build(tmp_path: Path) -> None:
    context = tmp_path / "context"
    context.mkdir()
    with open(os.devnull, "w") as stream, pytest.raises(BuildFailed, match="wrote no image id"):
        clibuild.build(_replaying_client(tmp_path, "buildkit-ok", 0), Images([]), context, tag="t:1",
                       labels={}, log_path=tmp_path / "build.log", progress=QuietProgress(stream))


def recording_client(tmp_path: Path, image_id: str = ID) -> tuple[clibuild.Client, Path]:
    """A client that records the arguments it was started with (a JSON list, in the returned
    file), writes ``image_id`` where ``--iidfile`` says and succeeds, as a real build does."""
    said = tmp_path / "client-argv.json"
    script = tmp_path / "recording-client.py"
    script.write_text("import json, sys\n"
                      f"open({str(said)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
                      "iid = sys.argv[sys.argv.index('--iidfile') + 1]\n"
                      f"open(iid, 'w').write({image_id!r})\n")
    return clibuild.Client((sys.executable, str(script)), (), "buildkit"), said


@pytest.mark.parametrize("network", [False, True])
def test_a_build_without_the_network_tells_the_client_network_none(tmp_path: Path, network: bool) -> None:
    """An offline build (a pack, a bundle) runs with the engine's network ``none`` through the
    command-line client as through the SDK (``network_mode``); with the network, no option."""
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM x\n")
    client, said = recording_client(tmp_path)
    with open(os.devnull, "w") as stream:
        built = clibuild.build(client, Images([]), context, tag="t:1", labels={}, log_path=tmp_path / "build.log",
                               progress=QuietProgress(stream), network=network)
    argv = json.loads(said.read_text())
    assert built == ID and argv[-1] == str(context)
    pairs = list(itertools.pairwise(argv))
    assert (("--network", "none") in pairs) is not network
    assert sum(a.startswith("--network") for a in argv) == (0 if network else 1)


def test_a_missing_client_is_an_unavailable_engine(tmp_path: Path) -> None:
    context = tmp_path / "context"
    context.mkdir()
    client = clibuild.Client((str(tmp_path / "no-such-docker"), "build"), (), "buildkit")
    with open(os.devnull, "w") as stream, pytest.raises(EngineUnavailable, match=r"cannot run .*no-such-docker"):
        clibuild.build(client, Images([]), context, tag="t:1", labels={}, log_path=tmp_path / "build.log",
                       progress=QuietProgress(stream))


@pytest.mark.parametrize("ignores_sigint", [False, True])
def test_a_stopped_client_gets_sigint_and_is_killed_when_it_stays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ignores_sigint: bool) -> None:
    monkeypatch.setattr(clibuild, "_STOP_SECONDS", 1.0)
    code = ("import signal, sys, time\n"
            + ("signal.signal(signal.SIGINT, signal.SIG_IGN)\n" if ignores_sigint else "")
            + "print('ready', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    t0 = time.monotonic()
    clibuild.stop(proc)
    proc.stdout.close()
    # Python ends an uncaught KeyboardInterrupt with SIGINT itself.
    assert proc.returncode == (-signal.SIGKILL if ignores_sigint else -signal.SIGINT)
    assert time.monotonic() - t0 < 30


def test_both_builders_start_their_log_with_the_one_context_line(tmp_path: Path) -> None:
    """The SDK's builder (a tar of the files) and a command-line client (the files linked) say
    what they were sent in one line, written once (``buildlog.context_sent``), which the speed
    test reads back with ``CONTEXT_SENT_RE`` whichever built."""
    from collections.abc import Iterator
    from typing import Any

    from envlock.restore.buildlog import CONTEXT_SENT_RE, context_sent
    from envlock.restore.dockerengine import DockerEngine

    context = tmp_path / "context"
    (context / "wheels").mkdir(parents=True)
    (context / "wheels" / "six.whl").write_bytes(b"s" * 250_000)
    (context / "Dockerfile").write_text("FROM x\n")
    client, _ = recording_client(tmp_path)
    with open(os.devnull, "w") as stream:
        clibuild.build(client, Images([]), context, tag="t:1", labels={}, log_path=tmp_path / "build.log",
                       progress=QuietProgress(stream), files=["Dockerfile", "wheels"])
    cli_line = (tmp_path / "build.log").read_text().splitlines(keepends=True)[0]

    class API:
        def build(self, **kw: Any) -> Iterator[dict[str, Any]]:
            return iter(())

    sdk = DockerEngine.__new__(DockerEngine)
    sdk.api = API()
    sdk_line = next(iter(sdk.build_stream(context, tag="t:1", labels={}, files=["Dockerfile", "wheels"])))["stream"]
    assert cli_line == context_sent(250_000 + len("FROM x\n")) == "envlock: sending a build context of 0.3 MB\n"
    for line in (cli_line, sdk_line):
        sent = CONTEXT_SENT_RE.search(line)
        assert sent is not None and sent.group(0) + "\n" == line and float(sent.group(1)) >= 0.2
