"""Preflight across nodes: ``envlock verify --fleet`` checks every node of an allocation before
a job starts.

``distributed.check()`` needs a started process group, so a node that hangs or runs another
NCCL hangs the job before anything is reported. This check needs none: the scheduler's own
launcher (``srun --ntasks-per-node=1``) starts ``envlock verify --fleet-node`` once on every node,
each node judges itself against the same lock with the one comparator and prints its verdict as
one JSON line, and this module gathers the lines, names each node's difference and groups the
nodes that differ in the same way. The nodes run in parallel; the gathering reads one short line
per node, so the cost grows with the node count only through that line.

Bounded: every node's probe gets the preflight's timeout as its own deadline
(``ENVLOCK_PROBE_TIMEOUT``), and a node that does not answer by then plus a grace period is named
as timed out, after which the step is cancelled the way srun documents (two interrupts), then
killed. srun's own ``--time`` is set too, as a backstop should this process die.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Literal

from envlock._comparison import Difference, difference_lines
from envlock._textsafe import safe
from envlock.errors import EXIT_DRIFT, EXIT_ENV, EXIT_OK, EnvlockError, UsageError

# The marker of the node side's lines; any other line of a task is its log.
MARKER = "envlock_fleet"
DEFAULT_TIMEOUT = 120.0
# After the nodes' own deadline: time for a node to print the error its probe's deadline raised.
GRACE = 10.0
# srun cancels a step on a second interrupt within a second; then it waits for the step to end.
_CANCEL_WAIT = 30.0
_LOG_KEEP = 5
# A node whose environment is not the lock's at all differs in every package: a group shows the
# first ones, as verify does, and --json has them all.
_ROWS_PER_GROUP = 10
_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")
_START = '{"' + MARKER + '"'
# A verdict line carries the node's non-info differences: far below this, unless the node's
# output is not envlock's at all.
_MAX_MESSAGE = 16 << 20

Status = Literal["ok", "drift", "error", "timeout"]


def node_name() -> str:
    """This node's name as the scheduler knows it: on one host several Slurm nodes share a
    hostname, and in a Kubernetes indexed Job the pod's hostname is its index's."""
    import socket

    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def node_line(kind: str, **payload: Any) -> str:
    """One line of the node side's protocol (compact JSON, one line per message)."""
    return json.dumps({MARKER: kind, "node": node_name(), **payload}, separators=(",", ":"),
                      default=str) + "\n"


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


