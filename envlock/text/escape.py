"""One escaping function per language the exports write, so each writer quotes the same way.

A lock is data from elsewhere (a paper's artifact, a colleague's branch) and ``envlock fmt``
reseals whatever was edited into it, so no export may trust a value's characters. The model's
character rules say what a value may *be*; these functions say how a value is *written* into a
given output language so that it reads back as the same value and nothing else (the
Dockerfile, restore's own language, is written by ``restore/dockerfile``: exec-form JSON, and
ENV values held to restore's allowlist):

=================  =======================================================================
language           function(s)
=================  =======================================================================
Apptainer def      ``apptainer_line``, ``apptainer_label``, ``apptainer_shell``
shell / sbatch     ``shell``, ``shell_export``, ``comment`` (also YAML and definitions)
Slurm/Apptainer    ``apptainer_env_export``: never ``--env K=V`` (both split it on commas)
YAML               ``yaml_scalar``, ``yaml_key``
GitHub outputs     ``github_output``
LaTeX              ``latex``, ``latex_tt``
markdown           ``markdown_text``, ``markdown_code``
HTML               ``html``: text and attribute values of a report page
=================  =======================================================================

Where a language has no escape for a character (a line break in an Apptainer label, NUL in
any shell word) the value is refused with a 2-exit error instead of being altered: an export
that silently changed a value would not be the lock's environment either.
"""

from __future__ import annotations

import html as _html
import json
import re
import shlex

from envlock.errors import EnvlockError, UnsafeValue, UsageError
from envlock.text.terminal import safe

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def _refuse(what: str, value: str, why: str) -> EnvlockError:
    shown = safe(repr(value))
    if len(shown) > 80:
        shown = shown[:77] + "..."
    if what.startswith("--"):  # the user typed it: a usage error about that option
        return UsageError(f"{what} {shown}: {why}")
    return UnsafeValue(f"refusing {what} {shown}: {why}",
                       hint="the lock was edited or crafted; exports write only values that read back as written")


# -- comments (any line-oriented language: shell, YAML, definition files) -------------------------


def comment(value: object) -> str:
    """Text for after ``#`` on one line: every control character, a newline included, is shown
    as an escape (``\\n``), so a value cannot end the comment and start a line of code."""
    return safe(value)


# -- shell / sbatch ------------------------------------------------------------------------------


def shell(value: str, *, what: str = "value") -> str:
    """One POSIX shell word that expands to exactly ``value`` (single quotes, ``'"'"'``).

    NUL cannot be in an argument or a variable, so it is refused rather than truncated.
    """
    if "\0" in value:
        raise _refuse(what, value, "contains a NUL byte, which no shell word can hold")
    return shlex.quote(value)


def shell_export(name: str, value: str, *, what: str | None = None) -> str:
    """``export NAME='value'``: the value arrives verbatim, commas and all."""
    if not _ENV_NAME.fullmatch(name):
        raise _refuse("environment variable name", name, "not [A-Za-z_][A-Za-z0-9_]*")
    return f"export {name}={shell(value, what=what or f'value of {name}')}"


def apptainer_env_export(name: str, value: str) -> str:
    """The variable for a job's container, as ``export APPTAINERENV_NAME='value'``.

    Apptainer's ``--env`` and srun's ``--export``/``--env`` split their argument on commas, so
    ``--env A=1,LD_PRELOAD=/x.so`` sets two variables and an honest ``XLA_FLAGS=a,b`` is cut in
    two. A host variable ``APPTAINERENV_NAME`` is passed into the container as ``NAME`` even
    under ``--cleanenv`` and is never split; srun forwards it with ``--export=ALL``.
    """
    return shell_export("APPTAINERENV_" + name, value, what=f"value of {name}")


# -- Apptainer definition ------------------------------------------------------------------------

# Apptainer reads a definition line by line and a line starting with ``%`` opens a section, so a
# value must never contain a line break of any kind (C0/C1 controls, NEL, the Unicode line and
# paragraph separators). ``{{ name }}`` is a build-argument placeholder (Apptainer >= 1.2) that
# is substituted anywhere in the file, quotes or not.
_DEF_BREAK = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_TEMPLATE = ("{{", "}}")


