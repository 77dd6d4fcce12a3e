"""``envlock restore``, ``envlock run`` and ``envlock bundle``: argument parsing and output only.

Registered into the main parser by ``envlock.cli`` (``register``). Handlers import the heavy
modules (docker, rich, pydantic models) only when they run, so ``envlock --help`` stays instant.
Errors are raised as ``envlock.errors`` exceptions; the main CLI maps them to exit codes.
Progress and notes go to stderr; stdout carries the verdict (restore) or the command's own
output (run).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envlock.errors import EXIT_DRIFT, EXIT_OK, EnvlockError, UsageError

if TYPE_CHECKING:
    from envlock.lock import Lock
    from envlock.restore.context import Options
    from envlock.restore.engine import ContainerEngine
    from envlock.restore.restore import RestoreResult


def _say(text: str) -> None:
    sys.stderr.write(f"envlock: {text}\n")
    sys.stderr.flush()


def _options(args: argparse.Namespace) -> Options:
    from envlock.restore.context import Options

    return Options(base=args.base, allow_unpinned_base=args.allow_unpinned_base,
                   skip_local=args.skip_local,
                   wheelhouse=Path(args.wheelhouse) if args.wheelhouse else None,
                   index_url=args.index_url, venv=args.venv, python=args.python,
                   allow_http=args.allow_http)


def _report_build_failure(exc: Any) -> None:
    if exc.log_tail:
        sys.stderr.write("envlock: last lines of the build log:\n")
        for line in exc.log_tail:
            sys.stderr.write(f"  | {line}\n")
    sys.stderr.flush()


def _restore(args: argparse.Namespace, lock: Lock, options: Options, engine: ContainerEngine, *,
             verify: bool) -> RestoreResult:
    from envlock.errors import BuildFailed
    from envlock.restore.restore import image_name, restore

    name = image_name(Path(args.lock), args.name)
    tag = f"envlock/{name}:{lock.short_id}"
    try:
        return restore(lock, options, engine=engine, name=name,
                       workdir=Path(args.context_dir) if args.context_dir else None,
                       verify=verify, use_cache=not args.no_cache, say=_say)
    except EnvlockError as exc:
        _hint_earlier_image(exc, engine, tag)
        if isinstance(exc, BuildFailed):
            _report_build_failure(exc)
        raise


def _hint_earlier_image(exc: EnvlockError, engine: Any, tag: str) -> None:
    """`restore --base X --wheelhouse W` then a bare `run`: the cache key differs, so run
    starts another restore from the lock's own image, which fails; say what was meant."""
    if isinstance(exc, UsageError):
        return
    with contextlib.suppress(Exception):  # the engine may be the very thing that failed
        if engine.image(tag) is not None:
            also = (f"{tag} exists but was restored with other options: give `envlock run` "
                    "the same --base/--wheelhouse/--index-url/--venv as `envlock restore`")
            exc.hint = f"{exc.hint}; {also}" if exc.hint else also


def cmd_restore(args: argparse.Namespace) -> int:
    if args.dockerfile_only:
        import shlex

        from envlock.lock import load
        from envlock.restore.restore import image_name, write_dockerfile_only

        lock = load(args.lock)
        plan = write_dockerfile_only(lock, _options(args), Path(args.dockerfile_only), force=args.force)
        for note in plan.notes:
            _say(f"note: {note}")
        sys.stdout.write(f"wrote {Path(args.dockerfile_only) / 'Dockerfile'} (base {plan.base.ref}); "
                         f"build it with: docker build -t envlock/{image_name(Path(args.lock), args.name)}:"
                         f"{lock.short_id} {shlex.quote(str(args.dockerfile_only))}\n")
        return EXIT_OK
    from envlock.lock import load
    from envlock.render import verify_text
    from envlock.restore.endpoint import connect

    lock, options = load(args.lock), _options(args)
    with connect(args.engine) as engine:
        result = _restore(args, lock, options, engine, verify=not args.no_verify)
        how = "cache hit, not rebuilt" if result.cached else f"built in {result.seconds:.1f}s"
        size = f", {result.size / 1e6:.0f} MB" if result.size else ""
        sys.stdout.write(f"image {result.tag} ({result.image_id[7:19]}{size}): {how}\n")
        ok = True
        if result.comparison is not None:
            sys.stdout.write(verify_text(result.comparison, lock, f"{args.lock} inside {result.tag}",
                                         show_info=args.all))
            ok = result.comparison.ok
        if args.push and not ok:
            _say("not pushing an image that does not match the lock")
        elif args.push:
            from envlock.export.push import push

            ref = push(engine, result.image_id, args.push, lock)
            sys.stdout.write(f"pushed {ref}\n  replay on a cluster: envlock export {args.lock} "
                             f"--to k8s|slurm|apptainer --image {ref}\n")
    return EXIT_OK if ok else EXIT_DRIFT


