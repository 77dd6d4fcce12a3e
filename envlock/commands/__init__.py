"""The ``envlock`` program: one module per subcommand, the grammar in ``_parser``.

The core raises typed exceptions (``envlock.errors``); ``main`` turns them into one line on
stderr and a documented exit code, never a traceback (set ENVLOCK_DEBUG=1 to see one):

    0  ok / no drift          1  drift or differences found
    2  usage error, invalid or tampered lock
    3  environment problem (no container engine, interpreter not found, build failed)
    130  interrupted (Ctrl-C); 143 SIGTERM, 129 SIGHUP (128 + the signal, as shells report)

Each handler (``envlock.commands.<name>.run``) prints what the report modules build (``envlock.report``
and the reports of one job; a one-line answer such as ``fmt``'s is written where it is decided) and returns
its exit code; it imports what it runs, so a command pays only for what it uses.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from envlock._signals import STOPS, on_the_way_out, stops_as_interrupt
from envlock.commands._output import err
from envlock.commands._parser import build_parser
from envlock.errors import EXIT_ENV, EXIT_OK, EXIT_USAGE, EnvlockError, interrupted_exit

_PROGRAM = [False]  # set by console_main: see is_program


def is_program() -> bool:
    """Whether envlock is this process's program (its console script or ``python -m envlock``),
    rather than a host that calls ``main``: only then is the interpreter's state (its path, its
    loaded modules) what it was started with, as a fresh one of it would have it."""
    return _PROGRAM[0]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command (``argv`` None: ``sys.argv[1:]``) and return its exit code.

    Never exits, so tests and other programs call it in-process; argparse's own exits (usage
    errors 2, ``--help`` 0) become return values too.
    """
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(words).parse_args(words)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    handler: Callable[..., int] = importlib.import_module(f"envlock.commands.{args.handler}").run
    try:
        with stops_as_interrupt():  # SIGTERM and SIGHUP clean up as Ctrl-C does, in every command
            return handler(args)
    except SystemExit as exc:  # the options `run`, `record` and `replay` parse after the command's split
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except EnvlockError as exc:
        err(f"envlock: error: {exc.message}\n")
        if exc.hint:
            err(f"  hint: {exc.hint}\n")
        if os.environ.get("ENVLOCK_DEBUG"):
            raise
        return exc.exit_code
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", None)
        err("envlock: interrupted\n" if signum in (None, signal.SIGINT)
            else f"envlock: stopped by {signal.Signals(signum).name}\n")
        return interrupted_exit(exc)
    except BrokenPipeError:
        return EXIT_OK
    except OSError as exc:  # a write into a read-only or full place, a file gone meanwhile
        if os.environ.get("ENVLOCK_DEBUG"):
            raise
        from envlock.text.terminal import safe

        where = f"{exc.filename}: " if exc.filename else ""
        err(f"envlock: error: {safe(where)}{safe(exc.strerror or exc)}\n")
        return EXIT_ENV
    except Exception as exc:
        if os.environ.get("ENVLOCK_DEBUG"):
            raise
        err(f"envlock: internal error: {type(exc).__name__}: {exc} "
            "(rerun with ENVLOCK_DEBUG=1 for a traceback, and please report it)\n")
        return EXIT_ENV


def console_main() -> NoReturn:
    """The ``envlock`` program (console script, ``python -m envlock``)."""
    _PROGRAM[0] = True
    code = main()
    if code in {128 + signum for signum in STOPS}:
        on_the_way_out()  # the process ends now: a late second signal must not change its code
    sys.exit(code)


__all__ = ["console_main", "is_program", "main"]
