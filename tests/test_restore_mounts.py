"""The plan rendered for a builder that reads ``RUN --mount`` (BuildKit, Buildah; no engine).

One plan, one renderer: with ``Plan.mounts`` the wheels, the requirement files and the uv binary
are bind-mounted into the RUN that installs them, so none of them enters a layer and no build
stage is needed; everything else is the text the classic builder gets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import re
from pathlib import Path

import pytest
from helpers import LockFactory
from hypothesis import given
from hypothesis import strategies as st
from test_restore_context import MOUNT, exec_form
from test_restore_layers import DIGEST, TORCH_PKGS, _instructions, _plan

from envlock.commands import main
from envlock.restore import context as ctx
from envlock.restore import dockerfile
from envlock.restore.image import Options


def _mounted(plan: ctx.Plan) -> ctx.Plan:
    return dataclasses.replace(plan, mounts=True)


def _command(line: str) -> list[str]:
    """A mounting RUN's command, after the digest of what it mounts (``ENVLOCK_MOUNTED``)."""
    argv = exec_form(line)
    assert argv[0] == "env" and re.fullmatch(r"ENVLOCK_MOUNTED=sha256:[0-9a-f]{64}", argv[1]), argv[:2]
    return argv[2:]


def test_with_mounts_no_wheel_requirement_file_or_uv_enters_a_layer(restore_lock: LockFactory,
                                                                   tmp_path: Path) -> None:
    plan = _mounted(_plan(restore_lock, tmp_path))
    assert plan.split_torch and plan.uv is not None
    files = dockerfile.render(plan)
    layer = _instructions(files[dockerfile.TORCH_LAYER_DOCKERFILE])
    main_ = _instructions(files["Dockerfile"])
    for text in (layer, main_):
        assert not any(line.startswith("COPY") and ("wheels/" in line or "requirements/" in line
                                                    or "tools/" in line) for line in text)
        assert not any("--from=" in line or " AS " in line for line in text)  # no build stage
    # The torch layer: the base by a build argument (its default the plan's base), the venv,
    # one RUN that mounts its requirement file, its wheels and uv, and its label. One stage.
    assert layer[:2] == [f"ARG ENVLOCK_BASE=a/b@{DIGEST}", "FROM ${ENVLOCK_BASE}"]
    assert sum(line.startswith("FROM") for line in layer) == 1
    install = next(line for line in layer if "--mount=" in line)
    assert re.findall(r"--mount=\S+", install) == [
        "--mount=type=bind,source=requirements/torch.txt,target=/tmp/envlock-requirements/torch.txt",
        "--mount=type=bind,source=wheels/torch,target=/tmp/envlock-wheels/torch",
        "--mount=type=bind,source=tools,target=/tmp/envlock-uv"]
    argv = _command(install)
    assert argv[-2:] == ["-r", "/tmp/envlock-requirements/torch.txt"]
    assert "--link-mode=hardlink" in argv[2] and "/tmp/envlock-uv/uv pip install" in argv[2]
    assert layer[-1].startswith('LABEL "org.envlock.torch-layer"=')
    # The image: FROM the torch layer, the rest in one RUN that mounts what it installs, with uv
    # too (mounted, it does not stay); the last RUN removes the mount points' empty directories.
    rest = next(line for line in main_ if "--mount=" in line)
    assert "source=wheels/packages,target=/tmp/envlock-wheels/packages" in rest
    assert "source=tools,target=/tmp/envlock-uv" in rest and "wheels/torch" not in rest
    script = _command(rest)[2]
    assert script.index("/tmp/envlock-requirements/packages.txt") < script.index("/tmp/envlock-requirements/tooling.txt")
    useradd = next(line for line in main_ if "useradd" in line)
    assert useradd.endswith("; rm -rf /tmp/envlock-wheels /tmp/envlock-requirements /tmp/envlock-uv")
    # The main build is sent the uv binary now (its layers install with it), not the torch wheels.
    sent = dockerfile.main_build_files(plan, files)
    assert "tools" in sent and not {"wheels/torch", dockerfile.TORCH_LAYER_DOCKERFILE} & set(sent)
    assert files[".dockerignore"].split() == ["build.log", "wheels/torch", dockerfile.TORCH_LAYER_DOCKERFILE]


