"""A fresh adversarial corpus for the output languages and hostile environments: injections, fail-open.

Kept apart from the test suite on purpose, like ``adversarial_secrets.py``: the tests check fixed
payloads per output language; this script draws new ones on every run (``--seed`` repeats one)
and counts what gets through. Usage:

    python benchmarks/adversarial_outputs.py [--seed N] [--locks K] [--envs K] [--json FILE] [--checkout DIR] [-v]

**Injections.** Every string slot of the lock model is found by walking the pydantic models of
``envlock.lock`` (so a field added later is covered too): free text (the note, ``[env]`` values
and keys, ``torch.cuda``, GPU names, OS package lines...) and the fields with a character rule
(versions, image references, URLs, hashes), which get as many metacharacters as their rule lets
through. Each drawn lock carries, in a few random slots, random combinations of the
metacharacters of every language envlock writes: Dockerfile (newline + instruction, ``\\``
continuation, ``$VAR``/``${VAR}``), Apptainer (a ``%post`` section at line start), shell and
sbatch (``$(...)``, backticks, quotes, ``;``, ``&&``, newline), Slurm ``--export`` commas, YAML
(``: ``, ``#``, ``{``, leading ``-``, ``!!python/...`` tags, YAML 1.1 booleans, anchors), LaTeX
(``\\input``, ``\\write18``, braces, ``%``, ``&``, ``#``, ``$``) and markdown (links, images,
``@user``, ``|``, backticks, raw HTML). The lock is sealed by the model (a value it refuses is
"refused at entry": a pass); for each accepted lock, every ``export --to`` format that needs no
package index (cyclonedx, intoto, apptainer, k8s, slurm), ``restore --dockerfile-only`` and
``show --format markdown|latex`` are run through the real command line, and so are they for a
*benign twin*: the same lock with each hostile value replaced by a plain one. Each output is
parsed by its real consumer and compared with the twin's:

* Dockerfile: the list of instructions (continuations joined) must equal the twin's; no
  ``$ZQ...`` variable outside ``RUN`` may be left unescaped; each ``RUN`` body runs in bash;
* shell (the sbatch script, the Apptainer ``%post``/``%environment``/``%runscript`` bodies and
  the Dockerfile's ``RUN`` bodies): ``bash -n``, then executed by bash in an empty directory
  with an empty ``PATH`` (every command a no-op, ``exec`` and ``set -e`` defused) except the
  sentinel ``zqpwn`` every payload tries to run: a sentinel call is an injection;
* Apptainer: the list of ``%section`` headers must equal the twin's;
* requirements: the kind of each line (comment, option, requirement) must equal the twin's and
  each requirement must parse (``packaging``);
* YAML (k8s), JSON (cyclonedx, intoto) and TOML (pylock): the real parser must succeed and
  the shape (every key path and the type of every leaf) must equal the twin's, so a ``yes``
  that became a boolean or a ``: `` that became a key is caught;
* LaTeX: no control word other than the escape macros may appear that the twin lacks, and the
  count of each unescaped special (``{ } % & # $ ^ _ ~``) must equal the twin's;
* markdown: the markdown-it-py token stream (block and inline token types) must equal the
  twin's, so a link, image, code span, table cell or raw HTML that a value opened is caught.

**Fail-open.** Fresh hostile environments, each a ``python -m venv --without-pip`` with
hand-written ``*.dist-info`` directories (no network, no pip): symlinks to ``/dev/zero`` and
``/dev/urandom``, FIFOs, sockets, directories in place of ``RECORD``, ``METADATA``,
``direct_url.json`` or ``INSTALLER``, huge files, non-UTF-8 names and versions, 300-character
versions, shell metacharacters in versions, dist-infos that are symlinks out of the prefix and a
``sitecustomize.py`` that prints to stdout, with random choices from the seed. For each:
``envlock capture --python VENV/bin/python`` under a timeout (it must finish: bounded), then a new
harmless distribution is added and ``envlock verify`` must exit 1 (drift); exit 0 is fail-open.

A command that refuses a hostile lock passes only with the documented exit 2 (a clear
"refusing ..." line); an exit 3 "internal error" is counted as a failure. Prints counts per
language and per hostile kind; exits 1 on any injection, crash, unbounded run or fail-open.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import random
import re
import socket
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adversarial_secrets import Tally

ROOT = Path(__file__).resolve().parent.parent
ALNUM = string.ascii_letters + string.digits


# -- payloads: the metacharacters of each language envlock writes ---------------------------------

SENTINEL = "zqpwn"  # the command every shell payload tries to run; a stub records each call
PAYLOADS: dict[str, list[str]] = {
    "dockerfile": ["\nRUN zqpwn", "\\\nRUN zqpwn", "\r\nENV ZQA=1", "$ZQVAR", "${ZQVAR}", "${ZQVAR:-x}",
                   "\nUSER root", "\n# comment\nCOPY / /x", "\\", "\\\n"],
    "apptainer": ["\n%post\n    zqpwn", "\n%runscript\nzqpwn", "\n%environment\nexport ZQA=1", "%post zqpwn",
                  "\n%files\n/etc/passwd /x"],
    "shell": ["$(zqpwn)", "`zqpwn`", "'$(zqpwn)'", "\"$(zqpwn)\"", "; zqpwn", "\nzqpwn\n", "&& zqpwn",
              "| zqpwn", "'; zqpwn; '", "\"; zqpwn; \"", "\\", "$((1+1))", "${IFS}zqpwn", "& zqpwn &",
              "'\nzqpwn\n'", "\"\nzqpwn\n\""],
    "slurm": [",LD_PRELOAD=/srv/x.so", ",ALL", "\n#SBATCH --export=ALL", ",ZQ=$(zqpwn)"],
    "yaml": [": x", " #c", "{a: 1}", "- item", "!!python/object/apply:os.system ['zqpwn']", "yes", "no",
             "on", "off", "~", "null", "&a", "*a", "\n  evil: 1", "[1, 2]", "%YAML 1.1", "--- ", "? k",
             "'", "\"", "|", ">", "0x1F", "1e3", "2026-01-02"],
    "latex": ["\\input{/etc/passwd}", "\\write18{zqpwn}", "{", "}", "%", "&", "#", "$", "\\", "^", "_",
              "~", "\\catcode`\\@=11", "\\immediate\\write18{zqpwn}", "\\\\", "\\def\\x{y}"],
    "markdown": ["[x](javascript:alert(1))", "![i](http://example.org/x.png)", "@user", "|", "`", "```\n",
                 "<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "\n# H\n", "*em*", "_u_",
                 "\n---\n", "<!--", "[ref]: http://example.org", "\n| a | b |\n|---|---|\n", "\\|", "&lt;"],
}
ALL_PAYLOADS = [(lang, p) for lang, ps in PAYLOADS.items() for p in ps]


def hostile_text(rng: random.Random) -> str:
    """1 to 4 payloads of random languages, with plain words around them."""
    parts = []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.5:
            parts.append("".join(rng.choices(ALNUM, k=rng.randint(1, 6))))
        parts.append(rng.choice(ALL_PAYLOADS)[1])
    return "".join(parts)


def _fit(base: str, payload: str, pattern: str) -> str:
    """The base value with each payload character its rule still accepts appended (a version or an
    image reference gets the metacharacters it can hold, no more)."""
    out = base
    for ch in payload:
        if re.fullmatch(pattern, out + ch):
            out += ch
    return out


def base_doc() -> dict[str, Any]:
    """A lock with every section filled (the tests' full lock) and an image by digest, so that every
    exporter renders every section."""
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import full_lock

    lock = full_lock()
    doc = lock.model_dump(mode="json", exclude_none=True)
    doc["envlock"]["created_at"] = lock.envlock.created_at
    doc["image"] = {"in_container": True, "source": "cli", "reference": "example.org/team/img:1",
                    "digest": "sha256:" + "a" * 64}
    doc["torch"]["cuda"] = "12.4"
    doc["python"].update(prefix="/opt/venv", executable="/opt/venv/bin/python")
    doc["envlock"]["note"] = "baseline"
    if not doc.get("unreadable"):
        doc["unreadable"] = [{"section": "packages", "item": "x-1.0.dist-info", "error": "RECORD: odd"}]
    # A plain value in each field with a character rule, so that each gets hostile text too.
    digest = "sha256:" + "b" * 64
    doc["image"].update(id=digest, container_id="0123456789ab")
    doc["torch"]["config_sha256"] = "c" * 64
    doc["gpu"]["devices"][0].update(compute_capability="9.0", uuid_sha256="d" * 64)
    doc["git"]["diff_sha256"] = "e" * 64
    doc["canary"]["torch"] = "2.13.0"
    doc["packages"][0]["files_sha256"] = "f" * 64
    return doc


def _strings(doc: Any) -> list[str]:
    if isinstance(doc, dict):
        return [s for k, v in doc.items() for s in (k, *_strings(v))]
    if isinstance(doc, list):
        return [s for v in doc for s in _strings(v)]
    return [doc] if isinstance(doc, str) else []


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def draw_lock(rng: random.Random, slots: list[tuple[tuple[Any, ...], str, str | None]],
              base: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(hostile doc, benign twin, what was put where): 1 to 4 random slots get hostile text."""
    hostile, twin = copy.deepcopy(base), copy.deepcopy(base)
    what = []
    for n, (path, kind, pattern) in enumerate(rng.sample(slots, rng.randint(1, 4))):
        try:
            hp, tp = _get(hostile, path[:-1]), _get(twin, path[:-1])
        except (KeyError, IndexError, TypeError):
            continue
        last = path[-1]
        # The twin keeps the base value where there is one (it passes every exporter's own
        # rules), so that the two outputs differ only where the hostile text went.
        old = tp.get(last) if isinstance(tp, dict) else None
        text = hostile_text(rng)
        if kind == "value":
            plain = old if isinstance(old, str) else f"benign{n}x"
            if pattern:
                if not re.fullmatch(pattern, plain):
                    continue  # no valid starting value to grow from: the slot is left as it is
                text = _fit(plain, text, pattern)
            elif isinstance(old, str) and rng.random() < 0.5:
                text = old + text  # past a shape check that looks at the start only
            hp[last], tp[last] = text, plain
        elif kind == "item":
            first = old[0] if isinstance(old, list) and old and isinstance(old[0], str) else f"benign{n}x"
            if pattern and not re.fullmatch(pattern, first):
                continue
            text = _fit(first, text, pattern) if pattern else text
            hp[last], tp[last] = [text], [first]
        else:
            items = list(old.items()) if isinstance(old, dict) and old else [("K" if last == "env" else "k", "v")]
            key, value = items[0]
            if kind == "key":
                hp[last], tp[last] = {text: value}, {key: value}
            else:
                hp[last], tp[last] = {key: text}, {key: value}
        what.append(f"{'.'.join(map(str, path))}[{kind}]={text!r}")
    return hostile, twin, what


# -- running the real commands ----------------------------------------------------------------------


def envlock_cli(argv: list[str]) -> tuple[int, str, str]:
    """One command through envlock's own command line, in-process (the same argparse and handlers
    as the ``envlock`` program, without paying an interpreter start per output)."""
    from envlock.commands import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


ERRORS: dict[str, str] = {}  # output name -> the last refusal's message (-v prints them)


def render_all(lock_path: Path, work: Path) -> dict[str, str]:
    """Every output of the lock: name -> text ("" when the command refused the lock)."""
    outs: dict[str, str] = {}
    ERRORS.clear()
    work.mkdir(exist_ok=True)
    (work / "wheelhouse").mkdir(exist_ok=True)
    for fmt in ("pylock", "requirements", "cyclonedx", "intoto", "apptainer", "k8s", "slurm"):
        target = work / f"out.{fmt}"
        target.unlink(missing_ok=True)
        extra = ["--command", "python train.py --epochs 3"] if fmt in ("k8s", "slurm") else []
        if fmt in ("pylock", "requirements"):
            # Offline: the VCS package needs no file; the system one (no wheel anywhere) is left out.
            extra = ["--skip", "six", "--wheelhouse", str(work / "wheelhouse")]
        rc, _, err = envlock_cli(["export", str(lock_path), "--to", fmt, "-o", str(target), "--force", *extra])
        ERRORS[fmt] = f"exit {rc}: {err.strip()}" if rc else ""
        outs[fmt] = target.read_text() if rc == 0 and target.exists() else ""
    ctx = work / "ctx"
    rc, _, err = envlock_cli(["restore", str(lock_path), "--dockerfile-only", str(ctx), "--force"])
    ERRORS["dockerfile"] = f"exit {rc}: {err.strip()}" if rc else ""
    outs["dockerfile"] = (ctx / "Dockerfile").read_text() if rc == 0 and (ctx / "Dockerfile").exists() else ""
    for fmt in ("markdown", "latex"):
        rc, out, _ = envlock_cli(["show", str(lock_path), "--format", fmt])
        outs[fmt] = out if rc == 0 else ""
    return outs


# -- consumers --------------------------------------------------------------------------------------

STUB_ENV = """\
command_not_found_handle() { return 0; }
shopt -s execfail
set() { :; }
cd() { :; }
exit() { :; }
"""


def run_shell(body: str, sandbox: Path) -> tuple[bool, str]:
    """(syntax ok and no sentinel ran, detail): bash parses the body, then runs it with every
    command a no-op except the sentinel, which leaves a mark."""
    script = sandbox / "body.sh"
    script.write_text(body)
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        return False, f"bash -n: {r.stderr.strip()[:200]}"
    bindir = sandbox / "bin"
    bindir.mkdir(exist_ok=True)
    stub = bindir / SENTINEL
    stub.write_text(f"#!/bin/bash\necho called >> {sandbox / 'pwned'}\n")
    stub.chmod(0o755)
    (sandbox / "stub_env.sh").write_text(STUB_ENV)
    mark = sandbox / "pwned"
    mark.unlink(missing_ok=True)
    try:
        subprocess.run(["/bin/bash", str(script)], cwd=sandbox, capture_output=True, timeout=10, check=False,
                       stdin=subprocess.DEVNULL,
                       env={"PATH": str(bindir), "BASH_ENV": str(sandbox / "stub_env.sh"), "HOME": str(sandbox)})
    except subprocess.TimeoutExpired:
        return False, "timed out"
    if mark.exists():
        return False, "the sentinel command ran"
    return True, ""


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) of each logical line: ``\\`` continuations joined, comments skipped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue  # comment lines inside a continuation are dropped by the parser
        if line.endswith("\\"):
            buf += line[:-1] + "\n"
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest))
        buf = ""
    if buf.strip():
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest))
    return out


