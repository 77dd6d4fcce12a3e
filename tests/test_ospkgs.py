"""OS packages: the dpkg/apk/rpm parsers, OS-owned distributions, the model, drift severity.

The dpkg fixture is a subset of a real Debian 12 ``/var/lib/dpkg/status`` with the real file
lists of python3-six, python3-yaml and libc6; the apk fixture follows Alpine's documented
``installed`` database format (one letter per field, ``F:`` directories, ``R:`` files).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import LockFactory, make_lock
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from envlock.drift.compare import compare
from envlock.drift.packages import os_package_severity
from envlock.lock import OsPackages
from envlock.probe import ospkgs
from envlock.probe.collect import collect_os_packages

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "ospkgs"
DPKG_ROOT = FIXTURES / "dpkg"
APK_ROOT = FIXTURES / "apk"
SPEC_RE = OsPackages.model_json_schema()["properties"]["packages"]["items"]["pattern"]


def _status() -> str:
    return (DPKG_ROOT / "var/lib/dpkg/status").read_text()


# -- dpkg -----------------------------------------------------------------------------------


def test_dpkg_status_fixture_parses_every_installed_package() -> None:
    pkgs = {p["name"]: p for p in ospkgs.parse_dpkg_status(_status())}
    assert len(pkgs) == 18
    assert pkgs["libc6"]["arch"] == "amd64" and pkgs["libc6"]["source"] == "glibc"
    assert pkgs["adduser"] == {"name": "adduser", "version": "3.134", "arch": "all"}
    assert pkgs["python3-six"]["version"] == "1.16.0-4"


def test_dpkg_skips_removed_packages_that_keep_a_stanza() -> None:
    removed = "Package: oldtool\nStatus: deinstall ok config-files\nArchitecture: amd64\nVersion: 1.0-1\n"
    half = "Package: halfway\nStatus: install ok half-configured\nArchitecture: amd64\nVersion: 2.0\n"
    names = {p["name"] for p in ospkgs.parse_dpkg_status(_status() + "\n" + removed + "\n" + half)}
    # Caught mid-install (dpkg -l "iF"): on disk at its new version, not removed.
    assert "oldtool" not in names and "halfway" in names and "libc6" in names


def test_load_reads_a_root_and_writes_name_arch_version_pins() -> None:
    db = ospkgs.load(str(DPKG_ROOT))
    assert db is not None and db.manager == "dpkg"
    specs = db.specs()
    assert "libc6:amd64=2.36-9+deb12u14" in specs and "python3-six:all=1.16.0-4" in specs
    assert specs == sorted(specs) and len(specs) == 18
    OsPackages(manager="dpkg", packages=specs)  # every pin passes the model


def test_no_database_means_no_table(tmp_path: Path) -> None:
    assert ospkgs.load(str(tmp_path)) is None


def _system_root(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A root with the dpkg fixture and the distributions its file lists name."""
    root = tmp_path / "root"
    shutil.copytree(DPKG_ROOT, root)
    site = "/usr/lib/python3/dist-packages"
    locations = {"six": f"{site}/six-1.16.0.egg-info", "pyyaml": f"{site}/PyYAML-6.0.dist-info",
                 "torch": "/usr/local/lib/python3.11/dist-packages/torch-2.13.0.dist-info",
                 "orphan": f"{site}/orphan-1.0.dist-info"}
    return root, locations


def test_os_owned_distributions_become_system_with_their_package(tmp_path: Path) -> None:
    root, locations = _system_root(tmp_path)
    db = ospkgs.load(str(root))
    assert db is not None
    packages: list[dict[str, Any]] = [
        {"name": "six", "version": "1.16.0", "source": "unknown"},
        {"name": "pyyaml", "version": "6.0", "source": "index", "url": "file:///x"},
        {"name": "torch", "version": "2.13.0", "source": "index", "installer": "pip"},
        {"name": "orphan", "version": "1.0", "source": "index"},
    ]
    assert ospkgs.mark_system(packages, locations, db) == 2
    by = {p["name"]: p for p in packages}
    assert by["six"]["source"] == "system" and by["six"]["os_package"] == "python3-six"
    assert by["six"]["os_package_version"] == "1.16.0-4"
    assert by["pyyaml"]["os_package"] == "python3-yaml" and "url" not in by["pyyaml"]
    # pip's own directory (/usr/local) and a dist no file list names keep what pip said.
    assert by["torch"]["source"] == "index" and "os_package" not in by["torch"]
    assert by["orphan"]["source"] == "index"


