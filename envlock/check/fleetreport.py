"""The text of a preflight across nodes (``verify --fleet`` without ``--json``).

Apart from the result (``verdicts``), as every command's text is apart from what it found:
the grouping and the exit code are decided once, and this only writes them.
"""

from __future__ import annotations

from envlock.check.verdicts import FleetResult
from envlock.drift.result import difference_lines
from envlock.text.terminal import safe

# A node whose environment is not the lock's at all differs in every package: a group shows the
# first ones, as verify does, and --json has them all.
_ROWS_PER_GROUP = 10


def fleet_text(result: FleetResult) -> str:
    """The preflight as a terminal shows it: one headline, then one row per group of nodes that
    differ in the same way, problems first, so a thousand nodes read as a few lines."""
    total = len(result.nodes)
    drift = sum(1 for n in result.nodes if n.status == "drift")
    silent = sum(1 for n in result.nodes if n.status in ("timeout", "error"))
    head = f"envlock: preflight of {safe(result.lock)} ({result.short_id}) on {total} node(s): "
    if not total:
        lines = [head + "no node answered"] + [f"  {safe(line)}" for line in result.log]
        return "\n".join(lines) + "\n"
    if result.ok:
        head += "all match"
    else:
        parts = []
        if drift:
            parts.append(f"{drift} {'differs' if drift == 1 else 'differ'} from the lock")
        if silent:
            parts.append(f"{silent} gave no verdict")
        head += ", ".join(parts)
    # Every name, path and message came from another machine's process: shown literally.
    rows: list[tuple[str, str, str]] = []
    for names, verdict, _ in result.groups():
        lines = difference_lines(verdict.differences, most=_ROWS_PER_GROUP,
                                 rest="--json lists every one")
        if verdict.status not in ("ok", "drift"):
            lines = [safe(verdict.message)]
        elif verdict.message:  # what the node's verify warned about, e.g. the environment it chose
            lines.insert(0, f"note: {safe(verdict.message)}")
        rows.append((safe(names), verdict.status, lines[0] if lines else ""))
        rows += [("", "", line) for line in lines[1:]]
    w0 = max(len("NODES"), *(len(r[0]) for r in rows))
    w1 = max(len("VERDICT"), *(len(r[1]) for r in rows))
    lines = [head, f"  {'NODES'.ljust(w0)}  {'VERDICT'.ljust(w1)}  DIFFERENCE"]
    lines += [f"  {a.ljust(w0)}  {b.ljust(w1)}  {c}".rstrip() for a, b, c in rows]
    return "\n".join(lines) + "\n"


__all__ = ["fleet_text"]
