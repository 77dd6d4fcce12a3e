"""``envlock export LOCK --to FORMAT``: argument parsing and output only.

Registered by ``envlock.cli`` through ``register(subparsers)``. Each format lives in its own
module and is imported only when asked for, so ``envlock --help`` stays instant.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from envlock.export.artifacts import Sources

FORMATS = ("pylock", "requirements", "cyclonedx", "intoto", "apptainer", "k8s", "slurm")
NEEDS_ARTIFACTS = ("pylock", "requirements")


def _sources(args: argparse.Namespace) -> Sources:
    from packaging.utils import canonicalize_name

    from envlock.export.artifacts import Sources

    return Sources(index_url=args.index_url, torch_index_url=args.torch_index_url,
                   wheelhouse=Path(args.wheelhouse) if args.wheelhouse else None,
                   use_cache=not args.no_cache, refresh=args.refresh,
                   skip=frozenset(canonicalize_name(n) for n in args.skip or ()))


def render(args: argparse.Namespace) -> str:
    """The export as text; everything heavy is imported here, per format."""
    from envlock.lock import load

    lock = load(args.lock)
    out_dir = Path(args.output).resolve().parent if args.output not in (None, "-") else None
    if args.to in NEEDS_ARTIFACTS:
        from envlock.export.artifacts import main_index, resolve_lock

        resolved = resolve_lock(lock, _sources(args), relative_to=out_dir if args.to == "pylock" else None)
        if args.to == "pylock":
            from envlock.export import pylock

            return pylock.render(lock, resolved)
        from envlock.export import requirements

        wh = Path(args.wheelhouse).resolve() if args.wheelhouse else None
        return requirements.render(lock, resolved, main_index=main_index(lock, args.index_url),
                                   wheelhouse=wh)
    if args.to == "cyclonedx":
        from envlock.export import cyclonedx

        hashed = None
        if args.hashes:
            from envlock.export.artifacts import resolve_lock

            hashed = resolve_lock(lock, _sources(args))
        return cyclonedx.render(lock, hashed)
    from envlock.export import common

    if args.to == "intoto":
        from envlock.export import intoto

        image = common.pinned_image(lock, args.image) if args.image else None
        return intoto.render(lock, Path(args.lock), image=image)
    if args.to == "apptainer":
        from envlock.export import apptainer

        return apptainer.render(lock, image=args.image, argv=common.command(args.command, required=False))
    argv = common.command(args.command, required=True)
    assert argv is not None
    if args.to == "k8s":
        from envlock.export import k8s

        return k8s.render(lock, argv=argv, image=args.image, gpus=args.gpus,
                          workspace_claim=args.workspace_claim)
    from envlock.export import slurm

    return slurm.render(lock, argv=argv, image=args.image, gpus=args.gpus)


def _written_by_envlock(path: Path) -> bool:
    """Every export names envlock near its top (a comment, a tool entry, a label)."""
    try:
        with open(path, "rb") as fh:
            return b"envlock" in fh.read(8192)
    except OSError:
        return False


def cmd_export(args: argparse.Namespace) -> int:
    from envlock.errors import EXIT_OK, EnvlockError, UsageError
    from envlock.lock import atomic_write

    if args.output not in (None, "-") and Path(args.output).resolve() == Path(args.lock).resolve():
        raise UsageError(f"-o {args.output} would overwrite the lock itself")
    if args.wheelhouse and not Path(args.wheelhouse).is_dir():
        raise UsageError(f"--wheelhouse {args.wheelhouse} is not a directory")
    out = Path(args.output) if args.output not in (None, "-") else None
    # Checked before rendering, which may ask a package index for every package.
    if out is not None and out.is_dir():
        raise UsageError(f"-o {args.output} is a directory; give a file name such as {out / 'pylock.toml'}")
    if out is not None and not out.resolve().parent.is_dir():
        raise UsageError(f"-o {args.output}: directory {out.parent} does not exist")
    if out is not None and out.is_file() and not args.force and not _written_by_envlock(out):
        # Someone's requirements.txt or job script: never replaced without being asked.
        raise UsageError(f"refusing to overwrite {args.output}: it was not written by envlock export",
                         hint="pass --force to replace it, or choose another -o")
    text = render(args)
    if out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return EXIT_OK
    if args.to == "pylock":
        from packaging.pylock import is_valid_pylock_path

        if not is_valid_pylock_path(out):
            sys.stderr.write(f"note: installers only recognise pylock.toml or pylock.NAME.toml, "
                             f"not {out.name}\n")
    try:
        atomic_write(out, text)
    except OSError as exc:
        raise EnvlockError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    sys.stderr.write(f"wrote {out} ({args.to}, {len(text.encode())} bytes)\n")
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("export", help="write the lock in a format other tools read "
                                      "(pylock.toml, requirements, CycloneDX, in-toto, cluster jobs)")
    p.add_argument("lock", nargs="?", default="env.lock")
    p.add_argument("--to", required=True, choices=FORMATS, help="output format")
    p.add_argument("-o", "--output", help="file to write (default: stdout); an existing file is "
                                          "replaced only if envlock export wrote it")
    p.add_argument("--force", action="store_true", help="replace an existing -o file of any origin")
    g = p.add_argument_group("package files (pylock, requirements)")
    g.add_argument("--index-url", help="simple-API index for packages (default: the index the "
                                       "lock's environment used, else pip's configured index)")
    g.add_argument("--torch-index-url", help="PyTorch's wheel index for +cpu/+cuXXX builds ({label} "
                                             "is replaced by the label, or it is appended; default: "
                                             "$ENVLOCK_TORCH_INDEX_URL)")
    g.add_argument("--wheelhouse", help="offline: take files from this `envlock bundle` directory")
    g.add_argument("--skip", action="append", metavar="NAME", help="leave this package out")
    g.add_argument("--no-cache", action="store_true", help="do not read or write the index cache")
    g.add_argument("--refresh", action="store_true", help="refetch index pages even when cached")
    g.add_argument("--hashes", action="store_true",
                   help="cyclonedx: also resolve and list each package's artifact hashes")
    g = p.add_argument_group("images and jobs (intoto, apptainer, k8s, slurm)")
    g.add_argument("--image", metavar="REF@sha256:...",
                   help="the image by digest (default: the lock's own image, when it has a digest)")
    g.add_argument("--command", help="what the job runs, e.g. 'python train.py --epochs 3'")
    g.add_argument("--gpus", type=int, help="GPUs to request (default: as many as the lock recorded)")
    g.add_argument("--workspace-claim", metavar="PVC",
                   help="k8s: mount this PersistentVolumeClaim at /workspace (default: emptyDir)")
    p.set_defaults(func=cmd_export)
