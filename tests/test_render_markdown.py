"""``show --format markdown`` and ``diff --format markdown``: every lock value is inert markdown
that reads as written. Checked on what a CommonMark/GFM-table parser makes of the output, not on
the source: no link, image or HTML token, no extra table cell, no mention left in plain text
(GitHub finds mentions in the rendered text, outside code), and the cell's text is the value."""

from __future__ import annotations

import re

from helpers import make_lock
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from markdown_it.token import Token

from envlock.drift.compare import compare
from envlock.lock import Lock
from envlock.report.render import diff_markdown, show_markdown
from envlock.text.terminal import safe

_MD = MarkdownIt("commonmark").enable("table").enable("strikethrough")
_LIVE = {"link_open", "image", "html_inline", "html_block", "autolink", "s_open", "em_open", "strong_open"}
_OWN_HTML = re.compile(r"<details><summary>\d+ packages</summary>|</details>")
# GitHub's mention rule: "@" then a name, at the start of a text run or after a non-word character.
_MENTION = re.compile(r"(?<![A-Za-z0-9_])@[A-Za-z0-9]")

INJECTIONS = {
    "link": "[click](https://evil.example)",
    "image": "![x](https://evil.example/t.png)",
    "reference link": "[click][1]\n\n[1]: https://evil.example",
    "autolink": "<https://evil.example>",
    "mention": "@octocat please merge",
    "team mention": "cc @org/security-team.",
    "chained mention": "@a@b and x@y @c.@d",
    "raw HTML": "<img src=x onerror=alert(1)>",
    "HTML block": "<script>alert(1)</script>",
    "pipe": "a | b | c",
    "backtick run": "``x`` ` closes ```",
    "newline heading": "ok\n# Heading\n\n- item",
    "emphasis": "**bold** _it_ ~~gone~~",
    "entity": "&lt;b&gt; &#64;octocat",
    "math and escapes": "$x$ \\[y\\] trailing \\",
}
ORDINARY = ["https://wandb.ai/lab/proj/runs/abc123?tab=overview", "mail alice@example.org or git@github.com:org/repo.git",
            "runs/sk-learn-2024", "loss=0.5 (seed 1)", "a_b*c", "Résumé: 学習率 0.1, ñandú ✓",
            "ResNet-50 baseline, seed 1234 (v2.1)", "sm_90 CUBLAS_WORKSPACE_CONFIG=:4096:8"]


def _with_note(note: str) -> Lock:
    lock = make_lock()
    return lock.model_copy(update={"envlock": lock.envlock.model_copy(update={"note": note})})


def _rows(doc: str) -> list[tuple[list[str], list[Token]]]:
    """Each table body row as (cell texts, the inline tokens of its cells); asserts nothing live."""
    tokens = _MD.parse(doc)
    # envlock's own <details> around the package table is the only HTML
    live = [t.type for t in tokens if t.type in _LIVE and not _OWN_HTML.fullmatch(t.content.strip())]
    rows: list[tuple[list[str], list[Token]]] = []
    cells: list[str] = []
    children: list[Token] = []
    in_body = False
    for t in tokens:
        live += [c.type for c in t.children or [] if c.type in _LIVE]
        if t.type in ("tbody_open", "tbody_close"):
            in_body = t.type == "tbody_open"
        elif t.type == "tr_close" and in_body:
            rows.append((cells, children))
            cells, children = [], []
        elif t.type == "inline" and in_body:
            kids = t.children or []
            cells.append("".join(c.content for c in kids if c.type in ("text", "code_inline", "text_special")))
            children += [Token("td_open", "td", 1), *kids]  # a new cell is a new run of text
    assert not live, live
    assert sum(t.type == "heading_open" for t in tokens) == 1, "a value opened a heading"
    assert not any(t.type in ("bullet_list_open", "ordered_list_open", "hr") for t in tokens)
    return rows


def _mentions(children: list[Token]) -> list[str]:
    """Mentions GitHub would find: in runs of plain text (code is skipped), escapes resolved."""
    runs, run = [], ""
    for c in children:
        if c.type in ("text", "text_special"):
            run += c.content
        else:
            runs.append(run)
            run = ""
    runs.append(run)
    return [r for r in runs if _MENTION.search(r)]


def _shown(value: str) -> str:
    """What a reader should see: the value on one line, controls as escapes (as ``safe``)."""
    return " ".join(safe(value).split())


def _note_cell(note: str) -> tuple[str, str]:
    """The note row of ``show --format markdown``: its one value cell's text and its source."""
    doc = show_markdown(_with_note(note))
    for cells, children in _rows(doc):
        if cells[0] == "note":
            assert len(cells) == 2, cells  # the value did not split the row
            assert not _mentions(children), cells
            return cells[1], next(line for line in doc.splitlines() if line.startswith("| note |"))
    raise AssertionError("no note row")


def test_injection_shapes_in_a_note_are_inert() -> None:
    for name, shape in INJECTIONS.items():
        text, _ = _note_cell(shape)
        assert text == _shown(shape), name


def test_injection_shapes_in_diff_values_are_inert() -> None:
    """``diff --format markdown``: a variable's value in the before/after cells."""
    for name, shape in INJECTIONS.items():
        a = make_lock(env={"CUDA_VISIBLE_DEVICES": "0"})
        b = make_lock(env={"CUDA_VISIBLE_DEVICES": shape})
        rows = _rows(diff_markdown(compare(a, b), a, b, "a.lock", "[b](https://evil.example).lock"))
        row = next((cells, children) for cells, children in rows if "CUDA_VISIBLE_DEVICES" in cells[1])
        assert len(row[0]) == 4 and row[0][3] == _shown(shape), (name, row[0])
        assert not _mentions(row[1]), name


def test_ordinary_notes_read_verbatim() -> None:
    """The over-escaping twin: URLs, e-mail addresses, paths and plain prose render as exactly
    the note, and with no markdown special in them they stay verbatim in the source too."""
    for note in ORDINARY:
        text, source = _note_cell(note)
        assert text == note
        if not re.search(r"[*\\`\[\]<>|~&$]", note):
            assert f"| note | {note} |" == source


def test_package_names_and_versions_read_verbatim() -> None:
    lock = make_lock(packages=[("torch", "2.3.1+cu121"), ("nvidia-cudnn-cu12", "8.9.2.26")])
    rows = {cells[0]: cells for cells, _ in _rows(show_markdown(lock)) if len(cells) == 3}
    assert rows["torch"] == ["torch", "2.3.1+cu121", "index"]
    assert rows["nvidia-cudnn-cu12"][1] == "8.9.2.26"


_ALPHABET = st.sampled_from([*"[]()!<>@`|*_~&$#\\-+=:./ \nab1é✓", "https://", "www.", "@x", "&#64;", "\t", "\u202e"])


@settings(max_examples=200, deadline=None)
@given(note=st.lists(_ALPHABET, min_size=1, max_size=40).map("".join))
def test_property_any_note_renders_as_itself(note: str) -> None:
    text, _ = _note_cell(note)
    assert text == _shown(note)