def apptainer_line(value: str, what: str) -> str:
    """``value`` unchanged if it cannot start a line of a definition file, else refused."""
    bad = _DEF_BREAK.search(value)
    if bad:
        raise _refuse(what, value, f"contains a line break or control character ({safe(bad.group())}), "
                                   "which would start a new line of the Apptainer definition")
    return value


def apptainer_label(key: str, value: str, *, what: str = "label") -> str:
    """``key value`` for ``%labels``: the rest of the line is the value, there is no quoting."""
    apptainer_line(key, what)
    if not re.fullmatch(r"[A-Za-z0-9._-]+", key):
        raise _refuse(what, key, "is not a label key of [A-Za-z0-9._-]")
    apptainer_line(value, what)
    if any(t in value for t in _TEMPLATE):
        raise _refuse(what, value, "contains '{{' or '}}', an Apptainer build-argument placeholder")
    return f"{key} {value}"


def apptainer_shell(value: str, *, what: str = "value") -> str:
    """A shell word for ``%environment``/``%runscript``/``%post``: quoted, on one line, and with
    every ``{{``/``}}`` split by an empty ``''`` so Apptainer's templating sees no placeholder
    while the shell still reads the same characters."""
    quoted = shell(apptainer_line(value, what), what=what)
    if quoted[:1] != "'":
        return quoted  # shlex left it bare: only [A-Za-z0-9_@%+=:,./-], no braces
    for pair in _TEMPLATE:
        while pair in quoted:
            quoted = quoted.replace(pair, f"{pair[0]}''{pair[1]}")
    return quoted


# -- YAML ----------------------------------------------------------------------------------------

_YAML_KEY = re.compile(r"[A-Za-z][A-Za-z0-9./-]*")
# Plain words a YAML 1.1 reader (PyYAML, many others) takes for a boolean or null, not a string.
_YAML_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "y", "n", "null"})


def yaml_scalar(value: object) -> str:
    """A YAML scalar that any YAML 1.1 or 1.2 parser reads back as exactly ``value``.

    Strings become double-quoted, all-ASCII scalars: ``"`` and ``\\`` escaped, every other
    character outside printable ASCII written as ``\\xXX``/``\\uXXXX``/``\\UXXXXXXXX``. (JSON's
    ``\\ud83d\\ude00`` surrogate pairs are not YAML: a YAML parser reads two lone surrogates.)
    Booleans, numbers and null are written as JSON writes them, which YAML reads the same.
    """
    if not isinstance(value, str):
        return json.dumps(value)
    out = ['"']
    for c in value:
        o = ord(c)
        if c in '"\\':
            out.append("\\" + c)
        elif 0x20 <= o < 0x7F:
            out.append(c)
        elif o < 0x100:
            out.append(f"\\x{o:02x}")
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    out.append('"')
    return "".join(out)


YAML_KEY_MAX = 1024


def yaml_key(key: str) -> str:
    """A mapping key: bare when plainly a name (``app.kubernetes.io/name``), else quoted.

    YAML allows an implicit key of at most 1024 characters; a longer one would need the
    explicit ``? key`` form, which no key envlock writes needs, so it is refused."""
    bare = _YAML_KEY.fullmatch(key) and key.lower() not in _YAML_WORDS
    text = key if bare else yaml_scalar(key)
    if len(text) > YAML_KEY_MAX:
        raise _refuse("YAML mapping key", key, f"longer than YAML's {YAML_KEY_MAX} characters")
    return text


# -- GitHub Actions step outputs -----------------------------------------------------------------