def test_one_plan_two_texts_that_differ_only_in_how_the_wheels_arrive(restore_lock: LockFactory,
                                                                     tmp_path: Path) -> None:
    """The classic text and the mounted one: the same requirement files, labels, variables, user
    and what the restore changed on purpose; the installs the same commands and arguments but
    for where the requirement files are read."""
    for packages in (TORCH_PKGS, [("pip", "24.0"), ("six", "1.16.0")]):
        (tmp_path / str(len(packages))).mkdir()
        classic_plan = _plan(restore_lock, tmp_path / str(len(packages)), packages)
        classic = dockerfile.render(classic_plan)
        mounted = dockerfile.render(_mounted(classic_plan))
        assert {k: v for k, v in classic.items() if "Dockerfile" not in k and k != ".dockerignore"} == \
               {k: v for k, v in mounted.items() if "Dockerfile" not in k and k != ".dockerignore"}

        def same(text: str) -> list[str]:
            return [line for line in _instructions(text) if line.startswith(("LABEL", "ENV", "USER", "WORKDIR",
                                                                              "COPY [\"restored.json\""))]

        def installs(text: str) -> list[list[str]]:
            runs = [_command(line) if "--mount" in line else exec_form(line)
                    for line in _instructions(text) if line.startswith("RUN") and "install" in line]
            return [[a.replace(dockerfile.REQ_DIR_IN_IMAGE, dockerfile.REQ_MOUNTED) for a in run] for run in runs]

        assert same(classic["Dockerfile"])[-4:] == same(mounted["Dockerfile"])[-4:]
        if classic_plan.split_torch:
            assert installs(classic[dockerfile.TORCH_LAYER_DOCKERFILE]) == \
                installs(mounted[dockerfile.TORCH_LAYER_DOCKERFILE])
        else:  # uv installs in the classic build stage and in the mounted image alike
            assert installs(classic["Dockerfile"]) == installs(mounted["Dockerfile"])


def test_what_a_run_mounts_is_in_its_text(restore_lock: LockFactory, tmp_path: Path) -> None:
    """Buildah before 1.38 keys its layer cache on an instruction's text alone, never on what a
    RUN --mount binds: each mounting RUN names the digest of its files, so other pins or another
    wheel under the same name change the instruction, and the same files keep it."""
    def runs(plan: ctx.Plan) -> dict[str, str]:
        rendered = dockerfile.render(_mounted(plan))
        return {name: line for name in ("Dockerfile", dockerfile.TORCH_LAYER_DOCKERFILE)
                for line in rendered[name].splitlines() if line.startswith("RUN --mount")
                and (name != "Dockerfile" or "packages.txt" in line)}

    one = runs(_plan(restore_lock, tmp_path))
    assert runs(_plan(restore_lock, tmp_path)) == one
    other_six = runs(_plan(restore_lock, tmp_path, [p if p[0] != "six" else ("six", "1.17.0") for p in TORCH_PKGS]))
    assert other_six[dockerfile.TORCH_LAYER_DOCKERFILE] == one[dockerfile.TORCH_LAYER_DOCKERFILE]
    assert other_six["Dockerfile"] != one["Dockerfile"]
    # Another build of the same torch wheel (same name, other bytes): another torch layer RUN.
    (tmp_path / "house" / "torch-2.13.0+cpu-py3-none-any.whl").write_bytes(b"another build")
    rebuilt = runs(_plan(restore_lock, tmp_path))
    assert rebuilt[dockerfile.TORCH_LAYER_DOCKERFILE] != one[dockerfile.TORCH_LAYER_DOCKERFILE]
    assert rebuilt["Dockerfile"] == one["Dockerfile"]


def test_a_one_package_change_keeps_the_mounted_torch_layer(restore_lock: LockFactory, tmp_path: Path) -> None:
    one = _mounted(_plan(restore_lock, tmp_path))
    other = _mounted(_plan(restore_lock, tmp_path, [p if p[0] != "six" else ("six", "1.17.0") for p in TORCH_PKGS]))
    key = dockerfile.torch_layer_key(one)
    assert key == dockerfile.torch_layer_key(other)
    assert dockerfile.render(one)[dockerfile.TORCH_LAYER_DOCKERFILE] == \
        dockerfile.render(other)[dockerfile.TORCH_LAYER_DOCKERFILE]
    # Another layer than the classic builder's (another Dockerfile), and another image cache key.
    assert key != dockerfile.torch_layer_key(_plan(restore_lock, tmp_path))
    assert dockerfile.context_key(one) != dockerfile.context_key(_plan(restore_lock, tmp_path))


