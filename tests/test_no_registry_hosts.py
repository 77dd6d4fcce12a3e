"""No package registry's host name in any tracked file.

envlock leaves the default index to pip's and uv's configuration, reads PyTorch's wheel index
from ``ENVLOCK_TORCH_INDEX_URL``, and scripts/test.sh reads its mirrors from the machine's apt
sources: a registry address written into the repository would be used (or copied) behind the
configuration's back. Tests use hosts under ``.example`` or 127.0.0.1; prose says "PyPI" or
"PyTorch's wheel index" in words.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from helpers import REPO

# Written in parts, so that this file does not name them either.
_HOSTS = tuple(".".join(parts) for parts in (
    ("deb", "debian", "org"), ("security", "debian", "org"), ("ftp", "debian", "org"),
    ("archive", "ubuntu", "com"), ("security", "ubuntu", "com"), ("ports", "ubuntu", "com"),
    ("pypi", "org"), ("pythonhosted", "org"), ("download", "pytorch", "org"),
    ("anaconda", "org"), ("repo", "anaconda", "com"), ("repo", "anaconda", "cloud"),
    ("pypi", "nvidia", "com"), ("registry", "npmjs", "org"),
))
# A host or any subdomain of it (upload.<pypi>, files.<pythonhosted>), not a longer name that
# merely ends the same way.
_PATTERN = re.compile(
    r"(?<![a-z0-9-])(?:[a-z0-9-]+\.)*(?:" + "|".join(re.escape(h) for h in _HOSTS) + r")(?![a-z0-9-])",
    re.IGNORECASE)


def _tracked_files() -> list[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=False)
    if out.returncode != 0:
        pytest.skip("not a git checkout: " + out.stderr.decode(errors="replace").strip())
    return [name for name in out.stdout.decode().split("\0") if name]


def test_the_pattern_finds_each_host_and_its_subdomains_only() -> None:
    for host in _HOSTS:
        assert _PATTERN.search(f"see https://{host}/simple")
        assert _PATTERN.search(f"url = 'http://mirror.{host.upper()}/x'")
        assert not _PATTERN.search(f"https://{host.replace('.', '-')}.example/simple")
        assert not _PATTERN.search(f"https://not{host}/")


def test_no_tracked_file_names_a_package_registry_host() -> None:
    files = _tracked_files()
    assert "pyproject.toml" in files and "scripts/test.sh" in files  # the listing is the repo's
    found = []
    for name in files:
        path = REPO / name
        if not path.is_file():  # deleted in the work tree, or a submodule
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            for m in _PATTERN.finditer(line):
                found.append(f"{name}:{lineno}: {m.group(0)}")
    assert not found, "package registry host names (use configuration, or a host under .example):\n" + "\n".join(found)
