"""The replay record: what a run produced and read, sealed like a lock.

A record sits beside the lock it was made under (``envlock run env.lock --record run.record``)
and holds, in TOML:

* ``[record]``: the command, the program its first word ran (on the host), its exit code, where
  it ran, the lock's file name and fingerprint, and the seal (``integrity``: sha256 of the
  canonical JSON of everything else, as a lock's);
* ``[restore]``: the restore options ``run --record`` was given, which ``run --replay`` reuses;
* ``[context]``: the facts of the recording process that can change numbers (CPU capability,
  GPU model, thread counts, world size, determinism flags, BLAS, numerics variables), flat
  ``table.field`` keys read from the process's own capture, so that a replay that diverges can
  say which of them differ;
* ``[[steps]]``: one row per ``envlock.record(step, ...)`` call, in call order, metrics at full
  precision (a float is written with ``repr``, which ``tomllib`` reads back to the same bits;
  a tensor or array as the sha256 of its bytes with its dtype, shape and mean);
* ``[[outputs]]``: the sha256 of each declared output after the run;
* ``[[inputs]]``: what the run read: declared data paths (sha256) and Hugging Face cache
  revisions;
* ``[code]``: the code the command ran: the workspace's git commit and the digest of its
  changes when the command started, and the sha256 of each workspace file the process had
  loaded (the script, the project's modules), so that an edited script is named;
* ``[reads]``: what the run's processes were seen reading (``probe.trace``): each file by
  its sha256, each ordinary variable by its scrubbed value, the child programs not traced;
* ``[[ranks]]``: each other rank of a multi-process run, as the keys of its context that differ
  from rank 0's (``[context]``), so that a cause on one rank only is named with its rank.

The models are strict and frozen like the lock's; a record is read by one function (``load``),
which checks the seal. A field added later is optional and left out when empty, so a record
written before it keeps its seal and reads as it did.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
)

from envlock import _files
from envlock.errors import EnvlockError, LockInvalid, LockTampered, UsageError
from envlock.lock import canonical_json, check_clean, parse_toml, schema_reader
from envlock.probe.rules import METRIC_NAME
from envlock.text.terminal import safe

RECORD_SCHEMA_VERSION = 1
# A record of a long run (a million steps of a few metrics) stays well under this.
MAX_RECORD_BYTES = 256 * 1024 * 1024

Name = Annotated[str, StringConstraints(pattern=f"^{METRIC_NAME.pattern}$")]
_PRINTABLE = r"^[^\x00-\x08\x0b-\x1f\x7f]*$"
Text = Annotated[str, StringConstraints(max_length=4096, pattern=_PRINTABLE)]
# One word of the recorded command: as long as the kernel lets one argument of a command be
# (MAX_ARG_STRLEN, 128 KiB), so that no command that can start is refused for its length; and
# clean by the lock's rule (no URL credentials, no token-shaped word), which ``recorded_command``
# makes it: a record from elsewhere that carries a credential is refused as a lock would be.
MAX_WORD_CHARS = 128 * 1024
Word = Annotated[str, StringConstraints(max_length=MAX_WORD_CHARS, pattern=_PRINTABLE),
                 AfterValidator(check_clean)]
Hex64 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Commit = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}$")]
Scalar = bool | int | float | Text


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class TensorDigest(_Model):
    """A tensor or array metric: its exact bytes hashed, with what a tolerance can compare."""

    sha256: Hex64
    dtype: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.]{1,64}$")]
    shape: list[Annotated[int, Field(ge=0)]]
    mean: float | None = None


Metric = bool | int | float | TensorDigest


class Step(_Model):
    """One ``envlock.record(step, ...)`` call: the rows a replay compares, in call order."""

    step: Annotated[int, Field(ge=0)]
    metrics: dict[Name, Metric] = Field(default_factory=dict)


class Output(_Model):
    """A declared output after the run, by digest: a replay that writes other bytes diverged
    even when every metric agrees."""

    path: Text
    sha256: Hex64 | None = None  # None: the run did not produce it
    size: Annotated[int, Field(ge=0)] | None = None


class Input(_Model):
    """What the run read (a data path's digest, a Hugging Face revision), so that a divergence
    caused by other data is named as such rather than blamed on the environment."""

    kind: Literal["path", "hf"]
    name: Text
    sha256: Hex64 | None = None           # path: the file's, or the directory's digest
    files: Annotated[int, Field(ge=0)] | None = None
    size: Annotated[int, Field(ge=0)] | None = None
    revision: Commit | None = None       # hf: the commit the ref points at in the cache
    files_sha256: Hex64 | None = None    # hf: digest of the snapshot's (path, blob) pairs


# A key of ``[context]``: ``table.field`` (``packages.<name>``, ``env.<VARIABLE>``); the context is
# made of keys that match, so no odd variable name can stop a record from being written. ``+``
# is a soname's (``native.unowned.libstdc++.so.6``, ``libfoo+cu121.so``): printable, never a
# separator of keys, and quoted in TOML like the dot every soname has.
CONTEXT_KEY = re.compile(r"[A-Za-z0-9_.:/+-]{1,200}")
ContextKey = Annotated[str, StringConstraints(pattern=f"^{CONTEXT_KEY.pattern}$")]


class Code(_Model):
    """The code the command ran. ``commit``, ``dirty``, ``untracked`` and ``tree_sha256`` (the
    lock's ``[git].diff_sha256`` rule: the diff against HEAD and the names of untracked files)
    describe the workspace when the command started, with the record, the lock and the declared
    outputs left out (a replay finds them written by the original) and bytecode caches too;
    absent outside a git repository. ``files``: the sha256 of each file, relative to the
    workspace, that the process had loaded from it (or from the git repository holding it:
    ``../train.py``) by its first ``envlock.record`` call;
    ``files_left_out``: how many more there were (over the bound, unreadable), and present
    whenever the files were looked at (a process that never called ``envlock.record`` was not
    looked into)."""

    commit: Commit | None = None
    dirty: bool | None = None
    untracked: Annotated[int, Field(ge=0)] | None = None
    tree_sha256: Hex64 | None = None
    files: dict[Text, Hex64] | None = None
    files_left_out: Annotated[int, Field(ge=0)] | None = None

    @property
    def files_known(self) -> bool:
        return self.files_left_out is not None


class FileRead(_Model):
    """A file the run read, by content. Over ``reads.MAX_HASHED`` bytes only its first and last
    MiB are hashed (``sample_sha256``, never ``sha256``: a sample is not the file's digest);
    neither when it was gone by the time the run ended (``missing``)."""

    sha256: Hex64 | None = None
    sample_sha256: Hex64 | None = None
    size: Annotated[int, Field(ge=0)] | None = None
    missing: bool | None = None


class Reads(_Model):
    """``[reads]``: what the run's processes were seen reading (``probe.trace``), less what
    another table already compares (the files of a distribution its RECORD lists, the lock's
    variables) and what is no input (the run's own files, the standard library, bytecode
    caches, /proc, /sys, /dev, envlock's own files). ``files``: by path, relative to the
    workspace inside it, ``~/...`` under HOME, else absolute; ``variables``: each ordinary
    variable read, with its value as the lock would scrub it (a secret's as ``sha256:<16 hex>``
    of its value); ``unset``: variables looked up and not set; ``untraced``: the programs of
    child processes that are not Python (not traced); ``processes``: how many were traced;
    ``late``: how many of them were traced only from their first ``envlock.record`` call (no
    start-up hook: what they read before is not here); ``unhashed``: files a container's run
    read outside its workspace and its environment, which only the container holds (not
    compared); ``left_out``: paths the record cannot hold. ``distributions``: the names
    (``packages.<name>``) of the distributions the run read a file of (a module, a data file,
    its ``.pth``, a program of it a process started), which a replay keeps apart from those it never read (no cause); absent where
    that is not known (a record written before it, a container's run, a trace started late),
    where every ``packages.<name>`` difference is a possible cause."""

    files: dict[Text, FileRead] = Field(default_factory=dict)
    variables: dict[Text, Text] = Field(default_factory=dict)
    unset: list[Text] | None = None
    untraced: list[Text] | None = None
    processes: Annotated[int, Field(ge=0)] = 0
    late: Annotated[int, Field(ge=1)] | None = None
    unhashed: Annotated[int, Field(ge=1)] | None = None
    left_out: Annotated[int, Field(ge=0)] | None = None
    distributions: Annotated[list[Text], Field(min_length=1)] | None = None


class RankContext(_Model):
    """One rank other than 0: the keys of its context whose values differ from rank 0's (its
    ``process.rank`` always does), and rank 0's keys it lacks."""

    rank: Annotated[int, Field(ge=1)]
    context: dict[ContextKey, Scalar] = Field(default_factory=dict)
    absent: list[ContextKey] | None = None


# The signals that stop envlock as Ctrl-C does (``envlock._signals.STOPS``), by name.
StopSignal = Literal["SIGINT", "SIGTERM", "SIGHUP"]


class Meta(_Model):
    """``[record]``: the command and how it ended, the lock it ran under, and the seal."""

    schema_version: int = RECORD_SCHEMA_VERSION
    tool_version: Text
    created_at: datetime
    where: Literal["container", "host"]
    command: list[Word]
    # The absolute path the command's first word ran (a bare name as found on PATH, symlinks
    # kept: a venv's bin/python is that venv). Host records only: in an image it is the image's.
    program: Text | None = None
    exit_code: int
    # Added later (None when absent): the signal that stopped envlock while the command ran
    # (a scheduler's SIGTERM, Ctrl-C); the record then holds what was recorded until then.
    interrupted: StopSignal | None = None
    lock: Text | None = None
    lock_fingerprint: Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")] | None = None
    # A run of a pack (``run PACK --record``): the pack, relative to the record as ``lock`` is,
    # and its id (``packdir.Pack.id``); ``lock`` is then absent: the pack's lock is unpacked in
    # envlock's cache, which is no place for a record to name.
    pack: Text | None = None
    pack_id: Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")] | None = None
    integrity: Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")] | None = None


# The options of ``run`` that choose the image a record's command ran in, by their ``dest``.
RestoreOption = Literal["base", "allow_unpinned_base", "skip_local", "wheelhouse", "index_url",
                        "allow_http", "venv", "python", "engine", "name"]


class RestoreOptions(_Model):
    """The restore options ``run --record`` was given (those not given are absent), reused by
    ``run --replay`` unless given again. ``wheelhouse`` is relative to the record's directory,
    as ``lock`` is. An option whose value the lock's scrubbing rules would change (a credential
    in an index URL) is not kept: it is named in ``withheld``, and a replay must be given it."""

    base: Text | None = None
    allow_unpinned_base: bool | None = None
    skip_local: bool | None = None
    wheelhouse: Text | None = None
    index_url: Text | None = None
    allow_http: bool | None = None
    venv: Text | None = None
    python: Text | None = None
    engine: Text | None = None
    name: Text | None = None
    withheld: list[RestoreOption] | None = None


class Record(_Model):
    """The whole record file; frozen, so what was read is what is compared."""

    record: Meta
    restore: RestoreOptions | None = None
    context: dict[ContextKey, Scalar] = Field(default_factory=dict)
    steps: list[Step] = Field(default_factory=list)
    outputs: list[Output] = Field(default_factory=list)
    inputs: list[Input] = Field(default_factory=list)
    # Added later: None when absent, so that a record written before them keeps its seal.
    code: Code | None = None
    ranks: list[RankContext] | None = None
    reads: Reads | None = None

    def save(self, path: str | os.PathLike[str]) -> None:
        save(self, path)


def _integrity_of(rec: Record) -> str:
    form = rec.model_dump(mode="json", exclude_none=True)
    form["record"].pop("integrity", None)
    return "sha256:" + hashlib.sha256(canonical_json(form)).hexdigest()


def seal(rec: Record) -> Record:
    """``rec`` with its integrity set, so an edit made after recording is found on reading."""
    meta = rec.record.model_copy(update={"integrity": _integrity_of(rec)})
    return rec.model_copy(update={"record": meta})


def dumps(rec: Record) -> str:
    """The record's TOML text, written with the lock's writer so both files read alike."""
    from envlock.lock import toml_array_of_tables as array_of_tables
    from envlock.lock import toml_table as table

    form = rec.model_dump(mode="python", exclude_none=True)
    out = ["# envlock replay record: what a run produced and read. Written by envlock; "
           "`envlock run LOCK --replay` re-runs and compares.\n"]
    table(out, "record", form["record"], header=True)
    if form.get("restore"):
        table(out, "restore", form["restore"], "the restore options of `run --record`, reused by "
              "`run --replay` unless given", header=True)
    if form.get("context"):
        table(out, "context", form["context"], "facts of the recording process that can "
              "change numbers", header=True)
    if form.get("code"):
        table(out, "code", form["code"], "the code the command ran: the workspace's git state "
              "when it started, and the sha256 of each workspace file the process loaded", header=True)
    if form.get("reads"):
        table(out, "reads", form["reads"], "what the run's processes were seen reading (files, "
              "variables), less what other tables compare", header=True)
    for name in ("steps", "outputs", "inputs", "ranks"):
        if form.get(name):
            array_of_tables(out, name, form[name])
    return "".join(out)


def save(rec: Record, path: str | os.PathLike[str]) -> None:
    """Seal and write with the lock's atomic write (an unpredictable temp file beside it,
    fsync, a rename; a link's target is updated, an existing file keeps its mode)."""
    from envlock.lock import atomic_write

    text = dumps(seal(rec))
    check_target(path)
    try:
        atomic_write(Path(path), text)
    except OSError as exc:
        raise EnvlockError(f"cannot write {os.fspath(path)}: {exc.strerror or exc}") from None


def check_target(path: str | os.PathLike[str]) -> None:
    """Refuse a record path that cannot be written, or whose file must not be replaced.

    Called before the recorded command runs (and again by ``save``): a missing directory or a
    typo that names the training script must be exit 2 at once, not after a training run. An
    existing file is replaced only when it is a record or empty: one wrong word in
    ``envlock record train.py -- ...`` must not cost a researcher their script.
    """
    from envlock.lock import file_head, write_target

    p = Path(path)
    if p.is_dir():
        raise UsageError(f"the record {p} is a directory; give a file name such as {p / 'run.record'}")
    target = write_target(p)  # a dangling link is refused: envlock never creates a link's target
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"cannot write the record {p}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write the record {p}: directory {parent} is not writable")
    if target.exists() and target.stat().st_size and b"[record]" not in file_head(target):
        raise UsageError(f"refusing to overwrite {p}: it is not a replay record",
                         hint="remove it or give another file name")


_WORD: TypeAdapter[str] = TypeAdapter(Word)
_TEXT: TypeAdapter[str] = TypeAdapter(Text)
# What the models' refusals mean, said for a person (pydantic's wording quotes the pattern).
_WHY = {"string_too_long": "is longer than a record keeps ({max_length} characters)",
        "string_pattern_mismatch": "holds a control character",
        "string_unicode": "holds bytes that are not UTF-8 text"}


def unrecordable(value: str) -> str:
    """What ``[context]`` keeps of a text the record's model refuses (a control character, as
    in a library path with a newline; more than a record's 4096 characters, as a long
    ``LD_LIBRARY_PATH`` or many copies of a library): a mark with the sha256 of the value.

    Marked rather than left out, because the record is what a run leaves (refusing the value
    used to lose the whole record after the run, as ``make._code`` already avoided for file
    names), and a key that is absent reads as a fact the process did not have (a rank's
    ``absent`` keys, a family one record predates). The mark is the same for the same value
    and differs for another, so a replay that ran with another path is still named as a
    difference, while the record holds only printable text of bounded length."""
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    return f"<not recordable: {len(value)} characters, sha256 {digest}>"


def holds(text: str) -> bool:
    """Whether a record's text field can hold ``text`` (printable, at most 4096 characters)."""
    try:
        _TEXT.validate_python(text)
    except ValidationError:
        return False
    return True


def _check(adapter: TypeAdapter[str], value: str, what: str) -> None:
    try:
        adapter.validate_python(value)
    except ValidationError as exc:
        err = exc.errors()[0]
        why = _WHY.get(err["type"], err["msg"]).format(**err.get("ctx", {}))
        shown = safe(value[:60]) + ("..." if len(value) > 60 else "")
        raise UsageError(f"{what} ({shown}) cannot be recorded: it {why}") from None


def recorded_command(command: Sequence[str]) -> list[str]:
    """The command as a record holds it; UsageError (exit 2) when the record cannot hold it.

    A command line can carry a credential (``--token hf_...``, ``https://user:pw@host/...``)
    and a record is meant to be shared, so every word is scrubbed as the lock scrubs a note:
    the probe's ``scrub_string``, with the values of this process's secret variables. The
    commands call this before the command runs, so that a word the record refuses stops them
    before a training run, not after it; the record is made with it too.
    """
    from envlock.probe.scrub import scrub_string, secret_values

    secrets = secret_values()
    words = [scrub_string(word, secrets) for word in command]
    for i, word in enumerate(words, 1):
        _check(_WORD, word, f"word {i} of the command")
    return words


def check_declared(outputs: Sequence[str], inputs: Sequence[str]) -> None:
    """Refuse, before the command runs, an ``--output`` or ``--input`` the record cannot hold."""
    for path in outputs:
        _check(_TEXT, path, "--output")
    for spec in inputs:
        _check(_TEXT, spec, "--input")


def command_to_replay(rec: Record, name: str) -> list[str]:
    """The recorded command, to run again: refused when recording removed a credential from it
    (it would run with ``<redacted>`` in its place)."""
    from envlock.probe.rules import REDACTED

    if any(REDACTED in word for word in rec.record.command):
        raise UsageError(f"the command of {name} had a credential removed when it was recorded, "
                         "so it cannot run as recorded",
                         hint="give the command to run after -- (with the credential)")
    return list(rec.record.command)


# Schema version -> the model a record of that version is validated with. Only schema 1 exists;
# a later schema keeps an entry for each older one (a model of its tables whose reader returns
# today's ``Record``), so every record an older envlock wrote still replays.
READERS: dict[int, type[Record]] = {RECORD_SCHEMA_VERSION: Record}


def loads(text: str, name: str = "record") -> Record:
    """A record from its TOML text: its schema's model, then the seal (``name`` is what errors
    call it). The one reader, so a record from elsewhere is checked as strictly as a lock."""
    data = parse_toml(text, name)
    meta = data.get("record")
    # The version first: a record of a newer envlock has fields this one does not know, and
    # "upgrade envlock" is the answer, not an unknown key.
    model = schema_reader(READERS, meta.get("schema_version") if isinstance(meta, dict) else None,
                          name, what="record")
    try:
        rec = model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise LockInvalid(f"{name} is not a replay record: {where}: {err['msg']}") from None
    if rec.record.integrity is None:
        raise LockTampered(f"{name} is not sealed (no integrity)")
    if rec.record.integrity != _integrity_of(rec):
        raise LockTampered(f"{name} was edited after it was recorded: its integrity does not match "
                           "its content")
    return rec


def load(path: str | os.PathLike[str]) -> Record:
    """Read a record file whole through the capped reader a lock uses (a FIFO, ``/dev/zero`` or
    a huge file is refused, not hung on), then ``loads``."""
    text = _files.read_text(path, limit=MAX_RECORD_BYTES, what="a replay record", error=LockInvalid,
                            missing_hint=f"make one with `envlock run env.lock --record {os.fspath(path)} -- CMD`")
    return loads(text, os.fspath(path))


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b  # 1 and True are different facts


def rank_entry(rank: int, context: Mapping[str, Any], rank0: Mapping[str, Any]) -> RankContext:
    """Rank ``rank``'s context as a record keeps it: what differs from rank 0's."""
    differs = {k: v for k, v in context.items() if k not in rank0 or not _same(rank0[k], v)}
    absent = sorted(k for k in rank0 if k not in context)
    return RankContext(rank=rank, context=differs, absent=absent or None)


def rank_contexts(rec: Record) -> dict[int, dict[str, Any]]:
    """Every rank's context that the record kept, whole: rank 0's ``[context]``, and each
    other rank's rebuilt from it and its differences."""
    out: dict[int, dict[str, Any]] = {0: dict(rec.context)}
    for entry in rec.ranks or ():
        gone = set(entry.absent or ())
        ctx = {k: v for k, v in rec.context.items() if k not in gone}
        ctx.update(entry.context)
        out[entry.rank] = ctx
    return out


def scalar_ok(value: Any) -> bool:
    """Whether a context value can be stored (the model's Scalar)."""
    return isinstance(value, (bool, int, float, str))