def github_output(name: str, value: str) -> str:
    """A ``$GITHUB_OUTPUT`` entry: ``name=value`` when the value is one line, else the heredoc
    form with a delimiter the value does not contain (a newline in ``name=value`` would set a
    second output of the value's choosing)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name):
        raise _refuse("step output name", name, "not [A-Za-z_][A-Za-z0-9_-]*")
    if "\n" not in value and "\r" not in value:
        return f"{name}={value}\n"
    n = 0
    while f"ENVLOCK_EOF_{n}" in value:
        n += 1
    delim = f"ENVLOCK_EOF_{n}"
    return f"{name}<<{delim}\n{value}\n{delim}\n"


# -- LaTeX ---------------------------------------------------------------------------------------

_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}", '"': r"\textquotedbl{}",
    "[": "{[}", "]": "{]}",  # a `[` right after `\\` would be read as the row's skip argument
}
_LATEX_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _latex_plain(value: object) -> str:
    """One line of text: control characters dropped, runs of whitespace one space (a blank line
    in a table cell is a paragraph break, an error inside ``tabular``)."""
    return " ".join(_LATEX_CONTROL.sub("", str(value)).split())


def _latex_chars(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(c, c) for c in text)


def latex(value: object) -> str:
    """Text that LaTeX typesets literally: every special escaped, control characters dropped."""
    return _latex_chars(_latex_plain(value))


def latex_tt(value: object, *, every: int = 16) -> str:
    """Monospace, with a break point every ``every`` characters (digests overflow otherwise)."""
    raw = _latex_plain(value)
    parts = [_latex_chars(raw[i:i + every]) for i in range(0, len(raw), every)]
    return r"\texttt{" + r"\allowbreak{}".join(parts) + "}"


# -- markdown ------------------------------------------------------------------------------------

# ASCII punctuation that can open markup anywhere in a line: code, emphasis (``*`` always, ``_``
# only at a word's edge: CommonMark ignores intraword underscores, so ``sm_90`` stays as it is),
# links and images (``[`` ``]``), raw HTML and autolinks (``<`` ``>``), table cells, strikethrough,
# entities, math (``$`` on GitHub). CommonMark lets any ASCII punctuation be backslash-escaped,
# so the rendered text is the value itself.
#
# ``@name`` at a word's start notifies a user or team on GitHub. A backslash does not stop it:
# GitHub finds mentions in the rendered text, after escapes are gone, but skips code. So the
# name goes in a code span: it reads as the same characters, in monospace, and notifies nobody.
# ``alice@example.org`` and ``git@host`` are no mentions (a letter before ``@``) and stay as
# written. Bare URLs and e-mail addresses are left alone: GitHub may autolink one, to itself,
# and a note's URL must read (and copy) exactly as it was recorded.
_MD_TOKEN = re.compile(r"(?P<mention>(?<![A-Za-z0-9])@[A-Za-z0-9][A-Za-z0-9_/@-]*(?:\.[A-Za-z0-9_/@-]+)*)"
                       r"|[\\`*\[\]<>|~&$]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
# At the start of a line: a heading, a list item, a thematic break.
_MD_LINE_START = re.compile(r"^(#{1,6}(?=\s|$)|[-+](?=\s|$)|(?:-\s*){3,}$)")
_MD_ORDERED = re.compile(r"^(\d{1,9})(?=[.)](\s|$))")


def _md_token(m: re.Match[str]) -> str:
    return f"`{m.group()}`" if m.group("mention") else "\\" + m.group()


def markdown_text(value: object, *, inline: bool = False) -> str:
    """Markdown that renders as ``value``, on one line, with no live markup: no link, image,
    HTML or mention, no break out of a table cell. The rendered text is the value's own
    characters (runs of whitespace one space, control characters shown as escapes, as
    ``safe`` shows them): a URL, an e-mail address or a path in a note reads verbatim.

    ``inline``: the text never starts a line (a table cell, the middle of a sentence), so what
    only means something at a line's start (``- ``, ``1. ``, ``# ``) is left as written.
    """
    text = _MD_TOKEN.sub(_md_token, " ".join(safe(value).split()))
    if not inline:
        text = _MD_ORDERED.sub(r"\1\\", _MD_LINE_START.sub(r"\\\1", text))
    return text


def markdown_code(value: object, *, table: bool = True) -> str:
    """Text for inside a `code span`: no markup is live there, but escapes do not work either,
    so a backtick (which would end the span) becomes ``'``; in a table ``|`` still ends the
    cell, and GFM reads ``\\|`` there as ``|``."""
    text = " ".join(safe(value).split()).replace("`", "'")
    return text.replace("|", "\\|") if table else text


def html(value: object) -> str:
    """HTML that shows ``value`` as text, in an element or a quoted attribute: ``&``, ``<``,
    ``>`` and both quotes as references, so no tag, attribute or entity can start (``</svg>``,
    ``<script>`` read as written), and control characters shown as ``safe`` shows them (a
    newline cannot split a value shown on one line; a bidi control cannot reorder it). A URL
    is text too: the pages hold no link a value could fill (``javascript:`` stays words)."""
    return _html.escape(safe(value), quote=True)
