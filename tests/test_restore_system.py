"""Restore of system-Python locks (OS packages through apt/apk) and ``--python`` as an interpreter."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest
from helpers import LockFactory

from envlock.errors import NotRestorable, UnsafeValue, UsageError
from envlock.lock import Lock
from envlock.restore import context as ctx
from envlock.restore import dockerfile, values
from envlock.restore.image import Options

DIGEST = "sha256:" + "ab" * 32
SYSTEM = {"version": "3.11.2", "implementation": "cpython", "prefix_kind": "system",
          "executable": "/usr/bin/python3"}
OS = {"manager": "dpkg", "packages": ["libc6:amd64=2.36-9+deb12u14", "python3-six:all=1.16.0-4",
                                       "python3-torch:amd64=1.13.1+dfsg-4", "libfoo:i386=1:2.0-1"]}
PACKAGES = [
    {"name": "six", "version": "1.16.0", "source": "system", "os_package": "python3-six",
     "os_package_version": "1.16.0-4"},
    {"name": "torch", "version": "1.13.0a0+gitunknown", "source": "system", "os_package": "python3-torch",
     "os_package_version": "1.13.1+dfsg-4"},
    {"name": "idna", "version": "3.10", "source": "index", "installer": "pip"},
]


# -- --python is an interpreter ----------------------------------------------------------------


@pytest.mark.parametrize("python", ["/usr/bin/python3", "python3", "python3.11", "/opt/conda/bin/python",
                                    "/usr/local/bin/python", "/opt/my tools/bin/python", "pypy3"])
def test_any_absolute_path_or_command_is_an_interpreter(python: str) -> None:
    assert values.interpreter(python) == python


@pytest.mark.parametrize(("python", "why"), [
    ("", "1 to"), ("/usr/bin/py\nthon", "control character"), ("py\x00", "control character"),
    ("-c", "starts with '-'"), ("bin/python", "absolute path"), ("/" + "p" * 2000, "1 to"),
    ("/usr/bin/python\t", "control character"),
])
def test_interpreter_refusals_are_usage_errors_about_the_option(python: str, why: str) -> None:
    with pytest.raises(UsageError) as err:
        values.interpreter(python)
    assert why in err.value.message and err.value.message.startswith("--python")
    assert "crafted" not in err.value.message and "crafted" not in (err.value.hint or "")
    assert not isinstance(err.value, UnsafeValue)


def test_restore_python_accepts_a_system_interpreter(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, python=SYSTEM)
    plan = ctx.plan(lock, Options(python="/usr/bin/python3"))
    assert plan.python == "/usr/bin/python3"
    assert '"/usr/bin/python3", "-m", "pip"' in dockerfile.render(plan)["Dockerfile"]


def test_user_options_never_blame_the_lock(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST})
    for opts in (Options(base="Not An Image"), Options(venv="/etc"), Options(index_url="ftp://x/y")):
        with pytest.raises(UsageError) as err:
            ctx.plan(lock, opts)
        assert "crafted" not in str(err.value) and "crafted" not in (err.value.hint or "")


def test_capture_in_image_validates_python_as_an_interpreter() -> None:
    from envlock.restore.inimage import capture_in_image

    with pytest.raises(UsageError, match="--python"):
        capture_in_image("img:1", python="bin/python")
    with pytest.raises(UsageError, match="--in-image"):
        capture_in_image("Bad Ref", python="/usr/bin/python3")


# -- OS packages ----------------------------------------------------------------------------


def _system_lock(restore_lock: LockFactory, **kw: Any) -> Lock:
    data: dict[str, Any] = {"image": {"reference": "a/b", "digest": DIGEST}, "python": SYSTEM, "os_packages": OS,
            "packages": PACKAGES}
    data.update(kw)
    return restore_lock(**data)


def test_system_lock_installs_os_packages_with_apt_pins_then_pip(restore_lock: LockFactory) -> None:
    plan = ctx.plan(_system_lock(restore_lock), Options())
    files = dockerfile.render(plan)
    df = files["Dockerfile"]
    assert plan.os_install is not None and plan.venv is None
    install = next(line for line in df.splitlines() if '"apt-get", "install"' in line)
    argv = json.loads(install[4:])
    # Native and arch-independent packages as name=version, a foreign one with its arch.
    assert argv[-4:] == ["libc6=2.36-9+deb12u14", "libfoo:i386=1:2.0-1", "python3-six=1.16.0-4",
                         "python3-torch=1.13.1+dfsg-4"]
    assert "--allow-downgrades" in argv and argv[:2] == ["env", "DEBIAN_FRONTEND=noninteractive"]
    lines = df.splitlines()
    assert lines.index(install) < next(i for i, line in enumerate(lines) if '"-m", "pip"' in line)
    assert any('"--check"' in line for line in lines[:lines.index(install)])
    assert files["ospkgs.py"].startswith('"""Installed OS packages')
    assert "python3-torch:amd64=1.13.1+dfsg-4" in files["requirements/os-packages.txt"]
    # OS-owned dists come with their packages; pip gets only what pip installed.
    reqs = "".join(v for k, v in files.items() if k.startswith("requirements/") and "os-" not in k)
    assert "idna==3.10" in reqs and "torch" not in reqs and "six" not in reqs
    assert "PIP_BREAK_SYSTEM_PACKAGES=1" in df and plan.skipped == ()


