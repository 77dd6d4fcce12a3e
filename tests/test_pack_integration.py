"""End to end: pack a lock, take away everything it came from, restore it offline.

The environment is a venv on this host with two wheels from the test wheelhouse and a package
installed from a local source directory (so its wheel exists nowhere: pip's cache is a fresh
directory). The pack must carry a wheel rebuilt from that package's installed files. The base
image is a copy of the test base with a label of this run, so it has an id of its own and can
be deleted from the engine (the shared test base stays): the restore must load it from the pack
and build with the engine's network ``none``.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import container_output, needs_tool, unavailable

from envlock.commands import main

DEMO_PYPROJECT = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "envlock-packdemo"
version = "0.3.1"

[project.scripts]
envlock-packdemo = "envlock_packdemo:main"
"""


@pytest.fixture(scope="module")
def host_env(tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path) -> tuple[Path, Path]:
    """(the venv's python, its lock)."""
    root = tmp_path_factory.mktemp("packenv")
    demo = root / "demo"
    (demo / "envlock_packdemo").mkdir(parents=True)
    (demo / "pyproject.toml").write_text(DEMO_PYPROJECT)
    (demo / "envlock_packdemo" / "__init__.py").write_text(
        "VALUE = 42\n\ndef main() -> None:\n    print('packdemo', VALUE)\n")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "PIP_CACHE_DIR": str(root / "pip-cache")}
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                    "--find-links", str(wheelhouse), "six==1.16.0", "idna==3.10", str(demo)],
                   check=True, env=env)
    lock = root / "env.lock"
    assert main(["capture", "--python", str(venv / "bin" / "python"), "--no-torch", "-o", str(lock)]) == 0
    return venv / "bin" / "python", lock