def apptainer_sections(text: str) -> list[tuple[str, str]]:
    sections: list[tuple[str, str]] = []
    name, body = "header", list[str]()
    for line in text.splitlines():
        if line.startswith("%"):
            sections.append((name, "\n".join(body)))
            name, body = line.split()[0], []
        else:
            body.append(line)
    sections.append((name, "\n".join(body)))
    return sections


LOCK_VALUES: set[str] = set()  # the slot values of the lock pair being checked (keys may be values)


def shape(doc: Any, path: str = "") -> set[str]:
    """Every key path of a parsed document, with the type of each leaf; a key that is one of the
    lock's own values (an ``[env]`` name in the in-toto predicate) counts as "<value>"."""
    if isinstance(doc, dict):
        def name(k: Any) -> str:
            return "<value>" if k in LOCK_VALUES else f"{k!s:.60}" if isinstance(k, str) else type(k).__name__
        return {f"{path}/{name(k)}" for k in doc} | {p for k, v in doc.items() for p in shape(v, f"{path}/{name(k)}")}
    if isinstance(doc, list):
        return {f"{path}[]"} | {p for item in doc for p in shape(item, f"{path}[]")}
    return {f"{path}:{type(doc).__name__}"}


def new_shape(hostile: Any, twin: Any) -> str:
    """What the hostile document has that the twin lacks ("" when nothing): an added key or
    element kind, a leaf whose type changed (``yes`` read as a boolean). A missing part (an
    exporter that leaves out a value it cannot name, such as an unparsable image reference)
    is not an injection."""
    extra = sorted(shape(hostile) - shape(twin))
    return f"new in the parsed output: {extra[:5]}" if extra else ""