def test_a_venv_capture_reads_no_file_list(tmp_path: Path) -> None:
    root, _ = _system_root(tmp_path)
    db = ospkgs.load(str(root))
    assert db is not None
    shutil.rmtree(root / "var/lib/dpkg/info")  # would make any lookup find nothing
    pkgs: list[dict[str, Any]] = [{"name": "six", "version": "1.16.0", "source": "index"}]
    assert ospkgs.mark_system(pkgs, {"six": "/opt/venv/lib/python3.11/site-packages/six-1.16.0.dist-info"}, db) == 0
    assert db.owners([]) == {}


def test_probe_block_returns_the_table_and_marks_dists(tmp_path: Path) -> None:
    root, locations = _system_root(tmp_path)
    packages: list[dict[str, Any]] = [{"name": "six", "version": "1.16.0", "source": "unknown"}]
    doc = collect_os_packages(packages, locations, root=str(root))
    assert doc is not None and doc["manager"] == "dpkg" and len(doc["packages"]) == 18
    assert packages[0]["source"] == "system"


@pytest.mark.parametrize(("site", "expected"), [
    ("/usr/lib/python3/dist-packages", True), ("/usr/lib/python3.12/site-packages", True),
    ("/usr/lib64/python3.9/site-packages", True), ("/usr/local/lib/python3.11/dist-packages", False),
    ("/opt/venv/lib/python3.11/site-packages", False), ("/usr/lib/python3.11", False),
])
def test_system_site_directories(site: str, expected: bool) -> None:
    assert ospkgs.is_system_site(site) is expected


# -- apk and rpm ----------------------------------------------------------------------------


def test_apk_installed_database() -> None:
    db = ospkgs.load(str(APK_ROOT))
    assert db is not None and db.manager == "apk"
    assert db.specs() == ["busybox:x86_64=1.36.1-r29", "musl:x86_64=1.2.5-r0", "py3-numpy:x86_64=1.26.4-r0",
                          "py3-six:noarch=1.16.0-r9", "python3:x86_64=3.12.3-r1"]
    site = "/usr/lib/python3.12/site-packages"
    owners = db.owners([f"{site}/six-1.16.0.dist-info", f"{site}/pip-24.0.dist-info", f"{site}/x-1.dist-info"])
    assert owners == {f"{site}/six-1.16.0.dist-info": ("py3-six", "1.16.0-r9"),
                      f"{site}/pip-24.0.dist-info": ("python3", "3.12.3-r1")}


def test_rpm_query_output_and_runner() -> None:
    out = "glibc\t2.34-100.el9\tx86_64\npython3\t3.9.18-3.el9\tx86_64\ngpg-pubkey\te\t(none)\nbash\t5.1.8-9.el9\tx86_64\n"
    assert [p["name"] for p in ospkgs.parse_rpm_query(out)] == ["glibc", "python3", "bash"]
    calls: list[list[str]] = []

    def run(argv: list[str], timeout: float) -> tuple[int | None, bytes, str]:
        calls.append(argv)
        return 0, out.encode(), ""

    # rpm is asked only for the running system's root, never for another root's files.
    assert ospkgs.load("/nonexistent", run) is None and calls == []


# -- fuzz: arbitrary and structured databases reach the parsers -------------------------------

_name = st.from_regex(r"\A[a-z0-9][a-z0-9+.-]{0,20}\Z")
_version = st.from_regex(r"\A([0-9]:)?[0-9][A-Za-z0-9.+~]{0,10}(-[A-Za-z0-9.+~]{1,6})?\Z")
_arch = st.sampled_from(["amd64", "arm64", "all", "i386"])


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=2000))
def test_parsers_never_raise_and_emit_only_valid_pins(text: str) -> None:
    import re

    for pkgs in (ospkgs.parse_dpkg_status(text), ospkgs.parse_apk_installed(text)[0], ospkgs.parse_rpm_query(text)):
        for p in pkgs:
            s = ospkgs.spec(p["name"], p["arch"], p["version"])
            assert s is None or re.fullmatch(SPEC_RE, s)


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_name, _version, _arch, st.booleans()), max_size=20, unique_by=lambda t: t[0]),
       st.text(alphabet=" abc.\n", max_size=80))
