"""``envlock run``: run a command in the lock's image, restoring it first when needed."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from envlock.commands._output import say
from envlock.commands._parser import command_after_options, run_options_parser
from envlock.commands.restore import options, pack_base, restore_image
from envlock.errors import EXIT_DRIFT, UsageError

if TYPE_CHECKING:
    from envlock.commands._recording import Plan
    from envlock.lock import Header, Lock
    from envlock.replay.compilecache import CacheFile
    from envlock.restore.engine import ContainerEngine
    from envlock.restore.image import Options
    from envlock.restore.packdir import Pack
    from envlock.restore.run import Ready


def run(args: argparse.Namespace) -> int:
    from envlock.restore.run import outside_workspace, parse_env, parse_ports

    command = split_run_args(args)
    if args.record and args.replay:
        raise UsageError("--record and --replay: give one (a replay compares with the record it reads)")
    if args.report and not args.replay:
        raise UsageError("--report writes a replay's page: give it with --replay REC")
    recording = None
    if args.record or args.replay:
        from envlock.commands._recording import plan, reuse_restore_options

        recording = plan(args, replay_path=args.replay,
                         base=Path(args.workspace).resolve() if args.workspace else Path.cwd(),
                         command=command, lock_path=args.lock)
        if recording.original is not None:
            reuse_restore_options(args, recording.original, args.replay)
            if not command:
                from envlock.replay.record import command_to_replay

                command = command_to_replay(recording.original, args.replay)
    if not command and not args.jupyter and not args.ssh:
        raise UsageError("nothing to run: envlock run env.lock -- CMD ...")
    workspace = Path(args.workspace).resolve() if args.workspace else Path.cwd()
    up = outside_workspace(command, workspace)
    if up is not None:
        raise UsageError(f"{up} is outside the workspace {workspace}, and the container sees the "
                         "workspace alone (at /workspace)",
                         hint="run from a directory that holds it, or give --workspace DIR and the "
                              "path from there (--workspace .. and train.py for ../train.py)")
    env = parse_env(args.env or [])
    parse_ports(args.publish or [])
    with contextlib.ExitStack() as held:
        pack = _open_pack(args, held)
        return _run(args, command, recording, pack, env)


def _run(args: argparse.Namespace, command: list[str], recording: Plan | None,
         pack: Pack | None, env: dict[str, str]) -> int:
    """The run itself, the pack (if any) unpacked and held in the cache."""
    from envlock.lock import header
    from envlock.restore.endpoint import connect
    from envlock.restore.run import RunOptions, run_in_image

    lock_path = str(pack.lock) if pack is not None else args.lock
    opts = RunOptions(command=command, gpus=args.gpus, workspace=Path(args.workspace) if args.workspace else None,
                      env=env, ports=args.publish or [], jupyter=args.jupyter,
                      ssh=args.ssh, ssh_key=args.ssh_key, lock_path=Path(lock_path))
    # The fast path: a plain command in an image already proven for this lock needs only the
    # lock's sealed header (``lock.header``: its id, its hashes, the few values a run passes on),
    # not the models. Everything else (a restore, a recording, a pack, --jupyter, a compile
    # cache to check against the lock) reads the lock through the models, as does a miss below.
    lock: Lock | None
    known: Lock | Header
    if recording is None and pack is None and not args.jupyter and not args.compile_cache:
        known = header(lock_path)
        lock = known.lock  # None: the table alone answered
    else:
        known = lock = _load(lock_path)
    # The image `envlock restore --base X ...` made for this lock, without X again: a recording
    # takes the remembered options first (its record keeps them); a plain run first looks for an
    # image proven with the options as given, so the models are read only when that misses.
    from envlock.commands._recording import reuse_remembered_options

    if pack is None and recording is not None and recording.original is None:
        reuse_remembered_options(args, known.short_id, args.lock)
    kept = None
    if recording is not None and recording.original is None:
        from envlock.commands._recording import kept_restore_options

        kept = kept_restore_options(args, args.record)
    cache, save = _compile_files(args, lock, pack)
    build_options = options(args)
    with connect(args.engine) as engine:
        from envlock.restore.image import image_name
        from envlock.restore.run import ready_image

        if pack is not None:
            assert lock is not None
            build_options = pack_base(args, pack, build_options, engine, lock)
        def proven(build: Options) -> Ready | None:
            if args.no_cache or args.no_verify:
                return None
            return ready_image(engine, known, build, image_name(Path(lock_path), args.name))

        found = proven(build_options)
        if found is None and pack is None and recording is None \
                and reuse_remembered_options(args, known.short_id, args.lock):
            build_options = options(args)
            found = proven(build_options)
        if found is None:
            # Not proven: the restore reads the lock through the models.
            known = lock = lock if lock is not None else _load(lock_path)
            ready = _restore_for_run(args, lock, build_options, engine, Path(lock_path),
                                     network=pack is None)
        else:
            ready = found
        if isinstance(ready, int):
            return ready
        image_id, tag = ready.image_id, ready.tag
        python, os_restored = ready.python, ready.os_packages_restored
        from dataclasses import replace

        from envlock.commands._recording import compile_report
        from envlock.replay.compilecache import compile_run

        with compile_run(cache, save, container=True) as compiled:
            copts = replace(opts, command=compiled.command(python, opts.command),
                            env={**opts.env, **compiled.env()}, mounts=compiled.mounts())
            if recording is None:
                code = run_in_image(engine, known, image_id, tag, copts, python=python,
                                    os_packages_restored=os_restored)
                compiled.loaded()
                compile_report(compiled)
                return code
            from envlock.commands._recording import (
                JOURNAL,
                container_hook,
                finish,
                journal_dir,
                recording_env,
                trace_dir,
            )
            from envlock.commands.record import child_exit
            from envlock.restore.image import WORKDIR
            from envlock.text.terminal import Tail

            assert lock is not None  # a recording reads the lock through the models

            with journal_dir() as journal:
                inner = "/envlock-record"
                traced = trace_dir(journal, not args.no_trace)
                mounts = [*copts.mounts, (str(journal), inner, False)]
                hook = None
                if traced is not None:  # every Python process traced from its start
                    mount, hook = container_hook(journal)
                    mounts.append(mount)
                env = recording_env(f"{inner}/{JOURNAL}", WORKDIR, f"{inner}/{traced.name}" if traced else None,
                                    hook=hook, pythonpath=_pythonpath(engine, image_id, copts.env))
                ropts = replace(copts, env={**copts.env, **env}, mounts=mounts, stderr_tail=Tail())
                stop: KeyboardInterrupt | None = None
                try:
                    code = run_in_image(engine, lock, image_id, tag, ropts, python=python,
                                        os_packages_restored=os_restored)
                except KeyboardInterrupt as exc:  # the container is stopped and gone: write what it recorded
                    stop, code = exc, child_exit(-int(getattr(exc, "signum", signal.SIGINT)))
                if stop is None:  # a command stopped early may not have reached the loader's status
                    compiled.loaded()
                verdict = finish(recording, journal / JOURNAL, command=opts.command, exit_code=code,
                                 where="container", base=(opts.workspace or Path.cwd()).resolve(), lock=lock,
                                 lock_path=lock_path, tolerance=(args.rtol, args.atol), restore=kept,
                                 stderr_tail=ropts.stderr_tail.lines() if ropts.stderr_tail else (),
                                 inside=WORKDIR, stop=stop,
                                 pack=(args.lock, pack.id) if pack is not None else None)
                compile_report(compiled, recording.original)
                return verdict


def _pythonpath(engine: ContainerEngine, image_id: str, given: Mapping[str, str]) -> str | None:
    """The ``PYTHONPATH`` the command would run with in the container: the one given with
    ``-e``, else the image's own, which the start-up hook is put in front of, never in place of."""
    if "PYTHONPATH" in given:
        return given["PYTHONPATH"]
    info = engine.image(image_id)
    return info.env.get("PYTHONPATH") if info is not None else None