LATEX_ESCAPES = {"textbackslash", "textasciicircum", "textasciitilde", "textbar", "textless", "textgreater",
                 "textquotedbl", "textquotesingle", "textasciigrave", "allowbreak", "_", "{", "}", "%", "&",
                 "#", "$", "texttt", "textunderscore", "slash", "ldots", "nobreak", "textendash",
                 "textemdash", "textbraceleft", "textbraceright", "textdollar", "textpercent"}


def latex_profile(text: str) -> tuple[set[str], dict[str, int]]:
    words = set(re.findall(r"\\([A-Za-z]+|.)", text))
    stripped = re.sub(r"\\([A-Za-z]+|.)", " ", text)
    return words, {c: stripped.count(c) for c in "{}%&#$^_~"}


def requirement_lines(doc: str) -> list[str]:
    """The kind of each line pip reads: a comment, an option (by name) or a requirement; a
    hashed requirement's continuation lines are part of it."""
    out = []
    for ln in doc.splitlines():
        if ln.strip() and not ln.startswith(" "):
            out.append("comment" if ln.startswith("#") else ln.split()[0] if ln.startswith("-") else "requirement")
    return out


def markdown_tokens(text: str) -> list[str]:
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark").enable("table")
    out = []
    for tok in md.parse(text):
        out.append(tok.type)
        for child in tok.children or []:
            out.append("  " + child.type)
    return out


