"""The probe, as envlock ships it into an image, runs under Python 3.8, 3.9 and 3.10.

Images keep their own interpreter, and many still have an old one: the syntax check in the
probe's tests cannot see a standard-library call that 3.8 lacks, so the probe really runs here.
PyPI has no interpreters; ``scripts/test.sh`` builds one minbase root per version from the
distribution release that ships it (Ubuntu focal, Debian bullseye, Ubuntu jammy) and names them
in ENVLOCK_TEST_OLD_PYTHONS (``"3.8=DIR 3.9=DIR 3.10=DIR"``); the probe runs there with chroot.
An interpreter on PATH (or from pyenv) is used too, so a developer's machine needs no root.

A missing interpreter skips the test on a developer's machine, and fails it when it was
required: ``scripts/test.sh`` sets ENVLOCK_REQUIRE_OLD_PYTHONS to the versions it provided
(it builds the Ubuntu ones only where the machine has an Ubuntu mirror), ``1`` requires all,
and in CI (CI set) every version named in ENVLOCK_TEST_OLD_PYTHONS is required: there a skip
would be a green run that never ran the probe under an interpreter the run was given.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REPO

from envlock.probing.capture import build_lock
from envlock.probing.process import parse_document

# The interpreters come from scripts/test.sh's setup, which the unit phase does not need.
pytestmark = pytest.mark.slow

OLD_VERSIONS = ("3.8", "3.9", "3.10")


def ship_probe(dest: Path) -> list[str]:
    """Lay the probe into ``dest`` the way envlock ships it into a container; return the
    arguments, relative to ``dest``'s contents, that run it after the interpreter.

    The one place that knows how the probe is shipped: it follows the restore code's own list
    of files, so a change to how the probe is packed changes this test with it.
    """
    from envlock.restore.verify import PROBE_DIR, probe_files

    for name, data in probe_files().items():
        target = dest / Path(name).relative_to(Path(PROBE_DIR).parent)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return [Path(PROBE_DIR).name]  # run as ``python DIR``


@dataclass(frozen=True)
class OldPython:
    version: str
    exe: str
    root: Path | None = None  # a chroot directory holding ``exe``; None: ``exe`` runs here

    def run_probe(self, *args: str, script: str | None = None) -> subprocess.CompletedProcess[bytes]:
        """Ship the probe where this interpreter can read it and run it with ``args``
        (``script``: run that Python source instead, next to the shipped probe)."""
        base = self.root / "tmp" if self.root else Path(tempfile.gettempdir())
        with tempfile.TemporaryDirectory(prefix="envlock-probe-", dir=base) as tmp:
            entry = ship_probe(Path(tmp))
            if script is not None:
                (Path(tmp) / "script.py").write_text(script)
                entry = ["script.py"]
            if self.root is None:
                argv = [self.exe, *(str(Path(tmp) / e) for e in entry), *args]
            else:
                inside = "/" + str(Path(tmp).relative_to(self.root))
                argv = ["chroot", str(self.root), self.exe, *(f"{inside}/{e}" for e in entry), *args]
            return subprocess.run(argv, capture_output=True, timeout=120, check=False,
                                  cwd=tmp, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})


def _provided() -> set[str]:
    """The versions ENVLOCK_TEST_OLD_PYTHONS names."""
    return {item.partition("=")[0] for item in os.environ.get("ENVLOCK_TEST_OLD_PYTHONS", "").split()}


def _required(version: str) -> bool:
    """Whether a missing ``version`` fails the test instead of skipping it."""
    want = os.environ.get("ENVLOCK_REQUIRE_OLD_PYTHONS", "").replace(",", " ").split()
    if want == ["1"] or version in want:
        return True
    ci = os.environ.get("CI", "").lower()
    return ci not in ("", "0", "false", "no") and version in _provided()


def _runs(argv: list[str]) -> bool:
    try:
        return subprocess.run([*argv, "-c", "pass"], capture_output=True, timeout=60, check=False).returncode == 0
    except OSError:
        return False


def find_old_python(version: str) -> OldPython | None:
    for item in os.environ.get("ENVLOCK_TEST_OLD_PYTHONS", "").split():
        ver, _, root = item.partition("=")
        if ver == version and os.geteuid() == 0 and _runs(["chroot", root, f"/usr/bin/python{version}"]):
            return OldPython(version, f"/usr/bin/python{version}", Path(root))
    candidates = sorted(glob.glob(str(Path.home() / f".pyenv/versions/{version}.*/bin/python{version}")))
    candidates.append(shutil.which(f"python{version}") or "")
    for exe in candidates:
        # pyenv shims exist for versions that are not active; only keep ones that run.
        if exe and _runs([exe]):
            return OldPython(version, exe)
    return None


@pytest.mark.parametrize("version", OLD_VERSIONS)
def test_probe_runs_under_older_interpreters(version: str) -> None:
    python = find_old_python(version)
    if python is None:
        where = "ENVLOCK_TEST_OLD_PYTHONS (as root), pyenv or PATH"
        if _required(version):
            pytest.fail(f"Python {version} not found in {where}; scripts/test.sh installs it", pytrace=False)
        pytest.skip(f"Python {version} not found in {where}; scripts/test.sh installs it")
    out = python.run_probe("--no-torch")
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    doc = parse_document(out.stdout, "")
    lock = build_lock(doc)
    assert lock.python.version.startswith(version + ".")
    assert str(REPO) not in json.dumps(doc.get("packages", []))


# What platform and sysconfig say under that interpreter: the probe records their answers,
# field by field, on every Python it supports.
_REFERENCE = """
import json, platform, sys, sysconfig
print(json.dumps({"os": platform.system() or sys.platform, "machine": platform.machine(),
                  "kernel": platform.release(), "version": platform.python_version(),
                  "soabi": sysconfig.get_config_var("SOABI"), "platform_tag": sysconfig.get_platform()}))
"""


@pytest.mark.parametrize("version", OLD_VERSIONS)
def test_platform_facts_equal_platform_and_sysconfig(version: str) -> None:
    python = find_old_python(version)
    if python is None:
        if _required(version):
            pytest.fail(f"Python {version} not found; scripts/test.sh installs it", pytrace=False)
        pytest.skip(f"Python {version} not found; scripts/test.sh installs it")
    out = python.run_probe("--no-torch", "--no-cache")
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    doc = parse_document(out.stdout, "")
    ref = python.run_probe(script=_REFERENCE)
    assert ref.returncode == 0, ref.stderr.decode(errors="replace")
    expected = json.loads(ref.stdout)
    got = {k: doc["platform"].get(k) for k in ("os", "machine", "kernel")}
    got.update({k: doc["python"].get(k) for k in ("version", "soabi", "platform_tag")})
    assert got == expected
