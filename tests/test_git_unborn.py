"""A git repository with no commit yet is recorded as such (no commit, its branch, its files
untracked), not as a failed ``git rev-parse``; a repository git cannot read still is."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from envlock.probe import git


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_a_repository_with_no_commit(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q", "-b", "trunk")
    (tmp_path / "train.py").write_text("print(1)\n")
    info, err = git.GitJob(str(tmp_path), 10).collect()
    assert err is None
    assert info is not None and info.get("commit") is None
    assert info["branch"] == "trunk" and info["untracked"] == 1


def test_twin_any_other_failure_is_still_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "git"
    broken.write_text("#!/bin/sh\necho 'fatal: something broke' >&2\nexit 128\n")
    broken.chmod(0o755)
    monkeypatch.setenv("ENVLOCK_GIT", str(broken))
    info, err = git.GitJob(str(tmp_path), 10).collect()
    assert info is None and err == "git rev-parse failed: fatal: something broke"
