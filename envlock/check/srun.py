"""The preflight started through Slurm's launcher: one task per node, bounded, gathered.

Bounded: every node's probe gets the preflight's timeout as its own deadline
(``ENVLOCK_PROBE_TIMEOUT``), and a node that does not answer by then plus a grace period is named
as timed out, after which the step is cancelled the way srun documents (two interrupts), then
killed. srun's own ``--time`` is set too, as a backstop should this process die.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO

from envlock.check.protocol import gather
from envlock.check.verdicts import FleetResult
from envlock.errors import EnvlockError, UsageError

DEFAULT_TIMEOUT = 120.0
# After the nodes' own deadline: time for a node to print the error its probe's deadline raised.
GRACE = 10.0
# srun cancels a step on a second interrupt within a second; then it waits for the step to end.
_CANCEL_WAIT = 30.0


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
    """Run the preflight on every node of the allocation (or on ``nodes`` new ones) and gather it.

    Usage errors are raised before srun starts; srun failing before any node answered (no
    allocation, a wrong partition) is that error with srun's own words, not a fleet of silent
    nodes."""
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


__all__ = ["DEFAULT_TIMEOUT", "GRACE", "launcher_argv", "run"]
