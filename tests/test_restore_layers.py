"""How an offline restore is laid out for speed (no engine; a fake API for the context tar).

With a torch layer, that layer is an image of its own (``torch-layer.Dockerfile``), built from
the torch wheels alone; the image installs the rest on top of it, in layer order, in its own
stage. uv installs inside build stages when there is one, pip otherwise, and the build falls
back to pip by itself when the binary does not run in the base.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
from helpers import LockFactory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envlock.restore import context as ctx
from envlock.restore import dockerfile, uvbin, wheelhouse
from envlock.restore.dockerengine import DockerEngine
from envlock.restore.image import Options

DIGEST = "sha256:" + "ab" * 32
TORCH_PKGS = [("pip", "24.0"), ("six", "1.16.0"), ("torch", "2.13.0+cpu"), ("zipp", "3.20.0")]
ELF_X86_64 = b"\x7fELF\x02\x01\x01" + b"\0" * 11 + (0x3E).to_bytes(2, "little") + b"\0" * 44


def _wheels(tmp_path: Path, packages: list[tuple[str, str]]) -> dict[str, tuple[Path, ...]]:
    house = tmp_path / "house"
    house.mkdir(exist_ok=True)
    out: dict[str, tuple[Path, ...]] = {}
    for name, version in packages:
        wheel = house / f"{name}-{version}-py3-none-any.whl"
        if not wheel.exists():
            wheel.write_bytes(f"{name} {version}".encode())
        out[name] = (wheel,)
    return out


def _fake_uv(tmp_path: Path) -> Path:
    uv = tmp_path / "bin" / "uv"
    uv.parent.mkdir(exist_ok=True)
    uv.write_bytes(ELF_X86_64)
    uv.chmod(0o755)
    return uv


def _plan(restore_lock: LockFactory, tmp_path: Path, packages: list[tuple[str, str]] = TORCH_PKGS, *,
          uv: bool = True, offline: bool = True) -> ctx.Plan:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=packages,
                        torch={"version": "2.13.0+cpu"})
    wheels = _wheels(tmp_path, packages) if offline else None
    options = Options(wheelhouse=tmp_path / "house") if offline else Options()
    return ctx.plan(lock, options, wheels_for=wheels, uv=_fake_uv(tmp_path) if uv else None)


def _instructions(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_the_torch_layer_is_an_image_of_its_own_built_from_the_torch_wheels_alone(
        restore_lock: LockFactory, tmp_path: Path) -> None:
    plan = _plan(restore_lock, tmp_path)
    assert plan.split_torch
    files = dockerfile.render(plan)
    layer = _instructions(files[dockerfile.TORCH_LAYER_DOCKERFILE])
    key = dockerfile.torch_layer_key(plan)
    # Build stage: base, venv, uv, the torch requirement file and wheels, one install; then the
    # layer: the base plus the venv, labelled with its key. Nothing of the other packages.
    assert layer[0] == f"FROM a/b@{DIGEST} AS envlock-build"
    assert 'COPY ["tools/uv", "/tmp/envlock-uv/uv"]' in layer
    installs = [line for line in layer if line.startswith("RUN") and "/torch" in line]
    assert len(installs) == 1 and installs[0].startswith('RUN ["/bin/sh", "-c", "if /tmp/envlock-uv/uv')
    assert [line for line in layer if line.startswith("FROM")][1] == f"FROM a/b@{DIGEST}"
    assert 'COPY --from=envlock-build ["/opt/venv", "/opt/venv"]' in layer
    assert layer[-1] == f'LABEL "org.envlock.torch-layer"="{key}"'
    assert not any("six" in line or "packages" in line for line in layer)
    assert plan.short_id not in files[dockerfile.TORCH_LAYER_DOCKERFILE]
    # The image: FROM the layer (its tag by default; restore passes the id), the rest on top in
    # layer order, with pip, in this stage (no build stage, no copy of the venv).
    main = _instructions(files["Dockerfile"])
    assert main[0] == f"ARG ENVLOCK_TORCH_LAYER={dockerfile.torch_layer_tag(key)}"
    assert main[1] == "FROM ${ENVLOCK_TORCH_LAYER}"
    assert sum(line.startswith("FROM") for line in main) == 1
    assert not any("--from=" in line or "/tmp/envlock-uv" in line for line in main)
    runs = [json.loads(line[4:]) for line in main if line.startswith("RUN") and "pip" in line]
    assert len(runs) == 1 and runs[0][:2] == ["/bin/sh", "-c"] and runs[0][3:] == ["/opt/venv/bin/python"]
    script = runs[0][2]
    assert script.index("envlock-restore/packages.txt") < script.index("envlock-restore/tooling.txt")
    assert "torch" not in script and "uv" not in script
    assert 'COPY ["wheels/packages/", "/tmp/envlock-wheels/packages/"]' in main
    # It does not pass for the torch layer: its label is emptied.
    assert '"org.envlock.torch-layer"=""' in files["Dockerfile"]


def _zip_wheel(house: Path, name: str, version: str, requires: list[str]) -> Path:
    wheel = house / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
        zf.writestr(f"{name}-{version}.dist-info/METADATA",
                    f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}\nRequires-Dist: not-a-header\n")
        zf.writestr(f"{name}-{version}.dist-info/RECORD", "")
    return wheel


def test_what_torch_requires_gets_a_layer_of_its_own_before_the_rest(restore_lock: LockFactory,
                                                                     tmp_path: Path) -> None:
    """torch's wheel requires sympy (which requires mpmath) and, as an extra, zipp: sympy and
    mpmath are installed right after the torch layer, in their own step; six and zipp after."""
    packages = [*TORCH_PKGS, ("sympy", "1.14.0"), ("mpmath", "1.3.0")]
    house = tmp_path / "house"
    house.mkdir()
    wheels = {
        "torch": (_zip_wheel(house, "torch", "2.13.0+cpu", ["sympy>=1.13", 'zipp; extra == "opt"']),),
        "sympy": (_zip_wheel(house, "sympy", "1.14.0", ["mpmath<1.4,>=1.1.0"]),),
        "mpmath": (_zip_wheel(house, "mpmath", "1.3.0", []),),
        "six": (_zip_wheel(house, "six", "1.16.0", []),),
        "zipp": (_zip_wheel(house, "zipp", "3.20.0", []),),
        "pip": (_zip_wheel(house, "pip", "24.0", []),),
    }
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=packages,
                        torch={"version": "2.13.0+cpu"})
    plan = ctx.plan(lock, Options(wheelhouse=house), wheels_for=wheels)
    names = {layer.name: sorted(r.name for r in layer.requirements) for layer in plan.layers}
    assert names["torch-deps"] == ["mpmath", "sympy"]
    assert names["packages"] == ["six", "zipp"]
    main = _instructions(dockerfile.render(plan)["Dockerfile"])
    deps_run = next(i for i, line in enumerate(main) if line.startswith("RUN") and "torch-deps.txt" in line)
    rest_run = next(i for i, line in enumerate(main) if line.startswith('RUN ["/bin/sh"'))
    assert deps_run < rest_run and "torch-deps" not in main[rest_run]
    # The torch layer itself does not depend on its requirements' pins.
    other = ctx.plan(lock.model_copy(update={"packages": [
        p if p.name != "sympy" else p.model_copy(update={"version": "1.13.0"}) for p in lock.packages]}),
        Options(wheelhouse=house), wheels_for={**wheels, "sympy": (_zip_wheel(house, "sympy", "1.13.0", []),)})
    assert dockerfile.torch_layer_key(other) == dockerfile.torch_layer_key(plan)
    assert dockerfile.context_key(other) != dockerfile.context_key(plan)
    # Online there is no wheel to read: everything but torch stays in the packages layer.
    assert wheelhouse.wheel_requires(tmp_path / "missing.whl") == set()


def test_each_build_is_sent_only_what_it_uses(restore_lock: LockFactory, tmp_path: Path) -> None:
    plan = _plan(restore_lock, tmp_path)
    rendered = dockerfile.render(plan)
    layer = dockerfile.torch_layer_files(plan)
    assert sorted(layer) == sorted([dockerfile.TORCH_LAYER_DOCKERFILE, "requirements/torch.txt",
                                    "wheels/torch", "tools/uv"])
    main = dockerfile.main_build_files(plan, rendered)
    assert "Dockerfile" in main and "wheels/packages" in main and "requirements/packages.txt" in main
    assert not {"wheels/torch", "tools/uv", "tools", dockerfile.TORCH_LAYER_DOCKERFILE} & set(main)
    # A hand-run `docker build .` leaves out the same.
    assert rendered[".dockerignore"].split() == ["build.log", "wheels/torch",
                                                 dockerfile.TORCH_LAYER_DOCKERFILE, "tools"]


def test_the_torch_layer_key_depends_only_on_its_own_inputs(restore_lock: LockFactory,
                                                             tmp_path: Path) -> None:
    one = _plan(restore_lock, tmp_path)
    other = _plan(restore_lock, tmp_path, [p if p[0] != "six" else ("six", "1.17.0") for p in TORCH_PKGS])
    assert one.short_id != other.short_id
    key = dockerfile.torch_layer_key(one)
    assert key == dockerfile.torch_layer_key(other)
    assert dockerfile.context_key(one) != dockerfile.context_key(other)
    # Another torch wheel, or another installer binary, is another layer.
    (tmp_path / "house" / "torch-2.13.0+cpu-py3-none-any.whl").write_bytes(b"another build")
    assert dockerfile.torch_layer_key(_plan(restore_lock, tmp_path)) != key
    assert dockerfile.torch_layer_key(_plan(restore_lock, tmp_path, uv=False)) != \
        dockerfile.torch_layer_key(_plan(restore_lock, tmp_path))


def test_without_a_torch_layer_uv_installs_in_the_build_stage_only(restore_lock: LockFactory,
                                                                   tmp_path: Path) -> None:
    plan = _plan(restore_lock, tmp_path, [("pip", "24.0"), ("six", "1.16.0")])
    assert not plan.split_torch
    files = dockerfile.render(plan)
    assert dockerfile.TORCH_LAYER_DOCKERFILE not in files
    lines = _instructions(files["Dockerfile"])
    final = max(i for i, line in enumerate(lines) if line.startswith("FROM"))
    assert 'COPY ["tools/uv", "/tmp/envlock-uv/uv"]' in lines[:final]
    assert not any("envlock-uv" in line for line in lines[final:])
    assert any(line.startswith('RUN ["/bin/sh", "-c", "if /tmp/envlock-uv/uv') for line in lines[:final])
    assert "tools" in dockerfile.context_binaries(plan)


def test_without_uv_or_online_the_installs_are_pip_as_before(restore_lock: LockFactory, torch_index: str,
                                                             tmp_path: Path) -> None:
    for plan in (_plan(restore_lock, tmp_path, uv=False), _plan(restore_lock, tmp_path, offline=False)):
        text = "\n".join(dockerfile.render(plan).values())
        assert "envlock-uv" not in text and "tools/uv" not in text
        assert plan.uv is None
    online = _plan(restore_lock, tmp_path, offline=False)
    assert not online.split_torch  # nothing to send: the index serves torch


def _fallback_argv(plan: ctx.Plan, python: Path, *args: str) -> list[str]:
    """The install RUN of ``plan``'s build stage, with another interpreter and arguments."""
    line = next(line for line in dockerfile.render(plan)["Dockerfile"].splitlines()
                if line.startswith('RUN ["/bin/sh", "-c", "if'))
    argv = json.loads(line[4:])
    return [*argv[:3], str(python), *args]


