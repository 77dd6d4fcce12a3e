"""Every command's options, in one place: the whole grammar of the ``envlock`` program.

Each subcommand names its handler module (``handler``): ``envlock.commands.<handler>.run``
takes the parsed arguments and returns the exit code. The handlers are imported only for the
command that runs, so ``envlock --help`` builds the parser and nothing else.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeAlias

from envlock._version import __version__

FORMATS = ("text", "json", "markdown")
# A page and the plots alone (``report/page``, ``report/plot``).
PAGE_FORMATS = ("html", "svg", "png")
EXPORT_FORMATS = ("pylock", "requirements", "cyclonedx", "intoto", "apptainer", "k8s", "slurm",
                  "conda-explicit", "conda-lock", "pixi")

_LOCK_HELP = ("the lock file (default: env.lock here or in the nearest parent directory, up to the "
              "repository root)")

Subparsers: TypeAlias = "argparse._SubParsersAction[_CommandParser]"


# How close a mistyped word must be to a right one to be suggested: "verfy" and "vrfy" are
# verify, "--deeep" is --deep, but "--deeep" is no --help (difflib's default, 0.6, said it was).
_CLOSE = 0.75


def _closest(word: str, choices: Sequence[str]) -> str | None:
    import difflib  # only for a mistyped word: not every start pays it

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=_CLOSE)
    return close[0] if close else None


class Parser(argparse.ArgumentParser):
    """argparse's parser, answering a mistyped word with the closest right one: a subcommand
    or another choice (``envlock verfy``: did you mean 'verify'?) and an option
    (``--deeep``: did you mean --deep?)."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse's one check of a value against ``choices`` (the subcommand's name included);
        # its message, with the suggestion before the list of choices.
        if action.choices is not None and value not in action.choices:
            names = [str(c) for c in action.choices]
            close = _closest(str(value), names)
            hint = f"; did you mean {close!r}?" if close else ""
            raise argparse.ArgumentError(
                action, f"invalid choice: {value!r}{hint} (choose from {', '.join(map(repr, names))})")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        words = list(sys.argv[1:] if args is None else args)
        # argparse checks that COMMAND is there before it looks at options it does not know, so
        # ``envlock --verison`` said "COMMAND is required": an unknown option before the command
        # is answered first, with the option it is closest to.
        leading = list(itertools.takewhile(lambda w: w.startswith("-") and w != "--", words))
        unknown = [w for w in leading if w.split("=", 1)[0] not in self._option_string_actions]
        if unknown and self._subparsers is not None:
            self.unrecognized(unknown)
        parsed, extras = self.parse_known_args(words, namespace)
        if extras:
            self.unrecognized(extras)
        return parsed

    def unrecognized(self, extras: list[str]) -> NoReturn:
        """argparse's "unrecognized arguments" error, with the option each mistyped one is
        closest to (``--deeep``: did you mean --deep?)."""
        options = list(self._option_string_actions)
        hints = {word: close for word in extras if word.startswith("-")
                 if (close := _closest(word.split("=", 1)[0], options))}
        if len(hints) == 1:
            hint = f" (did you mean {next(iter(hints.values()))}?)"
        else:
            hint = "".join(f"; {word}: did you mean {close}?" for word, close in hints.items())
            hint = f" ({hint[2:]})" if hint else ""
        self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")


