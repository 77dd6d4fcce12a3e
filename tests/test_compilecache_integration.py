"""A compile cache and the lock's restored image, with a real engine and real torch (CPU).

A cache compiled on this host by the wheelhouse's torch (the image's) is loaded before the
command starts, by the image's own interpreter, into a fresh Inductor directory that the
command finds named by ``TORCHINDUCTOR_CACHE_DIR``, as the caller's uid; a cache the command
saves is collected to the host. (The test base image has no C++ compiler, which Inductor needs
even to use a cached CPU kernel, so the compile that hits is ``test_compilecache_torch.py``'s,
on this host.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, needs_tool
from test_replay_integration import torch_image  # noqa: F401 - the module's torch image fixture
from test_restore_integration import capture, no_leftover_containers

from envlock.commands import main
from envlock.replay.compilecache import read_cache

pytestmark = pytest.mark.integration

COMPILE = """
import sys, torch
from envlock.probe import compilecache
out = torch.compile(lambda x: (torch.sin(x) * 0.3 + x.cos()).sum(dim=0))(torch.arange(64.0).reshape(8, 8) / 7)
assert compilecache.save(sys.argv[1]) is not None
"""

INSIDE = """
import json, os
d = os.environ["TORCHINDUCTOR_CACHE_DIR"]
print(json.dumps({"dir": d, "entries": sorted(os.listdir(d)), "uid": os.getuid(),
                  "loaded": os.environ.get("ENVLOCK_COMPILE_CACHE_LOADED")}))
"""

SAVES = """
import os
from envlock.probe import compilecache
compilecache.write(os.environ["ENVLOCK_COMPILE_CACHE_OUT"], {"torch": "2.13.0+cpu", "triton": None,
                   "artifacts": {"inductor": 1}}, b"compiled in the image")
"""


def test_run_loads_a_compile_cache_in_the_image_and_collects_one(
        docker_client: Any, base_image: str, wheelhouse: Path, torch_image: str,  # noqa: F811
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    needs_tool("g++")  # this host's compile, which makes the cache
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("ENVLOCK_PLAIN_PROGRESS", "1")
    ws = tmp_path / "ws"
    ws.mkdir()
    # envlock reaches the image through the workspace; the image holds only the lock's packages.
    shutil.copytree(REPO / "envlock", ws / "envlock", ignore=shutil.ignore_patterns("__pycache__"))
    capture(torch_image, ws / "env.lock")
    cache = tmp_path / "compiled.cache"
    subprocess.run([sys.executable, "-c", COMPILE, str(cache)], check=True, timeout=600,
                   env={**os.environ, "PYTHONPATH": str(REPO), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cold")})
    digest = read_cache(cache).sha256
    common = [str(ws / "env.lock"), "--base", base_image, "--wheelhouse", str(wheelhouse),
              "--name", "it-compile-cache", "--context-dir", str(tmp_path / "work"), "--workspace", str(ws)]
    capfd.readouterr()

    assert main(["run", *common, "--compile-cache", str(cache), "--", "python", "-c", INSIDE]) == 0
    out, err = capfd.readouterr()
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["dir"] == "/envlock-compile/inductor" and seen["uid"] == os.getuid(), err
    assert {"fxgraph", "aotautograd"} <= set(seen["entries"]), seen
    assert seen["loaded"] == f"{digest}:/envlock-compile/inductor"
    assert f"loading the compile cache {cache} {digest[:12]}" in err

    saved = tmp_path / "saved.cache"
    assert main(["run", *common, "--save-compile-cache", str(saved), "--", "python", "-c", SAVES]) == 0
    assert read_cache(saved).header["artifacts"] == {"inductor": 1}
    assert "saved the compile cache" in capfd.readouterr().err
    no_leftover_containers(docker_client)