def check_outputs(hostile: dict[str, str], twin: dict[str, str], sandbox: Path,
                  tally: Tally, label: str, errors: dict[str, str] | None = None) -> None:
    import yaml

    def add(lang: str, ok: bool, detail: str) -> None:
        tally.add(lang, ok, f"{label} {lang}: {detail}")

    for name, text in hostile.items():
        if not twin[name]:
            # The benign twin was refused too (a plain word where the exporter wants a version):
            # nothing to compare, counted apart.
            tally.add(f"({name}: twin refused)", True, "")
            continue
        if not text:
            # The command refused the hostile lock: a pass when it is the documented exit 2 with
            # a one-line message, not a crash (exit 3 "internal error", a traceback).
            why = (errors or {}).get(name, "exit 2")
            tally.add(f"({name} refused)", why.startswith("exit 2") and "Traceback" not in why,
                      f"{label} {name}: refused with {why[:200]!r}")
            continue
        if name == "dockerfile":
            h, t = dockerfile_instructions(text), dockerfile_instructions(twin[name])
            ok = [i for i, _ in h] == [i for i, _ in t]
            detail = f"instructions {[i for i, _ in h]} vs {[i for i, _ in t]}"
            if ok:
                for instr, rest in h:
                    if instr != "RUN" and re.search(r"(?<!\\)\$\{?ZQ", rest):
                        ok, detail = False, f"unescaped variable in {instr} {rest[:120]!r}"
                        break
                    if instr == "RUN" and not rest.lstrip().startswith("["):
                        good, why = run_shell(rest + "\n", sandbox)
                        if not good:
                            ok, detail = False, f"RUN {rest[:160]!r}: {why}"
                            break
            add("dockerfile", ok, detail)
        elif name == "apptainer":
            h, t = apptainer_sections(text), apptainer_sections(twin[name])
            ok = [n for n, _ in h] == [n for n, _ in t]
            detail = f"sections {[n for n, _ in h]}"
            for sec, body in h if ok else []:
                if sec in ("%post", "%environment", "%runscript", "%test"):
                    good, why = run_shell(body + "\n", sandbox)
                    if not good:
                        ok, detail = False, f"{sec}: {why}"
                        break
            add("apptainer", ok, detail)
        elif name == "slurm":
            good, why = run_shell(text, sandbox)
            exports_h = re.findall(r"^#SBATCH\s+--export=(\S*)", text, re.M)
            exports_t = re.findall(r"^#SBATCH\s+--export=(\S*)", twin[name], re.M)
            sb_h = [ln.split()[1].split("=")[0] for ln in text.splitlines() if ln.startswith("#SBATCH ")]
            sb_t = [ln.split()[1].split("=")[0] for ln in twin[name].splitlines() if ln.startswith("#SBATCH ")]
            ok = good and sb_h == sb_t and [e.count(",") for e in exports_h] == [e.count(",") for e in exports_t]
            add("shell/sbatch", ok, why or f"#SBATCH lines {sb_h} vs {sb_t}, exports {exports_h}")
        elif name == "k8s":
            try:
                detail = new_shape(list(yaml.safe_load_all(text)), list(yaml.safe_load_all(twin[name])))
                ok = not detail
            except yaml.YAMLError as exc:
                ok, detail = False, f"yaml: {str(exc)[:160]}"
            add("yaml", ok, detail)
        elif name == "pylock":
            import tomllib

            try:
                detail = new_shape(tomllib.loads(text), tomllib.loads(twin[name]))
                ok = not detail
            except tomllib.TOMLDecodeError as exc:
                ok, detail = False, f"toml: {exc}"
            add("toml", ok, detail)
        elif name == "requirements":
            from packaging.requirements import InvalidRequirement, Requirement

            h_lines, t_lines = requirement_lines(text), requirement_lines(twin[name])
            ok, detail = h_lines == t_lines, f"lines {h_lines} vs {t_lines}"
            for ln in text.splitlines():
                if ln.strip() and not ln.startswith(("#", "-")):
                    try:
                        Requirement(ln.split(" --hash")[0].rstrip(" \\"))
                    except InvalidRequirement as exc:
                        ok, detail = False, f"requirement {ln[:120]!r}: {exc}"
            add("requirements", ok, detail)
        elif name in ("cyclonedx", "intoto"):
            try:
                detail = new_shape(json.loads(text), json.loads(twin[name]))
                ok = not detail
            except ValueError as exc:
                ok, detail = False, f"json: {exc}"
            add("json", ok, detail)
        elif name == "latex":
            (hw, hc), (tw, tc) = latex_profile(text), latex_profile(twin[name])
            new = hw - tw - LATEX_ESCAPES
            # Braces: a value may add balanced groups (a longer cell is split into several
            # \\texttt{} pieces); a stray one shows as an unbalanced depth.
            depth, low = 0, 0
            for ch in re.sub(r"\\([A-Za-z]+|.)", " ", text):
                depth += {"{": 1, "}": -1}.get(ch, 0)
                low = min(low, depth)
            same = {c: n for c, n in hc.items() if c not in "{}"} == {c: n for c, n in tc.items() if c not in "{}"}
            ok = not new and same and depth == 0 and low == 0
            add("latex", ok, f"new control words {sorted(new)}, braces end at depth {depth} (lowest {low}), "
                             f"specials {hc} vs {tc}")
        elif name == "markdown":
            h_tok, t_tok = markdown_tokens(text), markdown_tokens(twin[name])
            ok = h_tok == t_tok
            diff = [x for x in h_tok if x not in t_tok][:6]
            add("markdown", ok, f"tokens differ (new: {diff})")