class _CommandParser(Parser):
    """A subcommand's parser: an argument it does not know is its own error, shown with its own
    usage (``envlock verify --deeep``); argparse hands such words up to the top-level parser,
    which printed the usage of ``envlock`` itself."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.unrecognized(extras)
        return parsed, extras


def build_parser(words: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """envlock's parser. Given the words it will parse (``words``), only the subcommand the first
    one names is built: building all fifteen takes a few ms of every command's start, and the
    subcommand's own parser is the same either way (its help, its errors). Help, a mistyped or a
    missing command get them all, to list or to suggest from."""
    parser = Parser(
        prog="envlock",
        description="Lock, verify and replay deep-learning environments.",
        epilog="exit codes: 0 ok, 1 drift/differences, 2 usage or invalid/tampered lock, "
               "3 environment problem (engine, interpreter, build)",
    )
    parser.add_argument("--version", action="version", version=f"envlock {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)
    sub.required = True
    named = _COMMANDS.get(words[0]) if words else None
    for add in [named] if named is not None else _COMMANDS.values():
        add(sub)
    return parser


_STRICT_HELP = ("warnings count as drift too (with --requirements: so does a requirement that "
                "cannot be checked here)")
_REQUIREMENTS_HELP = ("judge this host only against the lock's [requires] (driver CUDA, glibc, GPU "
                      "architectures, CPU features): what it cannot check, it says")
_REQUIRE_HELP = ("declare what a host needs, in [requires]: cuda_driver=12.4, glibc=2.28, "
                 "gpu_archs=sm_80,sm_90, cpu_features=avx2,fma (an empty value removes one); "
                 "repeatable")


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
    p.add_argument("--strict", action="store_true",
                   help="write no lock (exit 3) when anything could not be captured ([[unreadable]])")
    p.add_argument("--require", action="append", default=[], metavar="KEY=VALUE",
                   help=_REQUIRE_HELP)
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(handler="capture")


def _verify(sub: Subparsers) -> None:
    p = sub.add_parser("verify", help="does this environment match the lock?")
    p.add_argument("lock", nargs="?", default=None, help=_LOCK_HELP)
    p.add_argument("--python", help="verify this interpreter (default: chosen as capture does)")
    p.add_argument("--no-torch", action="store_true", help="do not import torch")
    p.add_argument("--strict", action="store_true", help=_STRICT_HELP)
    p.add_argument("--requirements", action="store_true", help=_REQUIREMENTS_HELP)
    p.add_argument("--all", action="store_true",
                   help="also list info-level differences, and every file --deep finds")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--deep", action="store_true",
                   help="check every installed file against its distribution's RECORD (files "
                        "whose stat is unchanged since the last check are not re-read)")
    p.add_argument("--no-cache", action="store_true",
                   help="ignore every cache: import torch even when its cached facts are still "
                        "valid, and with --deep re-hash every file, not only those whose stat changed")
    g = p.add_argument_group("every node of a cluster (Slurm)")
    g.add_argument("--fleet", action="store_true",
                   help="run this verify once on every node of the allocation through srun and "
                        "print one table of the nodes that differ, grouped by difference")
    g.add_argument("--nodes", type=int, metavar="N",
                   help="with --fleet outside an allocation: check N nodes (srun allocates them)")
    g.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="with --fleet: a node without a verdict by then is named as timed out "
                        "(default: 120)")
    # The node side of --fleet: one JSON line per message on stdout, the verdict included.
    p.add_argument("--fleet-node", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--record", metavar="REC",
                   help="also read the inputs of this replay record again: a changed one is drift "
                        "(with --fleet: on every node)")
    p.set_defaults(handler="verify")


def _diff(sub: Subparsers) -> None:
    p = sub.add_parser("diff", help="compare two locks",
                       description="envlock diff A B; envlock diff B compares the nearest env.lock "
                                   "(here or in a parent directory) with B")
    p.add_argument("a", help="the lock before (alone: the lock after, compared with the nearest env.lock)")
    p.add_argument("b", nargs="?", default=None, help="the lock after")
    p.add_argument("--format", choices=(*FORMATS, "html"), default="text",
                   help="html: one self-contained page, for a pull request")
    p.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE instead of stdout")
    p.add_argument("--process-state", action="store_true",
                   help="also compare what the capturing processes set (seeds, determinism flags, "
                        "variables set at run time); by default it is listed apart, as verify does")
    p.set_defaults(handler="diff")


def _show(sub: Subparsers) -> None:
    p = sub.add_parser("show", help="summarise a lock, or a replay record as a page or a plot")
    p.add_argument("lock", nargs="?", default=None, help=_LOCK_HELP + "; or a replay record (html, svg, png)")
    p.add_argument("--format", choices=(*FORMATS, "latex", *PAGE_FORMATS), default="text",
                   help="latex: a booktabs table for a paper's appendix; html: one self-contained page "
                        "(a record's with its metrics plotted); svg, png: a record's metric plots "
                        "(html of a record, svg and png need the extra envlock-ml[report])")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(handler="show")


def _fmt(sub: Subparsers) -> None:
    p = sub.add_parser("fmt", help="validate, normalise and re-seal a lock after a deliberate edit")
    p.add_argument("lock", nargs="?", default=None, help=_LOCK_HELP)
    p.add_argument("--check", action="store_true", help="only report whether it would change")
    p.add_argument("--require", action="append", default=[], metavar="KEY=VALUE",
                   help=_REQUIRE_HELP)
    p.set_defaults(handler="fmt")


def _schema(sub: Subparsers) -> None:
    p = sub.add_parser("schema", help="print the JSON Schema of env.lock")
    p.set_defaults(handler="schema")


# -- restore, run, bundle ------------------------------------------------------------------------


def _restore(sub: Subparsers) -> None:
    p = sub.add_parser("restore", help="rebuild the lock's environment as a container image and verify it",
                       description="envlock restore env.lock|PACK [options]: PACK is a directory or "
                                   ".tar that `envlock pack` wrote, restored with no network")
    _build_options(p)
    p.add_argument("--target", nargs="+", metavar="KIND [DIR]", default=["image"],
                   help="image (default): a container image; venv DIR: a plain virtual environment "
                        "on this host from the pack's (or --wheelhouse's) wheels, verified in place; "
                        "prefix DIR: a conda lock's prefix from the pack's conda channel (py-rattler, "
                        "no solving), verified in place; "
                        "charliecloud [DIR]: built by ch-image from the same Dockerfile (base from "
                        "the pack's OCI archive or --base ROOTFS.tar|DIR), a directory image at DIR "
                        "(default under envlock's cache), verified inside with ch-run")
    p.add_argument("--conda-channel", metavar="DIR",
                   help="--target prefix: take the conda archives from this channel directory "
                        "(<subdir>/<fn>, as a pack's conda/ or a local mirror) instead of a pack's")
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
                       usage="envlock run [LOCK] [options] -- CMD ...",
                       description="envlock run [LOCK] [options] -- CMD ...: LOCK defaults to env.lock "
                                   "here or in the nearest parent directory, up to the repository root")
    _build_options(p, lock=False)
    _run_options(p)
    # The lock is the first word before `--` (split_run_args): argparse cannot tell an optional
    # lock from the command once a `--` was consumed, and `envlock run -- CMD` must find it upward.
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="[LOCK] [options] -- CMD ...")
    p.set_defaults(handler="run")


def run_options_parser(*, command: bool) -> argparse.ArgumentParser:
    """``run``'s options (all but the lock) for what argparse's REMAINDER left unparsed: the
    options between the lock and ``--``, or before the command (``command``: the rest is it)."""
    parser = Parser(prog="envlock run", add_help=False)
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
    p.add_argument("--ssh", action="store_true", help="start the image's sshd as a non-root user, "
                   "key-only, on a free port of 127.0.0.1, and print the ssh command")
    p.add_argument("--ssh-key", metavar="FILE.pub",
                   help="with --ssh: the public key allowed to log in (default: ~/.ssh/id_ed25519.pub, "
                        "id_ecdsa.pub or id_rsa.pub)")
    g = p.add_argument_group("replay record (what the run produced and read)")
    g.add_argument("--record", metavar="REC", help="write a sealed replay record: the metrics the "
                   "command passes to envlock.record(), the sha256 of --output files, the --input digests")
    g.add_argument("--replay", metavar="REC", help="re-run REC's command (or CMD) and compare with "
                   "REC: exit 0 when reproduced, 1 on the first diverging step, output or changed input")
    _report_option(g)
    _record_options(g)
    _tolerance_options(g)
    g = p.add_argument_group("torch.compile cache (envlock.save_compile_cache)")
    _compile_cache_options(g, save=True)
    g.add_argument("--no-compile-cache", action="store_true",
                   help="with a pack that holds a compile cache: run without it (compile cold)")


def _compile_cache_options(g: argparse._ActionsContainer, *, save: bool) -> None:
    g.add_argument("--compile-cache", metavar="FILE",
                   help="load this compile cache into a fresh Inductor cache directory before CMD starts "
                        "(refused, exit 2, when another torch or Triton made it)")
    if save:
        g.add_argument("--save-compile-cache", metavar="FILE",
                       help="collect what CMD compiled: saved at its exit by envlock.record() (or "
                            "envlock.save_compile_cache()) and written to FILE")


def _report_option(g: argparse._ActionsContainer) -> None:
    g.add_argument("--report", metavar="FILE.html",
                   help="with a replay: also write the verdict as one self-contained page, every metric "
                        "plotted (needs the extra envlock-ml[report])")


def _trace_option(g: argparse._ActionsContainer) -> None:
    g.add_argument("--no-trace", action="store_true",
                   help="do not trace which files and variables the run's processes read (the replay "
                        "then cannot name a changed config, checkpoint or variable)")


def _record_options(g: argparse._ActionsContainer) -> None:
    _trace_option(g)
    g.add_argument("--output", action="append", metavar="PATH",
                   help="a file or directory the command writes (relative to the workspace); repeatable")
    g.add_argument("--input", action="append", metavar="PATH|hf:REPO",
                   help="what the command reads: a data file or directory, or a Hugging Face "
                        "repository in the cache (hf:org/name, hf:datasets/org/name, @ref); repeatable")


def _tolerance(text: str) -> float:
    """A tolerance: a finite number >= 0 (NaN would make every comparison fail or pass, inf
    every one pass, a negative one none)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number >= 0")
    return value


