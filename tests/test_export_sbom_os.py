"""The CycloneDX SBOM lists the image's OS packages (dpkg, apk, rpm) as components with their
purls, and ``envlock-ml[sbom]`` is the extra that brings its library."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib
from helpers import REPO, LockFactory

from envlock.export import cyclonedx


@pytest.fixture
def debian_lock(restore_lock: LockFactory) -> object:
    return restore_lock(packages=[("six", "1.17.0")],
                        os_packages={"manager": "dpkg", "packages": ["libc6:amd64=2.36-9+deb12u14",
                                                                     "tzdata:all=2025b-0+deb12u1"]})


def test_os_packages_are_components_with_purls(debian_lock: object) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    text = cyclonedx.render(debian_lock)  # type: ignore[arg-type]
    errors = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text, all_errors=True)
    assert errors is None, [str(e) for e in errors]
    by_ref = {c["bom-ref"]: c for c in json.loads(text)["components"]}
    libc = by_ref["deb:libc6:amd64"]
    assert libc["version"] == "2.36-9+deb12u14"
    assert libc["purl"].startswith("pkg:deb/") and "libc6@2.36-9%2Bdeb12u14" in libc["purl"]
    assert "arch=amd64" in libc["purl"]
    assert "deb:tzdata:all" in by_ref and "pypi:six" in by_ref
    deps = {d["ref"]: d.get("dependsOn", []) for d in json.loads(text)["dependencies"]}
    assert "deb:libc6:amd64" in deps["environment"]


def test_twin_a_lock_without_os_packages_has_none(restore_lock: LockFactory) -> None:
    text = cyclonedx.render(restore_lock(packages=[("six", "1.17.0")]))
    assert not [c for c in json.loads(text)["components"] if c["bom-ref"].startswith(("deb:", "apk:", "rpm:"))]


def test_the_sbom_extra_names_the_library() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("cyclonedx-python-lib") for req in extras["sbom"])
    assert "envlock-ml[sbom]" in Path(cyclonedx.__file__).read_text()  # the hint when it is missing
