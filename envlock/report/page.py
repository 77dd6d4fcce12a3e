"""Report pages: one self-contained HTML file per lock (``show --format html``), comparison
(``diff --format html``) or replay (``replay/page``), for a pull request, a paper's artifact or
a reviewer with no envlock installed.

One style for all of them, written here: the page loads nothing (no script, no font, no
stylesheet, no image from anywhere: CSS in one ``<style>``, plots as inline SVG) and says so
to the browser with a Content-Security-Policy that forbids everything else, so a value that
escaped its escaping still could not run or fetch. Every value goes through ``text.escape.html``
where it is written: names, paths, notes, commands and lock values are data from elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from envlock._version import __version__
from envlock.text.escape import html
from envlock.text.terminal import dash, plural

if TYPE_CHECKING:
    from envlock.drift.result import Comparison
    from envlock.lock import Lock

# Nothing but the page's own inline style and data: images (none are used today) may load.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:70em;
padding:0 1em;color:#1b1b1b;background:#fff}
h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.15em;margin:1.6em 0 .5em;border-bottom:1px solid #ddd}
.verdict{font-size:1.2em;font-weight:600;padding:.6em .8em;border-radius:4px;margin:1em 0}
.ok{background:#e6f4ea;color:#0d5c2e}.bad{background:#fdecea;color:#8a1c1c}.warn{background:#fff4e0;color:#7a4b00}
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ddd;padding:.25em .6em;
text-align:left;vertical-align:top}th{background:#f6f6f6}
code,pre,.mono{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:.92em}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;white-space:pre-wrap;word-break:break-all}
.note{color:#555;font-size:.9em}figure{margin:1em 0}svg{max-width:100%;height:auto}
"""


def page(title: str, body: Iterable[str]) -> str:
    """The whole document around ``body`` (HTML already escaped by its writer)."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{html(title)}</title>\n<style>{_STYLE}</style></head>\n<body>\n"
            + "\n".join(body)
            + f"\n<p class=\"note\">Written by envlock {html(__version__)}. This page loads "
              "nothing from anywhere: it reads the same offline, years from now.</p>\n</body></html>\n")


def heading(level: int, text: str) -> str:
    return f"<h{level}>{html(text)}</h{level}>"


def para(text: str, cls: str | None = None) -> str:
    return f"<p class=\"{cls}\">{html(text)}</p>" if cls else f"<p>{html(text)}</p>"


def verdict(text: str, kind: str) -> str:
    """The verdict line; ``kind`` "ok", "bad" or "warn" colours it."""
    return f"<p class=\"verdict {kind}\" id=\"verdict\">{html(text)}</p>"


def table(rows: Iterable[Sequence[object]], head: Sequence[str] | None = None, mono: Sequence[int] = ()) -> str:
    """A table of escaped cells; ``mono``: the columns shown as code (paths, digests)."""
    out = ["<table>"]
    if head:
        out.append("<tr>" + "".join(f"<th>{html(h)}</th>" for h in head) + "</tr>")
    for row in rows:
        cells = [f"<td class=\"mono\">{html(dash(v))}</td>" if i in mono else f"<td>{html(dash(v))}</td>"
                 for i, v in enumerate(row)]
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "".join(out)


def pre(text: str) -> str:
    """A block of lines kept as written (a lock's TOML, a command's stderr), each escaped."""
    return "<pre>" + "\n".join(html(line) for line in text.split("\n")) + "</pre>"


def embedded(what: str, text: str) -> str:
    """A file carried whole by the page, folded: a reader copies it back out, no link needed."""
    return f"<details><summary>{html(what)}</summary>{pre(text)}</details>"


def show_html(lock: Lock, name: str, text: str | None = None) -> str:
    """``envlock show --format html``: the environment as a paper's appendix shows it, with the
    lock itself folded in (``text``: the file's TOML) so the page alone gives it back."""
    from envlock.report.render import replay_lines, shared_rows

    body = [heading(1, f"Environment envlock:{lock.short_id}"), para(f"{name}, fingerprint "
            f"{lock.envlock.fingerprint or 'unsealed'}", "mono"),
            heading(2, "Summary"), table(shared_rows(lock), ("what", "value")),
            heading(2, plural(len(lock.packages), "package")),
            table(((p.name, p.version, p.source) for p in lock.packages), ("package", "version", "source"))]
    with_envlock, without = replay_lines(name)
    body += [heading(2, "Replay it"), table((("with envlock", with_envlock), ("without envlock", without)),
                                             mono=(1,))]
    if text is not None:
        body.append(embedded(f"the lock, {name} (id {lock.short_id}): save this text as {name}", text))
    return page(f"envlock: {name} ({lock.short_id})", body)


def drift_tables(cmp: Comparison) -> list[str]:
    """The differences grouped as ``verify`` groups them: by category, in the order the
    comparator found them, each group with its severities counted."""
    from envlock.drift.result import counts_text

    out: list[str] = []
    for category in dict.fromkeys(d.category for d in cmp.differences):
        diffs = cmp.by_category(category)
        counts: dict[str, int] = {}
        for d in diffs:
            counts[d.severity] = counts.get(d.severity, 0) + 1
        out.append(heading(3, f"{category.replace('_', ' ')}: {counts_text(counts, zeros=False)}"))
        out.append(table(((d.severity, d.path, d.old, d.new) for d in diffs),
                         ("severity", "what", "before", "after"), mono=(1,)))
    return out


def diff_html(cmp: Comparison, a: Lock, b: Lock, a_name: str, b_name: str) -> str:
    """``envlock diff --format html``: what changed from ``a`` to ``b``, for a pull request."""
    from envlock.report.render import counts_line

    body = [heading(1, f"Environment diff envlock:{a.short_id} → envlock:{b.short_id}"),
            para(f"{a_name} → {b_name}", "mono")]
    significant = any(d.severity != "info" for d in cmp.differences)
    if not cmp.differences:
        body.append(verdict("No differences: the two locks describe the same environment", "ok"))
    else:
        body.append(verdict(counts_line(cmp), "bad" if cmp.breaking else "warn" if significant else "ok"))
        body += drift_tables(cmp)
    if cmp.process:
        body += [heading(2, f"Process state that differs ({len(cmp.process)}; not compared)"),
                 table(((d.path, d.old, d.new) for d in cmp.process), ("what", "before", "after"), mono=(0,))]
    return page(f"envlock diff: {a_name} → {b_name}", body)
