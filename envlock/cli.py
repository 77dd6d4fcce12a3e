"""``envlock`` command line: argument parsing and rendering only.

The core raises typed exceptions (``envlock.errors``); this module turns them into one line on
stderr and a documented exit code, never a traceback (set ENVLOCK_DEBUG=1 to see one):

    0  ok / no drift          1  drift or differences found
    2  usage error, invalid or tampered lock
    3  environment problem (no container engine, interpreter not found, build failed)
    130  interrupted

Commands other than the core ones live in their own modules and register themselves through
``register(subparsers)`` (see ``EXTENSIONS``); everything heavy is imported inside handlers,
so ``envlock --help`` stays instant.
"""

from __future__ import annotations

import os
import sys

from envlock import __version__
from envlock.errors import EXIT_DRIFT, EXIT_ENV, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, EnvlockError

# argparse, pathlib and typing are imported where they are used: `envlock verify` starts its
# probe before any of them (envlock.early), and mypy treats any name TYPE_CHECKING as typing's.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any, NoReturn

    from envlock.early import VerifyArgs
    from envlock.probeproc import ProbeProcess

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

EXTENSIONS = ("envlock.restore.cli", "envlock.runtime_cli", "envlock.export.cli")
FORMATS = ("text", "json", "markdown")


def _out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _err(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


# -- capture -----------------------------------------------------------------------------------


def _say_link(path: Path) -> None:
    """A lock that is a symbolic link is updated where it points; say so, it may be shared."""
    if path.is_symlink():
        from envlock.lock import write_target

        _err(f"note: {path} is a symbolic link; updated its target {write_target(path)}\n")


def cmd_capture(args: argparse.Namespace) -> int:
    # Nothing heavy is imported before capture(): it starts the probe first and imports
    # pydantic and the models while the probe imports torch.
    from envlock.capturing import capture

    if args.in_image:
        # Lock an image that is not running: the probe runs in a throwaway container.
        from envlock.restore.inimage import capture_in_image

        lock = capture_in_image(args.in_image, python=args.python, torch=not args.no_torch,
                                canary=args.canary, note=args.note, engine=args.engine)
        locked = None
    else:
        from envlock.target import choose

        target = choose(args.python)
        if target.warning:
            _err(f"envlock: warning: {target.warning}\n")
        lock = capture(python=target.python, torch=not args.no_torch, canary=args.canary,
                       image=args.image, note=args.note, in_process=False, deep=args.deep,
                       cache=not args.no_cache,
                       git_exclude=[] if args.output == "-" else [args.output])
        locked = f"locked {target.probed(lock.python.prefix).describe()}"
    from envlock.lock import dumps, save

    if args.output != "-":
        path = save(lock, args.output, force=args.force, reseal=False)
        _say_link(path)
        if not args.json:
            from envlock.render import capture_summary

            summary, notes = capture_summary(lock, str(path), locked, verbose=args.verbose)
            _out(summary)
            if notes:
                _err(notes)
            return EXIT_OK
    # The one document on stdout is the lock: as JSON with --json, which with -o - is all that
    # is written (nothing goes to disk).
    if args.json:
        from envlock.render import show_json

        _out(show_json(lock))
    else:
        _out(dumps(lock))
    if locked:
        _err(f"envlock: {locked}\n")
    return EXIT_OK


# -- verify ------------------------------------------------------------------------------------


def cmd_verify(args: argparse.Namespace) -> int:
    # Everything this command imports is imported before check() waits for the probe.
    from envlock.capturing import check
    from envlock.deepreport import summary, torch_facts_line
    from envlock.render import comparison_json, verify_text
    from envlock.target import choose, recorded_prefix_hint

    target = choose(args.python)
    if target.warning:
        _err(f"envlock: warning: {target.warning}\n")
    # early: the probe starts before the lock is read, and imports torch meanwhile; main may
    # have started it already, before parsing the arguments (envlock.early).
    result = check(args.lock, python=target.python, torch=False if args.no_torch else None,
                   in_process=False, strict=args.strict, deep=args.deep, cache=not args.no_cache,
                   early=True, limit=None if args.all else 10, prestarted=args.prestarted)
    cmp, expected, current, report = result.comparison, result.expected, result.current, result.deep

    target = target.probed(current.python.prefix)
    captured_from = None if args.python else recorded_prefix_hint(expected.python.prefix, target)
    if args.json:
        _out(comparison_json(cmp, lock=str(args.lock), id=expected.short_id,
                             environment={"prefix": target.prefix, "reason": target.reason},
                             captured_from=captured_from,
                             torch_facts=current.probe.torch_facts, deep=report))
    else:
        _out(verify_text(cmp, expected, str(args.lock), show_info=args.all,
                         environment=target.describe(), captured_from=captured_from)
             + summary(report) + torch_facts_line(current))
    return EXIT_OK if cmp.ok else EXIT_DRIFT


# -- diff / show / fmt / schema ----------------------------------------------------------------


def cmd_diff(args: argparse.Namespace) -> int:
    from envlock.drift import compare
    from envlock.lock import load
    from envlock.render import comparison_json, diff_markdown, diff_text

    a, b = load(args.a), load(args.b)
    cmp = compare(a, b, names=(str(args.a), str(args.b)))
    if args.format == "json":
        _out(comparison_json(cmp, a=str(args.a), b=str(args.b)))
    elif args.format == "markdown":
        _out(diff_markdown(cmp, a, b, str(args.a), str(args.b)))
    else:
        _out(diff_text(cmp, str(args.a), str(args.b)))
    significant = any(d.severity != "info" for d in cmp.differences)
    return EXIT_DRIFT if significant else EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    from pathlib import Path

    from envlock.lock import load

    lock = load(args.lock)

    from envlock.render import show_json, show_markdown, show_text

    name = Path(args.lock).name
    if args.format == "json":
        _out(show_json(lock))
    elif args.format == "markdown":
        _out(show_markdown(lock, name))
    elif args.format == "latex":
        from envlock.export.latex import show_latex

        _out(show_latex(lock, name))
    else:
        _out(show_text(lock, str(args.lock)))
    return EXIT_OK


def cmd_fmt(args: argparse.Namespace) -> int:
    from pathlib import Path

    from envlock.lock import atomic_write, dumps, load, read_text, seal

    path = Path(args.lock)
    before = read_text(path)
    lock = seal(load(path, verify_seal=False))
    after = dumps(lock, path.name)
    if after == before:
        _out(f"{path} is already normalised and sealed (id {lock.short_id})\n")
        return EXIT_OK
    if args.check:
        _out(f"{path} would be re-sealed or reformatted\n")
        return EXIT_DRIFT
    _say_link(path)
    atomic_write(path, after)
    _out(f"re-sealed {path}  id {lock.short_id}\n")
    return EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    from envlock.lock import schema_json

    _out(schema_json())
    return EXIT_OK


# -- parser ------------------------------------------------------------------------------------


def _add_capture(sub: Subparsers) -> None:
    p = sub.add_parser("capture", help="record this environment into env.lock")
    p.add_argument("-o", "--output", default="env.lock", help="lock file to write ('-' for stdout)")
    p.add_argument("--python", help="probe this interpreter (path, command or venv directory); "
                   "default: $VIRTUAL_ENV, $CONDA_PREFIX, a .venv here or above, envlock's own")
    p.add_argument("--image", help="image reference REF[@sha256:...] this environment runs in")
    p.add_argument("--in-image", metavar="REF",
                   help="capture an image that is not running, in a throwaway container")
    p.add_argument("--engine", default=None,
                   help="with --in-image: docker (default), podman, or a socket URL")
    p.add_argument("--no-torch", action="store_true", help="do not import torch")
    p.add_argument("--canary", action="store_true", help="also hash a fixed set of torch kernels")
    p.add_argument("--note", help="free text stored in [envlock].note")
    p.add_argument("--json", action="store_true",
                   help="print the lock as JSON after writing it (with -o -: JSON instead of TOML)")
    p.add_argument("--deep", action="store_true",
                   help="also record each distribution's files as they are on disk")
    p.add_argument("--no-cache", action="store_true",
                   help="ignore every cache: import torch even when its cached facts are still "
                        "valid, and with --deep re-hash every file, not only those whose stat changed")
    p.add_argument("--force", action="store_true", help="overwrite a file that is not an env.lock, or a lock of a newer schema")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_capture)


