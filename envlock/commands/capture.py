"""``envlock capture``: record an environment into a lock file (or stdout)."""

from __future__ import annotations

import argparse

from envlock.commands._output import err, out, say_link
from envlock.errors import EXIT_OK
from envlock.text.terminal import plural, safe


def run(args: argparse.Namespace) -> int:
    # Nothing heavy is imported before capture(): it starts the probe first and imports
    # pydantic and the models while the probe runs.
    from envlock.probing.capture import capture

    updates = None
    if args.require:  # a bad --require is exit 2 before the probe runs
        from envlock.drift.requirements import requirement_updates

        updates = requirement_updates(args.require)
    if args.in_image:
        # Lock an image that is not running: the probe runs in a throwaway container.
        from envlock.restore.inimage import capture_in_image

        lock = capture_in_image(args.in_image, python=args.python, torch=not args.no_torch,
                                canary=args.canary, note=args.note, engine=args.engine)
        locked = None
    else:
        from envlock.probing.target import choose

        target = choose(args.python)
        if target.warning:
            err(f"envlock: warning: {target.warning}\n")
        if not args.no_cache:
            from envlock.probe.statcache import refusal

            why = refusal()
            if why:  # the capture is right without it, only slower: say why
                err(f"envlock: note: cache not used (neither read nor written): {safe(why)}\n")
        lock = capture(python=target.python, torch=not args.no_torch, canary=args.canary,
                       image=args.image, note=args.note, in_process=False, deep=args.deep,
                       cache=not args.no_cache,
                       git_exclude=[] if args.output == "-" else [args.output])
        locked = f"locked {target.probed(lock.python.prefix).describe()}"
    if args.strict and lock.unreadable:
        from envlock.errors import CaptureIncomplete

        first = lock.unreadable[0]
        raise CaptureIncomplete(
            f"{plural(len(lock.unreadable), 'thing')} could not be captured, so no lock was written "
            f"(--strict); first: {first.section}{' ' + first.item if first.item else ''}: {first.error}",
            hint="fix or remove what the probe cannot read, or capture without --strict to "
                 "record it as [[unreadable]] (verify then fails)")
    from envlock.lock import dumps, save

    if updates:
        from envlock.drift.requirements import with_requirements
        from envlock.lock import seal

        lock = seal(with_requirements(lock, updates))
    if args.output != "-":
        path = save(lock, args.output, force=args.force, reseal=False)
        say_link(path)
        if not args.json:
            from envlock.report.render import capture_summary

            summary, notes = capture_summary(lock, str(path), locked, verbose=args.verbose)
            out(summary)
            if notes:
                err(notes)
            return EXIT_OK
    # The one document on stdout is the lock: as JSON with --json, which with -o - is all that
    # is written (nothing goes to disk).
    if args.json:
        from envlock.report.render import show_json

        out(show_json(lock))
    else:
        out(dumps(lock))
    if locked:
        err(f"envlock: {locked}\n")
    return EXIT_OK
