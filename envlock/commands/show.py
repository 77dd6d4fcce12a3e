"""``envlock show``: summarise a lock as text, markdown, JSON or a LaTeX table."""

from __future__ import annotations

import argparse
from pathlib import Path

from envlock.commands._lockpath import lock_arg
from envlock.commands._output import out
from envlock.errors import EXIT_OK


def run(args: argparse.Namespace) -> int:
    args.lock = lock_arg(args.lock)
    from envlock.lock import load

    lock = load(args.lock)
    from envlock.report.render import show_json, show_markdown, show_text

    name = Path(args.lock).name
    if args.format == "json":
        out(show_json(lock))
    elif args.format == "markdown":
        out(show_markdown(lock, name))
    elif args.format == "latex":
        from envlock.export.latex import show_latex

        out(show_latex(lock, name))
    else:
        out(show_text(lock, str(args.lock)))
    return EXIT_OK
