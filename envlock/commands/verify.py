"""``envlock verify``: does this environment match the lock?"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from envlock._deepreport import summary, torch_facts_line
from envlock._render import comparison_json, verify_text
from envlock._target import choose, recorded_prefix_hint
from envlock._verify import check
from envlock.commands._output import err, out
from envlock.errors import EXIT_DRIFT, EXIT_OK

if TYPE_CHECKING:
    from envlock._recordcmp import ReplayComparison


def run(args: argparse.Namespace) -> int:
    target = choose(args.python)
    if target.warning:
        err(f"envlock: warning: {target.warning}\n")
    result = check(args.lock, python=target.python, torch=False if args.no_torch else None,
                   in_process=False, strict=args.strict, deep=args.deep, cache=not args.no_cache,
                   limit=None if args.all else 10)
    cmp, expected, current, report = result.comparison, result.expected, result.current, result.deep

    target = target.probed(current.python.prefix)
    captured_from = None if args.python else recorded_prefix_hint(expected.python.prefix, target)
    inputs = record_inputs(args.record) if args.record else None
    if args.json:
        text = comparison_json(cmp, lock=str(args.lock), id=expected.short_id,
                               environment={"prefix": target.prefix, "reason": target.reason},
                               captured_from=captured_from,
                               torch_facts=current.probe.torch_facts, deep=report)
        if inputs is not None:
            import json

            doc = json.loads(text)
            doc["record_inputs"] = inputs.to_dict()["inputs"]
            text = json.dumps(doc, indent=2) + "\n"
        out(text)
    else:
        out(verify_text(cmp, expected, str(args.lock), show_info=args.all,
                        environment=target.describe(), captured_from=captured_from)
            + summary(report) + torch_facts_line(current))
        if inputs is not None:
            from envlock._replay_report import inputs_text

            out(inputs_text(inputs, args.record))
    return EXIT_OK if cmp.ok and (inputs is None or inputs.same) else EXIT_DRIFT


def record_inputs(path: str) -> ReplayComparison:
    """The record's inputs (data paths relative to the current directory, Hugging Face cache
    revisions) read again; a changed one is drift. Read before the probe's verdict is printed,
    so a bad record is exit 2 with nothing else said."""
    from pathlib import Path

    from envlock._record import load
    from envlock._replay import check_inputs

    return check_inputs(load(path), Path.cwd())