def test_every_lock_value_in_the_os_lines_is_exec_form(restore_lock: LockFactory) -> None:
    df = dockerfile.render(ctx.plan(_system_lock(restore_lock), Options()))["Dockerfile"]
    lines = [line for line in df.splitlines() if "=1.16.0-4" in line or "os-packages" in line]
    assert lines, df  # the OS packages are in the Dockerfile, so there is something to check
    for line in lines:
        assert line.startswith(("RUN [", "COPY [")), line


def test_venv_lock_leaves_os_packages_to_the_base(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, os_packages=OS,
                        packages=[("six", "1.16.0")])
    plan = ctx.plan(lock, Options())
    assert plan.os_install is None and "apt-get" not in dockerfile.render(plan)["Dockerfile"]


def test_system_dist_without_os_table_is_left_to_the_base(restore_lock: LockFactory) -> None:
    lock = _system_lock(restore_lock, os_packages=None)
    plan = ctx.plan(lock, Options())
    assert set(plan.skipped) == {"six", "torch"}
    assert any("python3-torch" in n for n in plan.notes)


def test_system_dist_owned_by_an_unlisted_package_is_not_restorable(restore_lock: LockFactory) -> None:
    lock = _system_lock(restore_lock, os_packages={"manager": "dpkg", "packages": ["libc6:amd64=2.36-9"]})
    with pytest.raises(NotRestorable, match="six, torch"):
        ctx.plan(lock, Options())


def test_apk_images_use_apk_add(restore_lock: LockFactory) -> None:
    lock = _system_lock(restore_lock, packages=[PACKAGES[2]],
                        os_packages={"manager": "apk", "packages": ["musl:x86_64=1.2.5-r0"]})
    df = dockerfile.render(ctx.plan(lock, Options()))["Dockerfile"]
    assert 'RUN ["apk", "add", "--no-cache", "musl=1.2.5-r0"]' in df


def test_crafted_os_pin_is_refused(restore_lock: LockFactory) -> None:
    from envlock.lock import OsPackages

    lock = _system_lock(restore_lock, packages=[PACKAGES[2]], os_packages=None)
    bad = OsPackages.model_construct(manager="dpkg", packages=["x:amd64=1 && curl evil"])
    with pytest.raises(UnsafeValue, match="OS package"):
        ctx.plan(lock.model_copy(update={"os_packages": bad}), Options())


@pytest.mark.skipif(shutil.which("apt-cache") is None or not os.path.exists("/var/lib/dpkg/status"),
                    reason="needs a Debian-like host with apt-cache")
def test_check_script_names_every_unavailable_version(tmp_path: Any) -> None:
    from envlock.probe import ospkgs
    from envlock.probing.process import OSPKGS_PATH

    db = ospkgs.load("/")
    assert db is not None
    installed = db.specs()[0]
    spec = tmp_path / "os.txt"
    spec.write_text(f"# header\n{installed}\nlibc6:amd64=0.0-envlock-missing\nnosuchpkg-envlock:amd64=1.0\n")
    res = subprocess.run([sys.executable, str(OSPKGS_PATH), "--check", str(spec)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 100
    assert res.stdout.strip() == ("envlock: OS package versions no longer available: "
                                  "libc6:amd64=0.0-envlock-missing, nosuchpkg-envlock:amd64=1.0")
    spec.write_text(installed + "\n")
    ok = subprocess.run([sys.executable, str(OSPKGS_PATH), "--check", str(spec)],
                        capture_output=True, text=True, timeout=120, check=False)
    assert ok.returncode == 0 and ok.stdout == ""


def test_bundle_leaves_os_owned_dists_to_their_packages(restore_lock: LockFactory) -> None:
    from envlock.export.fetch import wanted

    found, skipped = wanted(_system_lock(restore_lock), skip_local=False)
    assert [p.name for p in found] == ["idna"] and sorted(skipped) == ["six", "torch"]