def _load(path: str) -> Lock:
    """The lock through the models (``lock.load``), imported only here: naming ``load`` imports
    pydantic and the models, which the fast path never needs."""
    from envlock.lock import load

    return load(path)


def _open_pack(args: argparse.Namespace, held: contextlib.ExitStack) -> Pack | None:
    """The checked pack ``args.lock`` names (a directory or a ``.tar``), or None for a lock.
    The cache stays in use (``cachedir.in_use``) until ``held`` closes, at the end of the run:
    the unpacked pack and the compile cache mounted from it are the running job's, and
    ``envlock cache prune`` refuses to remove them meanwhile."""
    from envlock.restore.packdir import is_pack

    if not is_pack(Path(args.lock)):
        return None
    from envlock.restore import cachedir
    from envlock.restore.packdir import open_pack
    from envlock.restore.restore import cache_dir

    held.enter_context(cachedir.in_use(cache_dir(), say))
    return open_pack(Path(args.lock), cache_dir() / cachedir.PACKS)


def _compile_files(args: argparse.Namespace, lock: Lock | None, pack: Pack | None) -> tuple[CacheFile | None, Path | None]:
    """The compile cache to load (``--compile-cache``, else the pack's) and where to save one."""
    from envlock.commands._recording import compile_files

    if (args.compile_cache or args.save_compile_cache) and (args.jupyter or args.ssh):
        raise UsageError("--compile-cache and --save-compile-cache apply to a command after --, "
                         "not to --jupyter or --ssh")
    if pack is not None and pack.compile_cache and (args.jupyter or args.ssh) and not args.no_compile_cache:
        say("note: the pack's compile cache is loaded before a command after --, not into JupyterLab "
            "or an ssh session")
        return None, None
    from envlock.replay.compilecache import pack_cache

    held = pack.compile_cache if pack is not None else None
    packed = pack_cache(held, pack.manifest["compile_cache"].get("sha256")) if pack is not None and held else None
    return compile_files(args, lock, "the pack's lock" if pack is not None else args.lock, packed)


