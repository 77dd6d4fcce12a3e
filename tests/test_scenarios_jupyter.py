"""Scenario matrix h: the notebook workflow, with a real browser.

A venv with torch (CPU) and JupyterLab from the offline wheelhouse is locked, restored, and
started with ``envlock run env.lock --jupyter --workspace DIR``. Debian's headless Chromium,
driven by Selenium through Debian's chromedriver (explicit paths: nothing is downloaded), opens
the lab with the token envlock printed, runs the notebook's cell (Shift+Enter in the editor, as a
person would), which prints the torch version and writes a file into the workspace; both are
asserted, and a screenshot is kept in the artifacts directory the test prints.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomllib
from scenario_steps import Steps, artifacts_dir, envlock, ok, uv_binary, uv_install, uv_venv

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1400,900"]
CELL = ("import pathlib, torch\n"
        "print('torch', torch.__version__)\n"
        "_ = pathlib.Path('from_notebook.txt').write_text('torch ' + torch.__version__)")


def _notebook() -> dict[str, Any]:
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "cells": [{"cell_type": "code", "id": "envlock-check", "metadata": {}, "execution_count": None,
                       "outputs": [], "source": CELL}]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _background(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``envlock run --jupyter``; on the way out, Ctrl-C it as a user would."""
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **env}, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _wait_for_lab(log: Path, proc: subprocess.Popen[bytes], deadline: float) -> str:
    """The lab URL with its token, once the server answers."""
    url = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")
        if url is None:
            m = re.search(r"JupyterLab: (http://\S+/lab\?token=[0-9a-f]+)", log.read_text(errors="replace"))
            url = m.group(1) if m else None
        if url is not None:
            base, token = url.split("/lab?token=")
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as resp:
                if resp.status == 200:
                    return url
        time.sleep(1)
    raise AssertionError("JupyterLab did not come up:\n" + log.read_text(errors="replace")[-3000:])


