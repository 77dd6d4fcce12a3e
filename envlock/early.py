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
abbreviated option; a second positional) leaves the start to the full path. What it is sure of
it also hands to the command as its arguments, so such a verify never imports argparse (~6 ms
with building the parser): a property test holds this reading and argparse's to one answer.
"""

from __future__ import annotations

# Nothing is imported before the probe starts that the start does not need; mypy treats any
# name TYPE_CHECKING as typing's.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from envlock.probeproc import ProbeProcess

# verify's flags that take no value; --deep is left to argparse (it draws progress).
_FLAGS = {"--no-torch": "no_torch", "--no-cache": "no_cache", "--strict": "strict", "--all": "all",
          "--json": "json"}


class VerifyArgs:
    """What argparse would make of a ``verify`` command line this reading is sure of."""

    command = "verify"
    deep = False

    def __init__(self) -> None:
        self.python: str | None = None
        self.lock = "env.lock"
        self.no_torch = self.no_cache = self.strict = self.all = self.json = False


def verify_options(argv: list[str]) -> VerifyArgs | None:
    """The options of a ``verify`` command line, as argparse gives them, or None when this
    reading is not sure of them: argparse then reads them, and the probe starts later. A
    property test holds the two readings to the same answer."""
    if not argv or argv[0] != "verify":
        return None
    args = VerifyArgs()
    lock: str | None = None
    rest = iter(argv[1:])
    for arg in rest:
        if arg in _FLAGS:
            setattr(args, _FLAGS[arg], True)
        elif arg == "--python":
            args.python = next(rest, None)
            if args.python is None or args.python.startswith("-"):
                return None
        elif arg.startswith("--python="):
            args.python = arg.partition("=")[2]
        elif arg.startswith("-") or lock is not None:
            return None
        else:
            lock = arg
    if args.python == "":
        return None
    if lock is not None:
        args.lock = lock
    return args


def start_verify_probe(options: VerifyArgs) -> ProbeProcess | None:
    """The probe ``envlock verify`` with these options will want, started now; None when that
    is not certain.

    Never raises for the user's input: every error is left for the full path to report.
    """
    try:
        from envlock.lockscan import lock_tables

        tables = lock_tables(options.lock)
        if tables is None:
            return None  # no lock there: the full path says so
        from envlock.probeproc import ProbeProcess, probe_args
        from envlock.target import choose

        target = choose(options.python)
        torch = "torch" in tables and not options.no_torch
        args = probe_args(torch=torch, canary="canary" in tables and torch, cache=not options.no_cache,
                          git_exclude=[options.lock])
        return ProbeProcess(target.python, args)
    except Exception:  # an invalid --python, a bad ENVLOCK_PROBE_TIMEOUT: reported later
        return None