def self_check(sandbox: Path) -> None:
    """Each consumer must see a planted injection, so that a broken check cannot report 0."""
    assert not run_shell("echo a; zqpwn\n", sandbox)[0], "the shell sandbox missed the sentinel"
    assert not run_shell("x=\"$(zqpwn)\"; set -e; exec srun y; cd /nowhere; exit 1\n", sandbox)[0]
    assert run_shell("echo '$(zqpwn)' \"\\$(zqpwn)\"\n", sandbox)[0], "the sandbox flags inert text"
    assert [i for i, _ in dockerfile_instructions("FROM a\nRUN a \\\n  b\n# c\nRUN zqpwn\n")] == ["FROM", "RUN", "RUN"]
    assert "  link_open" in markdown_tokens("| a |\n|---|\n| [x](http://e.org) |\n")
    assert "input" in latex_profile("a \\input{x}")[0]
    assert requirement_lines("# a\n--no-index\nsix==1 \\\n    --hash=sha256:ab\n") == ["comment", "--no-index", "requirement"]
    import yaml

    assert new_shape(yaml.safe_load("a: {b: 1}"), yaml.safe_load("a: x")), "the YAML shape missed a new key"
    assert new_shape(yaml.safe_load("a: yes"), yaml.safe_load("a: x")), "the YAML shape missed a boolean"
    assert [n for n, _ in apptainer_sections("Bootstrap: docker\n%post\n  x\n%runscript\n")] == \
        ["header", "%post", "%runscript"]