def _browser(shot: Path, url: str, notebook: str, expect: str) -> str:
    """Open the notebook in headless Chromium, run its cell, return the cell's output text."""
    from selenium import webdriver
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
        TimeoutException,
    )
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    profile = shot.parent / "chromium-profile"
    shutil.rmtree(profile, ignore_errors=True)
    profile.mkdir(parents=True)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        base, token = url.split("/lab?token=")
        driver.get(f"{base}/lab/tree/{notebook}?token={token}")
        # JupyterLab re-renders the notebook while it loads: an element found a moment ago can be
        # replaced before it is used, so every step finds, checks and acts in one retried call.
        wait = WebDriverWait(driver, 180, ignored_exceptions=(NoSuchElementException,
                                                              StaleElementReferenceException))

        def click_editor(d: Any) -> bool:
            # On a loaded machine the kernel can attach after the first Shift+Enter, and
            # JupyterLab then asks which kernel to use in a modal dialog that takes every click:
            # accept its default (the notebook's own kernel) and try again.
            for accept in d.find_elements(By.CSS_SELECTOR, ".jp-Dialog .jp-mod-accept"):
                if accept.is_displayed():
                    accept.click()
                    return False
            editor = d.find_element(By.CSS_SELECTOR, ".jp-Notebook .jp-Cell .cm-content")
            if not (editor.is_displayed() and editor.is_enabled()):
                return False
            editor.click()
            return True

        def output_text(d: Any) -> str | None:
            text = " ".join(e.text for e in d.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output"))
            return text if expect in text else None

        # A cell run before the kernel is ready waits for it; no need to watch the kernel. But a
        # re-render right after the click takes the focus with it and the keys go nowhere, so
        # the run is repeated (the cell is idempotent) until its output shows or time is up.
        deadline = time.monotonic() + 180
        output = None
        while output is None:
            wait.until(click_editor)
            ActionChains(driver).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
            attempt = WebDriverWait(driver, max(1.0, min(30.0, deadline - time.monotonic())),
                                    ignored_exceptions=(StaleElementReferenceException,))
            try:
                output = attempt.until(output_text)
            except TimeoutException:
                if time.monotonic() >= deadline:
                    raise
        driver.save_screenshot(str(shot))
        return output
    except Exception:
        with contextlib.suppress(Exception):
            driver.save_screenshot(str(shot))
        raise
    finally:
        driver.quit()


@pytest.mark.timeout(1800)  # the first build of the torch + JupyterLab image on a busy machine
def test_h_notebook_in_a_restored_environment(tmp_path: Path, base_image: str, wheelhouse: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    for tool in (CHROMIUM, CHROMEDRIVER):
        assert Path(tool).exists(), f"{tool} missing (scripts/test.sh installs chromium and chromium-driver)"
    steps = Steps("h notebook (JupyterLab + Chromium)", capsys)
    venv = tmp_path / ".venv"
    uv = uv_binary()
    with steps.step("setup"):
        uv_venv(venv)
        uv_install(venv, wheelhouse, "torch==2.13.0+cpu", "jupyterlab==4.6.6", timeout=900)
    lock = tmp_path / "env.lock"
    with steps.step("capture"):
        ok(envlock("capture", "--python", str(venv), "-o", str(lock), cwd=tmp_path))
    pkgs = {p["name"]: p["version"] for p in tomllib.loads(lock.read_text())["packages"]}
    assert pkgs["torch"] == "2.13.0+cpu" and pkgs["jupyterlab"] == "4.6.6"
    with steps.step("verify"):
        ok(envlock("verify", str(lock), "--python", str(venv), cwd=tmp_path))
    with steps.step("change + verify"):
        subprocess.run([uv, "pip", "uninstall", "-q", "--python", str(venv / "bin" / "python"), "json5"],
                       check=True, timeout=120)
        out = ok(envlock("verify", str(lock), "--python", str(venv), cwd=tmp_path), 1)
        assert "json5" in out, out
    # A fixed venv path keeps the build context, and so the image cache key, the same from run to
    # run: the torch + JupyterLab image (~1.3 GB) is built by the first run on a machine only.
    common = [str(lock), "--base", base_image, "--wheelhouse", str(wheelhouse), "--name", "scenario-h",
              "--venv", "/opt/venv"]
    with steps.step("restore"):
        out = ok(envlock("restore", *common, "--no-verify", cwd=tmp_path))
        assert "built in" in out or "cache hit" in out, out
    with steps.step("verify inside"):
        assert "OK: the environment matches the lock" in ok(envlock("restore", *common, cwd=tmp_path))

    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "check.ipynb").write_text(json.dumps(_notebook()))
    shots = artifacts_dir() / "scenario-h"
    shots.mkdir(parents=True, exist_ok=True)
    shot = shots / "jupyterlab.png"
    port = _free_port()
    argv = [sys.executable, "-m", "envlock", "run", *common, "--jupyter", "--workspace", str(workspace),
            "--gpus", "none", "-p", f"127.0.0.1:{port}:8888"]
    env = {"ENVLOCK_PLAIN_PROGRESS": "1", "XDG_CACHE_HOME": str(tmp_path / ".cache")}
    log = tmp_path / "jupyter.log"
    with _background(argv, tmp_path, env, log) as proc:
        with steps.step("run --jupyter (server up)"):
            url = _wait_for_lab(log, proc, time.monotonic() + 240)
            assert url.startswith(f"http://127.0.0.1:{port}/lab?token=")
        with steps.step("run --jupyter (Chromium runs the cell)"):
            output = _browser(shot, url, "check.ipynb", "torch 2.13.0+cpu")
    with capsys.disabled():
        sys.stdout.write(f"\n[scenario h] screenshot: {shot}\n")
    assert "torch 2.13.0+cpu" in output
    assert (workspace / "from_notebook.txt").read_text() == "torch 2.13.0+cpu"
    assert shot.stat().st_size > 10_000
    assert proc.returncode is not None
