"""``envlock canary``: run the numeric canary here, print its hashes, optionally check a lock's."""

from __future__ import annotations

import argparse
import sys

from envlock.commands._output import out
from envlock.errors import EXIT_DRIFT, EXIT_OK, LockInvalid, TorchMissing
from envlock.report.render import canary_check_text, canary_json, canary_text


def run(args: argparse.Namespace) -> int:
    expected = None
    if args.against:  # read the lock before the (slow) canary, so a bad path fails at once
        from envlock.lock import load

        expected = load(args.against)
        if expected.canary is None:
            raise LockInvalid(f"{args.against} has no [canary] table",
                              hint="capture it with `envlock capture --canary`")
    from envlock.probing.target import choose, same_path

    # The environment is chosen as capture chooses it: installed as a tool (pipx, uv tool),
    # envlock's own interpreter has no torch, the project's .venv or active venv has.
    target = choose(args.python)
    if not same_path(target.prefix, sys.prefix):
        from envlock.probing.capture import capture

        probed = capture(python=target.python, canary=True, in_process=False)
        current = probed.canary
        if current is None:
            why = probed.probe.errors.get("torch") or probed.probe.errors.get("canary") or "unknown reason"
            raise TorchMissing(f"the canary could not run in {target.describe()}: {why}")
    else:
        from envlock.runtime import canary

        current = canary(args.device or None)
    cmp = None
    if expected is not None:
        from envlock.drift.compare import compare

        # Same lock, only the canary replaced: every difference compare() finds is numeric.
        cmp = compare(expected, expected.model_copy(update={"canary": current}))
    if args.json:
        out(canary_json(current, cmp))
    else:
        out(canary_text(current) + (canary_check_text(cmp, str(args.against)) if cmp is not None else ""))
    return EXIT_OK if cmp is None or cmp.ok else EXIT_DRIFT

