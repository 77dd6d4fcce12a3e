"""``envlock diff``: compare two locks."""

from __future__ import annotations

import argparse

from envlock.commands._output import deliver, out
from envlock.errors import EXIT_DRIFT, EXIT_OK


def run(args: argparse.Namespace) -> int:
    from envlock.drift.compare import compare
    from envlock.lock import load
    from envlock.report.render import comparison_json, diff_markdown, diff_text

    if args.b is None:  # `envlock diff other.lock`: the project's lock against it
        from envlock.commands._lockpath import lock_arg

        args.a, args.b = lock_arg(None), args.a
    a, b = load(args.a), load(args.b)
    # What verify compares; the process state (seeds, flags, variables the capturing process
    # set) is listed apart, as verify reports it, unless --process-state asks to compare it.
    cmp = compare(a, b, names=(str(args.a), str(args.b)),
                  process_state="compare" if args.process_state else "report")
    if args.format == "json":
        text = comparison_json(cmp, a=str(args.a), b=str(args.b))
    elif args.format == "markdown":
        text = diff_markdown(cmp, a, b, str(args.a), str(args.b))
    elif args.format == "html":
        from envlock.report.page import diff_html

        text = diff_html(cmp, a, b, str(args.a), str(args.b))
    else:
        text = diff_text(cmp, str(args.a), str(args.b))
    if args.output is None:
        out(text)
    else:
        deliver(text, args.output)
    significant = any(d.severity != "info" for d in cmp.differences)
    return EXIT_DRIFT if significant else EXIT_OK
