"""``envlock restore``: rebuild the lock's environment as a container image and verify it.

Progress and notes go to stderr; stdout carries the verdict. ``envlock run`` restores its image
through ``restore_image`` here too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envlock.commands._output import say
from envlock.errors import EXIT_DRIFT, EXIT_OK, EnvlockError, UsageError
from envlock.restore.image import LABEL_OPTIONS, Options, image_name, image_tag, options_key

if TYPE_CHECKING:
    from envlock.lock import Lock
    from envlock.restore.engine import ContainerEngine
    from envlock.restore.packdir import Pack
    from envlock.restore.restore import RestoreResult


def options(args: argparse.Namespace) -> Options:
    """The build options ``restore`` and ``run`` share."""
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
                  *, verify: bool, lock_path: Path | None = None, network: bool = True) -> RestoreResult:
    """The lock's image, built or found in the cache, with a build failure's log tail shown."""
    from envlock.errors import BuildFailed
    from envlock.restore import cachedir
    from envlock.restore.restore import cache_dir, restore

    name = image_name(lock_path or Path(args.lock), args.name)
    tag = image_tag(name, lock.short_id)
    try:
        with cachedir.in_use(cache_dir(), say):
            return restore(lock, options, engine=engine, name=name,
                           workdir=Path(args.context_dir) if args.context_dir else None,
                           verify=verify, use_cache=not args.no_cache, say=say, network=network,
                           quiet=args.quiet)
    except EnvlockError as exc:
        hint_earlier_image(exc, engine, tag, options)
        if isinstance(exc, BuildFailed):
            _report_build_failure(exc)
        raise


def hint_earlier_image(exc: EnvlockError, engine: Any, tag: str, options: Options) -> None:
    """The lock's image exists, restored with other options than these, and this restore (or a
    run given other options than the remembered ones) failed, often pulling the lock's own base:
    say so. A plain `envlock run` reuses the options of the last `envlock restore` of the lock
    (``reuse_remembered_options``), so the hint does not ask for them there.

    Only when it is so: the lock's image exists and its build recorded other options than these
    (an image without that record, or restored with these very options, says nothing: the
    failure has another cause)."""

    if isinstance(exc, UsageError):
        return
    with contextlib.suppress(Exception):  # the engine may be the very thing that failed
        info = engine.image(tag)
        earlier = info.labels.get(LABEL_OPTIONS) if info is not None else None
        if earlier is not None and earlier != options_key(options):
            also = (f"{tag} exists but was restored with other options: give the same "
                    "--base/--wheelhouse/--index-url/--venv as then, or leave them out of "
                    "`envlock run`, which reuses those of the last `envlock restore`")
            exc.hint = f"{exc.hint}; {also}" if exc.hint else also


def _target(args: argparse.Namespace) -> tuple[str, Path | None]:
    kind, *rest = args.target
    if kind == "image" and not rest:
        return kind, None
    if kind == "venv" and len(rest) == 1:
        return kind, Path(rest[0])
    if kind == "charliecloud" and len(rest) <= 1:
        return kind, Path(rest[0]) if rest else None
    if kind == "prefix" and len(rest) == 1:
        return kind, Path(rest[0])
    raise UsageError(f"--target {' '.join(args.target)}: expected `image`, `venv DIR`, "
                     "`prefix DIR` or `charliecloud [DIR]`")


def pack_options(args: argparse.Namespace, pack: Pack, opts: Options) -> Options:
    """The pack's wheels and its base image (by id: it is loaded from the pack, never pulled),
    and the wheels its checked SHA256SUMS lists (the only ones uv is taken from)."""
    import dataclasses

    from envlock.restore.packdir import with_base

    changes: dict[str, Any] = {"checked_wheels": pack.checked_wheels, "debs": pack.debs}
    if not args.wheelhouse:
        changes["wheelhouse"] = pack.wheels
    opts = dataclasses.replace(opts, **changes)
    return opts if args.base else with_base(opts, pack.base)


def pack_base(args: argparse.Namespace, pack: Pack, opts: Options, engine: ContainerEngine,
              lock: Lock) -> Options:
    """A pack's build options (``pack_options``), its base image loaded into the engine when
    the engine lacks it; for a pack packed without one (``--no-image``), a note of what the
    build starts from. ``restore PACK`` and ``run PACK`` both come here, so they say the same."""
    from envlock.restore.packdir import base_tag, ensure_base
    from envlock.text.terminal import safe

    if ensure_base(engine, pack, base_tag(lock.short_id)):
        say(safe(f"loaded the base image {pack.base.get('display', '')} from the pack"))
    elif pack.base_id is None and not args.base:
        from envlock.export.pack import needed_base

        start = needed_base(lock, None) or "the lock's base image"
        say(safe(f"note: the pack holds no base image (packed with --no-image): the build starts FROM "
                 f"{start}, which the engine pulls unless it has it; pass --base REF to build from an "
                 "image it has"))
    return pack_options(args, pack, opts)


def run(args: argparse.Namespace) -> int:
    from envlock.commands._lockpath import lock_arg
    from envlock.restore import cachedir
    from envlock.restore.restore import cache_dir

    kind, venv_dir = _target(args)
    args.lock = lock_arg(args.lock)
    # The unpacked pack, the build context and envlock's own wheel stay in the cache while this
    # restore uses them: `envlock cache prune` refuses to run meanwhile.
    with cachedir.in_use(cache_dir(), say):
        return _restore(args, kind, venv_dir)


def _restore(args: argparse.Namespace, kind: str, venv_dir: Path | None) -> int:
    pack: Pack | None = None
    lock_path = Path(args.lock)
    from envlock.restore.packdir import is_pack

    if is_pack(lock_path):
        from envlock.restore.cachedir import PACKS
        from envlock.restore.packdir import open_pack
        from envlock.restore.restore import cache_dir

        pack = open_pack(lock_path, cache_dir() / PACKS)
        lock_path = pack.lock
    if kind == "venv":
        return _venv(args, lock_path, pack, venv_dir)
    if args.conda_channel and kind != "prefix":
        raise UsageError("--conda-channel goes with --target prefix DIR")
    if kind == "prefix":
        return _prefix(args, lock_path, pack, venv_dir)
    if kind == "charliecloud":
        return _charliecloud(args, lock_path, pack, venv_dir)
    if kind == "image" and pack is not None and pack.conda_channel is not None and not args.dockerfile_only:
        return _conda_image(args, lock_path, pack)
    if args.dockerfile_only:
        import dataclasses
        import shlex

        from envlock.lock import load
        from envlock.restore import clibuild, dockerfile
        from envlock.restore.restore import write_dockerfile_only

        lock = load(lock_path)
        opts = pack_options(args, pack, options(args)) if pack else options(args)
        # No engine: the text for any builder (the classic one's), or with ENVLOCK_BUILDER=cli the
        # one that mounts the wheels, for BuildKit or Podman.
        opts = dataclasses.replace(opts, mounts=clibuild.setting() == "cli")
        plan = write_dockerfile_only(lock, opts, Path(args.dockerfile_only), force=args.force, say=say)
        for note in plan.notes:
            say(note if note.startswith("warning: ") else f"note: {note}")
        where = shlex.quote(str(args.dockerfile_only))
        first = ""
        if plan.split_torch:  # the torch layer is an image of its own, built first
            tag = dockerfile.torch_layer_tag(dockerfile.torch_layer_key(plan))
            first = (f"(cd {where} && tar -c {' '.join(dockerfile.torch_layer_files(plan))} | docker build "
                     f"-f {dockerfile.TORCH_LAYER_DOCKERFILE} -t {tag} -) && ")
        sys.stdout.write(f"wrote {Path(args.dockerfile_only) / 'Dockerfile'} (base {plan.base.ref}); "
                         f"build it with: {first}docker build -t "
                         f"{image_tag(image_name(Path(args.lock), args.name), lock.short_id)} {where}\n")
        return EXIT_OK
    from envlock.lock import load
    from envlock.restore.endpoint import connect

    lock = load(lock_path)
    opts = options(args)
    with connect(args.engine) as engine:
        if pack is not None:
            opts = pack_base(args, pack, opts, engine, lock)
        # A pack's build needs no network: everything is in its context (restore keeps it for the
        # lock's OS packages, which only the image's package manager can fetch).
        result = restore_image(args, lock, opts, engine, verify=not args.no_verify,
                               lock_path=lock_path, network=pack is None)
        if pack is None:
            from envlock.commands._recording import remember_restore_options

            remember_restore_options(args, lock.short_id, str(lock_path))
        how = "cache hit, not rebuilt" if result.cached else f"built in {result.seconds:.1f}s"
        size = f", {result.size / 1e6:.0f} MB" if result.size else ""
        sys.stdout.write(f"image {result.tag} ({result.image_id[7:19]}{size}): {how}\n")
        ok = _verdict(result, lock, f"{lock_path} inside {result.tag}", show_info=args.all)
        if args.push and not ok:
            say("not pushing an image that does not match the lock")
        elif args.push:
            from envlock.export.push import push

            ref = push(engine, result.image_id, args.push, lock)
            sys.stdout.write(f"pushed {ref}\n  replay on a cluster: envlock export {args.lock} "
                             f"--to k8s|slurm|apptainer --image {ref}\n")
    return EXIT_OK if ok else EXIT_DRIFT


def _venv(args: argparse.Namespace, lock_path: Path, pack: Pack | None, directory: Path | None) -> int:
    """``--target venv DIR``: a venv on this host from the pack's or --wheelhouse's wheels."""
    from envlock.lock import load
    from envlock.report.render import verify_text
    from envlock.restore.venvtarget import restore_venv

    assert directory is not None
    lock = load(lock_path)
    opts = options(args)
    wheels = Path(args.wheelhouse) if args.wheelhouse else (pack.wheels if pack else None)
    if wheels is None:
        raise UsageError("--target venv installs offline: give a pack or --wheelhouse DIR")
    result = restore_venv(lock, wheels, directory, opts, verify=not args.no_verify, say=say)
    sys.stdout.write(f"venv {result.directory} ({result.installer}): installed in {result.seconds:.1f}s\n")
    if result.comparison is None:
        return EXIT_OK
    sys.stdout.write(verify_text(result.comparison, lock, f"{lock_path} in {result.directory}",
                                 show_info=args.all, restored=True))
    return EXIT_OK if result.comparison.ok else EXIT_DRIFT


def _prefix(args: argparse.Namespace, lock_path: Path, pack: Pack | None, directory: Path | None) -> int:
    """``--target prefix DIR``: a conda lock's prefix on this host from the pack's channel, with
    no solving, verified in place (``envlock.restore.condatarget``)."""
    from envlock.lock import load
    from envlock.report.render import verify_text
    from envlock.restore.condatarget import restore_prefix

    assert directory is not None
    lock = load(lock_path)
    channel = Path(args.conda_channel) if args.conda_channel else (pack.conda_channel if pack else None)
    if channel is None or not channel.is_dir():
        raise UsageError("--target prefix installs a conda lock offline: give a pack made by "
                         "`envlock pack` from a conda environment's lock, or --conda-channel DIR"
                         + (f" ({channel} is not a directory)" if channel is not None else ""))
    result = restore_prefix(lock, channel, directory, pack_wheels=pack.wheels if pack else None,
                            verify=not args.no_verify, say=say)
    sys.stdout.write(f"prefix {result.directory} (py-rattler, {result.packages} conda packages): "
                     f"installed in {result.seconds:.1f}s\n")
    if result.comparison is None:
        return EXIT_OK
    sys.stdout.write(verify_text(result.comparison, lock, f"{lock_path} in {result.directory}",
                                 show_info=args.all, restored=True))
    return EXIT_OK if result.comparison.ok else EXIT_DRIFT


def _conda_image(args: argparse.Namespace, lock_path: Path, pack: Pack) -> int:
    """A conda lock's pack into a container image: the prefix at the lock's path, installed by
    py-rattler in a build stage from the pack with the network off (``condatarget``)."""
    from envlock.lock import load
    from envlock.report.render import verify_text
    from envlock.restore.condatarget import restore_conda_image
    from envlock.restore.endpoint import connect
    from envlock.restore.restore import cache_dir

    lock = load(lock_path)
    if not args.base:
        raise UsageError("a conda lock's image is built FROM an image with python3 >= 3.10 and pip, "
                         "which the pack does not hold: pass --base REF")
    channel = pack.conda_channel
    assert channel is not None
    name = image_name(Path(args.lock), args.name)
    tag = image_tag(name, lock.short_id)
    # The lock's own directory in restore's cache, named as a pip lock's is (``restore``): its
    # build log outlives the temporary context, and `envlock cache` lists and prunes it.
    workdir = cache_dir() / f"{name}-{lock.short_id}"
    with connect(args.engine) as engine:
        image_id, comparison = restore_conda_image(engine, lock, channel, pack.wheels, base=args.base, tag=tag,
                                                   workdir=workdir, verify=not args.no_verify,
                                                   quiet=args.quiet, say=say)
    sys.stdout.write(f"image {tag} ({image_id[7:19]}): built from the pack's conda channel\n")
    if comparison is None:
        return EXIT_OK
    sys.stdout.write(verify_text(comparison, lock, f"{lock_path} inside {tag}", show_info=args.all,
                                 restored=True))
    return EXIT_OK if comparison.ok else EXIT_DRIFT


def _verdict(result: RestoreResult, lock: Lock, where: str, *, show_info: bool) -> bool:
    """The check inside the image, printed as `verify` prints it; True when it matches (or when
    the check was skipped, --no-verify)."""
    from envlock.report.render import verify_text

    if result.comparison is None:
        return True
    sys.stdout.write(verify_text(result.comparison, lock, where, show_info=show_info, restored=True))
    return result.comparison.ok


def _charliecloud(args: argparse.Namespace, lock_path: Path, pack: Pack | None, directory: Path | None) -> int:
    """``--target charliecloud [DIR]``: the image built by ch-image from the same context, as a
    directory image at DIR, verified inside with ch-run (``envlock.restore.chtarget``)."""
    import dataclasses

    from envlock.lock import load
    from envlock.restore import chtarget
    from envlock.restore.restore import cache_dir

    if args.push or args.dockerfile_only or args.engine:
        raise UsageError("--target charliecloud builds with ch-image: --push, --dockerfile-only and "
                         "--engine belong to the container engine target")
    lock = load(lock_path)
    opts = pack_options(args, pack, options(args)) if pack else options(args)
    # Each ch-image build becomes the directory image: the torch layer is a stage of the one build.
    opts = dataclasses.replace(opts, torch_layer_image=False)
    if args.base and not os.path.lexists(args.base):
        raise UsageError(f"--base {args.base}: --target charliecloud takes the base as a file, a "
                         "rootfs tarball or directory (an image reference would need a registry)")
    rootfs = Path(args.base) if args.base else None
    oci = docker_archive = None
    if pack is not None and rootfs is None:
        oci = pack.oci_archive
        docker_archive = None if oci else pack.docker_archive
    if rootfs is None and oci is None and docker_archive is None:
        raise UsageError("--target charliecloud imports its base from a file: restore a pack with its "
                         "base image (`envlock pack` without --no-image), or pass --base ROOTFS.tar|DIR")
    venv = opts.venv or (lock.python.prefix if lock.python.prefix_kind == "venv" else None)
    if venv and (venv.rstrip("/") == "/tmp" or venv.startswith("/tmp/")):
        # ch-image's RUN shares the host's /tmp: the venv would be built over the host's own.
        raise UsageError(f"--target charliecloud cannot build the virtual environment at {venv}: "
                         "ch-image shares /tmp with the host", hint="pass --venv /opt/venv")
    tools = chtarget.find_tools(umoci=rootfs is None)
    root = chtarget.private_dir(cache_dir() / "charliecloud")
    storage = root / "storage"  # ch-image creates it: it refuses an empty directory
    name = image_name(lock_path, args.name)
    dest = directory or root / "images" / f"{name}-{lock.short_id}"
    os_install = lock.python.prefix_kind == "system" and bool(lock.os_packages)
    engine = chtarget.CharliecloudEngine(storage, dest, tools=tools, force=os_install)
    if rootfs is not None:
        say(f"hashing the base {rootfs}")
        base = chtarget.rootfs_digest(rootfs)
        opts = dataclasses.replace(opts, base=base, base_origin="--base", base_display=None)
        if engine.image(base) is None:
            say(f"importing {rootfs} into Charliecloud's storage as {base[:19]}")
            engine.import_rootfs(rootfs, base)
    else:
        assert pack is not None and opts.base
        if engine.image(opts.base) is None:
            say(f"importing the base image {pack.base.get('display', '')} from the pack's "
                + ("OCI archive" if oci else "docker-archive (converted with skopeo)"))
            if oci is None:
                assert docker_archive is not None
                oci = engine.oci_from_docker_archive(docker_archive, root)
                try:
                    engine.import_oci(oci, opts.base, root)
                finally:
                    shutil.rmtree(oci.parent, ignore_errors=True)
            else:
                engine.import_oci(oci, opts.base, root)
    result = restore_image(args, lock, opts, engine, verify=not args.no_verify, lock_path=lock_path,
                           network=False)
    how = "cache hit, not rebuilt" if result.cached else f"built in {result.seconds:.1f}s"
    sys.stdout.write(f"charliecloud image {dest} ({result.tag}): {how}\n")
    ok = _verdict(result, lock, f"{lock_path} inside {dest}", show_info=args.all)
    sys.stdout.write(f"  run in it: {chtarget.run_command(dest)}\n")
    return EXIT_OK if ok else EXIT_DRIFT
