"""``envlock replay REC``: re-run a command recorded on this host and compare with its record
(``--against REC2``: compare two records, running nothing)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from envlock.commands._recording import JOURNAL, finish, journal_dir, plan
from envlock.commands.record import command_of, run_here
from envlock.errors import UsageError


def run(args: argparse.Namespace) -> int:
    command = command_of(args, "replay")
    args.output, args.input = None, None
    base = Path(args.workspace or ".").resolve()
    p = plan(args, replay_path=args.rec, base=base, command=command)
    original = p.original
    assert original is not None
    if args.against:
        from envlock.commands._recording import verdict
        from envlock.replay.compare import Tolerance, compare_records
        from envlock.replay.record import load as load_record

        # The two records' own inputs: what each run read, not what the disk holds today.
        other = load_record(args.against)
        cmp = compare_records(original, other, Tolerance(args.rtol, args.atol))
        code = verdict(cmp, args.rec, as_json=args.json)
        if args.report is not None:
            from envlock.commands._recording import write_report

            write_report(args.report, cmp, original, other, args.rec)
        return code
    if original.record.where == "container":
        made = original.record.pack or original.record.lock
        # Relative to the record in the record; relative to here in a command to type.
        lock = os.path.relpath(os.path.join(os.path.dirname(os.path.abspath(args.rec)), made)) if made else "env.lock"
        raise UsageError(f"{args.rec} was recorded in the {'pack' if original.record.pack else 'lock'}'s image",
                         hint=f"replay it there: envlock run {lock} --replay {args.rec}")
    if not command:
        from envlock.replay.record import command_to_replay

        command = command_to_replay(original, args.rec)
    lock = None
    if original.record.lock:
        path = os.path.join(os.path.dirname(os.path.abspath(args.rec)), original.record.lock)
        if os.path.exists(path):
            from envlock.commands._output import err
            from envlock.lock import LOCK_NAME, load

            shown = os.path.relpath(path)
            if shown != LOCK_NAME:  # as a lock found upward is named: the reader knows which
                err(f"envlock: reading {shown}\n")
            lock = load(path)
    from envlock.replay.make import check_program, resolve_program
    from envlock.restore.venvtarget import restored_from

    elsewhere = check_program(original, command, base, lock, args.rec, restored_from)
    if elsewhere is not None:
        from envlock.commands._output import say
        from envlock.text.terminal import safe

        say(safe(f"{command[0]} runs {elsewhere}, in a venv restored from the record's lock: the same "
                 "environment, replayed there"))
    from envlock.commands._recording import compile_files, compile_report
    from envlock.replay.compilecache import compile_run

    cache, _ = compile_files(args, lock, original.record.lock)
    with journal_dir() as journal, compile_run(cache, None, container=False) as compiled:
        code, stderr_tail, stop = run_here(command, journal, base, compiled, trace=not args.no_trace,
                                           stdout_to_stderr=args.json)
        if stop is None:  # a command stopped early may not have reached the loader's status
            compiled.loaded()
        compile_report(compiled, original)
        return finish(p, journal / JOURNAL, command=command, exit_code=code, where="host", base=base,
                      lock=lock, lock_path=None, tolerance=(args.rtol, args.atol), as_json=args.json,
                      program=resolve_program(command[0], base), stderr_tail=stderr_tail, stop=stop)