def test_dpkg_stanzas_round_trip(rows: list[tuple[str, str, str, bool]], description: str) -> None:
    desc = "\n".join(" " + (line or ".") for line in description.split("\n"))
    stanzas = [f"Package: {n}\nStatus: {'install ok installed' if ok else 'deinstall ok config-files'}\n"
               f"Architecture: {a}\nVersion: {v}\nDescription: x\n{desc}" for n, v, a, ok in rows]
    parsed = ospkgs.parse_dpkg_status("\n\n".join(stanzas) + "\n")
    assert [(p["name"], p["version"], p["arch"]) for p in parsed] == [(n, v, a) for n, v, a, ok in rows if ok]


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_name, _version), max_size=20, unique_by=lambda t: t[0]))
def test_apk_stanzas_round_trip(rows: list[tuple[str, str]]) -> None:
    text = "\n\n".join(f"C:Q1x=\nP:{n}\nV:{v}\nA:x86_64\nF:usr/lib/python3.12/site-packages/{n}-1.dist-info\n"
                       for n, v in rows)
    parsed, dirs = ospkgs.parse_apk_installed(text)
    assert [(p["name"], p["version"]) for p in parsed] == rows
    assert len(dirs) == len(rows)


# -- model and lockfile ---------------------------------------------------------------------


def test_model_sorts_and_refuses_duplicates_and_bad_pins() -> None:
    table = OsPackages(manager="dpkg", packages=["zlib1g:amd64=1:1.2.13", "adduser:all=3.134"])
    assert table.packages == ["adduser:all=3.134", "zlib1g:amd64=1:1.2.13"]
    assert table.versions()["zlib1g:amd64"] == "1:1.2.13"
    with pytest.raises(ValidationError, match="listed twice"):
        OsPackages(manager="dpkg", packages=["a:amd64=1", "a:amd64=2"])
    for bad in ("a=1", "a:amd64=1;rm", "a:AMD64=1", "-a:amd64=1", "a:amd64=1\n"):
        with pytest.raises(ValidationError):
            OsPackages(manager="dpkg", packages=[bad])


def test_lock_with_os_packages_round_trips_one_pin_per_line() -> None:
    from envlock import lock as lockio

    db = ospkgs.load(str(DPKG_ROOT))
    assert db is not None
    specs = db.document()
    lock = make_lock(os_packages=specs)
    text = lockio.dumps(lock)
    assert "[os_packages]\nmanager = \"dpkg\"\npackages = [\n    \"adduser:all=3.134\",\n" in text
    assert lockio.loads(text) == lock


# -- drift ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "severity"), [
    ("libc6", "breaking"), ("libc6-dev", "breaking"), ("glibc", "breaking"), ("musl", "breaking"),
    ("libcudnn9-cuda-12", "breaking"), ("libnccl2", "breaking"), ("cuda-cudart-12-4", "breaking"),
    ("libcublas-12-4", "breaking"), ("libnvidia-compute-550", "breaking"), ("python3.11", "breaking"),
    ("libpython3.11-minimal", "breaking"), ("python3", "breaking"), ("python3-minimal", "breaking"),
    ("python3-libs", "breaking"),
    ("python3-numpy", "warning"), ("libgl1", "warning"), ("ffmpeg", "warning"), ("tzdata", "warning"),
    ("libcap2", "warning"), ("musl-utils", "warning"),
])
def test_os_package_severity_table(name: str, severity: str) -> None:
    assert os_package_severity(name) == severity


def test_drift_reports_breaking_ones_alone_and_the_rest_in_one_line() -> None:
    base = ["libc6:amd64=2.36-9", "libgl1:amd64=1.6.0-1", "tzdata:all=2024a-0"]
    others = [f"lib{i}:amd64=1.0" for i in range(30)]
    old = make_lock(os_packages={"manager": "dpkg", "packages": base + others})
    new_specs = ["libc6:amd64=2.36-10", "libgl1:amd64=1.7.0-1", "tzdata:all=2024a-0", "ffmpeg:amd64=7:5.1"]
    new = make_lock(os_packages={"manager": "dpkg", "packages": new_specs})
    diffs = compare(old, new).by_category("os_packages")
    assert [(d.path, d.severity) for d in diffs] == [("os_packages.libc6:amd64", "breaking"),
                                                     ("os_packages", "warning")]
    assert diffs[0].describe() == "OS package libc6 2.36-9 -> 2.36-10"
    line = diffs[1].describe()
    assert line.startswith("32 other OS packages differ: 1 changed (libgl1); 1 added (ffmpeg); 30 removed (")
    assert "and 22 more" in line and len(line) < 300
    assert compare(old, old).by_category("os_packages") == ()


def test_drift_when_one_side_has_no_table_or_another_manager() -> None:
    with_table = make_lock(os_packages={"manager": "dpkg", "packages": ["a:amd64=1"]})
    without = make_lock()
    (d,) = compare(with_table, without).by_category("os_packages")
    assert d.severity == "warning" and d.describe() == "OS packages not recorded here"
    apk = make_lock(os_packages={"manager": "apk", "packages": ["a:x86_64=1"]})
    (d,) = compare(with_table, apk).by_category("os_packages")
    assert d.severity == "breaking"


