"""What ``run --record/--replay``, ``record`` and ``replay`` share: the journal the command
writes through ``ENVLOCK_RECORD``, and turning it into a record or a verdict afterwards."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from envlock._textsafe import plural
from envlock.commands._output import err, out
from envlock.errors import EXIT_DRIFT, EXIT_OK, UsageError

JOURNAL = "journal.jsonl"


@dataclass(frozen=True)
class Plan:
    """What a recorded or replayed run declares: outputs, inputs, and the original record."""

    record_path: str | None
    original: Any  # envlock._record.Record | None
    outputs: list[str]
    inputs: list[str]


def plan(args: argparse.Namespace, *, replay_path: str | None, base: Path) -> Plan:
    """Read the options (and the original record, for a replay) before anything runs, so a
    bad record or ``--input``, or a data path that is not there, is exit 2 at once rather than
    after a training run. (In a replay a missing input is drift, found when it ends.)"""
    from envlock._record import load
    from envlock._replay import check_specs

    if getattr(args, "rtol", 0.0) < 0 or getattr(args, "atol", 0.0) < 0:
        raise UsageError("--rtol and --atol must be >= 0")
    original = load(replay_path) if replay_path else None
    outputs = list(args.output or ([o.path for o in original.outputs] if original else []))
    inputs = list(args.input or ([i.name for i in original.inputs] if original else []))
    check_specs(inputs)
    if original is None:
        from envlock.probe.inputs import HF_PREFIX

        absent = [s for s in inputs if not s.startswith(HF_PREFIX) and not (base / s).exists()]
        if absent:
            raise UsageError(f"--input {absent[0]}: no such file or directory in {base}")
    target = replay_path or getattr(args, "record", None) or getattr(args, "rec", None)
    return Plan(target, original, outputs, inputs)


@contextmanager
def journal_dir() -> Iterator[Path]:
    """A private directory for the journal, removed afterwards (mounted into a container)."""
    path = Path(tempfile.mkdtemp(prefix="envlock-record-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def finish(p: Plan, journal: Path, *, command: Sequence[str], exit_code: int,
           where: Literal["container", "host"],
           base: Path, lock: Any, lock_path: str | None, tolerance: tuple[float, float],
           as_json: bool = False) -> int:
    """Write the record (a recording run: the command's exit code) or compare with the
    original (a replay: 0 reproduced, 1 diverged)."""
    from envlock._replay import make_record, read_inputs
    from envlock._replay_report import replay_text

    if p.original is None:
        assert p.record_path is not None
        name = (os.path.relpath(os.path.abspath(lock_path), os.path.dirname(os.path.abspath(p.record_path)))
                if lock_path else None)
        rec = make_record(journal, command=command, exit_code=exit_code, where=where, base=base,
                          outputs=p.outputs, inputs=p.inputs, lock=lock, lock_name=name)
        rec.save(p.record_path)
        err(f"envlock: recorded {plural(len(rec.steps), 'step')}, {plural(len(rec.outputs), 'output')} and "
            f"{plural(len(rec.inputs), 'input')} in {p.record_path}\n")
        return exit_code
    from envlock._recordcmp import Tolerance, compare_records

    replay = make_record(journal, command=command, exit_code=exit_code, where=where, base=base,
                         outputs=p.outputs, inputs=(), lock=lock)
    cmp = compare_records(p.original, replay, Tolerance(*tolerance), read_inputs(p.inputs, base))
    if as_json:
        out(json.dumps(cmp.to_dict(), indent=2) + "\n")
    else:
        out(replay_text(cmp, str(p.record_path or "the record")))
    return EXIT_OK if cmp.same else EXIT_DRIFT