def injections(rng: random.Random, n: int, work: Path, tally: Tally, verbose: bool) -> tuple[int, int]:
    from pydantic import ValidationError

    from envlock import lock as lockio
    from envlock.errors import EnvlockError
    from envlock.lock import Lock

    base = base_doc()
    sys.path.insert(0, str(ROOT / "tests"))
    from model_slots import string_slots  # the tests' walk of the model, one for both

    slots = [s for s in string_slots(Lock) if s[0][0] != "envlock" or s[0][1] in ("note", "tool_version")]
    accepted = refused = 0
    sandbox = work / "sandbox"
    sandbox.mkdir()
    self_check(sandbox)
    for i in range(n):
        hostile, twin, what = draw_lock(rng, slots, base)
        LOCK_VALUES.clear()
        LOCK_VALUES.update(v for d in (hostile, twin) for v in _strings(d))
        paths = []
        for kind, doc in (("hostile", hostile), ("twin", twin)):
            try:
                path = work / f"{kind}.lock"
                lockio.save(lockio.seal(Lock.model_validate(doc)), path)
                paths.append(path)
            except (ValidationError, ValueError, EnvlockError):
                break
        if len(paths) < 2:
            refused += 1
            if verbose:
                print(f"lock {i}: refused at entry: {what}")
            continue
        accepted += 1
        h_out = render_all(paths[0], work / "h")
        h_err = dict(ERRORS)
        t_out = render_all(paths[1], work / "t")
        check_outputs(h_out, t_out, sandbox, tally, f"lock {i} {what}", h_err)
        if verbose:
            print(f"lock {i}: {len([v for v in h_out.values() if v])} outputs: {what}")
            for name, msg in {**h_err, **{f"twin {k}": v for k, v in ERRORS.items()}}.items():
                if msg:
                    print(f"    {name} refused: {msg[:200]!r}")
    return accepted, refused


# -- fail-open: hostile environments ----------------------------------------------------------------

HOSTILE_KINDS = ("devzero", "urandom", "fifo", "socket", "dir-in-place", "huge", "non-utf8-name",
                 "non-utf8-version", "long-version", "shell-version", "symlink-out", "sitecustomize")


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def _dist(site: Path, name: str, version: str, files: dict[str, str] | None = None) -> Path:
    d = site / f"{name}-{version}.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (d / "INSTALLER").write_text("pip\n")
    (d / "RECORD").write_text("")
    for k, v in (files or {}).items():
        (d / k).write_text(v)
    return d


