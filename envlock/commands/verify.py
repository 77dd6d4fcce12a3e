"""``envlock verify``: does this environment match the lock?"""

from __future__ import annotations

import argparse

from envlock._deepreport import summary, torch_facts_line
from envlock._render import comparison_json, verify_text
from envlock._target import choose, recorded_prefix_hint
from envlock._verify import check
from envlock.commands._lockpath import lock_arg
from envlock.commands._output import err, out
from envlock.errors import EXIT_DRIFT, EXIT_OK


def run(args: argparse.Namespace) -> int:
    args.lock = lock_arg(args.lock)
    target = choose(args.python)
    if target.warning:
        err(f"envlock: warning: {target.warning}\n")
    result = check(args.lock, python=target.python, torch=False if args.no_torch else None,
                   in_process=False, strict=args.strict, deep=args.deep, cache=not args.no_cache,
                   limit=None if args.all else 10)
    cmp, expected, current, report = result.comparison, result.expected, result.current, result.deep

    target = target.probed(current.python.prefix)
    captured_from = None if args.python else recorded_prefix_hint(expected.python.prefix, target)
    if args.json:
        out(comparison_json(cmp, lock=str(args.lock), id=expected.short_id,
                            environment={"prefix": target.prefix, "reason": target.reason},
                            captured_from=captured_from,
                            torch_facts=current.probe.torch_facts, deep=report))
    else:
        out(verify_text(cmp, expected, str(args.lock), show_info=args.all,
                        environment=target.describe(), captured_from=captured_from)
            + summary(report) + torch_facts_line(current))
    return EXIT_OK if cmp.ok else EXIT_DRIFT