def test_without_uv_or_a_venv_the_mounted_installs_are_pips(restore_lock: LockFactory, tmp_path: Path) -> None:
    plan = _mounted(_plan(restore_lock, tmp_path, uv=False))
    text = "\n".join(dockerfile.render(plan).values())
    assert "source=tools" not in text and "/tmp/envlock-uv/uv" not in text
    system = restore_lock(image={"reference": "a/b", "digest": DIGEST},
                          python={"version": "3.11.2", "implementation": "cpython", "prefix_kind": "system",
                                  "prefix": "/usr", "soabi": "cpython-311-x86_64-linux-gnu"})
    lines = _instructions(dockerfile.render(ctx.plan(system, Options(mounts=True)))["Dockerfile"])
    run = next(line for line in lines if "-m\", \"pip\", \"install\"" in line)
    argv = _command(run)
    assert "PIP_BREAK_SYSTEM_PACKAGES=1" in argv and argv[-1] == "/tmp/envlock-requirements/packages.txt"
    assert lines[:2] == [f"ARG ENVLOCK_BASE=a/b@{DIGEST}", "FROM ${ENVLOCK_BASE}"]


# -- injection: what a mount line can hold -------------------------------------------------------


@pytest.mark.parametrize("source, target", [
    ("wheels/torch,target=/etc", "/tmp/envlock-wheels/torch"),   # a second option smuggled in
    ("wheels/torch", "/tmp/x,rw"),
    ("../../etc", "/tmp/envlock-wheels/torch"),
    ("wheels/torch", "/tmp/../etc"),
    ("wheels/to rch", "/tmp/envlock-wheels/torch"),
    ("wheels/torch\n", "/tmp/envlock-wheels/torch"),
    ("wheels/\"torch", "/tmp/envlock-wheels/torch"),
    ("wheels/$torch", "/tmp/envlock-wheels/torch"),
    ("", "/tmp/envlock-wheels/torch"),
    ("/etc", "/tmp/envlock-wheels/torch"),                       # an absolute source
    ("/wheels/torch", "/tmp/envlock-wheels/torch"),
    ("wheels/../../etc", "/tmp/envlock-wheels/torch"),
    ("./wheels", "/tmp/envlock-wheels/torch"),
    ("wheels/torch", "tmp/envlock-wheels/torch"),                # a relative target
])
def test_a_mount_names_only_plain_paths(source: str, target: str) -> None:
    with pytest.raises(ValueError, match="RUN --mount"):
        dockerfile._mount(source, target)


# Any text, and text near a path (which reaches the accepting side of the rule, where a check
# of the accepted line means something).
_NEAR_PATH = st.one_of(st.text(max_size=30), st.from_regex(r"/?[a-z0-9./,=-]{1,20}", fullmatch=True))


@given(_NEAR_PATH, _NEAR_PATH)
def test_any_mount_is_refused_or_one_bind_of_exactly_those_paths(source: str, target: str) -> None:
    try:
        line = dockerfile._mount(source, target)
    except ValueError:
        return
    _check_bind(line, source, target)


def _check_bind(line: str, source: str, target: str) -> None:
    """An accepted mount: one bind of exactly those paths, the source inside the context
    (relative, no part that is ``.`` or ``..``), the target absolute, no character that
    could end an option or a word."""
    options = line.removeprefix("--mount=").split(",")
    assert options == ["type=bind", f"source={source}", f"target={target}"]
    assert not re.search(r"[\s\"'$`\\=,]", source + target)
    assert not source.startswith("/") and target.startswith("/")
    assert not {".", "..", ""} & set(source.split("/")), source
    assert not {".", ".."} & set(target.split("/")) and "" not in target.split("/")[1:], target