def test_system_dist_fields_compare_as_warnings() -> None:
    row = {"name": "six", "version": "1.16.0", "source": "system", "os_package": "python3-six",
           "os_package_version": "1.16.0-4"}
    old = make_lock(packages=[row])
    new = make_lock(packages=[{**row, "os_package_version": "1.16.0-4+b1"}])
    (d,) = compare(old, new).by_category("packages")
    assert d.path == "packages.six.os_package_version" and d.severity == "warning"


# -- shipped beside the probe ---------------------------------------------------------------


def test_ospkgs_file_is_python38_syntax_and_stdlib_only() -> None:
    import ast
    import sys

    from envlock.probing.process import OSPKGS_PATH

    tree = ast.parse(OSPKGS_PATH.read_text(), feature_version=(3, 8))
    imports = {n.names[0].name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)}
    imports |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imports <= set(sys.stdlib_module_names) | {"__future__"}
    # Restore runs it alone in a build (``ospkgs.py --check``): nothing of the package beside it.
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]


def test_ospkgs_check_runs_as_a_lone_file(tmp_path: Path) -> None:
    """As restore copies it into a build context: the one file, no package around it."""
    import subprocess
    import sys

    from envlock.probing.process import OSPKGS_PATH

    alone = tmp_path / "ospkgs.py"
    alone.write_bytes(OSPKGS_PATH.read_bytes())
    out = subprocess.run([sys.executable, str(alone)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr == "usage: ospkgs.py --check SPEC_FILE\n"


@pytest.mark.skipif(not Path("/var/lib/dpkg/status").exists(), reason="needs a dpkg-based host")
def test_probe_run_by_path_records_this_hosts_packages(tmp_path: Path) -> None:
    import subprocess
    import sys

    from envlock.probing.capture import build_lock
    from envlock.probing.process import PROBE_PATH, parse_document

    out = subprocess.run([sys.executable, str(PROBE_PATH), "--no-torch"], capture_output=True,
                         timeout=120, cwd=tmp_path, check=True)
    doc = parse_document(out.stdout, "")
    assert "os_packages" not in doc["probe"]["errors"]
    lock = build_lock(doc)
    assert lock.os_packages is not None and lock.os_packages.manager == "dpkg"
    expected = ospkgs.load("/")
    assert expected is not None and lock.os_packages.packages == expected.specs()


def test_markdown_diff_keeps_os_packages_to_one_short_row() -> None:
    from envlock.report.render import diff_markdown

    old = make_lock(os_packages={"manager": "dpkg", "packages": [f"lib{i}:amd64=1.0" for i in range(500)]})
    new = make_lock(os_packages={"manager": "dpkg", "packages": [f"lib{i}:amd64=2.0" for i in range(500)]})
    rows = [line for line in diff_markdown(compare(old, new), old, new, "a", "b").splitlines() if "os_packages" in line]
    assert len(rows) == 1 and len(rows[0]) < 400
    assert "lib0 1.0, lib1 1.0" in rows[0] and "and 492 more" in rows[0]


def test_inside_a_venv_restored_onto_another_base_os_packages_are_info(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A venv lock from a host, restored onto the test base: `envlock run` says the image's
    OS packages are the base's, and in-process verify then judges them as restore's check did."""
    from envlock.drift.compare import (
        OS_FROM_BASE_ENV,
        compare,
        os_packages_come_from_base,
        os_packages_from_base,
    )

    host = make_lock(os_packages={"manager": "dpkg", "packages": ["python3.11:amd64=3.11.2-6+deb12u6",
                                                                  "libgl1:amd64=1.6.0-1"]})
    image = make_lock(os_packages={"manager": "dpkg", "packages": ["python3.11:amd64=3.11.2-6"]})
    strict = compare(host, image)
    assert not strict.ok and any(d.path.startswith("os_packages") for d in strict.breaking)
    monkeypatch.delenv(OS_FROM_BASE_ENV, raising=False)
    assert not os_packages_come_from_base()  # the twin: outside such an image, still breaking
    monkeypatch.setenv(OS_FROM_BASE_ENV, "base")
    assert os_packages_come_from_base()
    relaxed = os_packages_from_base(strict)
    assert relaxed.ok and relaxed.count("info") >= 2
    assert all("base image" in (d.message or "") for d in relaxed.differences if d.category == "os_packages")


def test_run_passes_the_os_package_origin_only_for_venvs_on_another_base(restore_lock: LockFactory) -> None:
    from envlock.restore.context import plan
    from envlock.restore.image import Options

    venv_lock = restore_lock()
    on_base = plan(venv_lock, Options(base="python@sha256:" + "a" * 64))
    assert not on_base.os_packages_restored