def _tolerance_options(g: argparse._ActionsContainer) -> None:
    g.add_argument("--rtol", type=_tolerance, default=0.0, help="relative tolerance (default 0: bit-identical)")
    g.add_argument("--atol", type=_tolerance, default=0.0, help="absolute tolerance (default 0: bit-identical)")


def _build_options(p: argparse.ArgumentParser, *, lock: bool = True) -> None:
    if lock:
        p.add_argument("lock", nargs="?", default=None, help=_LOCK_HELP)
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
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no build output, only a summary line (build.log keeps all of it)")


_REBUILD_HELP = ("the locked environment, to rebuild wheels that exist nowhere from its installed files "
                 "(default: the lock's own environment when it is on this machine, else chosen as capture does)")
_SKIP_LOCAL_HELP = "leave out editable installs and packages installed from a local directory or file"


def _bundle(sub: Subparsers) -> None:
    p = sub.add_parser("bundle", help="collect every wheel of a lock for offline replay")
    p.add_argument("lock", nargs="?", default=None, help=_LOCK_HELP)
    p.add_argument("-o", "--output", required=True, metavar="DIR")
    p.add_argument("--wheelhouse", metavar="SRC", help="copy from this directory instead of an index")
    p.add_argument("--index-url", metavar="URL", help="download missing wheels from this index (default: pip's and uv's configured indexes)")
    p.add_argument("--find-links", metavar="DIR", help="take the wheels from this directory, no index")
    p.add_argument("--python", help=_REBUILD_HELP)
    p.add_argument("--skip-local", action="store_true", help=_SKIP_LOCAL_HELP)
    p.add_argument("--allow-http", action="store_true", help="accept plain http:// package URLs and indexes")
    p.set_defaults(handler="bundle")


