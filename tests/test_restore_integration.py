"""End to end with a real engine: capture inside an image, restore it, verify inside, replay.

A "source" image stands for a researcher's environment: the base image plus a venv with a few
pinned packages installed from the local wheelhouse (containers reach no index). Its lock is
captured with ``envlock capture --in-image``; ``envlock restore`` must rebuild it from the
plain base image, prove it from inside, and ``envlock run`` must replay commands in it.
The torch image is built once per session (the wheel is ~200 MB).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envlock.commands import main

from helpers import container_output, reap, remove_image, stop_with  # isort: skip
from lock_edits import with_other_six  # isort: skip

pytestmark = pytest.mark.integration

PATH = "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SMALL = ["six==1.16.0", "idna==3.10", "packaging==24.2"]
TORCH = ["torch==2.13.0+cpu", "six==1.17.0"]


def build_source_image(client: Any, base: str, wheelhouse: Path, packages: list[str],
                       env: dict[str, str], tag_prefix: str) -> str:
    """Base + /opt/venv with ``packages`` from the wheelhouse, committed as an image."""
    key = hashlib.sha256(repr((base, packages, sorted(env.items()))).encode()).hexdigest()[:12]
    tag = f"{tag_prefix}:{key}"
    try:
        client.images.get(tag)
        return tag
    except Exception:
        pass
    script = ("python3 -m venv /opt/venv && /opt/venv/bin/pip install -q --no-index "
              "--disable-pip-version-check --find-links /wheels " + " ".join(packages))
    container = client.containers.run(base, ["sh", "-c", script], detach=True, network_disabled=True,
                                      volumes={str(wheelhouse): {"bind": "/wheels", "mode": "ro"}})
    try:
        result = container.wait()
        logs = container.logs().decode(errors="replace")
        assert result["StatusCode"] == 0, logs
        changes = [f"ENV PATH={PATH}"] + [f"ENV {k}={v}" for k, v in env.items()]
        repo, _, tag_part = tag.rpartition(":")
        container.commit(repository=repo, tag=tag_part, changes=changes)
    finally:
        container.remove(force=True)
    return tag


def purge(client: Any, fingerprint: str) -> None:
    """Remove restored images of a lock, so a test's first restore really builds."""
    for image in client.images.list(filters={"label": f"org.envlock.fingerprint={fingerprint}"}):
        remove_image(client, image)


def capture(ref: str, path: Path, *extra: str) -> Any:
    from envlock.lock import load

    assert main(["capture", "--in-image", ref, "-o", str(path), *extra]) == 0
    return load(path)


def no_leftover_containers(client: Any) -> None:
    left = client.containers.list(all=True, sparse=True, filters={"label": "org.envlock.owner"})
    assert left == [], [c.attrs.get("Names") for c in left]


@pytest.fixture(scope="session")
def small_source(docker_client: Any, base_image: str, wheelhouse: Path) -> str:
    return build_source_image(docker_client, base_image, wheelhouse, SMALL, {"PYTHONHASHSEED": "0"},
                              "envlock-test/src-small")


