"""The nodes' side of the preflight and its reading back: what one node prints, as JSON lines
marked ``MARKER`` (hello first, then its verdict or its error), and every node's verdict read from
srun's ``--label`` output, where those lines are mixed with the node's log and may come cut in
pieces.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

from envlock.check.verdicts import NodeVerdict
from envlock.drift.result import Difference

# The marker of the node side's lines; any other line of a task is its log.
MARKER = "envlock_fleet"
_LOG_KEEP = 5
_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")
_START = '{"' + MARKER + '"'
# A verdict line carries the node's non-info differences: far below this, unless the node's
# output is not envlock's at all.
_MAX_MESSAGE = 16 << 20


def node_name() -> str:
    """This node's name as the scheduler knows it: on one host several Slurm nodes share a
    hostname, and in a Kubernetes indexed Job the pod's hostname is its index's."""
    import socket

    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def node_line(kind: str, **payload: Any) -> str:
    """One message of a node, as one line of compact JSON: srun's ``--label`` then names the task
    it came from, and ``gather`` can join the pieces srun cuts a long line into."""
    return json.dumps({MARKER: kind, "node": node_name(), **payload}, separators=(",", ":"),
                      default=str) + "\n"


def _verdict(node: str, doc: dict[str, Any]) -> NodeVerdict:
    """A node's verdict from its ``verify --json`` document: the differences that are not info
    (nodes on different hosts differ by kernel or CPU model), and ``ok`` as verify decided it."""
    try:
        diffs = tuple(d for d in map(Difference.from_dict, doc.get("differences", ()))
                      if d.severity != "info")
    except (TypeError, ValueError):
        return NodeVerdict(node, "error", message="its verdict is not a verify --json document")
    note = doc.get("warning")
    return NodeVerdict(node, "ok" if doc.get("ok") is True else "drift", diffs,
                       message=str(note) if note else "")


def gather(lines: Iterable[str], tasks: int, *, timed_out: bool, timeout: float,
           task_nodes: Sequence[str] = ()) -> tuple[tuple[NodeVerdict, ...], tuple[str, ...]]:
    """Every task's verdict from srun's ``--label`` output (stdout and stderr merged).

    A task that said hello but gave no verdict is named as timed out (``timed_out``) or as having
    ended without one, with its last log lines; a task that never said hello is named by the
    allocation's node list when known (block distribution, one task per node), else by its task
    number. Returns the verdicts in task order and the launcher's own unlabelled lines.
    """
    names: dict[int, str] = {}
    verdicts: dict[int, NodeVerdict] = {}
    logs: dict[int, list[str]] = {}
    own: list[str] = []
    # srun cuts a long line into several labelled pieces; a message is whole when it parses.
    pending: dict[int, str] = {}
    for raw in lines:
        line = raw.rstrip("\n")
        m = _LABEL.match(line)
        if m is None:
            own.append(line)
            continue
        task, text = int(m.group(1)), m.group(2)
        if task >= tasks:  # srun labels tasks 0..tasks-1; anything else is not a task's line
            own.append(line)
            continue
        if text.startswith(_START):
            pending[task] = text
        elif task in pending:
            pending[task] += text
        else:
            logs.setdefault(task, []).append(text)
            continue
        if len(pending[task]) > _MAX_MESSAGE:
            logs.setdefault(task, []).append(pending.pop(task)[:200] + "...")
            continue
        if not text.endswith("}"):
            continue  # not whole yet: a message ends with its object's brace
        try:
            msg = json.loads(pending[task])
        except ValueError:
            continue  # a brace inside the message; not whole yet
        del pending[task]
        if not isinstance(msg, dict) or MARKER not in msg:
            continue
        node = str(msg.get("node") or f"task {task}")
        names[task] = node
        kind = msg[MARKER]
        if kind == "verdict" and isinstance(msg.get("result"), dict):
            verdicts[task] = _verdict(node, msg["result"])
        elif kind == "error":
            verdicts[task] = NodeVerdict(node, "timeout" if msg.get("timeout") is True else "error",
                                         message=str(msg.get("message", "")))
    result = []
    for task in range(tasks):
        if task in verdicts:
            result.append(verdicts[task])
            continue
        node = names.get(task) or (task_nodes[task] if task < len(task_nodes) else f"task {task}")
        tail = " | ".join(logs.get(task, [])[-_LOG_KEEP:])
        if timed_out:
            what = (f"no verdict within {timeout:g} s" if task in names
                    else f"did not start envlock within {timeout:g} s")
            result.append(NodeVerdict(node, "timeout", message=what + (f" ({tail})" if tail else "")))
        else:
            what = "ended without a verdict" if task in names else "did not run"
            result.append(NodeVerdict(node, "error", message=what + (f": {tail}" if tail else "")))
    return tuple(result), tuple(own[-_LOG_KEEP:])


__all__ = ["MARKER", "gather", "node_line", "node_name"]