def _pack(sub: Subparsers) -> None:
    p = sub.add_parser("pack", help="one self-contained artifact: lock, wheels, .debs, base image, "
                                    "checksums and a README; restores with no network")
    p.add_argument("lock", nargs="?", default=None, help=_LOCK_HELP)
    p.add_argument("-o", "--output", required=True, metavar="DIR|FILE.tar",
                   help="a new or empty directory, or a .tar file to create")
    p.add_argument("--wheelhouse", action="append", metavar="DIR",
                   help="look for wheels here first (repeatable); then pip's and uv's find-links, "
                        "pip's and uv's caches, the indexes")
    p.add_argument("--python", help=_REBUILD_HELP)
    p.add_argument("--base", metavar="REF", help="pack this base image instead of the lock's own")
    p.add_argument("--engine", help="docker (default), podman, or an API URL")
    p.add_argument("--no-image", action="store_true", help="leave the base image out (no engine needed)")
    p.add_argument("--no-oci", action="store_true", help="no OCI archive beside the docker-archive")
    p.add_argument("--no-download", action="store_true", help="never ask an index for a missing wheel")
    p.add_argument("--index-url", metavar="URL", help="index for missing wheels (default: pip's and uv's configured indexes)")
    p.add_argument("--allow-http", action="store_true", help="accept plain http:// package URLs and indexes")
    p.add_argument("--skip-local", action="store_true", help=_SKIP_LOCAL_HELP)
    p.add_argument("--compile-cache", metavar="FILE",
                   help="carry this compile cache (envlock.save_compile_cache, run --save-compile-cache); "
                        "`envlock run PACK` loads it before the command starts")
    p.set_defaults(handler="pack")