@pytest.mark.skipif(not os.path.exists("/bin/sh"), reason="needs /bin/sh")
def test_a_uv_that_does_not_run_falls_back_to_pip_with_one_line(restore_lock: LockFactory,
                                                                tmp_path: Path) -> None:
    """The build's own script, run here with its uv path pointing at nothing (the host's /tmp
    may hold one, such as a Charliecloud build's, which shares it): it says so once and runs
    ``python -m pip install`` with the same arguments, none of them parsed."""
    plan = _plan(restore_lock, tmp_path, [("pip", "24.0"), ("six", "1.16.0")])
    python = tmp_path / "python"
    python.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    tricky = "-r /x; echo $(id) `id` \"'"
    shell, flag, script, *args = _fallback_argv(plan, python, "--no-deps", tricky)
    assert dockerfile.UV_IN_IMAGE in script
    script = script.replace(dockerfile.UV_IN_IMAGE, str(tmp_path / "no-uv" / "uv"))
    proc = subprocess.run([shell, flag, script, *args], capture_output=True, text=True, check=True)
    assert proc.stderr.strip().splitlines() == [
        "envlock: the uv binary does not run in this base; installing with pip"]
    assert json.loads(proc.stdout) == ["-m", "pip", "install", "--no-cache-dir",
                                       "--disable-pip-version-check", "--no-input", "--no-deps", tricky]


