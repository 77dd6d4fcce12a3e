"""Two captures of an unchanged environment differ only in created_at and the seal, so a pull
request's diff of env.lock shows what changed and nothing else."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from helpers import run_cli

from envlock import lock as lockio

ALLOWED = ("created_at = ", "integrity = ", "fingerprint = ")


@pytest.mark.slow
def test_two_captures_differ_only_in_time_and_seal(tmp_path: Path) -> None:
    import torch  # noqa: F401 - a pinned dev dependency: without it this test would check nothing, so fail

    for name in ("first.lock", "second.lock"):  # two names: no file name may leak into the text
        res = run_cli("capture", "--canary", "-o", name, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
    a = (tmp_path / "first.lock").read_text().splitlines()
    b = (tmp_path / "second.lock").read_text().splitlines()
    changed = [line[1:] for line in difflib.unified_diff(a, b, lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert all(line.startswith(ALLOWED) for line in changed), changed
    text = "\n".join(a)
    assert "hashes = []" not in text and "duration_ms" not in text and "first.lock" not in text
    lock = lockio.load(tmp_path / "first.lock")
    assert lock.canary is not None and lock.canary.results and lock.probe.duration_ms is None
    assert all(p.hashes == [] for p in lock.packages)
