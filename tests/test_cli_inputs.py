"""Exit codes for what the user typed (2) and what the environment lacks (3), and what
``capture --json -o -`` prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO, run_cli

from envlock import lock as lockio


def test_bad_image_digest_is_a_usage_error_naming_the_option(tmp_path: Path) -> None:
    res = run_cli("capture", "--no-torch", "--image", "ref@sha256:abc", cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("envlock: error: --image 'ref@sha256:abc'")
    assert "probe" not in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "env.lock").exists()


def test_good_image_digest_is_recorded(tmp_path: Path) -> None:
    digest = "sha256:" + "ab" * 32
    res = run_cli("capture", "--no-torch", "--image", f"registry.example/team/img:1.0@{digest}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    image = lockio.load(tmp_path / "env.lock").image
    assert (image.reference, image.digest, image.source) == ("registry.example/team/img:1.0", digest, "cli")


def test_capture_json_to_stdout_prints_json(tmp_path: Path) -> None:
    res = run_cli("capture", "--no-torch", "--json", "-o", "-", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["envlock"]["fingerprint"].startswith("sha256:") and doc["packages"]
    assert list(tmp_path.iterdir()) == []


def _run_without_torch(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # torch stays installed on this machine; blocking its import is how a process without it
    # looks to envlock (find_spec answers None, as for an absent package).
    code = ("import sys; sys.modules['torch'] = None\n"
            "from envlock.commands import main\n"
            f"sys.exit(main({list(argv)!r}))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_canary_without_torch_is_an_environment_problem(tmp_path: Path) -> None:
    res = _run_without_torch("canary", cwd=tmp_path)
    assert res.returncode == 3, res.stderr
    assert "torch" in res.stderr and "Traceback" not in res.stderr


def test_canary_under_an_interpreter_without_torch_exits_3(tmp_path: Path) -> None:
    # A fresh venv sees no site-packages but its own, which hold nothing: no torch, wherever
    # this interpreter came from.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=120)
    bare = str(tmp_path / "venv" / "bin" / "python")
    has_torch = subprocess.run([bare, "-c", "import torch"], capture_output=True, check=False).returncode == 0
    assert not has_torch
    res = run_cli("canary", "--python", bare, cwd=tmp_path)
    assert res.returncode == 3, res.stderr
    assert "torch is not installed" in res.stderr
