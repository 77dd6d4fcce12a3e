"""``envlock fmt``: validate, normalise and re-seal a lock after a deliberate edit."""

from __future__ import annotations

import argparse
from pathlib import Path

from envlock.commands._lockpath import lock_arg
from envlock.commands._output import out, say_link
from envlock.errors import EXIT_DRIFT, EXIT_OK


def run(args: argparse.Namespace) -> int:
    args.lock = lock_arg(args.lock)
    from envlock.lock import atomic_write, dumps, load, read_text, seal

    path = Path(args.lock)
    before = read_text(path)
    lock = load(path, verify_seal=False)
    if args.require:
        from envlock.drift.requirements import requirement_updates, with_requirements

        lock = with_requirements(lock, requirement_updates(args.require))
    lock = seal(lock)
    after = dumps(lock, path.name)
    if after == before:
        out(f"{path} is already normalised and sealed (id {lock.short_id})\n")
        return EXIT_OK
    if args.check:
        out(f"{path} would be re-sealed or reformatted\n")
        return EXIT_DRIFT
    say_link(path)
    atomic_write(path, after)
    out(f"re-sealed {path}  id {lock.short_id}\n")
    return EXIT_OK