def _cache(sub: Subparsers) -> None:
    p = sub.add_parser("cache", help="list or prune what restore keeps in envlock's cache",
                       description="Restore keeps unpacked packs, build contexts (an offline one holds "
                                   "every wheel), wheels of envlock itself and uv binaries in "
                                   "~/.cache/envlock/restore; each is made again when it is needed.")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    ls = actions.add_parser("list", help="every entry with its size and when a restore last used it")
    ls.add_argument("--json", action="store_true", help="print the entries as JSON")
    prune = actions.add_parser("prune", help="remove every entry, or those unused for --older-than "
                                             "(refused while a restore runs)")
    prune.add_argument("--older-than", metavar="AGE", type=_age,
                       help="only entries no restore used for AGE: 30d, 12h, 45m (a bare number is days)")
    prune.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    p.set_defaults(handler="cache")


def _age(text: str) -> float:
    """``30d``, ``12h``, ``45m`` or a number of days, in seconds."""
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "d")
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not an age such as 30d, 12h or 45m")
    return value * units[unit]


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
                                      "(pylock.toml, requirements, CycloneDX, in-toto, cluster jobs, "
                                      "conda explicit, conda-lock, pixi)")
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
    g.add_argument("--md5", action="store_true",
                   help="conda-explicit: url#md5 lines, for conda before sha256 ones")
    g = p.add_argument_group("images and jobs (intoto, apptainer, k8s, slurm)")
    g.add_argument("--image", metavar="REF@sha256:...",
                   help="the image by digest (default: the lock's own image, when it has a digest)")
    g.add_argument("--command", help="what the job runs, e.g. 'python train.py --epochs 3'")
    g.add_argument("--gpus", type=int, help="GPUs to request (default: as many as the lock recorded)")
    g.add_argument("--venv", metavar="PATH",
                   help="slurm: run in this restored venv (on a filesystem every node mounts) "
                        "instead of an image, after an `envlock verify --fleet` preflight")
    g.add_argument("--nodes", type=int, metavar="N", help="slurm --venv: nodes to run on (default 1)")
    g.add_argument("--workspace-claim", metavar="PVC",
                   help="k8s: mount this PersistentVolumeClaim at /workspace (default: emptyDir)")
    p.set_defaults(handler="export")