@pytest.mark.skipif(not os.path.exists("/bin/sh"), reason="needs /bin/sh")
def test_the_layers_on_top_of_the_torch_layer_install_in_order_with_the_images_python(
        restore_lock: LockFactory, tmp_path: Path) -> None:
    """The one RUN on top of the torch layer, run here with a stand-in interpreter that logs
    its arguments: each requirement file in layer order, then ensurepip's leftovers go; the
    interpreter (a lock value) reaches the shell only as "$0"."""
    plan = _plan(restore_lock, tmp_path, [("setuptools", "66.1.1"), *TORCH_PKGS])
    main = _instructions(dockerfile.render(plan)["Dockerfile"])
    argv = next(json.loads(line[4:]) for line in main if line.startswith('RUN ["/bin/sh"'))
    log = tmp_path / "calls"
    python = tmp_path / "py thon $(id)"
    python.write_text(f"#!{sys.executable}\nimport json, sys\n"
                      f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    python.chmod(0o755)
    subprocess.run([*argv[:3], str(python)], check=True)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c[c.index("-r") + 1] if "-r" in c else c[:3] for c in calls] == [
        "/usr/local/share/envlock-restore/packages.txt", "/usr/local/share/envlock-restore/tooling.txt",
        ["-m", "pip", "uninstall"]]
    assert calls[-1][-1] == "wheel"


