"""``envlock record REC -- CMD``: run a command on this host and record what it produced."""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

from envlock.commands._recording import JOURNAL, finish, journal_dir, plan
from envlock.errors import EXIT_ENV, UsageError


def command_of(args: argparse.Namespace, kind: str) -> list[str]:
    """The command after REC (and after ``--``); the options before it are parsed into ``args``."""
    from envlock.commands._parser import command_after_options, host_options_parser

    return command_after_options(args, list(args.cmd or []),
                                 lambda command: host_options_parser(kind, command=command))


def run_here(command: list[str], journal: Path, base: Path) -> int:
    """CMD as a child of this process, with the journal's path in its environment."""
    from envlock.runtime.recorder import RECORD_ENV

    if not base.is_dir():
        raise UsageError(f"--workspace {base} is not a directory")
    try:
        return subprocess.call(command, cwd=base, env={**os.environ, RECORD_ENV: str(journal / JOURNAL)})
    except FileNotFoundError:
        raise UsageError(f"{command[0]}: command not found") from None
    except PermissionError:
        raise UsageError(f"{command[0]}: permission denied") from None


def run(args: argparse.Namespace) -> int:
    command = command_of(args, "record")
    if not command:
        raise UsageError("nothing to run: envlock record REC -- CMD ...")
    from envlock.commands._lockpath import optional_lock_arg

    lock_path = optional_lock_arg(args.lock)
    lock = None
    if lock_path:
        from envlock.lock import load

        lock = load(lock_path)
    base = Path(args.workspace or ".").resolve()
    p = plan(args, replay_path=None, base=base, command=command)
    with journal_dir() as journal:
        code = run_here(command, journal, base)
        if code < 0:
            code = EXIT_ENV if code != -2 else 130
        return finish(p, journal / JOURNAL, command=command, exit_code=code, where="host", base=base,
                      lock=lock, lock_path=lock_path, tolerance=(0.0, 0.0))