def _restore_for_run(args: argparse.Namespace, lock: Lock, build_options: Options,
                     engine: ContainerEngine, lock_path: Path, *, network: bool) -> Ready | int:
    """The lock's image through the whole restore (found by its build context, or built) and,
    unless --no-verify, the check inside it (kept per image id: it runs once per image); the
    exit code when the check found the image does not match the lock."""
    from envlock.restore.run import Ready

    result = restore_image(args, lock, build_options, engine, verify=False, lock_path=lock_path,
                           network=network)
    ready = Ready(image_id=result.image_id, tag=result.tag, python=result.plan.python,
                  os_packages_restored=result.plan.os_packages_restored)
    if args.no_verify:
        if not result.cached:
            say(f"{result.tag} was built but not verified (--no-verify)")
        return ready
    from envlock.report.render import verify_brief, verify_text
    from envlock.restore.restore import verify_image_for

    _, cmp = verify_image_for(engine, result.plan, result.image_id, result.tag)
    checked = f"{args.lock} inside {result.tag}"
    if not cmp.ok:
        sys.stderr.write(verify_text(cmp, lock, checked, restored=True))
        say("refusing to run in an image that does not match the lock (--no-verify overrides)")
        return EXIT_DRIFT
    # The verdict of the check, in verify's words, before the command's output.
    sys.stderr.write(verify_brief(cmp, lock, checked))
    return ready


def split_run_args(args: argparse.Namespace) -> list[str]:
    """The command after ``--``; the lock and the options before ``--`` are parsed here.

    argparse hands everything after run's leading options to REMAINDER, so ``envlock run env.lock
    --gpus all -- python train.py`` arrives as one list. Its first word, when it is not an option
    and not ``--``, is the lock; without one (``envlock run -- python train.py``) the lock is the
    nearest ``env.lock`` upward (``args.lock`` is set either way). Without ``--``, leading options
    are envlock's and the command starts at the first other word (``envlock run env.lock
    --jupyter --workspace DIR`` has no command at all); there a first word that names no path
    and no lock file (``envlock run python train.py``) is the command's, not a lock that is not
    there.
    """
    from envlock.commands._lockpath import lock_arg

    rest = list(args.cmd or [])
    given = None
    if rest and rest[0] != "--" and not rest[0].startswith("-") and (
            "--" in rest or _names_a_lock(rest[0])):
        given, rest = rest[0], rest[1:]
    args.cmd = rest
    command = command_after_options(args, rest, lambda command: run_options_parser(command=command))
    args.lock = lock_arg(given)
    return command


def _names_a_lock(word: str) -> bool:
    """A path that exists (a lock, a pack directory), or a name a lock has (``*.lock``,
    ``*.toml``) even when it is missing, so a mistyped lock is still reported as such."""
    return os.path.lexists(word) or word.endswith((".lock", ".toml"))
