"""Making a replay record from what a run left, and reading its inputs again.

The training process writes a journal (``envlock.runtime.recorder``: one JSON line per
``envlock.record`` call, its own capture first); when the command has exited, envlock reads
it, hashes the declared outputs, reads the declared inputs (data paths, Hugging Face cache
revisions: ``envlock.probe.inputs``) and seals all of it as a record (``envlock.replay.record``).
The capture is validated as a lock (``build_lock``, the gate every probed value passes) and
kept only as the few facts that can explain a divergence (``compare.context_of``). Every
other rank of a multi-process run leaves its own capture beside the journal, kept as what
differs from rank 0's; the workspace's git state is read here before the command starts.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from envlock._files import FileDigest, file_digest
from envlock._version import __version__
from envlock.errors import LockInvalid, OtherProgram, UsageError
from envlock.replay.compare import ReplayComparison, context_of, input_drift
from envlock.replay.record import (
    Code,
    Input,
    Meta,
    Output,
    Reads,
    Record,
    RestoreOptions,
    Step,
    StopSignal,
    holds,
    rank_entry,
    recorded_command,
)
from envlock.text.terminal import safe

# A journal line longer than this is not one step's metrics (the capture line of a big
# environment is the longest: a few MiB).
_MAX_LINE = 64 * 1024 * 1024


# More ranks than this on one host is not a training job's; their captures are not read.
MAX_RANKS = 4096


@dataclass(frozen=True)
class Journal:
    """What a run left: rank 0's steps and context, the workspace files it had loaded (None:
    its process recorded no capture), and each other rank's context by rank."""

    steps: list[Step] = field(default_factory=list)
    context: dict[str, Any] = field(default_factory=dict)
    code: dict[str, Any] | None = None
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)


def _journal_lines(path: str | os.PathLike[str]) -> list[bytes] | None:
    try:
        with open(path, "rb") as fh:
            return fh.read().split(b"\n")
    except FileNotFoundError:
        return None


def read_journal(path: str | os.PathLike[str]) -> Journal:
    """What a run left in its journal and, beside it, its other ranks' captures; a missing
    journal is a run that recorded nothing. A torn last line (the process was killed
    mid-write) is left out; any other bad line is refused."""
    lines = _journal_lines(path)
    if lines is None:
        return Journal(ranks=_rank_contexts(path))
    steps: list[Step] = []
    context: dict[str, Any] = {}
    code: dict[str, Any] | None = None
    last = len(lines) - 1
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            row = _row(raw)
            if "capture" in row:
                context = _context(row)
                code = row.get("code") if isinstance(row.get("code"), dict) else None
            else:
                steps.append(Step.model_validate(row))
        except (ValueError, ValidationError) as exc:
            if i >= last - 1 and not raw.endswith(b"}"):
                break  # the torn last line of a killed process
            raise LockInvalid(f"the run's record journal, line {i + 1}: {str(exc).splitlines()[0]}") from None
    return Journal(steps, context, code, _rank_contexts(path))


def _row(raw: bytes) -> dict[str, Any]:
    if len(raw) > _MAX_LINE:
        raise ValueError("line too long")
    row = json.loads(raw)
    if not isinstance(row, dict):
        raise ValueError("not an object")
    return row


