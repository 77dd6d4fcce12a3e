"""An editable src-layout project is one distribution, not an install shadowed by its own
``src/NAME.egg-info`` (left there by every setuptools build of the project)."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest
from helpers import make_dist, unavailable

from envlock.probe import packages
from envlock.probing.process import PROBE_PATH, parse_document


def _project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    (proj / "src" / "mypkg").mkdir(parents=True)
    (proj / "src" / "mypkg" / "__init__.py").write_text("")
    egg = proj / "src" / "mypkg.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: mypkg\nVersion: 0.1\n\n")
    (egg / "SOURCES.txt").write_text("src/mypkg/__init__.py\n")
    return proj


def _editable(site: Path, proj: Path) -> None:
    make_dist(site, "mypkg", "0.1", direct_url={"url": proj.as_uri(), "dir_info": {"editable": True}})


@pytest.mark.parametrize("src_first", [False, True])
def test_src_layout_editable_is_not_a_duplicate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                src_first: bool) -> None:
    site = tmp_path / "site-packages"
    proj = _project(tmp_path)
    _editable(site, proj)
    # The .pth of an editable install appends src/ after site-packages; PYTHONPATH=src puts
    # it first. Either way the editable install is the entry.
    path = [str(proj / "src"), str(site)] if src_first else [str(site), str(proj / "src")]
    monkeypatch.setattr(sys, "path", path)
    pkgs, dups = packages.collect_packages()
    assert dups == []
    (pkg,) = [p for p in pkgs if p["name"] == "mypkg"]
    assert pkg["source"] == "editable" and pkg["version"] == "0.1"


def test_a_real_second_copy_is_still_a_duplicate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site-packages"
    proj = _project(tmp_path)
    _editable(site, proj)
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "mypkg-0.0.9.egg-info").write_text("Metadata-Version: 2.1\nName: mypkg\nVersion: 0.0.9\n\n")
    monkeypatch.setattr(sys, "path", [str(site), str(proj / "src"), str(other)])
    _, dups = packages.collect_packages()
    assert dups == [{"name": "mypkg", "version": "0.0.9", "active_version": "0.1", "path_index": 2}]


@pytest.mark.integration
def test_pip_editable_src_layout_after_a_wheel_build(tmp_path: Path, wheelhouse: Path) -> None:
    """The real sequence: pip install -e, then build a wheel, which leaves src/mypkg.egg-info."""
    if not any(wheelhouse.glob("setuptools-*.whl")):
        unavailable("the test wheelhouse holds no setuptools wheel (scripts/test.sh WHEEL_SPECS)")
    proj = tmp_path / "proj"
    (proj / "src" / "mypkg").mkdir(parents=True)
    (proj / "src" / "mypkg" / "__init__.py").write_text("")
    (proj / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "mypkg"\nversion = "0.1"\n')
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    py = str(env / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheelhouse)]
    subprocess.run([*pip, "-U", "setuptools"], check=True, timeout=300)
    subprocess.run([*pip, "--no-build-isolation", "-e", str(proj)], check=True, timeout=300)
    subprocess.run([py, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(proj)], check=True, timeout=300)
    assert (proj / "src" / "mypkg.egg-info").is_dir()
    out = subprocess.run([py, str(PROBE_PATH), "--no-torch"], cwd=proj, capture_output=True, text=True,
                         check=True, timeout=300)
    doc = parse_document(out.stdout.encode(), "")
    assert doc["duplicates"] == []
    assert [p["source"] for p in doc["packages"] if p["name"] == "mypkg"] == ["editable"]
