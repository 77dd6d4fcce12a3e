"""A lock that differs from a restored one by one small package reuses the torch layer.

The torch lock is restored once (offline, from the test wheelhouse); then the same lock with
six at another version (its record_sha256 taken from that wheel, re-sealed with ``fmt``) is
restored again. The engine's layer cache must serve everything up to and including the torch
layer: the build log shows the torch layer's steps as cache hits.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from envlock.commands import main
from envlock.restore.wheelhouse import wheel_record_sha256

from test_restore_integration import TORCH, build_source_image, capture, purge  # isort: skip

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _with_other_six(lock_text: str, wheelhouse: Path) -> str:
    """The lock with six 1.16.0 instead of 1.17.0 (and that wheel's build)."""
    wheel = next(wheelhouse.glob("six-1.16.0-*.whl"))
    block = re.search(r'\[\[packages\]\]\nname = "six"\n.*?(?=\n\n|\Z)', lock_text, re.S)
    assert block is not None
    new = re.sub(r'version = "1\.17\.0"', 'version = "1.16.0"', block.group(0))
    new = re.sub(r'record_sha256 = "[0-9a-f]+"', f'record_sha256 = "{wheel_record_sha256(wheel)}"', new)
    new = re.sub(r'\nhashes = \[[^\]]*\]', "", new)
    return lock_text.replace(block.group(0), new)


def test_one_small_package_changed_reuses_the_torch_layer(
        docker_client: Any, base_image: str, wheelhouse: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("ENVLOCK_PLAIN_PROGRESS", "1")
    source = build_source_image(docker_client, base_image, wheelhouse, TORCH,
                                {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, "envlock-test/src-torch")
    (tmp_path / "a").mkdir()
    first_lock = capture(source, tmp_path / "a" / "env.lock")
    (tmp_path / "b").mkdir()
    second_path = tmp_path / "b" / "env.lock"
    second_path.write_text(_with_other_six((tmp_path / "a" / "env.lock").read_text(), wheelhouse))
    assert main(["fmt", str(second_path)]) == 0
    from envlock.lock import load

    second_lock = load(second_path)
    assert second_lock.short_id != first_lock.short_id
    common = ["--base", base_image, "--wheelhouse", str(wheelhouse), "--name", "it-speed"]
    tags = [f"envlock/it-speed:{first_lock.short_id}", f"envlock/it-speed:{second_lock.short_id}"]
    try:
        for lock in (first_lock, second_lock):
            purge(docker_client, str(lock.envlock.fingerprint))
        capfd.readouterr()
        t0 = time.monotonic()
        assert main(["restore", str(tmp_path / "a" / "env.lock"), *common, "--context-dir",
                     str(tmp_path / "ctx-a")]) == 0
        first = time.monotonic() - t0
        t0 = time.monotonic()
        code = main(["restore", str(second_path), *common, "--context-dir", str(tmp_path / "ctx-b")])
        second = time.monotonic() - t0
        out, err = capfd.readouterr()
        assert code == 0, out + err
        log = (tmp_path / "ctx-b" / "build.log").read_text()
        # The torch layer's RUN and everything before it came from the cache.
        torch_run = log.index("torch")
        assert "Using cache" in log[torch_run:torch_run + 2000], log[:3000]
        # What is left is the context upload (the torch wheel), the final stage's copy of the
        # venv out of the build stage and the check inside (which imports torch).
        assert second < first, (first, second)
        if os.environ.get("ENVLOCK_REPORT_TIMINGS"):
            sys.stderr.write(f"torch lock: first restore {first:.1f}s, one package changed {second:.1f}s\n")
    finally:
        for tag in tags:
            try:
                docker_client.images.remove(tag, force=True)
            except Exception:
                pass
