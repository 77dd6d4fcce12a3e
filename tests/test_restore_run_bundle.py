"""``envlock run`` options and host checks, ``envlock bundle`` and wheelhouse selection (no engine)."""

from __future__ import annotations

import argparse
import hashlib
import zipfile
from pathlib import Path
from typing import Any

import pytest
from helpers import LockFactory

from envlock.errors import (
    HashMismatch,
    HostIncompatible,
    IndexUnavailable,
    NotRestorable,
    UsageError,
)
from envlock.export.bundle import bundle
from envlock.restore.run import needs_driver, parse_env, parse_ports, resolve_gpus
from envlock.restore.tables import bases, driver_older, driver_requirement
from envlock.restore.wheelhouse import MANIFEST, read_manifest, select

# -- driver table and GPU requests -------------------------------------------------------------


def test_driver_table_has_minor_version_compatibility_minima() -> None:
    req = driver_requirement("12.1")
    assert req is not None and (req.min_driver, req.toolkit_driver) == ("525.60.13", "530.30.02")
    unlisted = driver_requirement("12.2")  # falls back to the major's minimum
    assert unlisted is not None and unlisted.min_driver == "525.60.13" and unlisted.toolkit_driver is None
    assert driver_requirement("9.0") is None
    assert driver_older("470.82.01", "525.60.13") and not driver_older("550.54.14", "525.60.13")


def test_torch_index_follows_the_local_label(torch_index: str) -> None:
    t = bases().torch
    assert t.index_for("cu121") == f"{torch_index}/cu121"
    assert t.index_for("cpu") == f"{torch_index}/cpu"
    assert t.index_for("rocm6.2") == f"{torch_index}/rocm6.2"
    assert t.index_for("dev") is None and t.index_for(None) is None
    # An explicit base wins; {label} is replaced, a trailing slash does not double.
    assert t.index_for("cu121", "https://mirror.example/torch/{label}/simple") == (
        "https://mirror.example/torch/cu121/simple")
    assert t.index_for("cpu", "https://mirror.example/whl/") == "https://mirror.example/whl/cpu"
    assert t.in_layer("nvidia-cudnn-cu12") and t.in_layer("torch") and not t.in_layer("numpy")


def test_no_torch_index_configured_is_a_clear_error_only_when_a_label_needs_one() -> None:
    t = bases().torch
    # Versions without one of PyTorch's labels need no index of PyTorch's: the default serves them.
    assert t.index_for("dev") is None and t.index_for(None) is None
    with pytest.raises(IndexUnavailable) as exc:
        t.index_for("cu121", hint="or restore with --wheelhouse")
    assert exc.value.exit_code == 3
    assert "+cu121" in exc.value.message and "PyTorch's wheel index" in exc.value.message
    assert exc.value.hint is not None and "ENVLOCK_TORCH_INDEX_URL" in exc.value.hint
    assert "--wheelhouse" in exc.value.hint


def test_a_restore_without_a_torch_index_names_the_command_that_makes_a_wheelhouse(
        restore_lock: LockFactory) -> None:
    """A first restore of a +cpu torch with no index configured: the hint names `envlock
    bundle -o DIR`, which is what makes the wheelhouse it suggests."""
    from envlock.restore.context import plan
    from envlock.restore.image import Options

    lock = restore_lock(torch={"version": "2.4.1+cpu", "cuda": None},
                        packages=[{"name": "torch", "version": "2.4.1+cpu"}])
    with pytest.raises(IndexUnavailable) as exc:
        plan(lock, Options(base="python@sha256:" + "a" * 64))
    assert exc.value.hint is not None and "envlock bundle -o DIR" in exc.value.hint


def cuda_lock(restore_lock: LockFactory, cuda: str = "12.1") -> Any:
    return restore_lock(torch={"version": f"2.4.1+cu{cuda.replace('.', '')}", "cuda": cuda})


def test_old_driver_is_refused_with_a_clear_message(restore_lock: LockFactory) -> None:
    with pytest.raises(HostIncompatible) as exc:
        resolve_gpus(cuda_lock(restore_lock), "all", "470.82.01")
    assert exc.value.exit_code == 3
    assert "470.82.01" in exc.value.message and "525.60.13" in exc.value.message
    assert "--gpus none" in (exc.value.hint or "")


def test_gpu_requests(restore_lock: LockFactory) -> None:
    lock = cuda_lock(restore_lock)
    assert resolve_gpus(lock, "all", "550.54.14") == ("all", [])
    assert resolve_gpus(lock, "0,1", "550.54.14")[0] == "0,1"
    assert resolve_gpus(lock, "none", None) == (None, [])
    assert resolve_gpus(lock, "auto", None) == (None, [])  # no driver: run on CPU
    assert resolve_gpus(restore_lock(), "auto", "550.54.14") == (None, [])  # CPU lock
    gpus, warnings = resolve_gpus(lock, "auto", "527.41")
    assert gpus == "all" and "minor version compatibility" in warnings[0]
    with pytest.raises(HostIncompatible, match="no NVIDIA driver"):
        resolve_gpus(lock, "all", None)
    with pytest.raises(UsageError):
        resolve_gpus(lock, "all; rm -rf /", "550.54.14")