def _add_verify(sub: Subparsers) -> None:
    p = sub.add_parser("verify", help="does this environment match the lock?")
    p.add_argument("lock", nargs="?", default="env.lock", help="the lock file (default: env.lock)")
    p.add_argument("--python", help="verify this interpreter (default: chosen as capture does)")
    p.add_argument("--no-torch", action="store_true", help="do not import torch")
    p.add_argument("--strict", action="store_true", help="warnings count as drift too")
    p.add_argument("--all", action="store_true",
                   help="also list info-level differences, and every file --deep finds")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--deep", action="store_true",
                   help="check every installed file against its distribution's RECORD (files "
                        "whose stat is unchanged since the last check are not re-read)")
    p.add_argument("--no-cache", action="store_true",
                   help="ignore every cache: import torch even when its cached facts are still "
                        "valid, and with --deep re-hash every file, not only those whose stat changed")
    p.set_defaults(func=cmd_verify)


def _add_diff(sub: Subparsers) -> None:
    p = sub.add_parser("diff", help="compare two locks")
    p.add_argument("a", help="the lock before")
    p.add_argument("b", help="the lock after")
    p.add_argument("--format", choices=FORMATS, default="text")
    p.set_defaults(func=cmd_diff)


def _add_show(sub: Subparsers) -> None:
    p = sub.add_parser("show", help="summarise a lock")
    p.add_argument("lock", nargs="?", default="env.lock", help="the lock file (default: env.lock)")
    p.add_argument("--format", choices=(*FORMATS, "latex"), default="text",
                   help="latex: a booktabs table for a paper's appendix")
    p.set_defaults(func=cmd_show)


