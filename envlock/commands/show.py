"""``envlock show``: summarise a lock as text, markdown, JSON, a LaTeX table or a page; a replay
record as a page or its metric plots."""

from __future__ import annotations

import argparse
from pathlib import Path

from envlock.commands._lockpath import lock_arg
from envlock.commands._output import deliver, out
from envlock.errors import EXIT_OK, UsageError


def is_record(path: str) -> bool:
    """Whether ``path`` holds a replay record rather than a lock (by its first table)."""
    from envlock.lock import file_head

    head = file_head(Path(path))
    return b"\n[record]\n" in head and b"\n[envlock]\n" not in head


def _record(args: argparse.Namespace) -> int:
    from envlock.replay import page
    from envlock.replay.record import load

    if args.format not in ("html", "svg", "png"):
        raise UsageError(f"{args.lock} is a replay record: show it with --format html, svg or png",
                         hint="or compare it with another: envlock replay REC --against REC2")
    rec = load(args.lock)
    name = Path(args.lock).name
    if args.format == "html":
        deliver(page.record_page(rec, name, lock_text=page.lock_beside(rec, args.lock)), args.output)
    else:
        deliver(page.image(args.format, page.series(rec)), args.output)
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    args.lock = lock_arg(args.lock)
    if is_record(args.lock):
        return _record(args)
    if args.format in ("svg", "png"):
        raise UsageError(f"--format {args.format} draws a replay record's metrics; {args.lock} is a lock",
                         hint="show a lock as a page with --format html")
    from envlock.lock import load

    lock = load(args.lock)
    from envlock.report.render import show_json, show_markdown, show_text

    name = Path(args.lock).name
    if args.format == "json":
        text = show_json(lock)
    elif args.format == "markdown":
        text = show_markdown(lock, name)
    elif args.format == "latex":
        from envlock.export.latex import show_latex

        text = show_latex(lock, name)
    elif args.format == "html":
        from envlock.lock import read_text
        from envlock.report.page import show_html

        text = show_html(lock, name, read_text(args.lock))
    else:
        text = show_text(lock, str(args.lock))
    if args.output is None:
        out(text)
    else:
        deliver(text, args.output)
    return EXIT_OK
