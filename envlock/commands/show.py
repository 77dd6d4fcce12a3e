"""``envlock show``: summarise a lock as text, markdown, JSON or a LaTeX table."""

from __future__ import annotations

import argparse
from pathlib import Path

from envlock.commands._output import out
from envlock.errors import EXIT_OK


def run(args: argparse.Namespace) -> int:
    from envlock.lockdata import light_view, read_data

    # A sealed lock is shown without the models (lockdata); LaTeX goes through them. The file
    # is read and parsed once either way.
    data = read_data(args.lock)
    lock = light_view(data) if args.format != "latex" else None
    if lock is None:
        from envlock.lockfile import from_dict

        lock = from_dict(data, str(args.lock))
    from envlock.render import show_json, show_markdown, show_text

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
