"""A pack restored, without a real engine: what the build is given (its network, its base),
the venv target with envlock's own wheel, a Ctrl-C or SIGTERM in the middle, two restores at
once, and the paths a pack's manifest may name."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, LockFactory, reap, stop_with

from envlock.commands import main
from envlock.errors import BuildFailed, PackDamaged, UsageError
from envlock.export.pack import PackOptions, pack
from envlock.restore import packdir
from envlock.restore.engine import BuildMode, ContainerEngine, ImageInfo, RunResult, RunSpec
from envlock.restore.image import Options
from envlock.restore.progress import Progress

from test_restore_run_bundle import make_wheel  # isort: skip

BASE_ID = "sha256:" + "ba" * 32
BUILT_ID = "sha256:" + "ee" * 32
LOCK_IMAGE = {"reference": "lab/base:1", "digest": "sha256:" + "ab" * 32}


class RecordingEngine(ContainerEngine):
    """An engine that knows a few images and records what it is asked to do."""

    name = "docker"

    def __init__(self, images: Mapping[str, str] | None = None) -> None:
        self.images = dict(images or {})  # ref -> image id
        self.builds: list[dict[str, Any]] = []
        self.pulls: list[str] = []
        self.loads: list[Path] = []

    def image(self, ref: str) -> ImageInfo | None:
        image_id = self.images.get(ref) or (ref if ref in self.images.values() else None)
        return ImageInfo(id=image_id, size=1) if image_id else None

    def pull(self, ref: str) -> ImageInfo:
        self.pulls.append(ref)
        self.images[ref] = BASE_ID
        return ImageInfo(id=BASE_ID)

    def tag(self, image_id: str, ref: str) -> None:
        self.images[ref] = image_id

    def build(self, context: Path, *, tag: str, labels: Mapping[str, str], log_path: Path,
              progress: Progress, network: bool = True, files: Sequence[str] | None = None,
              dockerfile: str = "Dockerfile", buildargs: Mapping[str, str] | None = None) -> str:
        self.builds.append({"network": network, "dockerfile": (context / dockerfile).read_text(),
                            "buildargs": dict(buildargs or {})})
        self.images[tag] = BUILT_ID
        return BUILT_ID

    def run(self, spec: RunSpec, *, on_stdout: Callable[[bytes], None] | None = None,
            on_stderr: Callable[[bytes], None] | None = None) -> RunResult:
        raise AssertionError("the tests restore with --no-verify")

    def remove_stale(self) -> int:
        return 0

    def save(self, ref: str, dest: Path) -> None:
        dest.write_bytes(b"docker-archive of " + ref.encode())

    def load(self, archive: Path) -> None:
        self.loads.append(archive)
        self.images["loaded"] = BASE_ID


@pytest.fixture
def clean(installer_clean: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No configuration or cache of this machine; uv never taken from the host."""
    monkeypatch.setenv("ENVLOCK_RESTORE_INSTALLER", "pip")
    return installer_clean


def _house(tmp_path: Path) -> Path:
    house = tmp_path / "house"
    house.mkdir(parents=True)
    make_wheel(house, "six", "1.16.0")
    return house


def _pack(lock: Any, tmp_path: Path, engine: RecordingEngine | None, out: Path | None = None) -> Path:
    lock_path = tmp_path / "env.lock"
    lock.save(lock_path)
    out = out or tmp_path / "pack"
    pack(lock, lock_path, out, PackOptions(wheelhouses=(_house(tmp_path),), download=False,
                                           image=engine is not None, oci=False), engine=engine)
    return out


def _restore(monkeypatch: pytest.MonkeyPatch, engine: RecordingEngine, *argv: str) -> int:
    monkeypatch.setattr("envlock.restore.endpoint.connect", lambda *a, **k: engine)
    return main(["restore", *argv, "--no-verify", "--name", "t"])


# -- a pack builds with the network off -----------------------------------------------------------


