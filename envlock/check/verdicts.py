"""What the preflight found: one verdict per node, and the nodes grouped by how they differ.

Apart from how the verdicts are obtained (``protocol`` reads them from srun's output) and from
their text (``fleetreport``), so the grouping, the exit code and the JSON are one thing whatever
launched the nodes and however the result is shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from envlock.check.hostlist import compress_names
from envlock.drift.result import Difference
from envlock.errors import EXIT_DRIFT, EXIT_ENV, EXIT_OK

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
        """The node's entry in ``--json``: its differences in verify's own form, so a script
        reads a node's verdict as it reads verify's."""
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
        """Every node answered and matches: a preflight where no node answered is no pass."""
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

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document: every node, and the groups the text shows, so a script needs
        no grouping of its own."""
        return {"ok": self.ok, "lock": self.lock, "id": self.short_id, "timeout": self.timeout,
                "nodes": [n.to_dict() for n in self.nodes],
                "groups": [{"nodes": names, "status": v.status, "message": v.message,
                            "differences": [d.to_dict() for d in v.differences]}
                           for _, v, names in self.groups()]}


__all__ = ["FleetResult", "NodeVerdict", "Status"]
