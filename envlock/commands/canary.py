"""``envlock canary``: run the numeric canary here, print its hashes, optionally check a lock's."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from envlock.errors import EXIT_DRIFT, EXIT_OK, LockInvalid, TorchMissing

if TYPE_CHECKING:
    from envlock.drift import Comparison
    from envlock.model import Canary


def _text(canary: Canary) -> str:
    devices = sorted({r.device for r in canary.results})
    duration = f" in {canary.duration_ms:.0f} ms" if canary.duration_ms is not None else ""
    lines = [f"canary v{canary.version}, torch {canary.torch or '-'}: {len(canary.results)} "
             f"results on {', '.join(devices) or 'no device'}{duration}"]
    if canary.results:
        wn = max(len(r.name) for r in canary.results)
        wd = max(len(r.device) for r in canary.results)
        wt = max(len(r.dtype) for r in canary.results)
        lines += [f"  {r.name.ljust(wn)}  {r.device.ljust(wd)}  {r.dtype.ljust(wt)}  {r.sha256[:16]}"
                  for r in canary.results]
    for key, why in sorted(canary.errors.items()):
        lines.append(f"  failed: {key}: {why}")
    if canary.settings:
        lines.append("settings: " + ", ".join(f"{k}={v}" for k, v in canary.settings.items()))
    return "\n".join(lines) + "\n"


def _check_text(cmp: Comparison, name: str) -> str:
    shown = [d for d in cmp.differences if d.severity != "info"]
    if not shown:
        return f"OK: same bytes as the canary in {name}\n"
    body = "".join(f"  {d.severity.upper() if d.severity == 'breaking' else d.severity}  "
                   f"{d.describe()}\n" for d in shown)
    verdict = (f"NUMERIC DRIFT: {len(cmp.breaking)} kernel(s) differ from {name}\n"
               if cmp.breaking else "OK: no breaking difference\n")
    return body + verdict


def run(args: argparse.Namespace) -> int:
    expected = None
    if args.against:  # read the lock before the (slow) canary, so a bad path fails at once
        from envlock.lockfile import load

        expected = load(args.against)
        if expected.canary is None:
            raise LockInvalid(f"{args.against} has no [canary] table",
                              hint="capture it with `envlock capture --canary`")
    from envlock.target import choose, same_path

    # The environment is chosen as capture chooses it: installed as a tool (pipx, uv tool),
    # envlock's own interpreter has no torch, the project's .venv or active venv has.
    target = choose(args.python)
    if not same_path(target.prefix, sys.prefix):
        from envlock._capture import capture

        probed = capture(python=target.python, canary=True, in_process=False)
        current = probed.canary
        if current is None:
            why = probed.probe.errors.get("torch") or probed.probe.errors.get("canary") or "unknown reason"
            raise TorchMissing(f"the canary could not run in {target.describe()}: {why}")
    else:
        from envlock.runtime import canary

        current = canary(args.device or None)
    result = EXIT_OK
    payload: dict[str, object] = {"canary": current.model_dump(mode="json", exclude_none=True)}
    text = _text(current)
    if expected is not None:
        from envlock.drift import compare

        # Same lock, only the canary replaced: every difference compare() finds is numeric.
        cmp = compare(expected, expected.model_copy(update={"canary": current}))
        payload["comparison"] = cmp.to_dict()
        text += _check_text(cmp, str(args.against))
        result = EXIT_OK if cmp.ok else EXIT_DRIFT
    if args.json:
        sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
    else:
        sys.stdout.write(text)
    sys.stdout.flush()
    return result

