"""The report pages (``show --format html``, ``diff --format html``, ``replay --report``) and the
plots (``show RECORD --format svg|png``): every value escaped, nothing that could load or run,
the lock given back whole, the drift grouped as verify groups it, the plots drawn from a
bounded number of points; without the extra, exit 2 naming it; nothing but ``report/plot``
imports matplotlib. The browser's view of the same pages is ``test_report_browser``."""

from __future__ import annotations

import ast
import html
import math
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import tomllib
from helpers import LockFactory

from envlock.commands import main
from envlock.lock import loads as load_lock_text
from envlock.lock import save
from envlock.replay.record import Meta, Output, Record, Step
from envlock.report.page import CSP
from envlock.report.plot import MAX_DRAWN, Series, downsampled
from envlock.text.escape import html as html_text

ROOT = Path(__file__).resolve().parents[1]
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
HOSTILE = "<script>alert(1)</script></svg><img src=x onerror=alert(2)> javascript:alert(3) \x1b[31m\u202e"


def record(losses: list[float], *, command: list[str] | None = None, exit_code: int = 0,
           context: dict[str, Any] | None = None, output: str = "model.pt", names: tuple[str, ...] = ("loss",),
           lock: str | None = None) -> Record:
    steps = [Step(step=i, metrics={n: v * (k + 1) for k, n in enumerate(names)}) for i, v in enumerate(losses)]
    return Record(record=Meta(tool_version="0.1.0", created_at=NOW, where="host",
                              command=command or ["python", "train.py"], exit_code=exit_code, lock=lock),
                  context=context or {"torch.version": "2.13.0", "env.OMP_NUM_THREADS": "4"},
                  steps=steps, outputs=[Output(path=output, sha256="a" * 64, size=3)])