# Pieces of paths: envlock's own words, and each way out of a context or out of an option.
# Drawn mostly from the first, so that a pair is often accepted and often refused for one reason.
_GOOD = ("wheels", "torch", "requirements", "tools", "a0", "x.txt", "b_c", "d-e", "tmp", "envlock-uv")
_BAD = (".", "..", "", "-d", " ", ",", "=", "$", "A", "é", "\n", "a,target=/etc")


def _fuzz_path(rng: random.Random, absolute: float) -> str:
    """1 to 4 parts, each bad one time in eight; a leading ``/`` with probability ``absolute``."""
    parts = [rng.choice(_BAD if rng.random() < 0.125 else _GOOD) for _ in range(rng.randint(1, 4))]
    return ("/" if rng.random() < absolute else "") + "/".join(parts)


def test_the_mount_rule_under_a_seeded_fuzz_reaches_both_answers() -> None:
    """4000 drawn pairs (seeded: the same pairs each run). Every pair reaches ``_mount``; an
    accepted one is a bind of exactly those paths with a relative source, and the draw is
    checked to reach both answers and the refusal of an absolute source whose relative form is
    accepted (with this seed: 1169 accepted, 2831 refused, 505 of them for the leading ``/``
    alone)."""
    rng = random.Random(20261207)
    accepted = refused = absolute_refused = 0
    for _ in range(4000):
        source, target = _fuzz_path(rng, 0.3), _fuzz_path(rng, 0.8)
        try:
            line = dockerfile._mount(source, target)
        except ValueError:
            refused += 1
            if source.startswith("/"):
                with contextlib.suppress(ValueError):
                    dockerfile._mount(source.lstrip("/"), target)
                    absolute_refused += 1  # refused for being absolute alone
            continue
        accepted += 1
        _check_bind(line, source, target)
    assert accepted > 500 and refused > 1000 and absolute_refused > 200, (accepted, refused, absolute_refused)


def test_crafted_lock_values_never_reach_a_mount_line(restore_lock: LockFactory, tmp_path: Path) -> None:
    """Lock values that pass validation but are odd (local version labels, long names, variables
    with spaces and colons) change requirement files, never the mounts."""
    odd = [("pip", "24.0"), ("six", "1.16.0+local.build-7"), ("zope-interface", "6.0.post1"),
           ("torch", "2.13.0+cpu")]
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=odd,
                        torch={"version": "2.13.0+cpu"},
                        determinism={"env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONHASHSEED": "0"}})
    from test_restore_layers import _fake_uv, _wheels

    plan = ctx.plan(lock, Options(wheelhouse=tmp_path / "house", mounts=True),
                    wheels_for=_wheels(tmp_path, odd), uv=_fake_uv(tmp_path))
    rendered = dockerfile.render(plan)
    runs = [line for text in (rendered["Dockerfile"], rendered[dockerfile.TORCH_LAYER_DOCKERFILE])
            for line in text.splitlines() if line.startswith("RUN --mount")]
    assert len(runs) >= 2
    for line in runs:
        mounts = re.findall(r"--mount=\S+", line)
        assert mounts and all(MOUNT.fullmatch(m) for m in mounts)
        argv = _command(line)
        assert not any("six" in m or "1.16.0" in m for m in mounts) and argv


# -- --dockerfile-only ---------------------------------------------------------------------------


def test_dockerfile_only_writes_the_mounted_text_when_told_and_refuses_a_bad_setting(
        restore_lock: LockFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from envlock.lock import save

    save(restore_lock(image={"reference": "a/b", "digest": DIGEST}), tmp_path / "env.lock")
    monkeypatch.setenv("ENVLOCK_BUILDER", "cli")
    assert main(["restore", str(tmp_path / "env.lock"), "--dockerfile-only", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "Dockerfile").read_text().count("RUN --mount=type=bind") >= 1
    monkeypatch.setenv("ENVLOCK_BUILDER", "auto")  # no engine here: the text any builder reads
    assert main(["restore", str(tmp_path / "env.lock"), "--dockerfile-only", str(tmp_path / "c")]) == 0
    assert "--mount" not in (tmp_path / "c" / "Dockerfile").read_text()
    capsys.readouterr()
    monkeypatch.setenv("ENVLOCK_BUILDER", "buildkit")
    assert main(["restore", str(tmp_path / "env.lock"), "--dockerfile-only", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "ENVLOCK_BUILDER must be auto, cli or sdk, not 'buildkit'" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()
