"""``envlock verify`` starts its probe before it imports or parses anything else.

The probe (a second interpreter that scans the environment) is most of a verify's time; what
the command itself does first (argparse, reading and checking the lock, importing the
comparison and the renderer) can run alongside it, on the other core. So ``main`` hands the
raw arguments here first: a conservative reading of them, the same choice of interpreter
(``target.choose``), the same decision from the lock's table names (``lockscan``) and the same
probe command line (``probe_args``) as the full path. The full path then *adopts* the started
probe only when the command line it would have started is exactly this one
(``capturing.start_probe``), and stops it otherwise, so this is only ever a head start.

Anything this reading does not know (``--deep``, with its progress display; ``-h``; an
abbreviated option; a second positional) leaves the start to the full path.
"""

from __future__ import annotations

# Nothing is imported before the probe starts that the start does not need; mypy treats any
# name TYPE_CHECKING as typing's.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from envlock.probeproc import ProbeProcess

# verify's flags that take no value and do not change how the probe is started.
_PLAIN = frozenset({"--strict", "--all", "--json"})


def verify_options(argv: list[str]) -> tuple[str | None, str, bool, bool] | None:
    """``(python, lock, no_torch, no_cache)`` of a ``verify`` command line, or None when it is
    not one this reading is sure of (argparse decides then, and the probe starts later)."""
    if not argv or argv[0] != "verify":
        return None
    python: str | None = None
    lock: str | None = None
    no_torch = no_cache = False
    rest = iter(argv[1:])
    for arg in rest:
        if arg == "--no-torch":
            no_torch = True
        elif arg == "--no-cache":
            no_cache = True
        elif arg in _PLAIN:
            pass
        elif arg == "--python":
            python = next(rest, None)
            if python is None or python.startswith("-"):
                return None
        elif arg.startswith("--python="):
            python = arg.partition("=")[2]
        elif arg.startswith("-") or lock is not None:
            return None
        else:
            lock = arg
    if python == "":
        return None
    return python, lock if lock is not None else "env.lock", no_torch, no_cache


def start_verify_probe(argv: list[str]) -> ProbeProcess | None:
    """The probe ``envlock verify`` will want, started now; None when that is not certain.

    Never raises for the user's input: every error is left for the full path to report.
    """
    options = verify_options(argv)
    if options is None:
        return None
    python, lock, no_torch, no_cache = options
    try:
        from envlock.lockscan import lock_tables

        tables = lock_tables(lock)
        if tables is None:
            return None  # no lock there: the full path says so
        from envlock.probeproc import ProbeProcess, probe_args
        from envlock.target import choose

        target = choose(python)
        torch = "torch" in tables and not no_torch
        args = probe_args(torch=torch, canary="canary" in tables and torch, cache=not no_cache)
        return ProbeProcess(target.python, args)
    except Exception:  # an invalid --python, a bad ENVLOCK_PROBE_TIMEOUT: reported later
        return None