def make_hostile(rng: random.Random, kind: str, venv: Path, outside: Path) -> list[socket.socket]:
    """Fill the venv's site-packages with one hostile kind (plus a few plain distributions);
    returns sockets to keep open while the case runs."""
    site = _site(venv)
    keep: list[socket.socket] = []
    for j in range(rng.randint(1, 4)):
        _dist(site, f"plain{j}", f"1.{rng.randint(0, 99)}")
    name = "hostile" + "".join(rng.choices(string.ascii_lowercase, k=4))
    member = rng.choice(["RECORD", "METADATA", "direct_url.json", "INSTALLER"])
    d = _dist(site, name, "1.0", {"direct_url.json": json.dumps({"url": "file:///x", "dir_info": {}})})
    target = d / member
    if kind in ("devzero", "urandom"):
        target.unlink(missing_ok=True)
        target.symlink_to("/dev/zero" if kind == "devzero" else "/dev/urandom")
    elif kind == "fifo":
        target.unlink(missing_ok=True)
        os.mkfifo(target)
    elif kind == "socket":
        target.unlink(missing_ok=True)
        s = socket.socket(socket.AF_UNIX)
        here = os.getcwd()
        os.chdir(target.parent)  # a socket's path is limited to about 100 bytes: bind it relative
        try:
            s.bind(target.name)
        finally:
            os.chdir(here)
        s.listen(1)
        keep.append(s)
    elif kind == "dir-in-place":
        target.unlink(missing_ok=True)
        target.mkdir()
        (target / "x").write_text("x")
    elif kind == "huge":
        with target.open("ab") as f:
            f.truncate(rng.choice([64, 256, 1024]) * 1024 * 1024)  # sparse: fast to make, huge to read
    elif kind == "non-utf8-name":
        raw = os.fsencode(str(site)) + b"/bad\xff" + bytes([rng.randint(0x80, 0xfe)]) + b"-1.0.dist-info"
        os.makedirs(raw)
        with open(raw + b"/METADATA", "wb") as f:
            f.write(b"Metadata-Version: 2.1\nName: bad\xff\nVersion: 1.0\n")
    elif kind == "non-utf8-version":
        with (d / "METADATA").open("wb") as f:
            f.write(b"Metadata-Version: 2.1\nName: " + name.encode() + b"\nVersion: 1.\xff\xfe" + bytes([rng.randint(0x80, 0xff)]) + b"\n")
    elif kind == "long-version":
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.{'9' * rng.randint(290, 400)}\n")
    elif kind == "shell-version":
        meta = rng.choice(["$(touch zqpwn)", "`id`", "1.0; rm -rf x", "1.0\nName: other", "1.0 && x", "'\"\\"])
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {meta}\n")
    elif kind == "symlink-out":
        real = outside / f"{name}-2.0.dist-info"
        real.mkdir(parents=True, exist_ok=True)
        (real / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}out\nVersion: 2.0\n")
        (real / "RECORD").write_text("")
        (site / f"{name}out-2.0.dist-info").symlink_to(real)
    elif kind == "sitecustomize":
        (site / "sitecustomize.py").write_text(
            "print('{\"hijacked\": true}')\nimport sys\nsys.stdout.write('envlock-probe garbage\\n')\n")
    return keep