@pytest.fixture(scope="session")
def torch_source(docker_client: Any, base_image: str, wheelhouse: Path) -> str:
    return build_source_image(docker_client, base_image, wheelhouse, TORCH,
                              {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, "envlock-test/src-torch")


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("ENVLOCK_PLAIN_PROGRESS", "1")
    yield tmp_path / "cache"


def test_small_lock_restores_verifies_runs_and_hits_the_cache(
        docker_client: Any, base_image: str, wheelhouse: Path, small_source: str, tmp_path: Path,
        cache_home: Path, capfd: pytest.CaptureFixture[str], builder: str) -> None:
    lock = capture(small_source, tmp_path / "env.lock")
    assert lock.image.source == "engine" and lock.image.id and lock.python.prefix == "/opt/venv"
    assert [p.name for p in lock.packages if p.name in ("six", "idna")] == ["idna", "six"]
    purge(docker_client, str(lock.envlock.fingerprint))
    capfd.readouterr()
    common = [str(tmp_path / "env.lock"), "--base", base_image, "--wheelhouse", str(wheelhouse),
              "--name", "it-small"]

    t0 = time.monotonic()
    assert main(["restore", *common]) == 0
    first = time.monotonic() - t0
    out, err = capfd.readouterr()
    assert "built in" in out and "OK: the environment matches the lock" in out, out + err
    assert "[1/" in err  # plain progress lines off a TTY
    assert ("with BuildKit (" in err) == (builder == "cli"), err

    t0 = time.monotonic()
    assert main(["restore", *common]) == 0
    second = time.monotonic() - t0
    out, err = capfd.readouterr()
    assert "cache hit" in out and "OK: the environment matches the lock" in out
    assert "[1/" not in err  # nothing was built
    assert second < first

    image = docker_client.images.get(f"envlock/it-small:{lock.short_id}")
    labels = image.labels
    assert labels["org.envlock.fingerprint"] == lock.envlock.fingerprint
    assert labels["org.envlock.schema-version"] == "1"
    assert image.attrs["Config"]["User"] == "1000:1000"
    assert image.attrs["Config"]["WorkingDir"] == "/workspace"
    # Nothing of envlock in the image: the probe was copied into throwaway containers only.
    tmp_listing = container_output(docker_client, image.id, ["ls", "/tmp"])
    assert "envlock-probe" not in tmp_listing
    pip_list = container_output(docker_client, image.id, ["python", "-m", "pip", "list"])
    assert "envlock" not in pip_list.lower()

    ws = tmp_path / "ws"
    ws.mkdir()
    code = main(["run", *common, "--workspace", str(ws), "--gpus", "none", "--", "python", "-c",
                 "import six, idna, os; print('versions', six.__version__, idna.__version__, "
                 "os.getcwd(), os.environ['PYTHONHASHSEED']); open('made.txt', 'w').write('x'); "
                 "raise SystemExit(5)"])
    out, err = capfd.readouterr()
    assert code == 5, err
    assert "versions 1.16.0 3.10 /workspace 0" in out
    made = ws / "made.txt"
    assert made.exists() and (made.stat().st_uid, made.stat().st_gid) == (os.getuid(), os.getgid())
    no_leftover_containers(docker_client)


def test_an_image_built_from_the_restored_one_is_never_the_cache_hit(
        docker_client: Any, base_image: str, wheelhouse: Path, small_source: str, tmp_path: Path,
        cache_home: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A user's image ``FROM envlock/<name>:<id>`` with a file of its own inherits every label
    of the restored image and is newer; the next restore's cache hit is still the image envlock
    built and tagged, and the user's image gets no envlock tag."""
    import io

    lock = capture(small_source, tmp_path / "env.lock")
    purge(docker_client, str(lock.envlock.fingerprint))
    common = [str(tmp_path / "env.lock"), "--base", base_image, "--wheelhouse", str(wheelhouse),
              "--name", "it-from", "--no-verify"]
    assert main(["restore", *common]) == 0
    tag = f"envlock/it-from:{lock.short_id}"
    restored = docker_client.images.get(tag)
    text = f"FROM {tag}\nRUN echo mine > /tmp/mine.txt\n"
    mine, _ = docker_client.images.build(fileobj=io.BytesIO(text.encode()), tag="envlock-test/on-restored:1",
                                         rm=True, network_mode="none")
    try:
        assert mine.id != restored.id and mine.labels == restored.labels  # inherited, every one
        capfd.readouterr()
        assert main(["restore", *common]) == 0
        out, err = capfd.readouterr()
        assert f"cache hit: {tag} ({restored.id[7:19]})" in out + err, out + err
        assert docker_client.images.get(tag).id == restored.id
        assert docker_client.images.get(mine.id).tags == ["envlock-test/on-restored:1"]
    finally:
        remove_image(docker_client, mine)


def test_restore_from_the_locks_own_image(docker_client: Any, small_source: str, tmp_path: Path,
                                          cache_home: Path, capfd: pytest.CaptureFixture[str],
                                          builder: str) -> None:
    """The lock's image by its id: BuildKit reads an id in FROM as a registry name, so the
    client path gives it one of the image's tags (nothing here can reach a registry)."""
    capture(small_source, tmp_path / "env.lock")
    assert main(["restore", str(tmp_path / "env.lock"), "--name", "it-own", "--no-cache"]) == 0
    out, _ = capfd.readouterr()
    assert "OK: the environment matches the lock" in out
    dockerfile = next((cache_home / "envlock" / "restore").glob("it-own-*/context/Dockerfile")).read_text()
    image_id = docker_client.images.get(small_source).id
    assert (f"FROM {image_id}" if builder == "sdk" else f"ARG ENVLOCK_BASE={image_id}\nFROM ${{ENVLOCK_BASE}}") \
        in dockerfile


def test_nonexistent_version_fails_before_the_build_with_exit_3(
        docker_client: Any, base_image: str, wheelhouse: Path, small_source: str, tmp_path: Path,
        cache_home: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from envlock.lock import save

    lock = capture(small_source, tmp_path / "env.lock")
    bad = [p.model_copy(update={"version": "9.9.9"}) if p.name == "six" else p for p in lock.packages]
    save(lock.model_copy(update={"packages": bad}), tmp_path / "bad.lock")
    capfd.readouterr()
    code = main(["restore", str(tmp_path / "bad.lock"), "--base", base_image, "--wheelhouse",
                 str(wheelhouse), "--name", "it-bad", "--context-dir", str(tmp_path / "work")])
    err = capfd.readouterr().err
    assert code == 3
    assert "no wheel in the wheelhouse" in err and "six==9.9.9" in err
    assert "Traceback" not in err and not (tmp_path / "work" / "build.log").exists()  # no build ran
    no_leftover_containers(docker_client)


def test_bundle_then_offline_hash_checked_restore(
        docker_client: Any, base_image: str, wheelhouse: Path, small_source: str, tmp_path: Path,
        cache_home: Path, capfd: pytest.CaptureFixture[str], builder: str) -> None:
    lock = capture(small_source, tmp_path / "env.lock")
    bundle = tmp_path / "bundle"
    assert main(["bundle", str(tmp_path / "env.lock"), "-o", str(bundle), "--wheelhouse", str(wheelhouse)]) == 0
    assert sorted(p.name.split("-")[0] for p in bundle.glob("*.whl")) == ["idna", "packaging", "six"]
    assert main(["restore", str(tmp_path / "env.lock"), "--base", base_image, "--wheelhouse", str(bundle),
                 "--name", "it-bundle", "--no-cache", "--context-dir", str(tmp_path / "work")]) == 0
    out, _ = capfd.readouterr()
    assert "OK: the environment matches the lock" in out
    hashed = (tmp_path / "work" / "context" / "requirements" / "packages-hashed.txt").read_text()
    assert "six==1.16.0" in hashed and "--hash=sha256:" in hashed
    assert lock.package("six") is not None


def test_torch_lock_with_determinism_env_round_trips(
        docker_client: Any, base_image: str, wheelhouse: Path, torch_source: str, tmp_path: Path,
        cache_home: Path, capfd: pytest.CaptureFixture[str], builder: str) -> None:
    lock = capture(torch_source, tmp_path / "env.lock")
    assert lock.torch is not None and lock.torch.version == "2.13.0+cpu"
    assert lock.determinism.env.get("CUBLAS_WORKSPACE_CONFIG") == ":4096:8"
    purge(docker_client, str(lock.envlock.fingerprint))
    common = [str(tmp_path / "env.lock"), "--base", base_image, "--wheelhouse", str(wheelhouse),
              "--name", "it-torch", "--context-dir", str(tmp_path / "work")]
    capfd.readouterr()
    assert main(["restore", *common]) == 0
    out, err = capfd.readouterr()
    assert "OK: the environment matches the lock" in out, out + err
    dockerfile = (tmp_path / "work" / "context" / "Dockerfile").read_text()
    assert dockerfile.index("torch.txt") < dockerfile.index("packages.txt")
    assert "torch==2.13.0+cpu" in (tmp_path / "work" / "context" / "requirements" / "torch.txt").read_text()
    code = main(["run", *common, "--workspace", str(tmp_path), "--", "python", "-c",
                 "import os, torch, six; print('stack', torch.__version__, six.__version__, "
                 "os.environ['CUBLAS_WORKSPACE_CONFIG'])"])
    out, err = capfd.readouterr()
    assert code == 0, err
    assert "stack 2.13.0+cpu 1.17.0 :4096:8" in out
    no_leftover_containers(docker_client)


@pytest.mark.podman
def test_podman_restore_verify_and_run(podman_client: Any, podman_base_image: str, wheelhouse: Path,
                                       tmp_path: Path, cache_home: Path,
                                       capfd: pytest.CaptureFixture[str], builder: str) -> None:
    url = os.environ["ENVLOCK_TEST_PODMAN_HOST"]
    source = build_source_image(podman_client, podman_base_image, wheelhouse, SMALL, {},
                                "envlock-test/src-small-podman")
    lock = capture(source, tmp_path / "env.lock", "--engine", url)
    assert lock.image.engine == "podman" and lock.image.id
    purge(podman_client, str(lock.envlock.fingerprint))
    common = [str(tmp_path / "env.lock"), "--engine", url, "--base", podman_base_image,
              "--wheelhouse", str(wheelhouse), "--name", "it-podman"]
    capfd.readouterr()
    assert main(["restore", *common]) == 0
    out, err = capfd.readouterr()
    assert "OK: the environment matches the lock" in out, out + err
    assert main(["restore", *common]) == 0
    assert "cache hit" in capfd.readouterr().out
    code = main(["run", *common, "--workspace", str(tmp_path), "--", "python", "-c",
                 "import os, six; print('podman', six.__version__, os.path.exists('/tmp/envlock-wheels')); "
                 "raise SystemExit(4)"])
    out, _ = capfd.readouterr()
    # False: the cache hit ran the final image, not Podman's labelled build stage with the wheels;
    # with mounts, the mount points' empty directories are gone too.
    assert code == 4 and "podman 1.16.0 False" in out
    # The same lock with six at another version: Buildah's layer cache must not hand back the
    # layer built from the other requirement file (with mounts, the RUN names what it mounts).
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "env.lock").write_text(with_other_six((tmp_path / "env.lock").read_text(), wheelhouse,
                                                            "1.16.0", "1.17.0"))
    assert main(["fmt", str(tmp_path / "b" / "env.lock")]) == 0
    from envlock.lock import load

    purge(podman_client, str(load(tmp_path / "b" / "env.lock").envlock.fingerprint))
    capfd.readouterr()
    assert main(["restore", str(tmp_path / "b" / "env.lock"), *common[1:]]) == 0
    out, err = capfd.readouterr()
    assert "built in" in out and "OK: the environment matches the lock" in out, out + err
    no_leftover_containers(podman_client)


BUILD_UNTIL_INTERRUPTED = """
import sys
from pathlib import Path
from envlock.restore.endpoint import connect
from envlock.restore.progress import PlainProgress

with connect() as engine:
    try:
        engine.build(Path(sys.argv[1]), tag=sys.argv[3], labels={}, log_path=Path(sys.argv[2]),
                     progress=PlainProgress(sys.stderr))
    except KeyboardInterrupt:
        sys.exit(130)
"""


@pytest.mark.parametrize("builder, engine", [("sdk", "docker"), ("cli", "docker"),
                                             pytest.param("cli", "podman", marks=pytest.mark.podman)])
def test_an_interrupted_build_leaves_no_image_of_its_steps(request: pytest.FixtureRequest, tmp_path: Path,
                                                            builder: str, engine: str) -> None:
    """A real build in an envlock process of its own, interrupted (SIGINT) while its last step
    runs: the images its earlier steps committed are gone, the base is not. Through the engine's
    own client (``clibuild``) the client is stopped too: BuildKit commits no step image, Podman's
    committed steps are removed as the SDK path removes Docker's."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import uuid

    from envlock.restore.buildlog import BuildLog

    client = request.getfixturevalue("docker_client" if engine == "docker" else "podman_client")
    base_image = request.getfixturevalue("base_image" if engine == "docker" else "podman_base_image")
    context = tmp_path / "context"
    context.mkdir()
    (context / "a.txt").write_text(uuid.uuid4().hex)  # no step of this build is in any cache
    # Podman's service runs the step whose client is gone to its end (docs/restore.md): shorter.
    (context / "Dockerfile").write_text(
        f"FROM {base_image}\nRUN [\"sh\", \"-c\", \"echo {uuid.uuid4().hex} > /one\"]\nCOPY a.txt /a.txt\n"
        f"RUN [\"sleep\", \"{600 if engine == 'docker' else 90}\"]\n")
    log = tmp_path / "build.log"
    tag = f"envlock-test/interrupted:{uuid.uuid4().hex[:12]}"
    # faulthandler: a build that does not stop is made to print where each thread stands.
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PYTHONFAULTHANDLER": "1",
           "ENVLOCK_BUILDER": builder}
    if engine == "podman":
        env["ENVLOCK_ENGINE"] = os.environ["ENVLOCK_TEST_PODMAN_HOST"]
    proc = subprocess.Popen([sys.executable, "-c", BUILD_UNTIL_INTERRUPTED, str(context), str(log), tag],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # the progress lines, as the build goes
            seen.append(line)
            if "sleep" in line:
                break
        assert any("sleep" in line for line in seen), seen
        time.sleep(1)  # the step's container starts: the daemon then has it to cancel too
        _, err = stop_with(proc, signal.SIGINT, "the interrupted build")
    finally:
        reap(proc)
    assert proc.returncode == 130, err
    parsed = BuildLog()
    for line in log.read_text().splitlines():
        parsed.feed({"stream": line + "\n"})
    # The RUN and the COPY before the sleep; BuildKit commits no image per step.
    assert len(parsed.committed) == (0 if (builder, engine) == ("cli", "docker") else 2), log.read_text()
    for image in parsed.committed:
        assert _no_image(client, image)
    assert _no_image(client, tag) and not _image_missing(client, base_image)
    # The client stopped with envlock: no process of this build is left.
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _cmdline_has(pid, tag)]


def _no_image(client: Any, ref: str) -> bool:
    return _image_missing(client, ref) and _image_missing(client, f"localhost/{ref}")


def _image_missing(client: Any, ref: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        client.images.get(ref)
    except ImageNotFound:
        return True
    return False


def _cmdline_has(pid: str, text: str) -> bool:
    try:
        return text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.parametrize("engine", ["docker", pytest.param("podman", marks=pytest.mark.podman)])
def test_a_client_restore_leaves_no_build_stage_or_untagged_image(
        request: pytest.FixtureRequest, wheelhouse: Path, tmp_path: Path, cache_home: Path,
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], engine: str) -> None:
    """A fresh restore through the engine's own client: the wheels are mounted, so there is no
    build stage; nothing it built is left untagged (Podman's step images are the restored
    image's parents, its layer cache, as through its API)."""
    monkeypatch.setenv("ENVLOCK_BUILDER", "cli")
    client = request.getfixturevalue("docker_client" if engine == "docker" else "podman_client")
    base = request.getfixturevalue("base_image" if engine == "docker" else "podman_base_image")
    url = os.environ["DOCKER_HOST"] if engine == "docker" else os.environ["ENVLOCK_TEST_PODMAN_HOST"]
    source = build_source_image(client, base, wheelhouse, SMALL, {}, f"envlock-test/src-small-{engine}")
    lock = capture(source, tmp_path / "env.lock", "--engine", url)
    fingerprint = str(lock.envlock.fingerprint)
    purge(client, fingerprint)
    capfd.readouterr()
    assert main(["restore", str(tmp_path / "env.lock"), "--engine", url, "--base", base, "--wheelhouse",
                 str(wheelhouse), "--name", "it-leftovers", "--context-dir", str(tmp_path / "work")]) == 0
    out, err = capfd.readouterr()
    assert "built in" in out and ("with BuildKit (" if engine == "docker" else "with Buildah (") in err, out + err
    assert "--mount=type=bind" in (tmp_path / "work" / "context" / "Dockerfile").read_text()
    restored = client.images.get(f"envlock/it-leftovers:{lock.short_id}")
    assert client.images.list(all=True, filters={"label": "org.envlock.build-stage"}) == []
    ours = [i for i in client.images.list(filters={"dangling": True})
            if (i.labels or {}).get("org.envlock.fingerprint") == fingerprint
            or (i.labels or {}).get("org.envlock.context") == restored.labels["org.envlock.context"]]
    assert ours == [], [i.id for i in ours]
    # Nothing of the build stays in the image: no wheel, no requirement file, no uv, no mount point.
    listing = container_output(client, restored.id,
                               ["sh", "-c", "ls -a /tmp; ls /usr/local/share/envlock-restore"]).split()
    assert sorted(listing) == [".", "..", "restored.json"], listing
    no_leftover_containers(client)


@pytest.fixture
def engine_b(tmp_path: Path) -> Iterator[str]:
    """A second, private dockerd (engine B) for this test alone: its own data root, exec root,
    pid file and socket under a short temporary directory (unix socket paths are short), and a
    bridge of its own with no iptables rules (docker0 is the first engine's; builds and
    containers need a bridge, and nothing here needs a route out). Up in about a second;
    stopped and removed afterwards. Its URL."""
    import shutil
    import signal
    import socket
    import subprocess
    import tempfile

    import docker

    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    if not os.access(dockerd, os.X_OK) or os.geteuid() != 0:
        from helpers import unavailable

        unavailable("a second dockerd needs dockerd (scripts/engine.sh installs it) and root")
    ip = shutil.which("ip")
    if ip is None:
        from helpers import unavailable

        unavailable("a second dockerd's bridge needs ip (iproute2)")
    root = Path(tempfile.mkdtemp(prefix="envlock-b-", dir="/tmp"))
    url = f"unix://{root}/d.sock"
    suffix = os.urandom(3).hex()
    bridge = f"elb-{suffix}"  # at most 15 characters, as interface names are
    subnet = f"10.213.{int(suffix[:2], 16)}"
    for argv in (["link", "add", "name", bridge, "type", "bridge"],
                 ["addr", "add", f"{subnet}.1/24", "dev", bridge], ["link", "set", bridge, "up"]):
        subprocess.run([ip, *argv], check=True, capture_output=True, timeout=30)
    proc = None
    try:
        with open(tmp_path / "dockerd-b.log", "wb") as log:
            proc = subprocess.Popen([dockerd, "--host", url, "--data-root", str(root / "data"),
                                     "--exec-root", str(root / "exec"), "--pidfile", str(root / "d.pid"),
                                     "--bridge", bridge, "--iptables=false", "--ip6tables=false"],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                # A plain socket first: docker-py leaks its socket when the connect fails.
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.settimeout(5)
                    sock.connect(str(root / "d.sock"))
                client = docker.DockerClient(base_url=url, timeout=5)
                try:
                    client.ping()
                finally:
                    client.close()
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("the second dockerd did not answer within 30 s: "
                                         + (tmp_path / "dockerd-b.log").read_text(errors="replace")[-2000:]) from None
                time.sleep(0.2)
        yield url
    finally:
        t0 = time.monotonic()
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its containerd too: the group is theirs
                proc.wait()
        t1 = time.monotonic()
        subprocess.run([ip, "link", "del", bridge], capture_output=True, timeout=30, check=False)
        shutil.rmtree(root, ignore_errors=True)
        if os.environ.get("ENVLOCK_REPORT_TIMINGS"):
            sys.stderr.write(f"second dockerd: stopped in {t1 - t0:.1f} s, removed in {time.monotonic() - t1:.1f} s\n")


def _everything(client: Any) -> list[tuple[str, tuple[str, ...]]]:
    return sorted((i.id, tuple(sorted(i.tags))) for i in client.images.list(all=True))


def test_a_restore_under_docker_context_tags_builds_and_checks_on_that_engine_alone(
        docker_client: Any, base_image: str, wheelhouse: Path, small_source: str, engine_b: str,
        tmp_path: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    """Two engines and two docker contexts: config.json's current context is A, $DOCKER_CONTEXT
    names B. The docker CLI builds on B; the SDK (whose own lookup reads no $DOCKER_CONTEXT)
    used to tag and inspect on A: the build then started from a name A had given and checked
    an image A never had (an internal ImageNotFound). One endpoint now: the base found, the
    build and the restored tag are B's, and A is left exactly as it was."""
    import shutil
    import subprocess

    import docker

    monkeypatch.setenv("ENVLOCK_BUILDER", "cli")
    lock = capture(small_source, tmp_path / "env.lock")  # on A, as the suite's setup
    a_url = os.environ["DOCKER_HOST"]
    b = docker.DockerClient(base_url=engine_b, timeout=300)
    try:
        archive = tmp_path / "base.tar"
        with open(archive, "wb") as fh:
            for chunk in docker_client.api.get_image(base_image):
                fh.write(chunk)
        with open(archive, "rb") as fh:
            b.images.load(fh)
        archive.unlink()
        config = tmp_path / "docker-config"
        docker_cli = shutil.which("docker")
        assert docker_cli, "no docker CLI on PATH (scripts/engine.sh installs it)"
        for argv in (["create", "ctx-a", "--docker", f"host={a_url}"],
                     ["create", "ctx-b", "--docker", f"host={engine_b}"], ["use", "ctx-a"]):
            subprocess.run([docker_cli, "context", *argv], check=True, capture_output=True, timeout=30,
                           env={**os.environ, "DOCKER_CONFIG": str(config)})
        monkeypatch.setenv("DOCKER_CONFIG", str(config))
        monkeypatch.setenv("DOCKER_CONTEXT", "ctx-b")
        monkeypatch.delenv("DOCKER_HOST")
        on_a = _everything(docker_client)
        capfd.readouterr()

        t0 = time.monotonic()
        code = main(["restore", str(tmp_path / "env.lock"), "--base", base_image, "--wheelhouse",
                     str(wheelhouse), "--name", "it-context"])
        took = time.monotonic() - t0
        out, err = capfd.readouterr()
        assert code == 0, out + err
        assert "with BuildKit (" in err and "OK: the environment matches the lock" in out, out + err
        assert "Traceback" not in err and "internal error" not in err
        restored = b.images.get(f"envlock/it-context:{lock.short_id}")
        assert restored.labels["org.envlock.fingerprint"] == lock.envlock.fingerprint
        assert _everything(docker_client) == on_a  # nothing tagged, built or removed on A
        assert docker_client.containers.list(all=True, sparse=True, filters={"label": "org.envlock.owner"}) == []
        if os.environ.get("ENVLOCK_REPORT_TIMINGS"):
            sys.stderr.write(f"restore on a second engine: {took:.1f} s\n")
    finally:
        b.close()