def _rank_contexts(path: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """The context of each other rank, from the capture it wrote beside the journal
    (``rank_journal``); a rank killed while it wrote is left out."""
    from envlock.probe.rules import rank_journal

    journal = Path(path)
    out: dict[int, dict[str, Any]] = {}
    prefix = rank_journal(journal.name, 0)[:-1]
    try:
        names = sorted(p.name for p in journal.parent.iterdir() if p.name.startswith(prefix))
    except FileNotFoundError:
        return out
    for name in names[:MAX_RANKS]:
        number = name[len(prefix):]
        if not number.isdigit() or int(number) < 1:
            continue
        raw = (_journal_lines(journal.parent / name) or [b""])[0]
        try:
            row = _row(raw)
        except ValueError:
            if raw.endswith(b"}"):
                raise LockInvalid(f"the run's record journal of rank {number} is not a capture") from None
            continue
        if "capture" not in row:
            raise LockInvalid(f"the run's record journal of rank {number} is not a capture")
        out[int(number)] = _context(row)
    return out


def _context(row: Mapping[str, Any]) -> dict[str, Any]:
    from envlock.lock import canonical_form
    from envlock.probing.capture import build_lock

    lock = build_lock(dict(row["capture"]))
    extra = {k: row[k] for k in ("world_size", "rank") if isinstance(row.get(k), int)}
    return context_of(canonical_form(lock), extra)


def lock_context(lock: Any) -> dict[str, Any]:
    """The same facts from a lock (when the run recorded no step, or to compare with one)."""
    from envlock.lock import canonical_form

    return context_of(canonical_form(lock))


def file_sha256(path: Path) -> FileDigest | None:
    """The declared output's digest and size; None when there is no file there (yet)."""
    try:
        return file_digest(path)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def outputs_of(paths: Sequence[str], base: Path) -> list[Output]:
    """The sha256 of each declared output (``base``-relative as declared); a directory is
    hashed as an input directory is."""
    out = []
    for p in paths:
        full = Path(p) if os.path.isabs(p) else base / p
        if full.is_dir():
            from envlock.probe.inputs import path_digest

            d = path_digest(str(full), cache=False)
            out.append(Output(path=p, sha256=d["sha256"], size=d["size"]))
            continue
        found = file_sha256(full)
        out.append(Output(path=p, sha256=found[0], size=found[1]) if found else Output(path=p))
    return out


def read_inputs(specs: Sequence[str], base: Path, *, cache: bool = True) -> dict[str, Input | str]:
    """Each declared input read now: an ``Input``, or the one-line reason it cannot be read."""
    from envlock.probe.inputs import InputError, describe

    out: dict[str, Input | str] = {}
    for spec in specs:
        try:
            found = describe(spec, str(base), cache=cache)
        except InputError as exc:
            out[spec] = str(exc)
            continue
        out[str(found["name"])] = Input.model_validate(
            {k: v for k, v in found.items() if v is not None})
    return out


def check_specs(specs: Sequence[str]) -> None:
    """Refuse a malformed ``--input`` before anything runs (exit 2)."""
    from envlock.probe.inputs import HF_PREFIX, InputError, parse_hf

    for spec in specs:
        if not spec or "\0" in spec:
            raise UsageError(f"--input {spec!r}: empty or holds a NUL byte")
        if spec.startswith(HF_PREFIX):
            try:
                parse_hf(spec)
            except InputError as exc:
                raise UsageError(f"--input: {exc}") from None


def resolve_program(word: str, cwd: Path) -> str | None:
    """The file a command's first word runs, as the child started in ``cwd`` finds it: a word
    with a slash is a path from ``cwd``, a bare name is looked up on PATH. Absolute, with its
    symlinks kept (a venv's ``bin/python`` links to the base interpreter, but it is the venv
    that runs). None: nothing runs by that name."""
    if os.sep in word:
        found = os.path.join(cwd, word)
        return os.path.normpath(found) if os.path.isfile(found) and os.access(found, os.X_OK) else None
    found_on_path = shutil.which(word)
    return os.path.abspath(found_on_path) if found_on_path else None


def check_program(original: Record, command: Sequence[str], cwd: Path, lock: Any = None,
                  name: str = "REC", restored_from: Callable[[str], str | None] = lambda program: None) -> str | None:
    """Refuse, before anything runs, to replay the recorded command where its first word now
    runs another program than the record's (``python`` found on another PATH: another
    interpreter, another environment). The same word given after ``--`` is the same command;
    another first word (an interpreter's path) is the caller's choice, and a record without
    ``program`` (older, or made in an image) is not checked. ``lock`` (the record's) and ``name``
    (the record's path) are for the hint.

    A program of the same name in a venv restored from the record's lock (``restored_from``
    gives the fingerprint of the lock a program's venv was restored from) is the same
    environment at another path: accepted, and returned, for the caller to say so."""
    recorded = original.record.program
    if recorded is None or not command or command[0] != original.record.command[0]:
        return None
    now = resolve_program(command[0], cwd)
    if now == recorded:
        return None
    fingerprint = original.record.lock_fingerprint
    if now is not None and fingerprint and os.path.basename(now) == os.path.basename(recorded) \
            and restored_from(now) == fingerprint:
        return now
    environment = original.context.get("python.prefix")
    of_lock = lock.python.prefix if lock is not None else None
    ran = f"{recorded} (Python environment {environment})" if environment else recorded
    found = f"runs {now}" if now else "is not found"
    # The environment it ran in is named only where it is (a record replayed on another host, or
    # after a restore from a pack, would be sent to a path that is not there).
    here = next((p for p in (of_lock, environment) if isinstance(p, str) and os.path.isdir(p)), None)
    program = recorded if os.path.exists(recorded) else "DIR/bin/python"
    hint = ("activate the environment it ran in" + (f" ({here})" if here else "")
            + (" or a venv restored from its lock (envlock restore LOCK|PACK --target venv DIR)" if fingerprint else "")
            + f", or give the command to run after --: envlock replay {name} -- {program} ...")
    raise OtherProgram(safe(f"the recorded command's {command[0]!r} {found} here, but the record "
                            f"ran {ran}: nothing was run"), hint=safe(hint))


# Bytecode caches are written by the run itself (a replay finds the original's) and derive from
# sources whose changes the digest already holds.
_BYTECODE = ("**/__pycache__/**", "**/*.pyc")


def workspace_git(base: Path, exclude: Sequence[str | os.PathLike[str]] = ()) -> dict[str, Any] | None:
    """The workspace's git state as a record's ``[code]`` keeps it, read before the command
    starts: the probe's git collector (the lock's ``[git]`` rule), with ``exclude`` (the record,
    the lock, the declared outputs: a replay finds them written by the original) and bytecode
    caches left out. None outside a git repository or when git cannot say."""
    from envlock.probe.collect import DEFAULT_GIT_TIMEOUT
    from envlock.probe.git import GitJob

    timeout = float(os.environ.get("ENVLOCK_GIT_TIMEOUT", DEFAULT_GIT_TIMEOUT))
    paths = [os.path.join(base, p) for p in exclude]
    info, _ = GitJob(str(base), timeout, paths, _BYTECODE).collect()
    if not info:
        return None
    state = {"commit": info.get("commit"), "dirty": info.get("dirty"),
             "untracked": info.get("untracked"), "tree_sha256": info.get("diff_sha256")}
    return {k: v for k, v in state.items() if v is not None}


def _code(git: Mapping[str, Any] | None, files: Mapping[str, Any] | None) -> Code | None:
    """A record's ``[code]``: the workspace's git state and the process's workspace files (a
    path the record cannot hold, a terminal control in a file's name, is counted as left
    out rather than refusing the record after the run)."""
    data: dict[str, Any] = dict(git or {})
    if files is not None:
        found = files.get("files") or {}
        kept = {path: digest for path, digest in found.items() if isinstance(path, str) and holds(path)}
        data["files"] = kept or None
        data["files_left_out"] = files.get("left_out", 0) + len(found) - len(kept)
    return Code.model_validate(data) if data else None


def _not_inputs(base: Path, own: Sequence[str], outputs: Sequence[str], inputs: Sequence[str]) -> list[str]:
    """The absolute paths a trace's reads are no input of the run at (or compared elsewhere):
    ``own`` (the record, the lock), the declared outputs, the declared inputs (a data path; a
    Hugging Face repository's folder in the cache)."""
    from envlock.probe.inputs import HF_PREFIX, InputError, hf_folder, parse_hf

    out = [os.path.abspath(p) for p in own]
    out += [os.path.normpath(os.path.join(base, p)) for p in outputs]
    for spec in inputs:
        if not spec.startswith(HF_PREFIX):
            out.append(os.path.normpath(os.path.join(base, spec)))
            continue
        try:
            kind, repo, _ = parse_hf(spec)
        except InputError:
            continue
        out.append(hf_folder(kind, repo))
    return out


def _reads(journal: str | os.PathLike[str], base: Path, where: str, program: str | None,
           code: Code | None, exclude: Sequence[str], inside: str | None) -> tuple[Reads | None, dict[str, Any]]:
    """The run's ``[reads]`` and the traced process facts, from the trace directory beside the
    journal; (None, {}) when the run was not traced (``--no-trace``). ``inside``: the
    workspace's path in the container the run's processes saw."""
    from envlock.replay.reads import collect, trace_dir

    directory = trace_dir(Path(journal).parent)
    if not directory.is_dir():
        return None, {}
    from envlock.probe.trace import hook_dir

    host = where == "host"
    return collect(directory, base, exclude=exclude, skip=(code.files or {}) if code is not None else (),
                   root_pid=os.getpid() if host else None, program=program if host else None,
                   hook=hook_dir() if host else None, inside=None if host else inside)


def make_record(journal: str | os.PathLike[str], *, command: Sequence[str], exit_code: int,
                where: Literal["container", "host"], base: Path, outputs: Sequence[str] = (), inputs: Sequence[str] = (),
                lock: Any = None, lock_name: str | None = None, pack: tuple[str, str] | None = None,
                program: str | None = None,
                restore: RestoreOptions | None = None, git: Mapping[str, Any] | None = None,
                own: Sequence[str] = (), declared: Sequence[str] = (), inside: str | None = None,
                interrupted: StopSignal | None = None) -> Record:
    """``git``: the workspace's state when the command started (``workspace_git``); ``own``:
    the record's and the lock's paths, and ``declared`` the run's declared inputs (a replay
    reads them again itself), which the trace's reads leave out. ``pack``: the pack the run's
    lock came from, (its path relative to the record, its id)."""
    ran = read_journal(journal)
    context = ran.context
    if not context and lock is not None:
        context = lock_context(lock)
    code = _code(git, ran.code)
    reads, facts = _reads(journal, base, where, program, code,
                          _not_inputs(base, own, outputs, [*inputs, *declared]), inside)
    if facts:
        context = {**context, **{k: v for k, v in facts.items() if k not in context}}
    found = read_inputs(inputs, base)
    missing = [f"{k}: {v}" for k, v in found.items() if isinstance(v, str)]
    if missing:
        raise UsageError("an input of the run cannot be read: " + "; ".join(missing))
    meta = Meta(tool_version=__version__, created_at=datetime.now(timezone.utc).replace(microsecond=0),
                where=where, command=recorded_command(command), program=program, exit_code=exit_code,
                interrupted=interrupted, lock=lock_name, pack=pack[0] if pack else None,
                pack_id=pack[1] if pack else None,
                lock_fingerprint=lock.envlock.fingerprint if lock is not None else None)
    try:
        ranks = [rank_entry(r, ctx, context) for r, ctx in sorted(ran.ranks.items())]
        return Record(record=meta, restore=restore, context=context, steps=ran.steps,
                      outputs=outputs_of(outputs, base),
                      inputs=[v for v in found.values() if isinstance(v, Input)],
                      code=code, ranks=ranks or None, reads=reads)
    except ValidationError as exc:
        raise LockInvalid(f"the run's record cannot be written: {str(exc).splitlines()[0]}") from None


def check_inputs(record: Record, base: Path) -> ReplayComparison:
    """The record's inputs read again now: a changed one is drift."""
    now = read_inputs([i.name for i in record.inputs], base)
    return ReplayComparison(inputs=tuple(input_drift(record.inputs, now)))
