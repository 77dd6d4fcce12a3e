"""Every command's options, in one place: the whole grammar of the ``envlock`` program.

Each subcommand names its handler module (``handler``): ``envlock.commands.<handler>.run``
takes the parsed arguments and returns the exit code. The handlers are imported only for the
command that runs, so ``envlock --help`` builds the parser and nothing else.
"""

from __future__ import annotations

import argparse
from typing import TypeAlias

from envlock._version import __version__

FORMATS = ("text", "json", "markdown")
EXPORT_FORMATS = ("pylock", "requirements", "cyclonedx", "intoto", "apptainer", "k8s", "slurm")

_LOCK_HELP = ("the lock file (default: env.lock here or in the nearest parent directory, up to the "
              "repository root)")

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="envlock",
        description="Lock, verify and replay deep-learning environments.",
        epilog="exit codes: 0 ok, 1 drift/differences, 2 usage or invalid/tampered lock, "
               "3 environment problem (engine, interpreter, build)",
    )
    parser.add_argument("--version", action="version", version=f"envlock {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in (_capture, _verify, _diff, _show, _fmt, _schema, _restore, _run, _bundle,
                _canary, _export):
        add(sub)
    return parser


def _capture(sub: Subparsers) -> None:
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
    p.set_defaults(handler="capture")


def _verify(sub: Subparsers) -> None:
    p = sub.add_parser("verify", help="does this environment match the lock?")
    p.add_argument("lock", nargs="?", default=None, help=_LOCK_HELP)
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
    p.set_defaults(handler="verify")


def _diff(sub: Subparsers) -> None:
    p = sub.add_parser("diff", help="compare two locks")
    p.add_argument("a", help="the lock before")
    p.add_argument("b", help="the lock after")
    p.add_argument("--format", choices=FORMATS, default="text")
    p.add_argument("--process-state", action="store_true",
                   help="also compare what the capturing processes set (seeds, determinism flags, "
                        "variables set at run time); by default it is listed apart, as verify does")
    p.set_defaults(handler="diff")


def _show(sub: Subparsers) -> None:
    p = sub.add_parser("show", help="summarise a lock")
    p.add_argument("lock", nargs="?", default=None, help=_LOCK_HELP)
    p.add_argument("--format", choices=(*FORMATS, "latex"), default="text",
                   help="latex: a booktabs table for a paper's appendix")
    p.set_defaults(handler="show")


def _fmt(sub: Subparsers) -> None:
    p = sub.add_parser("fmt", help="validate, normalise and re-seal a lock after a deliberate edit")
    p.add_argument("lock", nargs="?", default=None, help=_LOCK_HELP)
    p.add_argument("--check", action="store_true", help="only report whether it would change")
    p.set_defaults(handler="fmt")


def _schema(sub: Subparsers) -> None:
    p = sub.add_parser("schema", help="print the JSON Schema of env.lock")
    p.set_defaults(handler="schema")


# -- restore, run, bundle ------------------------------------------------------------------------


def _restore(sub: Subparsers) -> None:
    p = sub.add_parser("restore", help="rebuild the lock's environment as a container image and verify it")
    _build_options(p)
    p.add_argument("--dockerfile-only", metavar="DIR",
                   help="only write the build context (Dockerfile, requirements) to DIR; no engine")
    p.add_argument("--force", action="store_true",
                   help="with --dockerfile-only: replace a build context envlock wrote to DIR before")
    p.add_argument("--all", action="store_true", help="also list info-level differences")
    p.add_argument("--push", metavar="REGISTRY/REPO",
                   help="after a successful verify, push the image as REPO:<id> and print REPO@sha256:...")
    p.set_defaults(handler="restore")


def _run(sub: Subparsers) -> None:
    p = sub.add_parser("run", help="run a command in the lock's image (restored or reused)",
                       description="envlock run env.lock [options] -- CMD ...")
    _build_options(p)
    _run_options(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")
    p.set_defaults(handler="run")


def run_options_parser(*, command: bool) -> argparse.ArgumentParser:
    """``run``'s options (all but the lock) for what argparse's REMAINDER left unparsed: the
    options between the lock and ``--``, or before the command (``command``: the rest is it)."""
    parser = argparse.ArgumentParser(prog="envlock run", add_help=False)
    _build_options(parser, lock=False)
    _run_options(parser)
    if command:
        parser.add_argument("cmd", nargs=argparse.REMAINDER)
    return parser


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
    p.add_argument("--index-url", metavar="URL", help="package index (default: pip's configured index)")
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


def _bundle(sub: Subparsers) -> None:
    p = sub.add_parser("bundle", help="collect every wheel of a lock for offline replay")
    p.add_argument("lock")
    p.add_argument("-o", "--output", required=True, metavar="DIR")
    p.add_argument("--wheelhouse", metavar="SRC", help="copy from this directory instead of an index")
    p.add_argument("--index-url", metavar="URL", help="download from this index (default: pip's configured index)")
    p.add_argument("--find-links", metavar="DIR", help="download with pip from this directory, no index")
    p.add_argument("--skip-local", action="store_true", help="leave out editable/local packages")
    p.add_argument("--allow-http", action="store_true", help="accept plain http:// package URLs and indexes")
    p.set_defaults(handler="bundle")


# -- canary, export ------------------------------------------------------------------------------


def _canary(sub: Subparsers) -> None:
    p = sub.add_parser(
        "canary",
        help="hash a fixed set of seeded torch kernels: numeric drift that versions miss",
        description="Run fp32/bf16 matmul, conv, softmax, layer_norm and reductions on fixed "
                    "inputs, on the CPU and each visible CUDA device, and print the sha256 of "
                    "every output. Exit 1 with --against when the bytes differ from the lock's.",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--device", action="append", metavar="DEV",
                   help="run on DEV only (cpu, cuda:0, ...); repeatable")
    p.add_argument("--against", metavar="LOCK", help="compare with the [canary] of LOCK")
    p.add_argument("--python", help="run the canary under this interpreter (default: chosen as "
                                    "capture does: $VIRTUAL_ENV, $CONDA_PREFIX, a .venv here or above)")
    p.set_defaults(handler="canary")


def _export(sub: Subparsers) -> None:
    p = sub.add_parser("export", help="write the lock in a format other tools read "
                                      "(pylock.toml, requirements, CycloneDX, in-toto, cluster jobs)")
    p.add_argument("lock", nargs="?", default=None, help=_LOCK_HELP)
    p.add_argument("--to", required=True, choices=EXPORT_FORMATS, help="output format")
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
    p.set_defaults(handler="export")