def cmd_run(args: argparse.Namespace) -> int:
    from envlock.errors import UsageError
    from envlock.lock import load
    from envlock.restore.endpoint import connect
    from envlock.restore.run import RunOptions, parse_env, parse_ports, run_in_image

    command = _split_run_args(args)
    if not command and not args.jupyter:
        raise UsageError("nothing to run: envlock run env.lock -- CMD ...")
    env = parse_env(args.env or [])
    parse_ports(args.publish or [])
    opts = RunOptions(command=command, gpus=args.gpus, workspace=Path(args.workspace) if args.workspace else None,
                      env=env, ports=args.publish or [], jupyter=args.jupyter)
    lock, options = load(args.lock), _options(args)
    with connect(args.engine) as engine:
        # Verify only what was just built: a cache hit was verified when it was built, and a
        # replay should start fast.
        result = _restore(args, lock, options, engine, verify=False)
        if not result.cached and not args.no_verify:
            from envlock.restore.restore import verify_image_for

            _, cmp = verify_image_for(engine, result.plan, result.image_id, result.tag)
            if not cmp.ok:
                from envlock.render import verify_text

                sys.stderr.write(verify_text(cmp, lock, f"{args.lock} inside {result.tag}"))
                _say("refusing to run in an image that does not match the lock (--no-verify overrides)")
                return EXIT_DRIFT
        return run_in_image(engine, lock, result.image_id, result.tag, opts, python=result.plan.python,
                            os_packages_restored=result.plan.os_packages_restored)


def cmd_bundle(args: argparse.Namespace) -> int:
    from envlock.lock import load
    from envlock.restore.wheelhouse import bundle

    lock = load(args.lock)
    result = bundle(lock, Path(args.output), source=Path(args.wheelhouse) if args.wheelhouse else None,
                    index_url=args.index_url, pip_find_links=Path(args.find_links) if args.find_links else None,
                    skip_local=args.skip_local, allow_http=args.allow_http)
    for name in result.missing_tooling:
        _say(f"note: no wheel for {name}; a restore takes it from the base image's ensurepip")
    if result.skipped:
        _say(f"note: not bundled: {', '.join(result.skipped)}")
    sys.stdout.write(f"bundled {len(result.files)} files for {lock.short_id} into {result.directory}; "
                     f"replay offline with: envlock restore {args.lock} --wheelhouse {result.directory}\n")
    return EXIT_OK


def _split_run_args(args: argparse.Namespace) -> list[str]:
    """The command after ``--``; options between the lock and ``--`` are parsed here.

    argparse hands everything after the lock to REMAINDER, so ``envlock run env.lock --gpus all
    -- python train.py`` arrives as one list. Without ``--``, leading options are envlock's and
    the command starts at the first other word (``envlock run env.lock --jupyter --workspace
    DIR`` has no command at all).
    """
    rest = list(args.cmd or [])
    if "--" not in rest:
        if not rest or not rest[0].startswith("-"):
            return rest
        parser = argparse.ArgumentParser(prog="envlock run", add_help=False)
        _build_options(parser, lock=False)
        _run_options(parser)
        parser.add_argument("cmd", nargs=argparse.REMAINDER)
        parser.parse_args(rest, namespace=args)
        return list(args.cmd or [])
    cut = rest.index("--")
    before, command = rest[:cut], rest[cut + 1:]
    if before:
        parser = argparse.ArgumentParser(prog="envlock run", add_help=False)
        _build_options(parser, lock=False)
        _run_options(parser)
        parser.parse_args(before, namespace=args)
    return command


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", default="auto", help="all, none, auto (all when the lock uses CUDA "
                   "and the host has a driver), or device indexes such as 0,1")
    p.add_argument("--workspace", metavar="DIR", help="mounted at /workspace (default: current directory)")
    p.add_argument("--env", "-e", action="append", metavar="K=V", help="environment variable for CMD")
    p.add_argument("-p", "--publish", action="append", metavar="[IP:]HOST:CONTAINER",
                   help="publish a port, e.g. 8888:8888")
    p.add_argument("--jupyter", action="store_true", help="start JupyterLab (the lock must have it)")