def test_uv_is_taken_only_as_an_executable_of_this_machine(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    good = _fake_uv(tmp_path)
    assert uvbin.runs_here(good)
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\n")
    arm = tmp_path / "arm"
    arm.write_bytes(ELF_X86_64[:18] + (0xB7).to_bytes(2, "little") + ELF_X86_64[20:])
    assert not uvbin.runs_here(script) and not uvbin.runs_here(arm)
    assert not uvbin.runs_here(tmp_path / "missing")


def test_uv_is_taken_only_from_a_wheel_listed_with_its_digest(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A uv wheel that merely lies in the wheelhouse is not run (its binary runs as root in the
    build); one a pack's checked SHA256SUMS lists is, cached under the wheel's sha256."""
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    monkeypatch.setattr(uvbin, "from_host", lambda: None)
    house = tmp_path / "house"
    house.mkdir()
    assert uvbin.find({}, tmp_path / "cache") is None
    wheel = house / "uv-0.9.1-py3-none-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("uv-0.9.1.data/scripts/uv", ELF_X86_64)
        zf.writestr("uv-0.9.1.dist-info/RECORD", "")
    assert uvbin.find({}, tmp_path / "cache") is None  # in the wheelhouse, listed nowhere
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    found = uvbin.find({wheel: digest}, tmp_path / "cache")
    assert found == tmp_path / "cache" / digest / "uv" and found.read_bytes() == ELF_X86_64
    assert os.access(found, os.X_OK)
    monkeypatch.setenv("ENVLOCK_RESTORE_INSTALLER", "pip")
    assert uvbin.find({wheel: digest}, tmp_path / "cache") is None


class _API:
    def build(self, **kw: Any) -> Any:
        self.kw = kw
        self.sent = kw["fileobj"].read() if "fileobj" in kw else b""
        return iter([{"stream": "Step 1/1 : FROM x\n"}])


def test_the_engine_sends_exactly_the_files_named(tmp_path: Path) -> None:
    (tmp_path / "wheels" / "torch").mkdir(parents=True)
    (tmp_path / "wheels" / "torch" / "torch.whl").write_bytes(b"t" * 1000)
    (tmp_path / "wheels" / "small").mkdir()
    (tmp_path / "wheels" / "small" / "six.whl").write_bytes(b"s")
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    engine = DockerEngine.__new__(DockerEngine)
    engine.api = _API()
    chunks = list(engine.build_stream(tmp_path, tag="t:1", labels={}, files=["Dockerfile", "wheels/small"],
                                      buildargs={"ENVLOCK_TORCH_LAYER": "sha256:" + "1" * 64}))
    assert chunks[0]["stream"].startswith("envlock: sending a build context of 0.0 MB")
    kw = engine.api.kw
    assert kw["custom_context"] is True and kw["buildargs"] == {"ENVLOCK_TORCH_LAYER": "sha256:" + "1" * 64}
    with tarfile.open(fileobj=io.BytesIO(engine.api.sent)) as tar:
        assert sorted(m.name for m in tar.getmembers() if m.isfile()) == ["Dockerfile", "wheels/small/six.whl"]


def test_dockerfile_only_says_to_build_the_torch_layer_first(restore_lock: LockFactory, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from envlock.commands import main
    from envlock.lock import save

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("ENVLOCK_RESTORE_INSTALLER", "pip")
    house = tmp_path / "house"
    house.mkdir()
    for name, version in TORCH_PKGS:
        _zip_wheel(house, name, version, [])
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=TORCH_PKGS,
                        torch={"version": "2.13.0+cpu"})
    path = save(lock, tmp_path / "env.lock")
    out = tmp_path / "ctx"
    assert main(["restore", str(path), "--wheelhouse", str(house), "--dockerfile-only", str(out)]) == 0
    said = capsys.readouterr().out
    assert (out / dockerfile.TORCH_LAYER_DOCKERFILE).is_file() and (out / "wheels" / "torch").is_dir()
    assert not (out / "tools").exists()  # ENVLOCK_RESTORE_INSTALLER=pip: no uv
    assert f"tar -c {dockerfile.TORCH_LAYER_DOCKERFILE} requirements/torch.txt wheels/torch | docker build " \
           f"-f {dockerfile.TORCH_LAYER_DOCKERFILE} -t envlock/torch-layer:" in said
    assert said.index("torch-layer:") < said.index("-) && docker build -t envlock/") < said.index(lock.short_id)


def test_a_builder_without_layer_images_gets_one_build_with_the_torch_layer_as_a_stage(
        restore_lock: LockFactory, tmp_path: Path) -> None:
    """Charliecloud's target turns each build into its directory image, so it cannot build FROM
    a torch layer image: its plan renders the one Dockerfile, which still holds every package."""
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=TORCH_PKGS,
                        torch={"version": "2.13.0+cpu"})
    plan = ctx.plan(lock, Options(wheelhouse=tmp_path / "house", torch_layer_image=False),
                    wheels_for=_wheels(tmp_path, TORCH_PKGS), uv=_fake_uv(tmp_path))
    assert plan.offline and not plan.split_torch
    files = dockerfile.render(plan)
    assert dockerfile.TORCH_LAYER_DOCKERFILE not in files
    text = files["Dockerfile"]
    assert dockerfile.TORCH_LAYER_ARG not in text
    everything = "\n".join(files.values())
    assert all(f"{name}=={version}" in everything for name, version in TORCH_PKGS)


def test_a_wheels_requirements_keep_platform_markers_and_leave_extras_out(tmp_path: Path) -> None:
    wheel = _zip_wheel(tmp_path, "torch", "2.13.0", [
        "Sympy>=1.13", 'nvidia_cudnn_cu13==9.20.0.48; platform_system == "Linux"',
        'zipp; extra == "opt"', 'pytest ; python_version > "3.8" and extra=="test"', "not a requirement!"])
    assert wheelhouse.wheel_requires(wheel) == {"sympy", "nvidia-cudnn-cu13"}
    # Headers after the first blank line are the description, not metadata.
    assert "not-a-header" not in wheelhouse.wheel_requires(wheel)


@given(st.binary(max_size=2048))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_metadata_gives_a_set_of_names_never_an_error(tmp_path: Path, meta: bytes) -> None:
    """Fuzz: whatever bytes a wheel's METADATA holds, planning reads a set of names from it."""
    wheel = tmp_path / "x-1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("x-1.dist-info/METADATA", meta)
    names = wheelhouse.wheel_requires(wheel)
    assert isinstance(names, set) and all(isinstance(n, str) and n for n in names)


@given(st.lists(st.sampled_from(["six", "Foo.Bar", "a_b", "x>=1", 'y; os_name == "nt"', 'z; extra == "e"']),
                max_size=6))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_requires_dist_lines_reach_the_parser(tmp_path: Path, requires: list[str]) -> None:
    """Fuzz that reaches the parser: valid METADATA built from requirement lines gives every
    requirement's normalized name except those of an extra."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    wheel = _zip_wheel(tmp_path, "x", "1", requires)
    want = {canonicalize_name(Requirement(r).name) for r in requires if "extra" not in r}
    assert wheelhouse.wheel_requires(wheel) == want
