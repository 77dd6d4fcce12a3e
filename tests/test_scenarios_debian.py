"""Scenario matrix d: Debian's system python3 with apt-installed python3-* packages and a
``pip install --user`` package, as on a researcher's Debian box.

It runs in a container of the Debian bookworm base image (containers reach no network):
scripts/test.sh downloads the .debs of python3-six and python3-yaml (with libyaml) on the host
(``ENVLOCK_TEST_DEBS``), they are installed with dpkg, and a user (uid 1000) installs idna from
the wheelhouse with ``pip install --user``. The result is committed as the "researcher's
machine" image; capture and verify run there through ``--in-image`` (the probe runs with the
image's own /usr/bin/python3, nothing installed).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
import tomllib
from helpers import unavailable
from scenario_steps import Steps, envlock, ok

pytestmark = pytest.mark.integration

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture(scope="module")
def debs() -> Path:
    raw = os.environ.get("ENVLOCK_TEST_DEBS")
    if not raw or not list(Path(raw).glob("python3-six_*.deb")):
        unavailable("ENVLOCK_TEST_DEBS is not set or holds no python3-six .deb; run scripts/test.sh")
    return Path(raw)


def _commit(client: Any, base: str, script: str, tag: str, volumes: dict[str, dict[str, str]]) -> str:
    """Run SCRIPT (as root) in BASE and commit the result as TAG (once per content)."""
    try:
        client.images.get(tag)
        return tag
    except Exception:
        pass
    container = client.containers.run(base, ["sh", "-ec", script], detach=True, network_disabled=True,
                                      volumes=volumes)
    try:
        result = container.wait()
        assert result["StatusCode"] == 0, container.logs().decode(errors="replace")
        repo, _, tag_part = tag.rpartition(":")
        container.commit(repository=repo, tag=tag_part, changes=[f"ENV PATH={PATH}", "USER user"])
    finally:
        container.remove(force=True)
    return tag


def _machine(client: Any, base: str, debs: Path, wheelhouse: Path, user_pkgs: str) -> str:
    deb_files = sorted(p.name for p in debs.glob("*.deb"))
    key = hashlib.sha256(repr((base, deb_files, user_pkgs)).encode()).hexdigest()[:12]
    script = ("dpkg -i /debs/*.deb >/dev/null\n"
              "useradd --uid 1000 --user-group --create-home --shell /bin/sh user\n"
              # PEP 668: Debian's pip refuses even --user installs without this flag.
              "su user -c 'python3 -m pip install -q --user --break-system-packages "
              f"--disable-pip-version-check --no-index --find-links /wheels {user_pkgs}'\n")
    volumes = {str(debs): {"bind": "/debs", "mode": "ro"}, str(wheelhouse): {"bind": "/wheels", "mode": "ro"}}
    return _commit(client, base, script, f"envlock-test/scenario-d:{key}", volumes)


def test_d_debian_system_python(docker_client: Any, base_image: str, wheelhouse: Path, debs: Path,
                                tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    steps = Steps("d Debian system python", capsys)
    with steps.step("setup"):
        machine = _machine(docker_client, base_image, debs, wheelhouse, "idna==3.10")
    lock = tmp_path / "env.lock"
    with steps.step("capture"):
        ok(envlock("capture", "--in-image", machine, "-o", str(lock), cwd=tmp_path))
    doc = tomllib.loads(lock.read_text())
    assert doc["python"]["prefix_kind"] == "system" and doc["python"]["executable"] == "/usr/bin/python3"
    pkgs = {p["name"]: p for p in doc["packages"]}
    six_deb = next(debs.glob("python3-six_*.deb")).name.split("_")[1]  # 1.16.0-4
    yaml_deb = next(debs.glob("python3-yaml_*.deb")).name.split("_")[1]  # 6.0-3+b2
    assert pkgs["six"]["version"] == six_deb.split("-")[0]  # dist-info from apt
    assert pkgs["pyyaml"]["version"] == yaml_deb.split("-")[0]  # egg-info from apt
    assert pkgs["idna"]["version"] == "3.10" and pkgs["idna"]["installer"] == "pip"  # --user
    # apt's packages are the OS's (dist-info and egg-info alike), named with their owner;
    # the user-site package came from the index.
    assert pkgs["six"]["source"] == "system" and pkgs["six"]["os_package"] == "python3-six"
    assert pkgs["pyyaml"]["source"] == "system" and pkgs["pyyaml"]["os_package"] == "python3-yaml"
    assert pkgs["idna"]["source"] == "index"

    # verify = the probe again in a fresh container of the same machine, compared with the lock
    # (`envlock verify` runs in the environment in front of it; here that is a container).
    with steps.step("verify"):
        again = tmp_path / "again.lock"
        ok(envlock("capture", "--in-image", machine, "-o", str(again), cwd=tmp_path))
        ok(envlock("diff", str(lock), str(again), cwd=tmp_path))
    with steps.step("change + verify"):
        # The user upgrades six in their user site, shadowing apt's copy.
        changed = _machine(docker_client, base_image, debs, wheelhouse, "idna==3.10 six==1.17.0")
        after = tmp_path / "after.lock"
        ok(envlock("capture", "--in-image", changed, "-o", str(after), cwd=tmp_path))
        out = ok(envlock("diff", str(lock), str(after), cwd=tmp_path), 1)
        assert "six" in out and "1.17.0" in out, out

    # Restore builds FROM the lock's own image (the apt packages are part of it) and runs as
    # uid 1000 ("user", whose HOME holds the user site). `envlock run` sets HOME=/tmp for the
    # command, which hides a user site: the user's packages need HOME (or PYTHONUSERBASE)
    # passed explicitly, as here.
    common = [str(lock), "--wheelhouse", str(wheelhouse), "--name", "scenario-d"]
    with steps.step("restore"):
        assert "built in" in ok(envlock("restore", *common, "--no-cache", "--no-verify", cwd=tmp_path))
    with steps.step("verify inside"):
        out = ok(envlock("restore", *common, cwd=tmp_path))
        assert "OK: the environment matches the lock" in out, out
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    with steps.step("run"):
        out = ok(envlock("run", *common, "--workspace", str(workspace), "--gpus", "none",
                         "--env", "PYTHONUSERBASE=/home/user/.local", "--", "python3", "-c",
                         "import six, yaml, idna, sys; print('versions', six.__version__, yaml.__version__, "
                         "idna.__version__, sys.executable)", cwd=tmp_path))
        assert f"versions {six_deb.split('-')[0]} {yaml_deb.split('-')[0]} 3.10 /usr/bin/python3" in out, out
