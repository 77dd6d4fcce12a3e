"""The report pages as a reader sees them: Debian's headless Chromium (``scripts/test.sh``
installs chromium and chromium-driver; explicit paths, nothing is downloaded), driven by
Selenium, opens each page from disk with the network unreachable and records what the browser
logged and requested. A page passes when nothing was logged at error level (a blocked script
or fetch is a Content-Security-Policy error), nothing but the page itself was requested, every
plot is drawn (its SVG laid out, and the original's and the replay's colours in the pixels),
and the verdict and the first divergence are on it. Cases: a diverged replay, a reproduced one,
a failed command, and a 100,000-step record of five metrics (whose render time is printed).
A twin page with a script and a remote image shows that both are caught. Each full-page
screenshot is kept in the artifacts directory (``ENVLOCK_TEST_ARTIFACTS``)."""

from __future__ import annotations

import base64
import io
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scenario_steps import artifacts_dir
from test_report_page import record

from envlock.commands import main
from envlock.replay.record import Meta, Record, Step
from envlock.report.plot import ORIGINAL, REPLAY

pytestmark = pytest.mark.slow

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# No network: every host resolves to nothing and every proxy is a closed port.
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-quic",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9",
         "--window-size=1300,1000"]


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    for tool in (CHROMIUM, CHROMEDRIVER):
        assert Path(tool).exists(), f"{tool} missing (scripts/test.sh installs chromium and chromium-driver)"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _open(driver: Any, page: Path, shot: str) -> dict[str, Any]:
    """Open ``page``; what the browser logged, requested and drew, and the screenshot."""
    from PIL import Image
    from selenium.webdriver.common.by import By

    driver.get_log("browser")
    driver.get_log("performance")
    url = page.resolve().as_uri()
    start = time.monotonic()
    driver.get(url)  # returns once the page has loaded
    seconds = time.monotonic() - start
    errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    requests = [m["params"]["request"]["url"] for m in
                (json.loads(e["message"])["message"] for e in driver.get_log("performance"))
                if m["method"] == "Network.requestWillBeSent"]
    figures = driver.find_elements(By.CSS_SELECTOR, "figure > svg")
    drawn = [f for f in figures if f.size["width"] > 200 and f.size["height"] > 100
             and f.find_elements(By.CSS_SELECTOR, "path")]
    png = base64.b64decode(driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True})["data"])
    path = artifacts_dir() / f"report-{shot}.png"
    path.write_bytes(png)
    colours = {c for _, c in Image.open(io.BytesIO(png)).convert("RGB").getcolors(maxcolors=1 << 24) or []}
    verdict = driver.find_element(By.ID, "verdict").text if driver.find_elements(By.ID, "verdict") else ""
    first = driver.find_elements(By.ID, "first-divergence")
    return {"errors": errors, "requests": requests, "url": url, "figures": len(figures), "drawn": len(drawn),
            "colours": colours, "verdict": verdict, "first": first[0].text if first else "",
            "seconds": seconds, "shot": path}


def _rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def _clean(seen: dict[str, Any]) -> None:
    assert seen["errors"] == [], seen["errors"]
    assert set(seen["requests"]) <= {seen["url"]}, seen["requests"]
    assert seen["figures"] and seen["drawn"] == seen["figures"], seen
    assert _rgb(ORIGINAL) in seen["colours"], seen["shot"]


def _replay(tmp_path: Path, a: Record, b: Record, expect: int) -> Path:
    a.save(tmp_path / "a.record")
    b.save(tmp_path / "b.record")
    page = tmp_path / "replay.html"
    assert main(["replay", str(tmp_path / "a.record"), "--against", str(tmp_path / "b.record"),
                 "--report", str(page)]) == expect
    return page


def test_a_diverged_replay_shows_both_curves_the_step_and_the_cause(browser: Any, tmp_path: Path) -> None:
    losses = [2.0 * math.exp(-i / 40) for i in range(200)]
    changed = [v + (1e-9 * (i - 119) ** 2 if i >= 120 else 0.0) for i, v in enumerate(losses)]
    page = _replay(tmp_path, record(losses, names=("loss", "acc"), context={"env.OMP_NUM_THREADS": "4"}),
                   record(changed, names=("loss", "acc"), context={"env.OMP_NUM_THREADS": "8"}), 1)
    seen = _open(browser, page, "diverged")
    _clean(seen)
    assert seen["figures"] == 2 and _rgb(REPLAY) in seen["colours"]
    assert seen["verdict"].startswith("DIVERGED from a.record")
    assert "step 120, loss" in seen["first"] and changed[120].hex() in seen["first"]
    assert losses[120].hex() in seen["first"]
    assert "env.OMP_NUM_THREADS" in browser.page_source and "variable" in browser.page_source


def test_a_reproduced_replay(browser: Any, tmp_path: Path) -> None:
    losses = [1.0 / (i + 1) for i in range(50)]
    seen = _open(browser, _replay(tmp_path, record(losses), record(losses), 0), "reproduced")
    _clean(seen)
    assert seen["verdict"].startswith("OK: the replay reproduced a.record") and seen["first"] == ""
    assert "no difference at any step" in browser.page_source


def test_a_failed_command(browser: Any, tmp_path: Path) -> None:
    failed = Record(record=Meta(tool_version="0.1.0", created_at=record([]).record.created_at, where="host",
                                command=["python", "train.py"], exit_code=1))
    seen = _open(browser, _replay(tmp_path, record([1.0, 0.5, 0.25]), failed, 3), "failed")
    _clean(seen)
    assert seen["verdict"].startswith("FAILED: the replayed command exited with 1")


def test_a_100000_step_record_of_five_metrics(browser: Any, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    names = ("loss", "acc", "lr", "grad_norm", "val_loss")
    n = 100_000

    def run(shift: int | None) -> Record:
        steps = [Step.model_construct(step=i, metrics={
            k: 1.0 / (i + 1) * (j + 1) + (1e-12 * (i - shift) if shift is not None and i > shift else 0.0)
            for j, k in enumerate(names)}) for i in range(n)]
        return Record.model_construct(record=record([]).record, context={}, steps=steps, outputs=[], inputs=[])

    from envlock.replay.compare import compare_records
    from envlock.replay.page import replay_page

    a, b = run(None), run(60_000)
    start = time.monotonic()
    text = replay_page(compare_records(a, b), a, b, "long.record")
    written = time.monotonic() - start
    page = tmp_path / "long.html"
    page.write_text(text)
    seen = _open(browser, page, "100000-steps")
    _clean(seen)
    assert seen["figures"] == 5 and "step 60001" in seen["first"]
    assert "drawn from at most" in browser.page_source
    with capsys.disabled():
        print(f"\n100,000 steps x 5 metrics: page {page.stat().st_size / 1024:.0f} KiB, written in "
              f"{written:.1f} s, opened and drawn by Chromium in {seen['seconds']:.2f} s")


def test_twin_a_script_and_a_remote_image_are_caught(browser: Any, tmp_path: Path) -> None:
    losses = [1.0, 0.5]
    page = _replay(tmp_path, record(losses), record(losses), 0)
    text = page.read_text()
    page.write_text(text.replace("<body>", "<body><script>console.error('ran')</script>"
                                 "<img src=\"http://192.0.2.1/x.png\">", 1))
    seen = _open(browser, page, "twin")
    assert seen["errors"] and any("Content Security Policy" in e for e in seen["errors"]), seen["errors"]
    assert "ran" not in " ".join(seen["errors"]).replace("Content Security Policy", "")
