"""The Dockerfile's rebuild line names the tag restore builds (envlock/<name>:<id>, the name
from --name or the lock's directory), not always envlock/env."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import LockFactory

from envlock.commands import main
from envlock.lock import save


@pytest.mark.parametrize(("name", "expected"), [(None, "my-project"), ("Paper v2", "paper-v2")])
def test_the_rebuild_line_names_the_built_tag(restore_lock: LockFactory, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str],
                                             name: str | None, expected: str) -> None:
    project = tmp_path / "My Project"
    project.mkdir()
    lock = save(restore_lock(packages=[("six", "1.17.0")]), project / "env.lock")
    args = ["restore", str(lock), "--dockerfile-only", str(tmp_path / "ctx"), "--allow-unpinned-base"]
    assert main(args + (["--name", name] if name else [])) == 0
    said = capsys.readouterr().out
    built = re.search(r"docker build -t (envlock/[^ ]+) ", said)
    assert built is not None and built.group(1).startswith(f"envlock/{expected}:")
    dockerfile = (tmp_path / "ctx" / "Dockerfile").read_text()
    assert f"docker build -t {built.group(1)} ." in dockerfile