def compress_names(names: Sequence[str]) -> str:
    """``n1,n2,n3,n5,gpu7`` -> ``gpu7,n[1-3,5]``: Slurm's hostlist form, so a thousand nodes
    with the same difference fit on one line."""
    plain: list[str] = []
    numbered: dict[tuple[str, int], list[int]] = {}
    for name in names:
        m = re.fullmatch(r"(.*?)(\d+)", name)
        if m is None:
            plain.append(name)
        else:
            digits = m.group(2)
            # n9 and n10 belong together; gpu007 keeps its zeros (and is not gpu7).
            width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
            numbered.setdefault((m.group(1), width), []).append(int(digits))
    parts = list(plain)
    for (prefix, width), nums in sorted(numbered.items()):
        nums = sorted(set(nums))
        if len(nums) == 1:
            parts.append(f"{prefix}{nums[0]:0{width}d}")
            continue
        runs: list[str] = []
        start = prev = nums[0]
        for n in [*nums[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            runs.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
            if n is not None:
                start = prev = n
        parts.append(f"{prefix}[{','.join(runs)}]")
    return ",".join(sorted(parts))


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


def _allocation_nodes() -> tuple[int | None, tuple[str, ...]]:
    """Inside an allocation: its node count, and its node names in order when scontrol says."""
    raw = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES")
    count = int(raw) if raw and raw.isdigit() else None
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    names: tuple[str, ...] = ()
    scontrol = shutil.which("scontrol")
    if nodelist and scontrol:
        try:
            done = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True,
                                  text=True, timeout=30, check=False)
            if done.returncode == 0:
                names = tuple(done.stdout.split())
        except (OSError, subprocess.TimeoutExpired):
            names = ()
    return count, names


def launcher_argv(srun: str, lock: str, *, nodes: int, timeout: float,
                  node_args: Sequence[str], python: str | None = None) -> list[str]:
    """The srun command line: one task per node, none killed for another's exit (every verdict
    is wanted), labelled lines, the probe's deadline exported, srun's own time limit as backstop."""
    limit = math.ceil((timeout + GRACE + _CANCEL_WAIT) / 60)
    return [srun, f"--nodes={nodes}", "--ntasks-per-node=1", f"--ntasks={nodes}",
            "--kill-on-bad-exit=0", "--label", f"--time={limit}", "--job-name=envlock-preflight",
            f"--export=ALL,ENVLOCK_PROBE_TIMEOUT={timeout:g}",
            python or sys.executable, "-m", "envlock", "verify", lock, "--fleet-node", *node_args]


def _stop(proc: subprocess.Popen[str]) -> None:
    """Cancel the step as srun documents it (two interrupts within a second), then kill srun."""
    for _ in range(2):
        if proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
    try:
        proc.wait(timeout=_CANCEL_WAIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _drain(stream: IO[str], into: list[str]) -> None:
    """Every line of srun's output, until it ends; then the pipe is closed."""
    with stream:
        into.extend(stream)


def run(lock: str, short_id: str, *, nodes: int | None, timeout: float | None,
        node_args: Sequence[str], display: str | None = None) -> FleetResult:
    """Run the preflight on every node of the allocation (or on ``nodes`` new ones) and gather it."""
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    if not (timeout > 0 and math.isfinite(timeout)):
        raise UsageError(f"--timeout must be a positive number of seconds, not {timeout!r}")
    if nodes is not None and nodes < 1:
        raise UsageError(f"--nodes must be at least 1, not {nodes}")
    count, task_nodes = _allocation_nodes()
    if nodes is None:
        if count is None:
            raise UsageError("verify --fleet outside an allocation needs --nodes N",
                             hint="or run it inside salloc/sbatch, where it checks every node")
        nodes = count
    srun = shutil.which("srun")
    if srun is None:
        raise EnvlockError("srun not found: verify --fleet runs through Slurm's launcher",
                           hint="run it on a Slurm login node or inside an allocation")
    if count is None or nodes != count:
        task_nodes = ()
    argv = launcher_argv(srun, os.path.abspath(lock), nodes=nodes, timeout=timeout,
                         node_args=node_args)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)
    except OSError as exc:
        raise EnvlockError(f"cannot start srun: {exc.strerror or exc}") from None
    lines: list[str] = []
    assert proc.stdout is not None
    # The reader owns the pipe and closes it at its end, whichever way srun ended: closed from
    # here while the reader still waits in a read, the close would wait with it.
    reader = threading.Thread(target=_drain, args=(proc.stdout, lines), daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout + min(GRACE, timeout))
    except subprocess.TimeoutExpired:
        timed_out = True
        _stop(proc)
    except BaseException:
        _stop(proc)
        raise
    finally:
        reader.join(timeout=5)
    verdicts, own = gather(list(lines), nodes, timed_out=timed_out, timeout=timeout,
                           task_nodes=task_nodes)
    if not any(v.status in ("ok", "drift") for v in verdicts) and proc.returncode not in (0, None) \
            and not timed_out:
        tail = " | ".join(own) or f"exit {proc.returncode}"
        raise EnvlockError(f"srun failed before any node answered: {tail}")
    return FleetResult(display or lock, short_id, verdicts, timeout, own)


__all__ = ["FleetResult", "NodeVerdict", "compress_names", "gather", "launcher_argv", "node_line",
           "run"]
