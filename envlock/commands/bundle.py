"""``envlock bundle``: collect every wheel of a lock for offline replay."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envlock.commands._lockpath import lock_arg
from envlock.commands._output import say
from envlock.errors import EXIT_OK
from envlock.text.terminal import plural


def run(args: argparse.Namespace) -> int:
    from envlock.export.bundle import bundle
    from envlock.lock import load

    args.lock = lock_arg(args.lock)
    lock = load(args.lock)
    result = bundle(lock, Path(args.output), source=Path(args.wheelhouse) if args.wheelhouse else None,
                    index_url=args.index_url, pip_find_links=Path(args.find_links) if args.find_links else None,
                    skip_local=args.skip_local, python=args.python, allow_http=args.allow_http, say=say)
    for name in result.missing_tooling:
        say(f"note: no wheel for {name}; a restore takes it from the base image's ensurepip")
    if result.unproven:
        from envlock.restore.context import unproven_warning

        say(unproven_warning(result.unproven))
    if result.own:
        say(f"note: envlock-ml: {result.own}, a wheel of the envlock that bundles (a restore "
            "installs the restoring envlock's own)")
    if result.skipped:
        say(f"note: not bundled: {', '.join(result.skipped)}")
    downloaded = sum(1 for _, origin in result.origins if origin == "index")
    found = f" ({len(result.files) - downloaded} found on disk, {downloaded} downloaded)" if result.origins else ""
    sys.stdout.write(f"bundled {plural(len(result.files), 'file')}{found} for {lock.short_id} into {result.directory}; "
                     f"replay offline with: envlock restore {args.lock} --wheelhouse {result.directory}\n")
    return EXIT_OK
