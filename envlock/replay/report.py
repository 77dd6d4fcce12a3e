"""The text of a replay's verdict: the first divergence, the inputs that changed, and beside
them what can explain a divergence (the code the two commands ran, then the differences between
the two processes, named with their ranks where not every rank differs); or, for a command that
failed before it recorded anything, its exit code and the last lines of its stderr."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from envlock.replay.compare import (
    PACKAGES,
    CodeChange,
    ContextChange,
    InputDrift,
    ReadChange,
    ReplayComparison,
)
from envlock.text.terminal import first, plural, safe

# How many names of the packages the run never read the verdict's one line shows.
_UNREAD_SHOWN = 2


def _value(v: Any) -> str:
    return "(none)" if v is None else safe(str(v))


def _where(what: str, where: str) -> str:
    """``step 3, loss``; ``output model.pt``; ``exit code of the command``."""
    if what == "step":
        return safe(where)
    return f"{safe(what)} of {safe(where)}" if what == "exit code" else f"{safe(what)} {safe(where)}"


def _drift(d: InputDrift) -> str:
    """``data content changed: a -> b``; ``data missing: a -> why``; ``x added: ...``."""
    what = f"{d.what} changed" if d.what in ("content", "revision", "snapshot") else d.what
    return f"{safe(d.name)} {safe(what)}: {safe(d.original)} -> {safe(d.now)}"


def _code(c: CodeChange) -> str:
    """``train.py changed: a -> b``; ``git commit: a -> b``; ``command: a -> b``."""
    if c.what == "file":
        if c.original is None:
            return f"{safe(c.name)}: loaded by the replay only ({safe(str(c.replay))})"
        if c.replay is None:
            return f"{safe(c.name)}: loaded by the original only ({safe(c.original)})"
        return f"{safe(c.name)} changed: {safe(c.original)} -> {safe(c.replay)}"
    what = {"commit": "git commit", "tree": "the working tree's changes against its commit"}.get(c.what, c.what)
    return f"{safe(what)}: {_value(c.original)} -> {_value(c.replay)}"


def _short(value: str) -> str:
    """``sha256 <64 hex>`` -> ``sha256 <12 hex>``: enough to tell two files apart on a line."""
    kind, _, digest = value.partition(" ")
    return f"{kind} {digest[:12]}" if kind in ("sha256", "sample_sha256") and digest else value


def _read(r: ReadChange) -> str:
    """``config/hparams.json changed (sha256 ab12 -> cd34)``; ``LR read by the run: 0.1 -> 0.2``;
    ``x.json: read by the original only (sha256 ab12)``."""
    shown = _short if r.what == "file" else str
    for side, value, other in (("original", r.original, r.replay), ("replay", r.replay, r.original)):
        if other is None and value is not None:
            return f"{safe(r.name)}: read by the {side} only ({safe(shown(value))})"
    if r.what == "file":
        return f"{safe(r.name)} changed ({safe(_short(str(r.original)))} -> {safe(_short(str(r.replay)))})"
    return f"{safe(r.name)} read by the run: {_value(r.original)} -> {_value(r.replay)}"


def _context(c: ContextChange) -> str:
    """``determinism.num_threads: 2 -> 1``; on some ranks only, ``rank 1: env.X: (none) -> 1``."""
    where = ""
    if c.ranks:
        where = ("rank " if len(c.ranks) == 1 else "ranks ") + ", ".join(map(str, c.ranks)) + ": "
    return f"{where}{safe(c.key)}: {_value(c.original)} -> {_value(c.replay)}"


def _unread(changes: Sequence[ContextChange]) -> str:
    """``9 packages changed that the run never read (not causes): contourpy, cycler and 7
    more``: one line for what a researcher installed for something else."""
    names = sorted({c.key[len(PACKAGES):] for c in changes})
    return (f"{plural(len(names), 'package')} changed that the run never read (not causes): "
            f"{safe(first(names, _UNREAD_SHOWN))}")


def replay_text(cmp: ReplayComparison, original: str, stderr_tail: Sequence[str] = ()) -> str:
    """The verdict; ``stderr_tail``: the last lines the replayed command wrote to stderr, shown
    when it failed."""
    lines: list[str] = []
    tol = cmp.tolerance
    how = "bit-identical" if tol.exact else f"within rtol={tol.rtol!r} atol={tol.atol!r}"
    if cmp.failed is not None:
        lines.append(f"FAILED: the replayed command exited with {cmp.failed} before it recorded a "
                     f"step; nothing was compared with {safe(original)}")
        if stderr_tail:
            lines.append("  the last lines of its stderr:")
            lines += [f"    | {safe(line)}" for line in stderr_tail]
        lines += [f"  input drift: {_drift(d)}" for d in cmp.inputs]
        return "\n".join(lines) + "\n"
    if cmp.same:
        lines.append(f"OK: the replay reproduced {safe(original)} ({how}; "
                     f"{plural(cmp.steps_compared, 'step')} compared)")
        if cmp.exit_code != 0:
            when = " before recording a step" if not cmp.steps_compared else ""
            lines.append(f"  note: both runs failed{when}, with exit code {cmp.exit_code}: "
                         f"the failure is what was reproduced")
        return "\n".join(lines) + "\n"
    if cmp.divergences:
        first = cmp.divergences[0]
        lines.append(f"DIVERGED from {safe(original)} ({how}; {plural(cmp.steps_compared, 'step')} compared)")
        lines.append(f"  first divergence: {_where(first.what, first.where)}: "
                     f"{safe(first.original)} (original) != {safe(first.replay)} (replay)")
        for d in cmp.divergences[1:]:
            lines.append(f"  also: {_where(d.what, d.where)}: {safe(d.original)} != {safe(d.replay)}")
    else:
        lines.append(f"DRIFT: an input of {safe(original)} changed")
    lines += [f"  input drift: {_drift(d)}" for d in cmp.inputs]
    if cmp.divergences:
        if cmp.code or cmp.context or cmp.reads:
            lines.append("  lock differences that can explain it (original -> replay):")
            lines += [f"    {_code(c)}" for c in cmp.code]
            lines += [f"    {_read(r)}" for r in cmp.reads]
            lines += [f"    {_context(c)}" for c in cmp.context]
        else:
            packages = "packages the run read" if cmp.packages_not_read else "packages"
            if not cmp.not_seen:
                lines.append(f"  no difference in code, {packages}, CPU, GPU, threads, world size, determinism "
                             "flags, BLAS, numerics variables or anything the run read: a nondeterministic "
                             "operation or a changed input")
            else:
                lines.append(f"  no difference in what was compared (code, {packages}, CPU, GPU, threads, world "
                             "size, determinism flags, BLAS, numerics variables, what the run was seen reading)")
        if cmp.packages_not_read:
            lines.append(f"  {_unread(cmp.packages_not_read)}")
        lines += [f"  not looked at: {safe(n)}" for n in cmp.not_seen]
        if cmp.not_compared:
            lines.append("  not compared, kept by one record only: "
                         + ", ".join(safe(f) for f in cmp.not_compared))
    return "\n".join(lines) + "\n"


def inputs_text(cmp: ReplayComparison, record: str) -> str:
    """``verify --record``'s lines: whether the record's inputs read the same now, each changed
    one named with how it changed."""
    if not cmp.inputs:
        return f"OK: the inputs of {safe(record)} are unchanged\n"
    return "".join(f"DRIFT input {_drift(d)}\n" for d in cmp.inputs)
