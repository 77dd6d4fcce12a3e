"""``envlock restore``: rebuild the lock's environment as a container image and verify it.

Progress and notes go to stderr; stdout carries the verdict. ``envlock run`` restores its image
through ``restore_image`` here too.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envlock.commands._output import say
from envlock.errors import EXIT_DRIFT, EXIT_OK, EnvlockError, UsageError

if TYPE_CHECKING:
    from envlock.lock import Lock
    from envlock.restore.context import Options
    from envlock.restore.engine import ContainerEngine
    from envlock.restore.restore import RestoreResult


def options(args: argparse.Namespace) -> Options:
    """The build options ``restore`` and ``run`` share."""
    from envlock.restore.context import Options
    from envlock.restore.restore import image_name

    return Options(base=args.base, allow_unpinned_base=args.allow_unpinned_base,
                   skip_local=args.skip_local,
                   wheelhouse=Path(args.wheelhouse) if args.wheelhouse else None,
                   index_url=args.index_url, venv=args.venv, python=args.python,
                   allow_http=args.allow_http, image_name=image_name(Path(args.lock), args.name))


def _report_build_failure(exc: Any) -> None:
    if exc.log_tail:
        sys.stderr.write("envlock: last lines of the build log:\n")
        for line in exc.log_tail:
            sys.stderr.write(f"  | {line}\n")
    sys.stderr.flush()


def restore_image(args: argparse.Namespace, lock: Lock, options: Options, engine: ContainerEngine,
                  *, verify: bool) -> RestoreResult:
    """The lock's image, built or found in the cache, with a build failure's log tail shown."""
    from envlock.errors import BuildFailed
    from envlock.restore.restore import image_name, restore

    name = image_name(Path(args.lock), args.name)
    tag = f"envlock/{name}:{lock.short_id}"
    try:
        return restore(lock, options, engine=engine, name=name,
                       workdir=Path(args.context_dir) if args.context_dir else None,
                       verify=verify, use_cache=not args.no_cache, say=say,
                       quiet=args.quiet)
    except EnvlockError as exc:
        hint_earlier_image(exc, engine, tag)
        if isinstance(exc, BuildFailed):
            _report_build_failure(exc)
        raise


def hint_earlier_image(exc: EnvlockError, engine: Any, tag: str) -> None:
    """`restore --base X --wheelhouse W` then a bare `run`: the cache key differs, so run
    starts another restore from the lock's own image, which fails; say what was meant."""
    if isinstance(exc, UsageError):
        return
    with contextlib.suppress(Exception):  # the engine may be the very thing that failed
        if engine.image(tag) is not None:
            also = (f"{tag} exists but was restored with other options: give `envlock run` "
                    "the same --base/--wheelhouse/--index-url/--venv as `envlock restore`")
            exc.hint = f"{exc.hint}; {also}" if exc.hint else also


def run(args: argparse.Namespace) -> int:
    if args.dockerfile_only:
        import shlex

        from envlock.lock import load
        from envlock.restore.restore import image_name, write_dockerfile_only

        lock = load(args.lock)
        plan = write_dockerfile_only(lock, options(args), Path(args.dockerfile_only), force=args.force)
        for note in plan.notes:
            say(note if note.startswith("warning: ") else f"note: {note}")
        sys.stdout.write(f"wrote {Path(args.dockerfile_only) / 'Dockerfile'} (base {plan.base.ref}); "
                         f"build it with: docker build -t envlock/{image_name(Path(args.lock), args.name)}:"
                         f"{lock.short_id} {shlex.quote(str(args.dockerfile_only))}\n")
        return EXIT_OK
    from envlock._render import verify_text
    from envlock.lock import load
    from envlock.restore.endpoint import connect

    lock = load(args.lock)
    with connect(args.engine) as engine:
        result = restore_image(args, lock, options(args), engine, verify=not args.no_verify)
        how = "cache hit, not rebuilt" if result.cached else f"built in {result.seconds:.1f}s"
        size = f", {result.size / 1e6:.0f} MB" if result.size else ""
        sys.stdout.write(f"image {result.tag} ({result.image_id[7:19]}{size}): {how}\n")
        ok = True
        if result.comparison is not None:
            sys.stdout.write(verify_text(result.comparison, lock, f"{args.lock} inside {result.tag}",
                                         show_info=args.all))
            ok = result.comparison.ok
        if args.push and not ok:
            say("not pushing an image that does not match the lock")
        elif args.push:
            from envlock.export.push import push

            ref = push(engine, result.image_id, args.push, lock)
            sys.stdout.write(f"pushed {ref}\n  replay on a cluster: envlock export {args.lock} "
                             f"--to k8s|slurm|apptainer --image {ref}\n")
    return EXIT_OK if ok else EXIT_DRIFT
