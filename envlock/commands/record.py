"""``envlock record REC -- CMD``: run a command on this host and record what it produced."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from envlock._signals import GRACE_SECONDS, GRACE_VAR, own_group, stop_process
from envlock.commands._output import say
from envlock.commands._recording import (
    JOURNAL,
    compile_files,
    compile_report,
    finish,
    journal_dir,
    plan,
    recording_env,
    trace_dir,
)
from envlock.errors import EXIT_ENV, EXIT_INTERRUPTED, UsageError
from envlock.probing.process import seconds_from_env
from envlock.replay.compilecache import CompileRun, compile_run
from envlock.text.terminal import Tail

# After the command exits, how long a child it left behind may keep its stderr open before
# envlock stops waiting for the last of it.
_EXIT_GRACE = 1.0


def command_of(args: argparse.Namespace, kind: str) -> list[str]:
    """The command after REC (and after ``--``); the options before it are parsed into ``args``."""
    from envlock.commands._parser import command_after_options, host_options_parser

    return command_after_options(args, list(args.cmd or []),
                                 lambda command: host_options_parser(kind, command=command))


def child_exit(returncode: int) -> int:
    """A child's return code as the record keeps it and envlock reports it: its own exit code,
    or for a signal 130 (Ctrl-C, as shells report it) or 3 (killed: by the OOM killer, a
    scheduler, a limit), never the negative number ``subprocess`` gives."""
    if returncode >= 0:
        return returncode
    return EXIT_INTERRUPTED if returncode == -signal.SIGINT else EXIT_ENV


def _copy(stream: IO[bytes], tail: Tail) -> None:
    """The command's stderr to envlock's as it comes, its last lines kept."""
    shown = True
    while chunk := os.read(stream.fileno(), 1 << 16):
        tail.feed(chunk)
        if shown:
            try:
                sys.stderr.buffer.write(chunk)
                sys.stderr.buffer.flush()
            except (OSError, ValueError):  # envlock's stderr closed: keep draining, or CMD blocks
                shown = False


def run_here(command: list[str], journal: Path, base: Path,
             compiled: CompileRun | None = None, trace: bool = True,
             stdout_to_stderr: bool = False) -> tuple[int, list[str], KeyboardInterrupt | None]:
    """CMD as a child of this process, with the journal's path in its environment (and behind
    the compile cache's loader, ``compiled``), its Python processes traced unless ``trace`` is
    False: (its exit code as ``child_exit`` maps it, the last lines of its stderr, which
    passes through, and the interrupt that stopped it or None). ``stdout_to_stderr``: the
    command's stdout goes to envlock's stderr, where envlock's own stdout is a document
    (``replay --json``) that a script's prints would break.

    A stop signal envlock gets (Ctrl-C, SIGTERM, SIGHUP: ``_signals``) is passed on to CMD,
    to its whole process group where it has one of its own (``own_group``: every run but one
    in the foreground of a terminal), and CMD is killed if it has not ended
    ``GRACE_SECONDS`` later: a training process never outlives envlock, and what it recorded
    until then is still written (``finish``)."""
    if not base.is_dir():
        raise UsageError(f"--workspace {base} is not a directory")
    from envlock.probe.trace import hook_dir

    tail = Tail()
    traced = trace_dir(journal, trace)
    env = {**os.environ, **recording_env(str(journal / JOURNAL), str(base), str(traced) if traced else None,
                                         hook=hook_dir(), pythonpath=os.environ.get("PYTHONPATH"))}
    if compiled is not None:
        from envlock.replay.compilecache import host_python
        from envlock.replay.make import resolve_program

        env.update(compiled.env())
        if compiled.load is not None:
            command = compiled.command(host_python(resolve_program(command[0], base), base), command)
    grace = seconds_from_env(GRACE_VAR, GRACE_SECONDS)
    group = own_group()
    try:
        proc = subprocess.Popen(command, cwd=base, env=env, stderr=subprocess.PIPE,
                                stdout=2 if stdout_to_stderr else None,  # fd 2: envlock's own stderr
                                start_new_session=group)
    except FileNotFoundError:
        raise UsageError(f"{command[0]}: command not found") from None
    except PermissionError:
        raise UsageError(f"{command[0]}: permission denied") from None
    stop: KeyboardInterrupt | None = None
    with proc:
        assert proc.stderr is not None
        pump = threading.Thread(target=_copy, args=(proc.stderr, tail), daemon=True)
        pump.start()
        try:
            code = proc.wait()
        except KeyboardInterrupt as exc:
            stop = exc
            stop_process(proc, int(getattr(exc, "signum", signal.SIGINT)), group=group, grace=grace, say=say)
            code = proc.wait()
        except BaseException:  # an error of envlock's own: do not leave the command running
            proc.kill()
            raise
        pump.join(_EXIT_GRACE)
    return child_exit(code), tail.lines(), stop


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
    p = plan(args, replay_path=None, base=base, command=command, lock_path=lock_path)
    from envlock.replay.make import resolve_program

    program = resolve_program(command[0], base)
    cache, save = compile_files(args, lock, lock_path)
    with journal_dir() as journal, compile_run(cache, save, container=False) as compiled:
        code, _, stop = run_here(command, journal, base, compiled, trace=not args.no_trace)
        if stop is None:  # a command stopped early may not have reached the loader's status
            compiled.loaded()
        result = finish(p, journal / JOURNAL, command=command, exit_code=code, where="host", base=base,
                        lock=lock, lock_path=lock_path, tolerance=(0.0, 0.0), program=program, stop=stop)
        compile_report(compiled)
        return result
