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
  revisions.

The models are strict and frozen like the lock's; a record is read by one function (``load``),
which checks the seal. A field added later is optional and left out when empty, so a record
written before it keeps its seal and reads as it did.
"""

from __future__ import annotations

import hashlib
import os
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from envlock.errors import LockInvalid, LockTampered
from envlock.lock._seal import canonical_json
from envlock.lock._text import parse_toml

RECORD_SCHEMA_VERSION = 1
# A record of a long run (a million steps of a few metrics) stays well under this.
MAX_RECORD_BYTES = 256 * 1024 * 1024

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_./-]{0,127}$")]
Text = Annotated[str, StringConstraints(max_length=4096, pattern=r"^[^\x00-\x08\x0b-\x1f\x7f]*$")]
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
    step: Annotated[int, Field(ge=0)]
    metrics: dict[Name, Metric] = Field(default_factory=dict)


class Output(_Model):
    path: Text
    sha256: Hex64 | None = None  # None: the run did not produce it
    size: Annotated[int, Field(ge=0)] | None = None


class Input(_Model):
    kind: Literal["path", "hf"]
    name: Text
    sha256: Hex64 | None = None           # path: the file's, or the directory's digest
    files: Annotated[int, Field(ge=0)] | None = None
    size: Annotated[int, Field(ge=0)] | None = None
    revision: Commit | None = None       # hf: the commit the ref points at in the cache
    files_sha256: Hex64 | None = None    # hf: digest of the snapshot's (path, blob) pairs


class Meta(_Model):
    schema_version: int = RECORD_SCHEMA_VERSION
    tool_version: Text
    created_at: datetime
    where: Literal["container", "host"]
    command: list[Text]
    # The absolute path the command's first word ran (a bare name as found on PATH, symlinks
    # kept: a venv's bin/python is that venv). Host records only: in an image it is the image's.
    program: Text | None = None
    exit_code: int
    lock: Text | None = None
    lock_fingerprint: Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")] | None = None
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
    record: Meta
    restore: RestoreOptions | None = None
    context: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:/-]{1,200}$")], Scalar] = Field(
        default_factory=dict)
    steps: list[Step] = Field(default_factory=list)
    outputs: list[Output] = Field(default_factory=list)
    inputs: list[Input] = Field(default_factory=list)

    def save(self, path: str | os.PathLike[str]) -> None:
        save(self, path)


def _integrity_of(rec: Record) -> str:
    form = rec.model_dump(mode="json", exclude_none=True)
    form["record"].pop("integrity", None)
    return "sha256:" + hashlib.sha256(canonical_json(form)).hexdigest()


def seal(rec: Record) -> Record:
    meta = rec.record.model_copy(update={"integrity": _integrity_of(rec)})
    return rec.model_copy(update={"record": meta})


def dumps(rec: Record) -> str:
    from envlock.lock._toml import array_of_tables, table

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
    for name in ("steps", "outputs", "inputs"):
        if form.get(name):
            array_of_tables(out, name, form[name])
    return "".join(out)


def save(rec: Record, path: str | os.PathLike[str]) -> None:
    """Seal and write atomically (a temp file beside it, then a rename)."""
    text = dumps(seal(rec))
    target = os.fspath(path)
    tmp = f"{target}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, target)


def loads(text: str, name: str = "record") -> Record:
    data = parse_toml(text, name)
    try:
        rec = Record.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise LockInvalid(f"{name} is not a replay record: {where}: {err['msg']}") from None
    if rec.record.schema_version > RECORD_SCHEMA_VERSION:
        raise LockInvalid(f"{name} is a record of a newer envlock (schema {rec.record.schema_version})",
                          hint="upgrade envlock")
    if rec.record.integrity is None:
        raise LockTampered(f"{name} is not sealed (no integrity)")
    if rec.record.integrity != _integrity_of(rec):
        raise LockTampered(f"{name} was edited after it was recorded: its integrity does not match "
                           "its content")
    return rec


def load(path: str | os.PathLike[str]) -> Record:
    p = os.fspath(path)
    try:
        with open(p, "rb") as fh:
            raw = fh.read(MAX_RECORD_BYTES + 1)
    except FileNotFoundError:
        raise LockInvalid(f"{p} not found", hint="make one with `envlock run env.lock --record "
                          f"{p} -- CMD`") from None
    except IsADirectoryError:
        raise LockInvalid(f"{p} is a directory, not a replay record") from None
    except OSError as exc:
        raise LockInvalid(f"{p} cannot be read: {exc.strerror}") from None
    if len(raw) > MAX_RECORD_BYTES:
        raise LockInvalid(f"{p} is larger than {MAX_RECORD_BYTES >> 20} MiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LockInvalid(f"{p} is not UTF-8 text (byte {exc.start})") from None
    return loads(text, p)


def scalar_ok(value: Any) -> bool:
    """Whether a context value can be stored (the model's Scalar)."""
    return isinstance(value, (bool, int, float, str))