# -- record, replay (on this host; in the lock's image: run --record / --replay) ----------------


def _record(sub: Subparsers) -> None:
    p = sub.add_parser("record", help="run a command here and record what it produced and read",
                       description="envlock record REC [options] -- CMD ...: CMD runs on this host "
                                   "with ENVLOCK_RECORD set; envlock.record() calls, outputs and "
                                   "inputs go into the sealed record REC")
    p.add_argument("rec", metavar="REC", help="the record to write")
    _host_record_options(p, "record")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="[options] -- CMD ...")
    p.set_defaults(handler="record")


def _replay(sub: Subparsers) -> None:
    p = sub.add_parser("replay", help="re-run a recorded command here and compare with its record",
                       description="exit 0: reproduced; 1: a step, metric, output or input differs "
                                   "(the first is named, with the process differences beside it); "
                                   "2: the record is invalid or tampered")
    p.add_argument("rec", metavar="REC", help="the record of the original run")
    _host_record_options(p, "replay")
    # REMAINDER is required to argparse, which would name CMD among the missing arguments of a
    # bare `envlock replay`: the command is optional (the recorded one is the default).
    p.add_argument("cmd", nargs=argparse.REMAINDER,
                   help="[options] [-- CMD ...] (default: the recorded command)").required = False
    p.set_defaults(handler="replay")


def _host_record_options(p: argparse.ArgumentParser, kind: str) -> None:
    p.add_argument("--workspace", metavar="DIR", help="where --output and --input paths are "
                   "relative to, and CMD runs (default: current directory)")
    if kind == "record":
        p.add_argument("--lock", help="the lock the run belongs to (default: env.lock here or in the "
                                      "nearest parent directory, if any)")
        _record_options(p)
        _compile_cache_options(p, save=True)
    else:
        p.add_argument("--against", metavar="REC2", help="compare REC2 with REC instead of re-running")
        p.add_argument("--json", action="store_true", help="print the comparison as JSON")
        _report_option(p)
        _trace_option(p)
        _tolerance_options(p)
        _compile_cache_options(p, save=False)


def host_options_parser(kind: str, *, command: bool = False) -> argparse.ArgumentParser:
    """``record``'s or ``replay``'s options for what REMAINDER left unparsed (before ``--``, or
    before the command: ``command``)."""
    parser = Parser(prog=f"envlock {kind}", add_help=False)
    _host_record_options(parser, kind)
    if command:
        parser.add_argument("cmd", nargs=argparse.REMAINDER)
    return parser


def command_after_options(args: argparse.Namespace, rest: list[str],
                          options: Callable[[bool], argparse.ArgumentParser]) -> list[str]:
    """The command in what argparse's REMAINDER left (``rest``); the options before it are
    parsed into ``args`` by ``options(command)``, the command's own option parser.

    REMAINDER takes everything after a command's positionals and drops a ``--`` that comes
    first. After ``--`` everything is the command's; without ``--``, leading options are
    envlock's and the command starts at the first other word (``options(True)`` adds ``cmd``
    as REMAINDER to collect it).
    """
    if "--" not in rest:
        if not rest or not rest[0].startswith("-"):
            return rest
        options(True).parse_args(rest, namespace=args)
        return list(args.cmd or [])
    cut = rest.index("--")
    if cut:
        options(False).parse_args(rest[:cut], namespace=args)
    return rest[cut + 1:]


# Each subcommand's name and the function that adds its parser, in the order help lists them.
_COMMANDS: dict[str, Callable[[Subparsers], None]] = {
    "capture": _capture, "verify": _verify, "diff": _diff, "show": _show, "fmt": _fmt,
    "schema": _schema, "restore": _restore, "run": _run, "bundle": _bundle, "pack": _pack,
    "cache": _cache, "canary": _canary, "export": _export, "record": _record, "replay": _replay,
}