class Tags(HTMLParser):
    """Every element and attribute of a page, and its text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def inert(page: str) -> Tags:
    """The page parsed; fails on anything that could run or load: a script, an event handler,
    a link or source that is not an id inside the page, an object or frame."""
    parsed = Tags()
    parsed.feed(page)
    names = {t for t, _ in parsed.tags}
    assert not names & {"script", "iframe", "object", "embed", "link", "img", "a", "base", "form", "foreignobject"}
    for tag, attrs in parsed.tags:
        for key, value in attrs:
            assert not key.startswith("on"), (tag, key)
            if key in ("href", "xlink:href", "src", "action", "srcset"):
                assert (value or "").startswith("#"), (tag, key, value)
    assert f'content="{CSP}"' in page
    return parsed


def test_html_escapes_markup_quotes_and_controls() -> None:
    assert html_text('<a href="x">&\'') == "&lt;a href=&quot;x&quot;&gt;&amp;&#x27;"
    assert html_text("a\nb\x1b\u202e") == "a\\nb\\x1b\\u202e"
    assert html.unescape(html_text("</svg> javascript:x")) == "</svg> javascript:x"


def test_a_replay_page_escapes_every_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = record([1.0, 0.5, 0.25], command=["python", "train.py", HOSTILE.replace("\x1b", "").replace("\u202e", "")],
               context={"platform.cpu_model": HOSTILE.replace("\x1b", "").replace("\u202e", "")},
               output=f"out/{HOSTILE.replace(chr(27), '').replace(chr(0x202e), '')}.pt")
    b = record([1.0, 0.5, 0.3], command=["python", "train.py"], context={"platform.cpu_model": "Xeon"})
    a.save(tmp_path / "a.record")
    b.save(tmp_path / "b.record")
    page = tmp_path / "replay.html"
    assert main(["replay", str(tmp_path / "a.record"), "--against", str(tmp_path / "b.record"),
                 "--report", str(page)]) == 1
    text = page.read_text()
    parsed = inert(text)
    shown = "".join(parsed.text)
    assert "<script>alert(1)</script>" in shown  # as words, in the causes and the commands
    assert "0.25 (0x1.0000000000000p-2)" in shown and "0.3 (0x1.3333333333333p-2)" in shown
    assert "step 2, loss" in shown and "platform.cpu_model" in shown and "hardware" in shown
    capsys.readouterr()


def test_hostile_metric_names_are_text_in_the_svg_and_mathtext_is_not_parsed(tmp_path: Path) -> None:
    from envlock.report.plot import svg

    # The record's model allows only plain names today; the drawing must not depend on it.
    names = ["loss</svg><script>alert(1)</script>", "$\\frac{1}{$", "a\x1b[31mb", "javascript:alert(1)"]
    drawn = svg([Series(n, [0, 1, 2], [1.0, 2.0, math.nan], [0, 1, 2], [1.0, 2.5, 3.0], 1, i == 0)
                 for i, n in enumerate(names)])
    ET.fromstring(drawn)  # well-formed: no name closed an element
    parsed = Tags()
    parsed.feed(drawn)
    shown = "".join(parsed.text)
    assert "<script" not in drawn.lower().replace("&lt;script", "")
    assert "loss</svg><script>alert(1)</script>" in shown and "$\\frac{1}{$" in shown
    assert "javascript:alert(1)" in shown


def test_unbuildable_mathtext_in_a_metric_name_still_draws(tmp_path: Path) -> None:
    rec = Record.model_construct(**{**record([1.0, 2.0]).__dict__,
                                    "steps": [Step.model_construct(step=0, metrics={"$^_$": 1.0}),
                                              Step.model_construct(step=1, metrics={"$^_$": 2.0})]})
    from envlock.replay.page import image, series

    assert image("png", series(rec)).startswith(b"\x89PNG\r\n\x1a\n")


def test_downsampling_bounds_the_points_and_keeps_the_extremes() -> None:
    steps = list(range(100_000))
    values = [math.sin(i / 50) for i in steps]
    values[77_777] = 50.0  # a spike a mean would hide
    values[500] = math.nan
    x, y = downsampled(steps, values)
    assert len(x) == len(y) <= 2 * MAX_DRAWN
    assert 50.0 in y and min(v for v in y if not math.isnan(v)) == min(values[:500] + values[501:])
    assert x == sorted(x)
    short = list(range(10))
    assert downsampled(short, [float(v) for v in short]) == ([float(v) for v in short], [float(v) for v in short])


def test_a_record_shows_as_a_page_and_as_images(tmp_path: Path, restore_lock: LockFactory) -> None:
    save(restore_lock(), tmp_path / "env.lock")
    record([1.0, 0.5], lock="env.lock", names=("loss", "acc")).save(tmp_path / "run.record")
    rec = str(tmp_path / "run.record")
    assert main(["show", rec, "--format", "html", "-o", str(tmp_path / "r.html")]) == 0
    text = (tmp_path / "r.html").read_text()
    inert(text)
    assert text.count("<figure>") == 2 and "Replay it with: envlock replay run.record" in text
    assert main(["show", rec, "--format", "svg", "-o", str(tmp_path / "r.svg")]) == 0
    root = ET.fromstring((tmp_path / "r.svg").read_bytes())
    assert root.tag.endswith("svg")
    assert main(["show", rec, "--format", "png", "-o", str(tmp_path / "r.png")]) == 0
    assert (tmp_path / "r.png").read_bytes().startswith(b"\x89PNG")
    assert main(["show", rec, "--format", "markdown"]) == 2
    assert main(["show", str(tmp_path / "env.lock"), "--format", "svg"]) == 2


def _pre_text(page: str) -> str:
    found = re.search(r"<details><summary>[^<]*</summary><pre>(.*?)</pre></details>", page, re.S)
    assert found is not None
    return html.unescape(found.group(1))


def test_a_lock_page_gives_the_lock_back_and_escapes_its_values(tmp_path: Path, restore_lock: LockFactory) -> None:
    lock = save(restore_lock(envlock={"note": HOSTILE.replace("\x1b", "").replace("\u202e", "")},
                             env={"NCCL_DEBUG": "</svg><script>alert(1)</script>"}), tmp_path / "env.lock")
    out = tmp_path / "lock.html"
    assert main(["show", str(lock), "--format", "html", "-o", str(out)]) == 0
    page = out.read_text()
    inert(page)
    back = load_lock_text(_pre_text(page))
    assert back.envlock.fingerprint == load_lock_text(lock.read_text()).envlock.fingerprint
    assert back.envlock.integrity == load_lock_text(lock.read_text()).envlock.integrity
    assert "<script>alert(1)</script>" in "".join(inert(page).text)
    assert tomllib.loads(_pre_text(page))["env"]["NCCL_DEBUG"] == "</svg><script>alert(1)</script>"


def test_a_diff_page_groups_the_drift_by_category(tmp_path: Path, restore_lock: LockFactory,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    a = save(restore_lock(packages=[("six", "1.16.0"), ("idna", "3.10")]), tmp_path / "a.lock")
    b = save(restore_lock(packages=[("six", "1.17.0"), ("idna", "3.10")], env={"NCCL_DEBUG": "<b>x</b>"}),
             tmp_path / "b.lock")
    out = tmp_path / "diff.html"
    assert main(["diff", str(a), str(b), "--format", "html", "-o", str(out)]) == 1
    page = out.read_text()
    shown = "".join(inert(page).text)
    headings = re.findall(r"<h3>(.*?)</h3>", page)
    assert any(h.startswith("packages:") for h in headings) and any(h.startswith("env:") for h in headings)
    assert "packages.six" in shown and "<b>x</b>" in shown
    assert main(["diff", str(a), str(a), "--format", "html", "-o", str(out)]) == 0
    assert "No differences" in out.read_text()
    capsys.readouterr()


def test_without_the_extra_a_plot_is_exit_2_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str],
                                                      restore_lock: LockFactory) -> None:
    record([1.0]).save(tmp_path / "a.record")
    record([2.0]).save(tmp_path / "b.record")
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import matplotlib` meets without it
    rec = str(tmp_path / "a.record")
    for argv in (["show", rec, "--format", "svg", "-o", str(tmp_path / "x.svg")],
                 ["show", rec, "--format", "html", "-o", str(tmp_path / "x.html")],
                 ["replay", rec, "--against", str(tmp_path / "b.record"), "--report", str(tmp_path / "x.html")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "envlock-ml[report]" in err, err
    assert not list(tmp_path.glob("x.*"))  # refused before anything was compared or written
    lock = save(restore_lock(), tmp_path / "env.lock")
    assert main(["run", str(lock), "--report", str(tmp_path / "x.html"), "--", "true"]) == 2
    assert "--replay" in capsys.readouterr().err


def test_only_report_plot_imports_matplotlib() -> None:
    importers = []
    for path in sorted((ROOT / "envlock").rglob("*.py")):
        source = path.read_text()
        if "matplotlib" not in source:  # no import of it can be written without its name
            continue
        for node in ast.walk(ast.parse(source, str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "matplotlib" or n.startswith("matplotlib.") for n in names):
                importers.append(path.relative_to(ROOT).as_posix())
    assert sorted(set(importers)) == ["envlock/report/plot.py"]


def test_a_lock_page_and_a_diff_page_load_no_plotting_library(tmp_path: Path, restore_lock: LockFactory) -> None:
    lock = save(restore_lock(), tmp_path / "env.lock")
    code = ("import sys; from envlock.commands import main; "
            f"rc = main(['show', {str(lock)!r}, '--format', 'html', '-o', {str(tmp_path / 'a.html')!r}]); "
            f"rc += main(['diff', {str(lock)!r}, {str(lock)!r}, '--format', 'html', '-o', {str(tmp_path / 'b.html')!r}]); "
            "print(rc, 'matplotlib' in sys.modules, 'numpy' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.stdout.split() == ["0", "False", "False"], done.stderr