@pytest.fixture
def fresh_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No cache of this machine helps: pip's is empty, envlock's is new."""
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip-cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("ENVLOCK_PLAIN_PROGRESS", "1")
    yield


# Run by every build FROM the base (an ONBUILD trigger): the network interfaces the build saw,
# written into the image, where the test reads them. A build with the engine's network `none`
# has only the loopback interface.
BUILD_NET = "/etc/envlock-test-build-net"


def _own_base(client: Any, base: str) -> str:
    """A copy of ``base`` with an id of its own, which this test may delete, that records the
    network of every build made from it."""
    tag = f"envlock-test/packbase:{uuid.uuid4().hex[:12]}"
    dockerfile = (f"FROM {base}\nLABEL org.envlock.test.pack={tag.rsplit(':', 1)[1]}\n"
                  f'ONBUILD RUN ["sh", "-c", "ls /sys/class/net > {BUILD_NET}"]\n')
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    return tag


def _remove(client: Any, *refs: str) -> None:
    for ref in refs:
        try:
            client.images.remove(ref, force=True)
        except Exception:
            pass


def _pack_restore_offline(client: Any, base: str, host_env: tuple[Path, Path], wheelhouse: Path,
                          out: Path, engine: list[str], capfd: pytest.CaptureFixture[str],
                          builder: str | None = None) -> dict[str, float]:
    python, lock_path = host_env
    from envlock.lock import load

    lock = load(lock_path)
    own = _own_base(client, base)
    base_id = client.images.get(own).id
    timings: dict[str, float] = {}
    restored: list[str] = []
    try:
        t0 = time.monotonic()
        assert main(["pack", str(lock_path), "-o", str(out), *engine, "--wheelhouse", str(wheelhouse),
                     "--python", str(python), "--base", own, "--no-download"]) == 0
        timings["pack"] = time.monotonic() - t0
        got, err = capfd.readouterr()
        assert "rebuilt from installed files (envlock-packdemo" in got, got + err

        # Everything the pack came from is gone: the base image (by id) and every cache.
        _remove(client, own)
        from docker.errors import ImageNotFound

        with pytest.raises(ImageNotFound):
            client.images.get(base_id)
        for image in client.images.list(filters={"label": f"org.envlock.fingerprint={lock.envlock.fingerprint}"}):
            _remove(client, image.id)

        t0 = time.monotonic()
        code = main(["restore", str(out), *engine, "--name", "it-pack"])
        timings["restore"] = time.monotonic() - t0
        got, err = capfd.readouterr()
        assert code == 0, got + err
        assert "loaded the base image" in err and "OK: the environment matches the lock" in got, got + err
        if builder is not None:  # ENVLOCK_BUILDER: which one built (the client: BuildKit or Buildah)
            assert ("with BuildKit (" in err or "with Buildah (" in err) == (builder == "cli"), err
        assert client.images.get(base_id).id == base_id
        tag = f"envlock/it-pack:{lock.short_id}"
        restored.append(tag)
        ran = container_output(client, tag, ["python", "-c", "import envlock_packdemo as d, six; "
                                             "print(d.VALUE, six.__version__)"],
                               # network "none", not NetworkDisabled: Podman's Docker API
                               # ignores the latter and rootless Podman then needs slirp4netns.
                               network_mode="none")
        assert ran.split() == ["42", "1.16.0"]
        if not engine:  # on Docker: Podman's builder may drop ONBUILD (OCI images carry none)
            seen = container_output(client, tag, ["cat", BUILD_NET], network_mode="none")
            assert seen.split() == ["lo"], f"the restore's build had a network: {seen.split()}"
    finally:
        _remove(client, *restored, f"envlock-pack/base:{lock.short_id}", own, base_id)
    return timings


@pytest.mark.integration
@pytest.mark.slow
def test_pack_then_restore_with_no_network_docker(docker_client: Any, base_image: str, wheelhouse: Path,
                                                  host_env: tuple[Path, Path], tmp_path: Path,
                                                  fresh_caches: None, capfd: pytest.CaptureFixture[str],
                                                  builder: str) -> None:
    """With each builder (``builder``: the command-line client, BuildKit, mounting the wheels;
    the SDK's classic builder, a build stage): the offline build is not only the one ``auto``
    picks on the machine that runs the suite."""
    out = tmp_path / "pack"
    timings = _pack_restore_offline(docker_client, base_image, host_env, wheelhouse, out, [], capfd, builder)
    assert (out / "image" / "base.docker.tar").is_file() and (out / "README.md").is_file()
    assert (out / "image" / "base.oci.tar").is_file() == bool(shutil.which("skopeo"))
    if os.environ.get("ENVLOCK_REPORT_TIMINGS"):
        sys.stderr.write(f"pack+restore (docker): {timings}\n")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.podman
def test_pack_as_tar_then_restore_with_no_network_podman(podman_client: Any, podman_base_image: str,
                                                         wheelhouse: Path, host_env: tuple[Path, Path],
                                                         tmp_path: Path, fresh_caches: None,
                                                         capfd: pytest.CaptureFixture[str], builder: str) -> None:
    """With Buildah (the client) and with Podman's API (the SDK), as on Docker."""
    url = os.environ["ENVLOCK_TEST_PODMAN_HOST"]
    out = tmp_path / "pack.tar"
    timings = _pack_restore_offline(podman_client, podman_base_image, host_env, wheelhouse, out,
                                    ["--engine", url], capfd, builder)
    assert out.is_file()
    if os.environ.get("ENVLOCK_REPORT_TIMINGS"):
        sys.stderr.write(f"pack+restore (podman): {timings}\n")


@pytest.mark.slow
def test_pack_then_venv_target_passes_verify_deep(host_env: tuple[Path, Path], wheelhouse: Path,
                                                  tmp_path: Path, fresh_caches: None,
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    python, lock_path = host_env
    out = tmp_path / "pack"
    assert main(["pack", str(lock_path), "-o", str(out), "--no-image", "--wheelhouse", str(wheelhouse),
                 "--python", str(python), "--no-download"]) == 0
    capfd.readouterr()
    venv = tmp_path / "restored"
    t0 = time.monotonic()
    code = main(["restore", str(out), "--target", "venv", str(venv), "--python", sys.executable])
    seconds = time.monotonic() - t0
    got, err = capfd.readouterr()
    assert code == 0 and "OK: the environment matches the lock" in got, got + err
    ran = subprocess.run([str(venv / "bin" / "envlock-packdemo")], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "packdemo 42"  # the console script came back from entry_points.txt
    assert main(["verify", str(lock_path), "--python", str(venv / "bin" / "python"), "--deep"]) == 0, \
        capfd.readouterr()
    # Into an existing venv it never installs.
    assert main(["restore", str(out), "--target", "venv", str(venv)]) == 2
    if os.environ.get("ENVLOCK_REPORT_TIMINGS"):
        sys.stderr.write(f"venv target: {seconds:.1f}s\n")


ROOTLESS_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "podman-rootless.sh"


@pytest.fixture
def rootless_podman() -> Iterator[tuple[Any, str]]:
    """A rootless Podman service: an unprivileged user's ``podman system service`` on a socket
    in its own XDG_RUNTIME_DIR (``scripts/podman-rootless.sh``, which needs root to create the
    user); (client, API URL). Skipped where it cannot be set up, unless
    ENVLOCK_REQUIRE_PODMAN_ROOTLESS=1 (scripts/test.sh, as root with Podman working) asks for it."""
    import docker

    required = "ENVLOCK_REQUIRE_PODMAN_ROOTLESS"
    if os.geteuid() != 0 or not shutil.which("podman"):
        unavailable("rootless Podman is set up by root with podman installed", required_env=required)
    proc = subprocess.run(["bash", str(ROOTLESS_SCRIPT), "start"], capture_output=True, text=True,
                          timeout=600, check=False)
    urls = [line.split("=", 1)[1] for line in proc.stdout.splitlines()
            if line.startswith("export ENVLOCK_TEST_PODMAN_ROOTLESS_HOST=")]
    if proc.returncode != 0 or not urls:
        unavailable(f"rootless Podman could not start: {proc.stderr.strip()[-600:]}", required_env=required)
    client = docker.DockerClient(base_url=urls[0])
    try:
        yield client, urls[0]
    finally:
        # The user's storage is the test's own, and vfs copies every layer whole: what a build
        # left untagged would stay from one run to the next.
        try:
            client.images.prune(filters={"dangling": True})
        except docker.errors.APIError:
            pass
        client.close()
        subprocess.run(["bash", str(ROOTLESS_SCRIPT), "stop"], capture_output=True, timeout=120, check=False)


# -- one pack of a torch lock, every restore target, the same weights ---------------------------

REPO = Path(__file__).resolve().parents[1]
TRAIN = ["python", "train.py", "--workers", "0", "--epochs", "1"]


@pytest.fixture(scope="module")
def torch_env(tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path) -> tuple[Path, Path]:
    """(a venv's python with CPU torch from the wheelhouse, its lock)."""
    root = tmp_path_factory.mktemp("r20ch-torchenv")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "PIP_CACHE_DIR": str(root / "pip-cache")}
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                    "--disable-pip-version-check", "--find-links", str(wheelhouse), "torch==2.13.0+cpu"],
                   check=True, env=env, timeout=900)
    lock = root / "env.lock"
    assert main(["capture", "--python", str(venv / "bin" / "python"), "-o", str(lock)]) == 0
    return venv / "bin" / "python", lock