@pytest.mark.parametrize("gpus", ["all", "none", "auto", "0,1"])
@pytest.mark.parametrize("cuda", [True, False])
def test_the_driver_is_asked_only_where_it_changes_the_answer(
        restore_lock: LockFactory, gpus: str, cuda: bool) -> None:
    """``run`` looks the host's driver up (NVML, nvidia-smi) only for a request whose answer
    depends on it: not for --gpus none, nor for auto with a lock that runs on CPU."""
    lock = cuda_lock(restore_lock) if cuda else restore_lock()

    def answer(driver: str | None) -> str:
        try:
            return repr(resolve_gpus(lock, gpus, driver))
        except HostIncompatible as exc:
            return exc.message

    answers = {answer(None), answer("550.54.14"), answer("470.82.01")}
    assert needs_driver(lock, gpus) == (len(answers) > 1), answers


def test_env_and_port_options() -> None:
    assert parse_env(["A=1", "B=x=y"]) == {"A": "1", "B": "x=y"}
    with pytest.raises(UsageError):
        parse_env(["1BAD=x"])
    assert parse_ports(["8888:8888", "127.0.0.1:6006:6006/tcp"]) == {
        "8888/tcp": ("0.0.0.0", 8888), "6006/tcp": ("127.0.0.1", 6006)}
    for bad in ("8888", "99999:1", "a:b"):
        with pytest.raises(UsageError):
            parse_ports([bad])


def test_run_options_after_the_lock_are_parsed_and_the_command_kept_verbatim() -> None:
    from envlock.commands._parser import build_parser
    from envlock.commands.run import split_run_args

    args = build_parser().parse_args(["run", "env.lock", "--gpus", "none", "-e", "A=1", "--",
                                      "python", "-c", "print(1)", "--gpus", "all"])
    assert split_run_args(args) == ["python", "-c", "print(1)", "--gpus", "all"]
    assert args.gpus == "none" and args.env == ["A=1"]
    args = build_parser().parse_args(["run", "--base", "x@sha256:" + "a" * 64, "env.lock", "python", "t.py"])
    assert split_run_args(args) == ["python", "t.py"]
    assert isinstance(args, argparse.Namespace) and args.base.startswith("x@")


def test_run_options_without_a_command_or_double_dash_are_options() -> None:
    from envlock.commands._parser import build_parser
    from envlock.commands.run import split_run_args

    # The README's notebook line: no command, so nothing may be taken for one.
    args = build_parser().parse_args(["run", "env.lock", "--jupyter", "--workspace", "ws", "-p", "127.0.0.1:9000:8888"])
    assert split_run_args(args) == []
    assert args.jupyter is True and args.workspace == "ws" and args.publish == ["127.0.0.1:9000:8888"]
    # Leading options, then the command verbatim (its own options included).
    args = build_parser().parse_args(["run", "env.lock", "--gpus", "none", "python", "t.py", "--gpus", "all"])
    assert split_run_args(args) == ["python", "t.py", "--gpus", "all"]
    assert args.gpus == "none"


def test_jupyter_needs_jupyterlab_in_the_lock(restore_lock: LockFactory) -> None:
    from envlock.restore.run import RunOptions, run_in_image

    with pytest.raises(UsageError, match="jupyterlab"):
        run_in_image(None, restore_lock(), "sha256:" + "a" * 64, "t:1",  # type: ignore[arg-type]  # refused before any engine is used
                     RunOptions(command=[], jupyter=True), python="python3")


# -- wheelhouse and bundle ---------------------------------------------------------------------