def test_a_pack_of_a_venv_lock_builds_with_the_network_off(
        restore_lock: LockFactory, tmp_path: Path, clean: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    lock = restore_lock(image=LOCK_IMAGE, packages=[("six", "1.16.0")])
    engine = RecordingEngine({"lab/base@" + LOCK_IMAGE["digest"]: BASE_ID})
    root = _pack(lock, tmp_path, engine)
    capsys.readouterr()
    assert _restore(monkeypatch, engine, str(root)) == 0
    err = capsys.readouterr().err
    (build,) = engine.builds
    assert build["network"] is False, err
    assert f"FROM {BASE_ID}" in build["dockerfile"] and not engine.pulls
    assert "needs the network" not in err


def test_run_after_a_restore_finds_its_image_without_the_restores_options_again(
        restore_lock: LockFactory, tmp_path: Path, clean: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`restore --base X --wheelhouse W` then a plain `run`: run reuses X and W (kept per lock
    id in envlock's cache, said in one line), so it looks for that image instead of restoring
    another from the lock's own base; a restore without options forgets them."""
    from helpers import fake_engine_run

    lock = restore_lock(image=LOCK_IMAGE, packages=[("six", "1.16.0")])
    lock.save(tmp_path / "env.lock")
    monkeypatch.chdir(tmp_path)
    house = _house(tmp_path)
    engine = RecordingEngine({BASE_ID: BASE_ID})
    assert _restore(monkeypatch, engine, "env.lock", "--base", BASE_ID, "--wheelhouse", str(house)) == 0
    builds: list[Any] = []
    fake_engine_run(monkeypatch, lock, lambda *a, **k: 0, builds=builds)
    capsys.readouterr()
    assert main(["run", "env.lock", "--", "python", "train.py"]) == 0
    args, options, _ = builds[-1]
    assert (options.base, options.wheelhouse, args.name) == (BASE_ID, house, "t")
    assert (f"envlock: reusing the restore options `envlock restore` was given for env.lock: "
            f"--base {BASE_ID} --wheelhouse {house} --name t\n") in capsys.readouterr().err
    # An option given now wins over the remembered one.
    assert main(["run", "env.lock", "--name", "u", "--", "python", "train.py"]) == 0
    assert builds[-1][0].name == "u" and builds[-1][1].base == BASE_ID
    # Restored again without options: nothing is remembered any more.
    monkeypatch.setattr("envlock.restore.endpoint.connect", lambda *a, **k: engine)
    assert main(["restore", "env.lock", "--no-verify"]) == 0
    fake_engine_run(monkeypatch, lock, lambda *a, **k: 0, builds=builds)
    capsys.readouterr()
    assert main(["run", "env.lock", "--", "python", "train.py"]) == 0
    assert builds[-1][1].base is None and "reusing" not in capsys.readouterr().err


def test_only_os_packages_that_the_image_installs_keep_the_network(
        restore_lock: LockFactory, tmp_path: Path, clean: Path) -> None:
    """A system-Python lock with dpkg pins is the one restore whose build fetches something
    (apt, from the image's sources): the network stays on for it, with a note."""
    from envlock.restore.restore import restore

    system = restore_lock(image=LOCK_IMAGE,
                          python={"version": "3.11.2", "implementation": "cpython", "prefix_kind": "system",
                                  "executable": "/usr/bin/python3"},
                          os_packages={"manager": "dpkg", "packages": ["python3-six:all=1.16.0-4"]},
                          packages=[{"name": "six", "version": "1.16.0", "source": "system",
                                     "os_package": "python3-six", "os_package_version": "1.16.0-4"}])
    venv = restore_lock(image=LOCK_IMAGE, packages=[("six", "1.16.0")],
                        os_packages={"manager": "dpkg", "packages": ["libc6:amd64=2.36-9"]})
    notes: dict[str, list[str]] = {}
    for name, lock in (("system", system), ("venv", venv)):
        engine = RecordingEngine({"lab/base@" + LOCK_IMAGE["digest"]: BASE_ID})
        notes[name] = []
        restore(lock, Options(wheelhouse=_house(tmp_path / name)), engine=engine, name=name,
                verify=False, network=False, say=notes[name].append)
        assert engine.builds[0]["network"] is (name == "system"), notes[name]
    assert any("installed with apt, which needs the network" in n for n in notes["system"])
    assert not any("network" in n for n in notes["venv"])


@pytest.mark.parametrize("missing", ["", "python3-foo"])
def test_a_system_python_pack_installs_its_own_debs_with_the_network_off(
        missing: str, restore_lock: LockFactory, tmp_path: Path, clean: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A pack of a system-Python lock holds the .deb of every pin: its restore installs them
    from the pack (apt given their paths, no `apt-get update`) with the network off, and its
    README says nothing is downloaded. With one .deb missing (apt could not download it), the
    restore fetches the pins with apt, network on, and the README names what it fetches."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(  # `apt-get download` as apt names its files
        "#!/bin/sh\n[ \"$1\" = download ] || exit 2\nshift; [ \"$1\" = -q ] && shift\n"
        "for pin in \"$@\"; do case \"$pin\" in \"$MISSING\"*) exit 100;; esac; done\n"
        "for pin in \"$@\"; do n=${pin%%=*}; v=$(printf %s \"${pin#*=}\" | sed 's/:/%3a/')\n"
        "  echo deb > \"${n}_${v}_all.deb\"; done\n")
    (bin_dir / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("MISSING", missing or "no-such-package")
    lock = restore_lock(image=LOCK_IMAGE,
                        python={"version": "3.11.2", "implementation": "cpython", "prefix_kind": "system",
                                "executable": "/usr/bin/python3"},
                        os_packages={"manager": "dpkg", "packages": ["python3-six:all=1.16.0-4",
                                                                     "python3-foo:all=1:2.0-1"]},
                        packages=[{"name": "six", "version": "1.16.0", "source": "system",
                                   "os_package": "python3-six", "os_package_version": "1.16.0-4"}])
    engine = RecordingEngine({"lab/base@" + LOCK_IMAGE["digest"]: BASE_ID})
    root = _pack(lock, tmp_path, engine)
    readme = (root / "README.md").read_text()
    assert _restore(monkeypatch, engine, str(root)) == 0
    err = capsys.readouterr().err
    (build,) = engine.builds
    if not missing:
        assert build["network"] is False, err
        assert '"apt-get", "update"' not in build["dockerfile"] and "ospkgs.py" not in build["dockerfile"]
        assert "/debs/python3-foo_1%3a2.0-1_all.deb" in build["dockerfile"]
        assert "/debs/python3-six_1.16.0-4_all.deb" in build["dockerfile"]
        assert "nothing is downloaded" in readme and "installed from `debs/`" in readme
    else:
        assert build["network"] is True and '"apt-get", "update"' in build["dockerfile"]
        assert "the pack has no .deb for python3-foo=1:2.0-1" in err
        assert "nothing is downloaded" not in readme and "`python3-foo=1:2.0-1`" in readme
        assert "which needs the network" in readme


class MountingEngine(RecordingEngine):
    """An engine whose builder reads RUN --mount (``BuildMode``), or one that says why not."""

    def __init__(self, images: Mapping[str, str], mode: BuildMode) -> None:
        super().__init__(images)
        self.mode = mode

    def build_mode(self) -> BuildMode:
        return self.mode


@pytest.mark.parametrize("mounts", [True, False])
def test_the_engines_builder_decides_how_the_wheels_arrive(
        restore_lock: LockFactory, tmp_path: Path, clean: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], mounts: bool) -> None:
    """A pack restored through an engine whose builder mounts: the plan mounts the wheels, the
    base goes as the build argument a client can name, and the network stays off. Without, the
    classic text with its build stage, and the builder's note is said once."""
    lock = restore_lock(image=LOCK_IMAGE, packages=[("six", "1.16.0")])
    mode = (BuildMode(mounts=True, builder="BuildKit (a client)") if mounts
            else BuildMode(builder="the docker SDK", note="no client here: slower"))
    engine = MountingEngine({"lab/base@" + LOCK_IMAGE["digest"]: BASE_ID}, mode)
    root = _pack(lock, tmp_path, engine)
    capsys.readouterr()
    assert _restore(monkeypatch, engine, str(root)) == 0
    err = capsys.readouterr().err
    (build,) = engine.builds
    assert build["network"] is False
    assert ("RUN --mount=type=bind,source=requirements/packages" in build["dockerfile"]) == mounts
    assert (" AS envlock-build" in build["dockerfile"]) != mounts
    if mounts:
        assert build["buildargs"] == {"ENVLOCK_BASE": BASE_ID} and "with BuildKit (a client)" in err
        assert f"ARG ENVLOCK_BASE={BASE_ID}" in build["dockerfile"]
    else:
        assert err.count("note: no client here: slower") == 1 and "ENVLOCK_BASE" not in build["buildargs"]


class ClientEngine(MountingEngine):
    """An engine whose builds go through a command-line client (``clibuild.build``), as with
    BuildKit or Buildah: the client is a stand-in that records the arguments it is given."""

    def __init__(self, images: Mapping[str, str], tmp_path: Path) -> None:
        from test_restore_clibuild import recording_client

        super().__init__(images, BuildMode(mounts=True, builder="BuildKit (a stand-in client)"))
        self.client, self.argv_file = recording_client(tmp_path, BUILT_ID)

    def build(self, context: Path, *, tag: str, labels: Mapping[str, str], log_path: Path,
              progress: Progress, network: bool = True, files: Sequence[str] | None = None,
              dockerfile: str = "Dockerfile", buildargs: Mapping[str, str] | None = None) -> str:
        from envlock.restore import clibuild

        built = clibuild.build(self.client, self, context, tag=tag, labels=labels, log_path=log_path,
                               progress=progress, network=network, files=files, dockerfile=dockerfile,
                               buildargs=buildargs)
        self.images[tag] = built
        return built

    def layers(self, image_id: str) -> tuple[str, ...]:
        return ()

    def remove_committed(self, images: Sequence[str]) -> None:
        raise AssertionError("nothing is interrupted here")


def test_a_pack_restored_through_a_client_builds_with_network_none(
        restore_lock: LockFactory, tmp_path: Path, clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the client is started with, not only what envlock asked of the engine: a pack's
    build gets ``--network none`` on the BuildKit or Buildah command line."""
    import json

    lock = restore_lock(image=LOCK_IMAGE, packages=[("six", "1.16.0")])
    engine = ClientEngine({"lab/base@" + LOCK_IMAGE["digest"]: BASE_ID}, tmp_path)
    root = _pack(lock, tmp_path, engine)
    assert _restore(monkeypatch, engine, str(root)) == 0
    argv = json.loads(engine.argv_file.read_text())
    assert ("--network", "none") in set(itertools.pairwise(argv)), argv
    assert "type=bind" in (Path(argv[argv.index("-f") + 1])).read_text()  # the mounted text it built


# -- a pack without its base image says what it needs ---------------------------------------------


def test_pack_checks_its_base_image_before_collecting_any_wheel(
        restore_lock: LockFactory, tmp_path: Path, clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A base the engine has not and cannot pull fails the pack at once: no wheel is collected
    (downloaded) first, and no directory is left."""
    from envlock.errors import ImageNotFound
    from envlock.export import pack as pack_mod

    class NoBase(RecordingEngine):
        def pull(self, ref: str) -> ImageInfo:
            self.pulls.append(ref)
            raise ImageNotFound(f"cannot pull {ref}")

    collected: list[Any] = []

    def collect_wheels(*a: Any, **k: Any) -> tuple[list[Any], list[Any], list[Any]]:
        collected.append(a)
        return [], [], []

    monkeypatch.setattr(pack_mod, "collect_wheels", collect_wheels)
    lock = restore_lock(packages=[("six", "1.16.0")])
    lock.save(tmp_path / "env.lock")
    engine = NoBase()
    with pytest.raises(ImageNotFound):
        pack(lock, tmp_path / "env.lock", tmp_path / "pack", PackOptions(wheelhouses=(_house(tmp_path),)),
             engine=engine)
    assert len(engine.pulls) == 1 and collected == [] and not (tmp_path / "pack").exists()


def test_a_pack_without_its_base_image_says_what_a_restore_needs(
        restore_lock: LockFactory, tmp_path: Path, clean: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    lock = restore_lock(image=LOCK_IMAGE, packages=[("six", "1.16.0")])
    lock_path = tmp_path / "env.lock"
    lock.save(lock_path)
    result = pack(lock, lock_path, tmp_path / "pack", PackOptions(wheelhouses=(_house(tmp_path),),
                                                                  download=False, image=False), engine=None)
    wanted = "lab/base@" + LOCK_IMAGE["digest"]
    note = next(n for n in result.notes if "no base image" in n)
    assert wanted in note and "--target venv" in note and "--base REF" in note
    readme = (tmp_path / "pack" / "README.md").read_text()
    assert "nothing is downloaded" not in readme
    assert "--no-image" in readme and wanted in readme and "envlock restore . --base REF" in readme
    assert "docker load" not in readme

    # Restored as it is, the build starts from the lock's image, which the engine pulls (and
    # envlock says so); with --base, from the image given.
    engine = RecordingEngine()
    assert _restore(monkeypatch, engine, str(tmp_path / "pack")) == 0
    err = capsys.readouterr().err
    assert "the pack holds no base image" in err and wanted in err and "--base REF" in err
    assert f"FROM {wanted}" in engine.builds[0]["dockerfile"]
    mine = RecordingEngine({"my/base:1": "sha256:" + "cc" * 32})
    assert _restore(monkeypatch, mine, str(tmp_path / "pack"), "--base", "my/base:1") == 0
    assert "the pack holds no base image" not in capsys.readouterr().err
    (build,) = mine.builds
    assert "FROM sha256:" + "cc" * 32 in build["dockerfile"] and build["network"] is False and not mine.pulls


def test_a_pack_with_its_base_image_still_promises_nothing_downloaded(restore_lock: LockFactory) -> None:
    from envlock.export.packreadme import readme

    text = readme(restore_lock(), 2, [], base={"id": BASE_ID, "display": "lab/base:1"}, oci=False, debs=[],
                  missing_debs=[], skipped=[], size=1, pack_seconds=1.0)
    assert "nothing is downloaded" in text and "--no-image" not in text


# -- the venv target installs envlock's own wheel -------------------------------------------------


def test_the_venv_target_installs_envlocks_own_wheel_as_the_image_does(
        restore_lock: LockFactory, tmp_path: Path, clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """envlock installed from a checkout (the README's route) is in the lock as a local
    package; the venv target gets a wheel of the running envlock for it, as the image target
    does, and never the build of that name the wheelhouse holds."""
    from envlock.restore import ownwheel
    from envlock.restore.venvtarget import RESTORED, restore_venv, restored_from

    def own_wheel(dest: Path, *, offline: bool = False) -> Path:  # the real one: test_replay.py (slow)
        assert offline  # from a wheelhouse: nothing may be fetched to build it
        wheel = make_wheel(dest, "envlock-ml", "0.1.0")
        with zipfile.ZipFile(wheel, "a") as zf:
            zf.writestr("envlock-ml/own.txt", "the running envlock's\n")
        return wheel

    monkeypatch.setattr(ownwheel, "own_wheel", own_wheel)
    house = _house(tmp_path)
    make_wheel(house, "envlock-ml", "0.1.0")  # a pack holds the packing envlock's, of that name
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}"
    lock = restore_lock(python={"version": mine, "implementation": "cpython", "prefix_kind": "venv",
                                "prefix": "/opt/venv"},
                        packages=[("six", "1.16.0"), {"name": "envlock-ml", "version": "0.1.0",
                                                      "source": "local", "url": "file:///src/envlock"}])
    for skip_local in (False, True):
        dest = tmp_path / f"venv-{skip_local}"
        result = restore_venv(lock, house, dest, Options(python=sys.executable, skip_local=skip_local),
                              verify=False)
        site = next((result.directory / "lib").glob("python*/site-packages"))
        assert (site / "envlock-ml" / "own.txt").is_file()
        # Finished: no unfinished marker, and the lock it was restored from named for a replay.
        assert (site / "six-1.16.0.dist-info").is_dir() and [p.name for p in dest.glob(".envlock-*")] == [RESTORED]
        assert restored_from(result.python) == lock.envlock.fingerprint


def _envlock_checkout(root: Path) -> Path:
    """A source checkout of a (tiny) envlock with no wheel built: what a restore run from a
    checkout on sys.path must build its own wheel from."""
    (root / "envlock").mkdir(parents=True)
    (root / "envlock" / "__init__.py").write_text('__version__ = "0.1.0"\n')
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "envlock-ml"\nversion = "0.1.0"\n\n'
        '[tool.setuptools.packages.find]\ninclude = ["envlock*"]\n')
    return root


@pytest.fixture
def from_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], dict[str, str]]]:
    """The running envlock as a source checkout without a built wheel, and every subprocess
    ``ownwheel`` starts, observed (argv, environment) and run for real."""
    from envlock.restore import ownwheel

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(ownwheel, "_installed", lambda: None)
    monkeypatch.setattr(ownwheel, "_source_tree", lambda: _envlock_checkout(tmp_path / "checkout"))
    started: list[tuple[list[str], dict[str, str]]] = []
    real = subprocess.run

    def observed(argv: list[str], **kw: Any) -> Any:
        started.append((list(argv), dict(kw.get("env") or os.environ)))
        return real(argv, **kw)

    monkeypatch.setattr(subprocess, "run", observed)  # the module ownwheel calls through
    return started


def test_an_offline_restore_without_a_build_backend_says_what_to_do_and_fetches_nothing(
        restore_lock: LockFactory, tmp_path: Path, from_checkout: list[tuple[list[str], dict[str, str]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A restore from a wheelhouse (a bundle, a pack) of a lock that holds envlock, run from a
    checkout by an interpreter without setuptools: pip's isolated build would fetch the backend
    from the index. It is never started; the error says what to do instead."""
    from envlock.errors import EXIT_ENV, NotRestorable
    from envlock.restore import ownwheel
    from envlock.restore.restore import wheel_inputs

    monkeypatch.setattr(ownwheel, "_has_backend", lambda: False)
    lock = restore_lock(packages=[("six", "1.16.0"), ("envlock-ml", "0.1.0")])
    with pytest.raises(NotRestorable) as err:
        wheel_inputs(lock, Options(wheelhouse=_house(tmp_path)))
    assert err.value.exit_code == EXIT_ENV
    assert str(err.value).startswith("cannot build a wheel of envlock from ") and " offline: " in str(err.value)
    hint = err.value.hint or ""
    assert "`pip install setuptools`" in hint and "`envlock bundle -o DIR`" in hint, hint
    assert from_checkout == []  # no pip at all


@pytest.mark.slow  # a pip build of a wheel (about 5 s on a busy 2-core machine)
def test_an_offline_restore_builds_its_own_wheel_with_no_index_and_no_isolation(
        restore_lock: LockFactory, tmp_path: Path, from_checkout: list[tuple[list[str], dict[str, str]]]) -> None:
    """With setuptools here, the offline build is pip's with this interpreter's backend and no
    index (``PIP_NO_INDEX``): the wheel of the checkout, and no pip run that could reach one."""
    from envlock.restore.restore import wheel_inputs

    lock = restore_lock(packages=[("six", "1.16.0"), ("envlock-ml", "0.1.0")])
    _, _, own = wheel_inputs(lock, Options(wheelhouse=_house(tmp_path)))
    assert own is not None and own.name == "envlock_ml-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(own) as zf:
        assert zf.read("envlock/__init__.py") == b'__version__ = "0.1.0"\n'
    pips = [(argv, env) for argv, env in from_checkout if argv[1:4] == ["-m", "pip", "wheel"]]
    assert pips and len(pips) == len(from_checkout)
    for argv, env in pips:
        assert "--no-build-isolation" in argv and env.get("PIP_NO_INDEX") == "1", (argv, env.get("PIP_NO_INDEX"))


# -- an interrupted restore leaves nothing in the way of the next ---------------------------------


FAKE_PYTHON = """#!/bin/sh
# Answers the version question like the lock's python, then makes a venv that never finishes.
case "$1" in
  -c) echo "3.11.2 cpython" ;;
  -m) mkdir -p "$3/bin" && : > "$3/bin/python" && : > "$STARTED" && exec sleep 600 ;;
esac
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_venv_restore_takes_its_venv_away(
        signum: int, restore_lock: LockFactory, tmp_path: Path, clean: Path) -> None:
    """A real envlock process, stopped while the venv is being made (its python hangs there):
    it exits as interrupted and the half-made venv is gone, so the same command works again."""
    import time

    lock_path = tmp_path / "env.lock"
    restore_lock(packages=[("six", "1.16.0")]).save(lock_path)
    fake = tmp_path / "python3.11"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    started, dest = tmp_path / "started", tmp_path / "venv"
    # faulthandler: a restore that does not stop is made to print where each thread stands.
    env = {**os.environ, "PYTHONPATH": str(REPO), "STARTED": str(started), "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "envlock", "restore", str(lock_path), "--target", "venv",
                             str(dest), "--wheelhouse", str(_house(tmp_path)), "--python", str(fake),
                             "--no-verify"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), proc.communicate(timeout=60)
        assert (dest / "bin" / "python").exists()
        out, err = stop_with(proc, signum, "the restore")
    finally:
        reap(proc)
    said = "envlock: interrupted" if signum == signal.SIGINT else "envlock: stopped by SIGTERM"
    assert proc.returncode == 128 + signum and said in err, (proc.returncode, out, err)
    assert not dest.exists()


def test_a_venv_that_a_killed_restore_left_is_named_with_how_to_remove_it(tmp_path: Path) -> None:
    from envlock.restore.venvtarget import UNFINISHED, refuse_unless_free

    dest = tmp_path / "my venv"
    (dest / "bin").mkdir(parents=True)
    (dest / UNFINISHED).write_text("")
    with pytest.raises(UsageError, match="unfinished venv that an envlock restore left") as exc:
        refuse_unless_free(dest)
    assert exc.value.hint == f"remove it (rm -rf '{dest}') and restore again"
    (dest / UNFINISHED).unlink()
    with pytest.raises(UsageError, match="exists and is not an empty directory"):
        refuse_unless_free(dest)
    refuse_unless_free(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    refuse_unless_free(tmp_path / "empty")


def test_a_failed_venv_restore_leaves_an_empty_directory_empty(
        restore_lock: LockFactory, tmp_path: Path, clean: Path) -> None:
    """Not only Ctrl-C: a restore that fails takes its half venv away, and a directory the
    user made for it stays, empty."""
    from envlock.restore.venvtarget import restore_venv

    mine = f"{sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}"
    lock = restore_lock(python={"version": mine, "implementation": "cpython", "prefix_kind": "venv",
                                "prefix": "/opt/venv"}, packages=[("six", "1.16.0")])
    house = tmp_path / "house"
    house.mkdir()
    with zipfile.ZipFile(house / "six-1.16.0-py3-none-any.whl", "w") as zf:  # a wheel pip refuses
        zf.writestr("six-1.16.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: six\nVersion: 1.16.0\n")
        zf.writestr("six-1.16.0.dist-info/WHEEL", "Wheel-Version: 9.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("six-1.16.0.dist-info/RECORD", "")
    dest = tmp_path / "empty"
    dest.mkdir()
    with pytest.raises(BuildFailed, match="install"):
        restore_venv(lock, house, dest, Options(python=sys.executable), verify=False)
    assert dest.is_dir() and not any(dest.iterdir())


# -- every path a pack names stays inside it ------------------------------------------------------


@pytest.mark.parametrize("key", ["docker_archive", "oci_archive"])
@pytest.mark.parametrize("rel", ["/etc/shadow", "../outside.tar", "image/../../x", "link/base.tar"])
def test_a_pack_manifest_cannot_name_an_archive_outside_the_pack(key: str, rel: str, tmp_path: Path) -> None:
    (tmp_path / "pack").mkdir()
    (tmp_path / "pack" / "link").symlink_to(tmp_path)
    with pytest.raises(UsageError, match="outside the pack") as exc:
        getattr(packdir.Pack(tmp_path / "pack", {key: rel}), key)
    assert exc.value.exit_code == 2
    inside = packdir.Pack(tmp_path / "pack", {key: "image/base.tar"})
    assert getattr(inside, key) == tmp_path / "pack" / "image" / "base.tar"


def test_sha256sums_cannot_name_a_file_through_a_link_out_of_the_pack(tmp_path: Path) -> None:
    root = tmp_path / "pack"
    root.mkdir()
    (tmp_path / "secret").write_text("x")
    (root / "wheels").symlink_to(tmp_path)
    (root / "SHA256SUMS").write_text(f"{'0' * 64}  wheels/secret\n")
    with pytest.raises(PackDamaged, match="holds a link, wheels") as exc:
        packdir.check_sums(root)
    assert exc.value.exit_code == 2


# -- two restores of one pack at once -------------------------------------------------------------


def test_a_pack_unpacked_by_another_restore_meanwhile_is_used(
        restore_lock: LockFactory, tmp_path: Path, clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second of two restores that unpack one pack at the same time finds the first one's
    copy in place when it renames its own: it uses that one (it once failed, 'not a readable
    pack', on the rename's ENOTEMPTY)."""
    root = _pack(restore_lock(packages=[("six", "1.16.0")]), tmp_path, None, tmp_path / "p.tar")
    work = tmp_path / "work"
    real = packdir.extract_data
    other: list[Path] = []

    def slow_extract(archive: Path, dest: Path, *, not_what: str) -> None:
        real(archive, dest, not_what=not_what)
        if not other:  # the other restore runs its whole unpack while this one is at the end of its
            other.append(dest)
            other.append(packdir.open_pack(archive, work).root)

    monkeypatch.setattr(packdir, "extract_data", slow_extract)
    opened = packdir.open_pack(root, work)
    assert opened.root == other[1] and (opened.root / "env.lock").is_file()
    assert [p.name for p in work.iterdir()] == [opened.root.name]  # no temporary copy left


def test_a_second_restore_of_a_lock_waits_for_the_first_ones_build(
        restore_lock: LockFactory, tmp_path: Path, clean: Path) -> None:
    """While one restore writes and builds a lock's context, another restore of that lock
    waits for it (and says so) instead of rewriting the context under the build."""
    from envlock.restore import cachedir
    from envlock.restore.restore import cache_dir, restore

    lock = restore_lock(image=LOCK_IMAGE, packages=[("six", "1.16.0")])
    workdir = cache_dir() / f"t-{lock.short_id}"
    workdir.mkdir(parents=True)
    engine = RecordingEngine({"lab/base@" + LOCK_IMAGE["digest"]: BASE_ID})
    waiting = threading.Event()
    said: list[str] = []

    def say(text: str) -> None:
        said.append(text)
        if text.startswith("waiting for another restore"):
            waiting.set()

    errors: list[BaseException] = []

    def second() -> None:
        try:
            restore(lock, Options(), engine=engine, name="t", verify=False, say=say)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    with cachedir.hold(workdir, exclusive=True):  # the first restore, building
        thread = threading.Thread(target=second)
        thread.start()
        assert waiting.wait(60), said
        assert not engine.builds
    thread.join(60)
    assert not thread.is_alive() and not errors and len(engine.builds) == 1