def _build_options(p: argparse.ArgumentParser, *, lock: bool = True) -> None:
    if lock:
        p.add_argument("lock", help="the env.lock to restore")
    p.add_argument("--base", metavar="REF", help="build FROM this image instead of the lock's "
                   "(REF@sha256:... or a local tag, resolved to its id); the image change is expected")
    p.add_argument("--allow-unpinned-base", action="store_true",
                   help="accept a base given by tag only (it may point at other content later)")
    p.add_argument("--skip-local", action="store_true",
                   help="leave out editable/local packages instead of refusing")
    p.add_argument("--wheelhouse", metavar="DIR", help="install offline from these wheels "
                   "(pip --no-index; an `envlock bundle` directory adds hash checks)")
    p.add_argument("--index-url", metavar="URL", help="package index instead of PyPI")
    p.add_argument("--allow-http", action="store_true",
                   help="accept plain http:// package URLs and indexes (content can be swapped in transit)")
    p.add_argument("--venv", metavar="PATH", help="virtual environment path in the image "
                   "(default: the lock's)")
    p.add_argument("--python", metavar="CMD", help="the base image's interpreter (default python3)")
    p.add_argument("--engine", help="docker (default), podman, or an API URL such as "
                   "unix:///run/podman/podman.sock")
    p.add_argument("--name", help="image name: envlock/NAME:<id> (default: the lock's directory)")
    p.add_argument("--context-dir", metavar="DIR",
                   help="where the build context and build.log go (default: ~/.cache/envlock/restore/...)")
    p.add_argument("--no-cache", action="store_true", help="build even if the image exists")
    p.add_argument("--no-verify", action="store_true", help="skip the probe inside the image")


def register(sub: Any) -> None:
    p = sub.add_parser("restore", help="rebuild the lock's environment as a container image and verify it")
    _build_options(p)
    p.add_argument("--dockerfile-only", metavar="DIR",
                   help="only write the build context (Dockerfile, requirements) to DIR; no engine")
    p.add_argument("--force", action="store_true",
                   help="with --dockerfile-only: replace a build context envlock wrote to DIR before")
    p.add_argument("--all", action="store_true", help="also list info-level differences")
    p.add_argument("--push", metavar="REGISTRY/REPO",
                   help="after a successful verify, push the image as REPO:<id> and print REPO@sha256:...")
    p.set_defaults(func=cmd_restore)

    p = sub.add_parser("run", help="run a command in the lock's image (restored or reused)",
                       description="envlock run env.lock [options] -- CMD ...")
    _build_options(p)
    _run_options(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("bundle", help="collect every wheel of a lock for offline replay")
    p.add_argument("lock")
    p.add_argument("-o", "--output", required=True, metavar="DIR")
    p.add_argument("--wheelhouse", metavar="SRC", help="copy from this directory instead of an index")
    p.add_argument("--index-url", metavar="URL", help="download from this index (default PyPI)")
    p.add_argument("--find-links", metavar="DIR", help="download with pip from this directory, no index")
    p.add_argument("--skip-local", action="store_true", help="leave out editable/local packages")
    p.add_argument("--allow-http", action="store_true", help="accept plain http:// package URLs and indexes")
    p.set_defaults(func=cmd_bundle)