def make_wheel(directory: Path, name: str, version: str, tag: str = "py3-none-any") -> Path:
    path = directory / f"{name.replace('-', '_')}-{version}-{tag}.whl"
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}/__init__.py", f"__version__ = {version!r}\n")
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        zf.writestr(f"{dist}/WHEEL", f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n")
        zf.writestr(f"{dist}/RECORD", "")
    return path


def sha(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def house(tmp_path: Path) -> Path:
    d = tmp_path / "house"
    d.mkdir()
    for name, version in [("six", "1.16.0"), ("six", "1.17.0"), ("idna", "3.10"), ("pip", "24.0")]:
        make_wheel(d, name, version)
    (d / "notes.txt").write_text("not a wheel")
    return d


def test_select_matches_exact_versions(restore_lock: LockFactory, house: Path) -> None:
    lock = restore_lock(packages=[("six", "1.16.0"), ("idna", "3.10"), ("attrs", "24.2.0")])
    found = select(house, lock.packages)
    assert {k: [p.name for p in v] for k, v in found.items()} == {
        "six": ["six-1.16.0-py3-none-any.whl"], "idna": ["idna-3.10-py3-none-any.whl"]}


def test_bundle_copies_checks_and_writes_a_manifest(restore_lock: LockFactory, house: Path, tmp_path: Path) -> None:
    good = sha(house / "six-1.16.0-py3-none-any.whl")
    lock = restore_lock(packages=[{"name": "six", "version": "1.16.0", "hashes": [good]},
                                  ("idna", "3.10"), ("setuptools", "66.1.1")])
    result = bundle(lock, tmp_path / "out", source=house)
    assert sorted(f[2] for f in result.files) == ["idna-3.10-py3-none-any.whl", "six-1.16.0-py3-none-any.whl"]
    assert result.missing_tooling == ("setuptools==66.1.1",)
    manifest = read_manifest(tmp_path / "out")
    assert manifest["six"] == (good,)
    assert (tmp_path / "out" / MANIFEST).is_file()


def test_bundle_refuses_a_wheel_with_the_wrong_hash(restore_lock: LockFactory, house: Path, tmp_path: Path) -> None:
    lock = restore_lock(packages=[{"name": "six", "version": "1.16.0", "hashes": ["sha256:" + "0" * 64]}])
    with pytest.raises(HashMismatch):
        bundle(lock, tmp_path / "out", source=house)
    assert not list((tmp_path / "out").glob("*.whl"))


def test_bundle_reports_every_missing_wheel(restore_lock: LockFactory, house: Path, tmp_path: Path) -> None:
    lock = restore_lock(packages=[("six", "1.15.0"), ("attrs", "24.2.0"), ("idna", "3.10")])
    with pytest.raises(NotRestorable, match=r"six==1.15.0, attrs==24.2.0|attrs==24.2.0, six==1.15.0"):
        bundle(lock, tmp_path / "out", source=house)


def test_bundle_refuses_local_sources_unless_skipped(restore_lock: LockFactory, house: Path, tmp_path: Path) -> None:
    lock = restore_lock(packages=[("six", "1.16.0"),
                                  {"name": "mine", "version": "0.1", "source": "editable", "url": "file:///x"}])
    with pytest.raises(NotRestorable, match="mine"):
        bundle(lock, tmp_path / "out", source=house)
    assert bundle(lock, tmp_path / "out", source=house, skip_local=True).skipped == ("mine",)


def test_bundle_downloads_with_pip_for_the_locks_platform(restore_lock: LockFactory, house: Path, tmp_path: Path) -> None:
    # pip download with the lock's python/abi/platform, here from a directory instead of an index.
    lock = restore_lock(packages=[("six", "1.16.0"), ("idna", "3.10")])
    result = bundle(lock, tmp_path / "out", pip_find_links=house)
    assert sorted(f[0] for f in result.files) == ["idna", "six"]


def test_restore_with_a_bundle_uses_its_hashes(restore_lock: LockFactory, house: Path, tmp_path: Path) -> None:
    from envlock.restore.image import Options
    from envlock.restore.restore import prepare

    lock = restore_lock(image={"reference": "a/b", "digest": "sha256:" + "ab" * 32},
                        packages=[("six", "1.16.0"), ("idna", "3.10")])
    bundle(lock, tmp_path / "out", source=house)
    plan, files = prepare(lock, Options(wheelhouse=tmp_path / "out"))
    assert "--hash=sha256:" in files["requirements/packages-hashed.txt"]
    assert '"--no-index", "--find-links", "/tmp/envlock-wheels/packages"' in files["Dockerfile"]
    assert sorted(p.name for p in plan.wheels["packages"]) == ["idna-3.10-py3-none-any.whl",
                                                               "six-1.16.0-py3-none-any.whl"]
    # The wheels stay in a build stage; the image gets the venv only.
    df = files["Dockerfile"]
    froms = [line for line in df.splitlines() if line.startswith("FROM ")]
    assert len(froms) == 2 and froms[0].endswith(" AS envlock-build") and "AS" not in froms[1]
    assert 'COPY --from=envlock-build ["/opt/venv", "/opt/venv"]' in df
    image_from = df.index("\n" + froms[1] + "\n")
    assert df.index("wheels/packages/") < image_from < df.rindex("LABEL ")
    # The stage ends labelled with the build's id (a build argument), so restore removes it.
    stage_label = df.index('LABEL "org.envlock.build-stage"="${ENVLOCK_BUILD_STAGE}"')
    assert df.index("ARG ENVLOCK_BUILD_STAGE\n") < stage_label < image_from


def test_published_ports_are_exposed_as_docker_py_wants_them() -> None:
    from envlock.restore.dockerengine import _exposed

    # "8888/tcp" handed to docker-py as a string became "8888/tcp/tcp": nothing was published.
    assert _exposed(parse_ports(["127.0.0.1:9000:8888", "53:53/udp"])) == [(8888, "tcp"), (53, "udp")]
    assert _exposed({}) is None