def _add_fmt(sub: Subparsers) -> None:
    p = sub.add_parser("fmt", help="validate, normalise and re-seal a lock after a deliberate edit")
    p.add_argument("lock", nargs="?", default="env.lock", help="the lock file (default: env.lock)")
    p.add_argument("--check", action="store_true", help="only report whether it would change")
    p.set_defaults(func=cmd_fmt)


def _add_schema(sub: Subparsers) -> None:
    p = sub.add_parser("schema", help="print the JSON Schema of env.lock")
    p.set_defaults(func=cmd_schema)


CORE: dict[str, Callable[[Subparsers], None]] = {
    "capture": _add_capture,
    "verify": _add_verify,
    "diff": _add_diff,
    "show": _add_show,
    "fmt": _add_fmt,
    "schema": _add_schema,
}


def _columns() -> int:
    """``shutil.get_terminal_size().columns``, without importing shutil (and bz2 and lzma with
    it, ~5 ms): ``$COLUMNS``, else the terminal's width, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


def _parser_class() -> type[argparse.ArgumentParser]:
    """ArgumentParser whose help formatter gets its width from ``_columns``: argparse builds a
    formatter for every ``add_argument`` (to check the metavar), and its default one imports
    shutil to ask for the terminal's width."""
    import argparse

    class Formatter(argparse.HelpFormatter):
        def __init__(self, prog: str, *args: Any, **kwargs: Any) -> None:
            if len(args) < 3 and "width" not in kwargs:
                kwargs["width"] = _columns() - 2  # what HelpFormatter itself subtracts
            super().__init__(prog, *args, **kwargs)

    class Parser(argparse.ArgumentParser):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("formatter_class", Formatter)
            super().__init__(*args, **kwargs)

    return Parser


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with ``command`` (a core command's name) only that command's: a
    verify then does not build a dozen other parsers and import the extension modules."""
    import importlib

    parser = _parser_class()(
        prog="envlock",
        description="Lock, verify and replay deep-learning environments.",
        epilog="exit codes: 0 ok, 1 drift/differences, 2 usage or invalid/tampered lock, "
               "3 environment problem (engine, interpreter, build)",
    )
    parser.add_argument("--version", action="version", version=f"envlock {__version__}")
    # prog given: argparse would otherwise build a help formatter to work it out, which imports
    # shutil (and bz2, lzma) for the terminal width, ~5 ms of every command.
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", prog=parser.prog,
                                parser_class=type(parser))
    sub.required = True

    if command in CORE:
        CORE[command](sub)
        return parser
    for add in CORE.values():
        add(sub)
    for name in EXTENSIONS:
        # These ship with envlock: a missing one is a broken install, reported, never skipped.
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command (``argv`` None: ``sys.argv[1:]``) and return its exit code.

    Never exits, so tests and other programs call it in-process; argparse's own exits (usage
    errors 2, ``--help`` 0) become return values too.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    prestarted: ProbeProcess | None = None
    known: VerifyArgs | None = None
    if argv[:1] == ["verify"]:
        # envlock.early: the probe starts now, and a command line it is sure of skips argparse.
        from envlock.early import start_verify_probe, verify_options

        known = verify_options(argv)
        prestarted = start_verify_probe(known) if known is not None else None
    try:
        return _run(argv, prestarted, known)
    finally:
        if prestarted is not None:
            prestarted.cancel()  # a no-op once its document was read


def _run(argv: list[str], prestarted: ProbeProcess | None, known: VerifyArgs | None) -> int:
    func: Callable[[Any], int]
    if known is not None:
        args: Any = known
        func = cmd_verify
    else:
        parser = build_parser(argv[0] if argv else None)
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        func = args.func
    args.prestarted = prestarted
    try:
        return func(args)
    except EnvlockError as exc:
        _err(f"envlock: error: {exc.message}\n")
        if exc.hint:
            _err(f"  hint: {exc.hint}\n")
        if os.environ.get("ENVLOCK_DEBUG"):
            raise
        return exc.exit_code
    except KeyboardInterrupt:
        _err("envlock: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:
        if os.environ.get("ENVLOCK_DEBUG"):
            raise
        _err(f"envlock: internal error: {type(exc).__name__}: {exc} "
             "(rerun with ENVLOCK_DEBUG=1 for a traceback, and please report it)\n")
        return EXIT_ENV


def console_main() -> NoReturn:
    """The ``envlock`` program (console script, ``python -m envlock``): ``main``, then exit
    without the interpreter's teardown. Everything is written and every container removed by
    then, and tearing down pydantic and friends costs ~30 ms per command; atexit handlers
    registered while the command ran are skipped with it (envlock registers none)."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


__all__ = ["build_parser", "console_main", "main"]