def failopen(rng: random.Random, n: int, work: Path, tally: Tally, timeout: float,
             verbose: bool) -> tuple[int, int, int, float]:
    """(cases, bounded, fail-open, slowest seconds)."""
    bounded = fails = 0
    slowest = 0.0
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work / "home"),
           "PYTHONPATH": str(ROOT), "ENVLOCK_CACHE_DIR": str(work / "cache"), "LANG": "C.UTF-8"}
    (work / "home").mkdir(exist_ok=True)
    for i in range(n):
        kinds = rng.sample(HOSTILE_KINDS, rng.randint(1, 3))
        case = work / f"env{i}"
        venv = case / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        keep = []
        for kind in kinds:
            keep += make_hostile(rng, kind, venv, case / "outside")
        label = f"env {i} {'+'.join(kinds)}"
        lock = case / "env.lock"
        py = str(venv / "bin" / "python")
        try:
            t0 = time.monotonic()
            try:
                cap = subprocess.run([sys.executable, "-m", "envlock", "capture", "--no-torch", "--python", py,
                                      "-o", str(lock)], cwd=case, env=env, capture_output=True, text=True,
                                     timeout=timeout, check=False)
            except subprocess.TimeoutExpired:
                tally.add("capture-bounded", False, f"{label}: capture ran past {timeout:.0f} s")
                continue
            took = time.monotonic() - t0
            slowest = max(slowest, took)
            bounded += 1
            tally.add("capture-bounded", True, "")
            if cap.returncode != 0 or not lock.exists():
                # Refusing the environment is closed, not open: the exit must be documented.
                tally.add("capture-refused-cleanly", cap.returncode in (1, 2, 3, 4, 5, 6, 7, 8)
                          and "Traceback" not in cap.stderr, f"{label}: capture rc {cap.returncode}: {cap.stderr[-300:]}")
                continue
            _dist(_site(venv), "addedlater" + "".join(rng.choices(string.ascii_lowercase, k=4)), "0.1")
            t0 = time.monotonic()
            try:
                ver = subprocess.run([sys.executable, "-m", "envlock", "verify", str(lock), "--python", py],
                                     cwd=case, env=env, capture_output=True, text=True, timeout=timeout, check=False)
            except subprocess.TimeoutExpired:
                tally.add("verify-bounded", False, f"{label}: verify ran past {timeout:.0f} s")
                continue
            slowest = max(slowest, time.monotonic() - t0)
            tally.add("verify-bounded", True, "")
            ok = ver.returncode == 1
            if ver.returncode == 0:
                fails += 1
            tally.add("drift-caught", ok, f"{label}: verify rc {ver.returncode} (0 is fail-open): "
                      f"{(ver.stdout + ver.stderr)[-300:]!r}")
            if verbose:
                print(f"{label}: capture {took:.1f} s, verify rc {ver.returncode}")
        finally:
            for s in keep:
                s.close()
    return n, bounded, fails, slowest


# -- main -------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--seed", type=int, default=None, help="repeat a corpus (default: a fresh one)")
    ap.add_argument("--locks", type=int, default=40, help="hostile locks to draw (default 40)")
    ap.add_argument("--envs", type=int, default=12, help="hostile environments to build (default 12)")
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="seconds a capture or verify may take before it counts as unbounded (default 120)")
    ap.add_argument("--json", type=Path, default=None, help="write the counts here")
    ap.add_argument("--checkout", type=Path, default=None,
                    help="the envlock checkout to run (default: this one), to compare two revisions")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.checkout is not None:
        global ROOT
        ROOT = args.checkout.resolve()
    sys.path.insert(0, str(ROOT))
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    inj, env_tally = Tally(), Tally()
    with tempfile.TemporaryDirectory(prefix="envlock-advout-") as tmp:
        work = Path(tmp)
        accepted, refused = injections(rng, args.locks, work, inj, args.verbose)
        cases, bounded, fails, slowest = failopen(rng, args.envs, work, env_tally, args.timeout, args.verbose)
    injected = sum(inj.failed.values())
    env_bad = sum(env_tally.failed.values())
    print(f"adversarial outputs, seed {seed}: {args.locks} hostile locks ({accepted} accepted, "
          f"{refused} refused at entry)")
    print(f"\n{'output language':26} {'clean':>11}")
    for lang in sorted(inj.tried):
        t, f = inj.tried[lang], inj.failed[lang]
        print(f"{lang:26} {t - f:>5}/{t:<5}")
    print(f"\nhostile environments: {cases} cases, {bounded} captures bounded, fail-open {fails}, "
          f"slowest command {slowest:.1f} s")
    for kind in sorted(env_tally.tried):
        t, f = env_tally.tried[kind], env_tally.failed[kind]
        print(f"{kind:24} {t - f:>4}/{t:<4}")
    print(f"\ninjections: {injected}   fail-open: {fails}   other environment failures: {env_bad - fails}")
    for line in (inj.examples + env_tally.examples)[:40]:
        print("  " + line[:600])
    if args.json:
        args.json.write_text(json.dumps({
            "seed": seed, "locks": args.locks, "accepted": accepted, "refused_at_entry": refused,
            "injections": injected, "outputs": {k: [v - inj.failed[k], v] for k, v in inj.tried.items()},
            "envs": cases, "bounded": bounded, "fail_open": fails, "slowest_s": round(slowest, 1),
            "env_checks": {k: [v - env_tally.failed[k], v] for k, v in env_tally.tried.items()}}, indent=2))
    return 1 if injected or env_bad else 0


if __name__ == "__main__":
    sys.exit(main())
