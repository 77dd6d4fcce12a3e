"""What the preflight found: one verdict per node, and the nodes grouped by how they differ.

Apart from how the verdicts are obtained (``protocol`` reads them from srun's output), so the
grouping, the exit code and the JSON are one thing whatever launched the nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from envlock._comparison import Difference, difference_lines
from envlock._textsafe import safe
from envlock.check.hostlist import compress_names
from envlock.errors import EXIT_DRIFT, EXIT_ENV, EXIT_OK

# A node whose environment is not the lock's at all differs in every package: a group shows the
# first ones, as verify does, and --json has them all.
_ROWS_PER_GROUP = 10

Status = Literal["ok", "drift", "error", "timeout"]


@dataclass(frozen=True)
class NodeVerdict:
    """One node's answer: its verdict, the differences that decide it, or why there is none."""

    node: str
    status: Status
    differences: tuple[Difference, ...] = ()
    message: str = ""

    def signature(self) -> tuple[Any, ...]:
        """Nodes with equal signatures are shown as one group."""
        return (self.status, self.message,
                tuple((d.severity, d.path, d.describe()) for d in self.differences))

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "status": self.status, "message": self.message,
                "differences": [d.to_dict() for d in self.differences]}


@dataclass(frozen=True)
class FleetResult:
    """Every node's verdict on one lock, in node order."""

    lock: str
    short_id: str
    nodes: tuple[NodeVerdict, ...]
    timeout: float
    log: tuple[str, ...] = field(default=())  # the launcher's own last lines, for a failed start

    @property
    def ok(self) -> bool:
        return bool(self.nodes) and all(n.status == "ok" for n in self.nodes)

    @property
    def exit_code(self) -> int:
        """1 when any node drifts; else 3 when a node could not answer (or none did); else 0."""
        if any(n.status == "drift" for n in self.nodes):
            return EXIT_DRIFT
        return EXIT_OK if self.ok else EXIT_ENV

    def groups(self) -> list[tuple[str, NodeVerdict, list[str]]]:
        """(compressed node list, one verdict, its nodes), problems first, then by size."""
        by_sig: dict[tuple[Any, ...], list[NodeVerdict]] = {}
        for n in self.nodes:
            by_sig.setdefault(n.signature(), []).append(n)
        order = {"drift": 0, "timeout": 1, "error": 2, "ok": 3}
        items = sorted(by_sig.values(), key=lambda vs: (order[vs[0].status], -len(vs), vs[0].node))
        return [(compress_names([v.node for v in vs]), vs[0], [v.node for v in vs]) for vs in items]

    def describe(self) -> str:
        total = len(self.nodes)
        drift = sum(1 for n in self.nodes if n.status == "drift")
        silent = sum(1 for n in self.nodes if n.status in ("timeout", "error"))
        head = f"envlock: preflight of {safe(self.lock)} ({self.short_id}) on {total} node(s): "
        if not total:
            lines = [head + "no node answered"] + [f"  {safe(line)}" for line in self.log]
            return "\n".join(lines) + "\n"
        if self.ok:
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
        for names, verdict, _ in self.groups():
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

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "lock": self.lock, "id": self.short_id, "timeout": self.timeout,
                "nodes": [n.to_dict() for n in self.nodes],
                "groups": [{"nodes": names, "status": v.status, "message": v.message,
                            "differences": [d.to_dict() for d in v.differences]}
                           for _, v, names in self.groups()]}


__all__ = ["FleetResult", "NodeVerdict", "Status"]
