"""The text of a replay's verdict: the first divergence, the inputs that changed, and beside
them the differences between the two processes that can explain a divergence."""

from __future__ import annotations

from typing import Any

from envlock._recordcmp import ReplayComparison
from envlock._textsafe import plural, safe


def _value(v: Any) -> str:
    return "(none)" if v is None else safe(str(v))


def _where(what: str, where: str) -> str:
    """``step 3, loss``; ``output model.pt``; ``exit code of the command``."""
    if what == "step":
        return safe(where)
    return f"{safe(what)} of {safe(where)}" if what == "exit code" else f"{safe(what)} {safe(where)}"


def replay_text(cmp: ReplayComparison, original: str) -> str:
    lines: list[str] = []
    tol = cmp.tolerance
    how = "bit-identical" if tol.exact else f"within rtol={tol.rtol!r} atol={tol.atol!r}"
    if cmp.same:
        lines.append(f"OK: the replay reproduced {safe(original)} ({how}; "
                     f"{plural(cmp.steps_compared, 'step')} compared)")
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
    for drift in cmp.inputs:
        lines.append(f"  input drift: {safe(drift.name)} {safe(drift.what)} changed: "
                     f"{safe(drift.original)} -> {safe(drift.now)}")
    if cmp.divergences:
        if cmp.context:
            lines.append("  lock differences that can explain it (original -> replay):")
            lines += [f"    {safe(c.key)}: {_value(c.original)} -> {_value(c.replay)}" for c in cmp.context]
        else:
            lines.append("  no difference in CPU, GPU, threads, world size, determinism flags, BLAS "
                         "or numerics variables: a nondeterministic operation or a changed input")
    return "\n".join(lines) + "\n"


def inputs_text(cmp: ReplayComparison, record: str) -> str:
    if not cmp.inputs:
        return f"OK: the inputs of {safe(record)} are unchanged\n"
    return "".join(f"DRIFT input {safe(d.name)} {safe(d.what)} changed: {safe(d.original)} -> "
                   f"{safe(d.now)}\n" for d in cmp.inputs)
