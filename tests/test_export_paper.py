"""What goes in a paper or a PR: ``show --format latex`` (compiled by a real LaTeX) and the
markdown summary (a real header row, no raw error text, replay instructions)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers import LockFactory, needs_tool, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from envlock.export.latex import show_latex
from envlock.lock import Lock, save
from envlock.report.render import show_markdown
from envlock.text.escape import latex as escape

NASTY_NOTE = r"50% of runs & $x_1$ {#2} ~ ^ \textbf{no} <b>|</b> `tick`"


@pytest.fixture
def paper_lock(restore_lock: LockFactory) -> Lock:
    return restore_lock(
        envlock={"tool_version": "0.1.0", "created_at": "2026-01-01T00:00:00Z", "note": NASTY_NOTE},
        image={"in_container": True, "source": "env", "reference": "ghcr.io/lab/train_x:v1",
               "digest": "sha256:" + "cd" * 32},
        torch={"version": "2.13.0+cu130", "cuda": "13.0", "cudnn": "91200", "nccl": "2.27.7"},
        gpu={"source": "nvml", "driver": "580.65.06",
             "devices": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]},
        determinism={"torch_loaded": True, "deterministic_algorithms": True,
                     "env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}},
        seeds={"seed": 1234, "seed_source": "envlock", "python_hash_seed": "0"},
        probe={"errors": {"git": "OSError: [Errno 2] No such file or directory: '/home/alice/secret-project/.git'"}},
        packages=[("torch", "2.13.0+cu130"), ("typing-extensions", "4.16.0")],
    )


def test_markdown_summary_has_a_header_and_no_raw_errors(paper_lock: Any) -> None:
    md = show_markdown(paper_lock, "env.lock")
    lines = md.splitlines()
    header = lines.index("| what | value |")
    assert lines[header + 1] == "|---|---|"
    assert "| | |" not in md
    assert "OSError" not in md and "/home/alice" not in md
    assert "| not captured | git (details: envlock show) |" in md
    assert "`envlock restore env.lock`" in md and "uv pip install -r pylock.toml" in md
    note = next(ln for ln in lines if ln.startswith("| note |"))
    assert note.count("|") - note.count("\\|") == 3  # the note's pipes cannot add columns
    assert "<b>" not in note


def test_latex_escapes_every_value(paper_lock: Any) -> None:
    tex = show_latex(paper_lock, "my_env.lock")
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex
    assert r"ghcr.io/lab/train\_x:v1@sha256:" in tex.replace(r"\allowbreak{}", "")
    assert r"my\_env.lock" in tex.replace(r"\allowbreak{}", "")
    assert "OSError" not in tex
    assert "envlock restore" in tex and "uv pip install -r pylock.toml" in tex.replace(r"\allowbreak{}", "")


def test_latex_keeps_the_spaces_between_joined_parts(paper_lock: Any) -> None:
    # escape() collapses whitespace, so a part ending or starting with a space lost it:
    # "pinned in\texttt{env.lock}" typesets as "pinned inenv.lock".
    tex = show_latex(paper_lock, "env.lock")
    assert r"pinned in \texttt{env.lock}" in tex
    assert "2.13.0+cu130 / 13.0 / 91200 / NCCL 2.27.7" in tex


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_fuzz_escape_leaves_no_active_character(text: str) -> None:
    out = escape(text)
    stripped = out
    for cmd in (r"\textbackslash{}", r"\textasciitilde{}", r"\textasciicircum{}", r"\textless{}",
                r"\textgreater{}", r"\textbar{}", r"\textquotedbl{}", "{[}", "{]}"):
        stripped = stripped.replace(cmd, "")
    for c in "&%$#_{}":
        stripped = stripped.replace("\\" + c, "")
    assert not any(c in stripped for c in "\\&%$#_{}~^")
    assert "\n" not in out


def test_latex_table_compiles(paper_lock: Any, tmp_path: Path) -> None:
    needs_tool("pdflatex")
    lock = save(paper_lock, tmp_path / "env.lock")
    r = run_cli("show", str(lock), "--format", "latex")
    assert r.returncode == 0, r.stderr
    (tmp_path / "paper.tex").write_text(
        "\\documentclass{article}\n\\usepackage[T1]{fontenc}\n\\usepackage{booktabs}\n"
        "\\begin{document}\n" + r.stdout + "\\end{document}\n")
    proc = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "paper.tex"],
                          cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (tmp_path / "paper.pdf").stat().st_size > 1000
    log = (tmp_path / "paper.log").read_text(errors="replace")
    assert "Overfull \\hbox" not in log
