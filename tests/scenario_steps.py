"""The scenario matrix's shared walk: timed steps, the CLI as a user runs it, restore → run.

Every scenario goes capture → verify (0) → one change → verify (1, naming it) → restore into a
container → verify inside (0) → ``envlock run`` a command importing the locked packages. A step
that does not apply to a setup is recorded with the reason (``Steps.not_applicable``), never
skipped silently. Each step's seconds are printed live (``[scenario c] capture: 0.9 s``) and
appended as one JSON line to ``<artifacts>/scenarios.jsonl`` so the matrix can be tabulated.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, run_cli


def artifacts_dir() -> Path:
    """Where scenario figures and screenshots are kept (``ENVLOCK_TEST_ARTIFACTS`` overrides)."""
    raw = os.environ.get("ENVLOCK_TEST_ARTIFACTS") or os.path.join(tempfile.gettempdir(),
                                                                    "envlock-test-artifacts")
    path = Path(raw)
    path.mkdir(parents=True, exist_ok=True)
    return path


class Steps:
    """Times the steps of one scenario and says what each one did."""

    def __init__(self, scenario: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.scenario = scenario
        self.capsys = capsys
        self.rows: list[dict[str, Any]] = []

    def _say(self, text: str) -> None:
        with self.capsys.disabled():
            sys.stdout.write(f"\n[scenario {self.scenario}] {text}")
            sys.stdout.flush()

    def _record(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        with (artifacts_dir() / "scenarios.jsonl").open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"scenario": self.scenario, **row}) + "\n")

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        ok = False
        try:
            yield
            ok = True
        finally:
            seconds = round(time.monotonic() - t0, 2)
            self._record({"step": name, "result": "pass" if ok else "fail", "seconds": seconds})
            self._say(f"{name}: {'pass' if ok else 'FAIL'} {seconds:.1f} s")

    def not_applicable(self, name: str, why: str) -> None:
        self._record({"step": name, "result": "n/a", "why": why})
        self._say(f"{name}: n/a - {why}")


def envlock(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 900
            ) -> subprocess.CompletedProcess[str]:
    """``python -m envlock ARGS`` with plain progress lines and a private restore cache."""
    full = {"ENVLOCK_PLAIN_PROGRESS": "1", "XDG_CACHE_HOME": str(cwd / ".cache"), **(env or {})}
    return run_cli(*args, cwd=cwd, env=full, timeout=timeout)


def ok(res: subprocess.CompletedProcess[str], code: int = 0) -> str:
    """The run's stdout after checking its exit code; both streams in the failure message."""
    assert res.returncode == code, f"exit {res.returncode} (wanted {code})\n{res.stdout}\n{res.stderr}"
    assert "Traceback" not in res.stderr, res.stderr
    return res.stdout


def uv_binary() -> str:
    """uv from the test venv (the dev extra installs it), else from PATH."""
    here = Path(sys.executable).parent / "uv"
    found = str(here) if here.exists() else shutil.which("uv")
    assert found, "uv is not installed (scripts/test.sh installs it with the dev extra)"
    return found


def uv_venv(venv: Path) -> None:
    """A venv made by uv (no pip in it) from the base image's python3 version."""
    subprocess.run([uv_binary(), "venv", "-q", "--python", debian_python(), str(venv)], check=True, timeout=120)


def uv_install(venv: Path, wheelhouse: Path, *specs: str, timeout: float = 300) -> None:
    """``uv pip install`` into ``venv``, offline, from the test wheelhouse only."""
    subprocess.run([uv_binary(), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "--offline",
                    "--no-index", "--find-links", str(wheelhouse), *specs], check=True, timeout=timeout)


def debian_python() -> str:
    """The interpreter the scenario venvs are made from: the base image's own python3 version.

    The base image is Debian bookworm's python3; the host's /usr/bin/python3 is the same build
    on the Debian hosts the suite runs on, so a restore into the base image is like for like.
    """
    for candidate in ("/usr/bin/python3", sys.executable):
        if Path(candidate).exists():
            return candidate
    raise AssertionError("no python3")


def restore_verify_run(steps: Steps, lock: Path, *, base: str, wheelhouse: Path, name: str,
                       code: str, expect: str, extra: tuple[str, ...] = (),
                       run_extra: tuple[str, ...] = ()) -> None:
    """restore (build) → verify inside (0) → ``envlock run`` CODE, whose output holds EXPECT.

    ``extra`` goes to every command, ``run_extra`` to ``envlock run`` only.
    """
    common = [str(lock), "--base", base, "--wheelhouse", str(wheelhouse), "--name", name, *extra]
    cwd = lock.parent
    with steps.step("restore"):
        out = ok(envlock("restore", *common, "--no-cache", "--no-verify", cwd=cwd))
        assert "built in" in out
    with steps.step("verify inside"):
        out = ok(envlock("restore", *common, cwd=cwd))
        assert "cache hit" in out and "OK: the environment matches the lock" in out, out
    workspace = cwd / "workspace"
    workspace.mkdir(exist_ok=True)
    with steps.step("run"):
        out = ok(envlock("run", *common, "--workspace", str(workspace), "--gpus", "none",
                         *run_extra, "--",
                         "python", "-c", code, cwd=cwd))
        assert expect in out, out


def build_nvml_standin(out: Path) -> Path:
    """Compile tests/nvml_standin.c into OUT/libnvidia-ml.so.1; returns OUT (for LD_LIBRARY_PATH)."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    assert gcc, "gcc is needed to build the NVML stand-in (scripts/test.sh installs it)"
    subprocess.run([gcc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(out / "libnvidia-ml.so.1"),
                    str(REPO / "tests" / "nvml_standin.c")], check=True, timeout=120)
    return out
