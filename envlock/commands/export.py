"""``envlock export LOCK --to FORMAT``: write the lock in a format other tools read.

Each format lives in its own module under ``envlock.export`` and is imported only when asked for.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from envlock.commands._lockpath import lock_arg
from envlock.text.terminal import plural

if TYPE_CHECKING:
    from envlock.export.artifacts import Sources
    from envlock.lock import Lock

NEEDS_ARTIFACTS = ("pylock", "requirements")
_MAX_JSON = 64 << 20


def _sources(args: argparse.Namespace) -> Sources:
    from packaging.utils import canonicalize_name

    from envlock.export.artifacts import Sources

    return Sources(index_url=args.index_url, torch_index_url=args.torch_index_url,
                   wheelhouse=Path(args.wheelhouse) if args.wheelhouse else None,
                   use_cache=not args.no_cache, refresh=args.refresh,
                   skip=frozenset(canonicalize_name(n) for n in args.skip or ()))


def render(args: argparse.Namespace) -> str:
    """The export as text, with envlock's proof of authorship (``export.common.stamp``)."""
    from envlock.export.common import stamp
    from envlock.lock import load

    lock = load(args.lock)
    return stamp(args.to, lock, _render(args, lock))


def _render(args: argparse.Namespace, lock: Lock) -> str:
    """The export as text; everything heavy is imported here, per format."""
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
                                   wheelhouse=wh, relative_to=out_dir,
                                   filename=Path(args.output).name if out_dir else "requirements.txt")
    if args.to == "cyclonedx":
        from envlock.export import cyclonedx

        hashed = None
        if args.hashes:
            from envlock.export.artifacts import resolve_lock

            hashed = resolve_lock(lock, _sources(args))
        return cyclonedx.render(lock, hashed)
    if args.to in ("conda-explicit", "conda-lock", "pixi"):
        from envlock.export import conda

        if args.to == "conda-explicit":
            return conda.explicit(lock, md5=args.md5)
        return conda.conda_lock(lock) if args.to == "conda-lock" else conda.pixi(lock)
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

    return slurm.render(lock, argv=argv, image=args.image, gpus=args.gpus, venv=args.venv,
                        lock_path=str(Path(args.lock).resolve()), nodes=args.nodes)


def _json_proof(data: bytes) -> bool:
    from envlock.export.common import MARKER_PROPERTY, marker_property
    from envlock.export.intoto import PREDICATE_TYPE

    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return False
    if not isinstance(doc, dict):
        return False
    if doc.get("predicateType") == PREDICATE_TYPE:  # a statement of envlock's own type
        return True
    meta = doc.get("metadata")
    props = meta.get("properties") if isinstance(meta, dict) else None
    return isinstance(props, list) and any(
        isinstance(p, dict) and p.get("name") == MARKER_PROPERTY and marker_property(p.get("value"))
        for p in props)


def written_by_envlock(path: Path) -> bool:
    """True when ``path`` (a regular file, or a link to one) holds envlock's proof of
    authorship (``export.common.stamp``): the marker line, or in JSON its field. The word
    envlock alone proves nothing: a pyproject.toml or a job script running envlock has it."""
    from envlock.export.common import has_marker

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not hang the check
    except OSError:
        return False
    with os.fdopen(fd, "rb") as fh:
        try:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return False
            head = fh.read(1 << 16)
            if head.lstrip().startswith(b"{"):
                rest = fh.read(_MAX_JSON)
                return len(head) + len(rest) < _MAX_JSON and _json_proof(head + rest)
        except OSError:
            return False
    return has_marker(head.decode("utf-8", "replace"))


def run(args: argparse.Namespace) -> int:
    args.lock = lock_arg(args.lock)
    from envlock.errors import EXIT_OK, EnvlockError, UsageError
    from envlock.lock import atomic_write

    if args.output not in (None, "-") and Path(args.output).resolve() == Path(args.lock).resolve():
        raise UsageError(f"-o {args.output} would overwrite the lock itself")
    if args.md5 and args.to != "conda-explicit":
        raise UsageError("--md5 goes with --to conda-explicit")
    if (args.venv is not None or args.nodes is not None) and args.to != "slurm":
        raise UsageError("--venv and --nodes go with --to slurm")
    if args.nodes is not None and (args.venv is None or args.nodes < 1):
        raise UsageError("--nodes N (at least 1) goes with --venv")
    if args.venv is not None and not Path(args.venv).is_absolute():
        # The job runs it on every node, from wherever sbatch was called.
        raise UsageError(f"--venv {args.venv} must be an absolute path on a shared filesystem")
    if args.wheelhouse and not Path(args.wheelhouse).is_dir():
        raise UsageError(f"--wheelhouse {args.wheelhouse} is not a directory")
    out = Path(args.output) if args.output not in (None, "-") else None
    # Checked before rendering, which may ask a package index for every package.
    if out is not None and out.is_dir():
        raise UsageError(f"-o {args.output} is a directory; give a file name such as {out / 'pylock.toml'}")
    if out is not None and not out.resolve().parent.is_dir():
        raise UsageError(f"-o {args.output}: directory {out.parent} does not exist")
    if out is not None:
        from envlock.lock import write_target

        write_target(out)  # a dangling link is refused before any index is asked
    if out is not None and os.path.lexists(out) and not args.force and not written_by_envlock(out):
        # Someone's requirements.txt or job script: never replaced without being asked.
        raise UsageError(f"refusing to overwrite {args.output}: it was not written by envlock export "
                         "(it has no envlock-export marker)",
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
    sys.stderr.write(f"wrote {out} ({args.to}, {plural(len(text.encode()), 'byte')})\n")
    return EXIT_OK