def _offline() -> list[str]:
    """A prefix that runs a command with no network at all (a network namespace of its own)."""
    if subprocess.run([needs_tool("unshare"), "-n", "true"], check=False).returncode:
        unavailable("unshare -n is not permitted here (it needs root, as scripts/test.sh runs)")
    return ["unshare", "-n"]


def _envlock(*args: str, pythonpath: bool = True) -> subprocess.CompletedProcess[str]:
    """This checkout's envlock in a process of its own, offline. ``pythonpath=False`` for the
    venv target, which verifies in place with the caller's environment: PYTHONPATH on the
    checkout (its envlock_ml.egg-info of an editable install) would add envlock to the venv."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = str(REPO)
    return subprocess.run([*_offline(), sys.executable, "-m", "envlock", *args], capture_output=True,
                          text=True, env=env, timeout=3600, check=False)


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _in_engine(client: Any, tag: str, ws: Path, out: str) -> None:
    client.containers.run(tag, [*TRAIN, "--save", f"{out}/model.pt"], remove=True, network_disabled=True,
                          user=f"{os.getuid()}:{os.getgid()}", working_dir="/workspace",
                          volumes={str(ws): {"bind": "/workspace", "mode": "rw"}})


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.podman
def test_pack_then_restore_with_no_network_rootless_podman(rootless_podman: tuple[Any, str], base_image: str,
                                                           wheelhouse: Path, host_env: tuple[Path, Path],
                                                           tmp_path: Path, fresh_caches: None,
                                                           capfd: pytest.CaptureFixture[str]) -> None:
    """The same offline restore through a plain user's Podman: the image loaded from the pack,
    built with network none and verified inside, all without root."""
    client, url = rootless_podman
    timings = _pack_restore_offline(client, f"localhost/{base_image}", host_env, wheelhouse,
                                    tmp_path / "pack", ["--engine", url], capfd)
    if os.environ.get("ENVLOCK_REPORT_TIMINGS"):
        sys.stderr.write(f"pack+restore (rootless podman): {timings}\n")


@pytest.mark.integration
@pytest.mark.slow
def test_one_pack_restores_the_same_weights_with_every_target(
        request: pytest.FixtureRequest, docker_client: Any, base_image: str, wheelhouse: Path,
        torch_env: tuple[Path, Path], tmp_path: Path, fresh_caches: None) -> None:
    """pack -> base and caches gone -> restore offline with Docker, Podman, Charliecloud and as
    a venv -> each verifies inside -> the example training gives one sha256 of its weights."""
    needs_tool("ch-image")
    _offline()  # here, before the pack is built, rather than halfway through
    try:  # with ENVLOCK_REQUIRE_PODMAN=1 (scripts/test.sh, Podman working) a missing one fails
        podman: Any = request.getfixturevalue("podman_client")
    except pytest.skip.Exception:
        podman = None
    python, lock_path = torch_env
    from envlock.lock import load

    lock = load(lock_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    shutil.copy(REPO / "examples" / "train_mnist_like.py", ws / "train.py")
    # The example imports envlock; the images hold only the lock's packages.
    shutil.copytree(REPO / "envlock", ws / "envlock", ignore=shutil.ignore_patterns("__pycache__"))
    own = _own_base(docker_client, base_image)
    base_id = docker_client.images.get(own).id
    pack = tmp_path / "pack"
    chdir = tmp_path / "r20ch-image"
    seconds: dict[str, float] = {}
    weights: dict[str, str] = {}
    tags: list[tuple[Any, str]] = []
    # The lock's venv lies under /tmp, which ch-image shares with the host: every image target
    # builds it at /opt/venv, so all of them render the same Dockerfile.
    image_opts = ["--venv", "/opt/venv", "--name", "r20ch-every"]
    try:
        t0 = time.monotonic()
        assert main(["pack", str(lock_path), "-o", str(pack), "--wheelhouse", str(wheelhouse),
                     "--python", str(python), "--base", own, "--no-download"]) == 0
        seconds["pack"] = time.monotonic() - t0
        assert (pack / "image" / "base.oci.tar").is_file(), "the pack needs skopeo for its OCI archive"
        _remove(docker_client, own, base_id)

        engines: list[tuple[str, Any, list[str]]] = [("docker", docker_client, [])]
        if podman is not None:
            engines.append(("podman", podman, ["--engine", os.environ["ENVLOCK_TEST_PODMAN_HOST"]]))
        for name, client, engine in engines:
            tag = f"envlock/r20ch-every:{lock.short_id}"
            tags += [(client, tag), (client, f"envlock-pack/base:{lock.short_id}"), (client, base_id)]
            t0 = time.monotonic()
            done = _envlock("restore", str(pack), *engine, *image_opts)
            seconds[name] = time.monotonic() - t0
            assert done.returncode == 0, done.stdout + done.stderr
            assert "OK: the environment matches the lock" in done.stdout, done.stdout + done.stderr
            (ws / f"out-{name}").mkdir(mode=0o777)
            _in_engine(client, tag, ws, f"out-{name}")
            weights[name] = _sha256(ws / f"out-{name}" / "model.pt")

        t0 = time.monotonic()
        done = _envlock("restore", str(pack), "--target", "charliecloud", str(chdir), *image_opts)
        seconds["charliecloud"] = time.monotonic() - t0
        assert done.returncode == 0, done.stdout + done.stderr
        assert "OK: the environment matches the lock" in done.stdout, done.stdout + done.stderr
        assert "importing the base image" in done.stderr
        # The command restore prints runs the example as documented.
        printed = done.stdout.split("run in it: ", 1)[1].splitlines()[0]
        assert printed.endswith(" -- python train.py")
        (ws / "out-charliecloud").mkdir()
        from envlock.restore.chtarget import find_tools, tool_env

        ran = subprocess.run(["bash", "-c", printed + " --workers 0 --epochs 1 --save out-charliecloud/model.pt"],
                             cwd=ws, env=tool_env(tmp_path / "unused", find_tools(umoci=False)),
                             capture_output=True, text=True, timeout=900, check=False)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        weights["charliecloud"] = _sha256(ws / "out-charliecloud" / "model.pt")
        # A second restore of the same pack finds the directory image.
        t0 = time.monotonic()
        again = _envlock("restore", str(pack), "--target", "charliecloud", str(chdir), *image_opts)
        seconds["charliecloud again"] = time.monotonic() - t0
        assert again.returncode == 0 and "cache hit" in again.stdout, again.stdout + again.stderr

        t0 = time.monotonic()
        venv = tmp_path / "r20ch-venv"
        done = _envlock("restore", str(pack), "--target", "venv", str(venv), "--python", sys.executable,
                        pythonpath=False)
        seconds["venv"] = time.monotonic() - t0
        assert done.returncode == 0, done.stdout + done.stderr
        (ws / "out-venv").mkdir()
        subprocess.run([str(venv / "bin" / "python"), *TRAIN[1:], "--save", "out-venv/model.pt"], cwd=ws,
                       check=True, capture_output=True, timeout=900)
        weights["venv"] = _sha256(ws / "out-venv" / "model.pt")
    finally:
        for client, ref in tags:
            _remove(client, ref)
        _remove(docker_client, own)
        shutil.rmtree(chdir, ignore_errors=True)
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)  # Charliecloud's storage is there
        shutil.rmtree(tmp_path / "r20ch-venv", ignore_errors=True)
    table = "\n".join(f"  {target:<13} {digest}" for target, digest in weights.items())
    assert len(set(weights.values())) == 1, f"the weights differ between targets:\n{table}"
    assert set(weights) == {"docker", "charliecloud", "venv", *(["podman"] if podman is not None else [])}
    if os.environ.get("ENVLOCK_REPORT_TIMINGS"):
        sys.stderr.write(f"seconds per target: {({k: round(v, 1) for k, v in seconds.items()})}\n"
                         f"model.pt sha256 per target:\n{table}\n")


@pytest.mark.integration
@pytest.mark.slow
def test_a_system_python_pack_installs_its_debs_with_the_network_off(
        docker_client: Any, base_image: str, tmp_path: Path, fresh_caches: None,
        capfd: pytest.CaptureFixture[str]) -> None:
    """A lock captured in the base image (its Debian python3, its ~120 OS packages) plus one OS
    package the base lacks (``ed``, at the version this machine's apt sources offer): the pack
    carries the .deb of every pin, says nothing is downloaded, and its restore builds with the
    engine's network ``none`` (the base's ONBUILD trigger records the build's interfaces),
    installs ``ed`` from the pack and matches the lock."""
    import re

    from envlock.lock import load, save

    needs_tool("apt-get")  # `pack` downloads the .debs with this machine's apt
    show = subprocess.run(["apt-cache", "show", "--no-all-versions", "ed"], capture_output=True, text=True,
                          check=True).stdout
    version = re.search(r"^Version: (\S+)$", show, re.M)
    arch = re.search(r"^Architecture: (\S+)$", show, re.M)
    assert version and arch, show
    own = _own_base(docker_client, base_image)
    restored: list[str] = []  # what to remove: the restored image, the base loaded from the pack
    try:
        lock_path = tmp_path / "env.lock"
        assert main(["capture", "--in-image", own, "--no-torch", "-o", str(lock_path)]) == 0
        lock = load(lock_path)
        assert lock.python.prefix_kind == "system" and lock.os_packages and lock.os_packages.manager == "dpkg"
        assert not any(s.startswith("ed:") for s in lock.os_packages.packages)
        specs = sorted([*lock.os_packages.packages, f"ed:{arch.group(1)}={version.group(1)}"])
        save(lock.model_copy(update={"os_packages": lock.os_packages.model_copy(update={"packages": specs})}),
             lock_path)
        lock = load(lock_path)
        restored += [f"envlock/it-pack-debs:{lock.short_id}", f"envlock-pack/base:{lock.short_id}"]
        out = tmp_path / "pack"
        t0 = time.monotonic()
        assert main(["pack", str(lock_path), "-o", str(out), "--base", own, "--no-download", "--no-oci"]) == 0
        t_pack = time.monotonic() - t0
        got, err = capfd.readouterr()
        assert f"{len(specs)} debs" in got, got + err
        assert "nothing is downloaded" in (out / "README.md").read_text()
        t0 = time.monotonic()
        code = main(["restore", str(out), "--name", "it-pack-debs"])
        t_restore = time.monotonic() - t0
        got, err = capfd.readouterr()
        assert code == 0, got + err
        assert "OK: the environment matches the lock" in got and "needs the network" not in err, got + err
        tag = restored[0]
        seen = container_output(docker_client, tag, ["cat", BUILD_NET], network_mode="none")
        assert seen.split() == ["lo"], f"the restore's build had a network: {seen.split()}"
        installed = container_output(docker_client, tag, ["dpkg-query", "-W", "-f", "${Version}", "ed"],
                                     network_mode="none")
        assert installed == version.group(1)
        if os.environ.get("ENVLOCK_REPORT_TIMINGS"):
            sys.stderr.write(f"system-Python pack (docker): pack {t_pack:.1f}s, restore {t_restore:.1f}s\n")
    finally:
        _remove(docker_client, *restored, own)
