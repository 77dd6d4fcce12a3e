"""What a ``--python`` wrapper starts is stopped with the probe, even a child that left the
probe's process group and session (``setsid``), and even once its parent has exited."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from envlock.probe.rules import PROBE_RUN_VAR as RUN_VAR
from envlock.probing.process import ProbeProcess, leftovers, probe_args

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="Linux /proc")


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for init, which a container may lack)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 10  # SIGKILL is sent; its delivery is the kernel's
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not _running(pid)


@pytest.mark.parametrize("shape", ["child", "orphan"])
def test_a_setsid_child_of_a_wrapper_does_not_outlive_the_probe(tmp_path: Path, shape: str) -> None:
    pidfile = tmp_path / "pid"
    # "child": the daemon's parent is the probe itself (the wrapper execs it); "orphan": started
    # by a shell that exits at once, so its parent is init long before the probe ends.
    start = ("setsid sleep 300 & echo $! > PIDFILE" if shape == "child"
             else "sh -c 'setsid sleep 300 & echo $! > PIDFILE' && sleep 0.2")
    wrapper = tmp_path / "python"
    wrapper.write_text("#!/bin/sh\n" + start.replace("PIDFILE", str(pidfile))
                       + f"\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    probe = ProbeProcess(str(wrapper), probe_args(torch=False, cache=False, cwd=str(tmp_path)))
    pid = 0
    try:
        doc = probe.result()
        pid = int(pidfile.read_text())
        assert doc["python"]
        assert RUN_VAR not in doc.get("env", {}).get("variables", {})
        assert RUN_VAR not in str(doc)  # the marker never reaches a lock
        assert _gone(pid)
    finally:
        if pid and _running(pid):
            os.kill(pid, signal.SIGKILL)


def test_leftovers_finds_only_marked_processes_and_descendants() -> None:
    # This process carries no token: nothing of the test runner is ever taken for a leftover.
    assert leftovers(os.getpid(), "0" * 32) == []
    assert leftovers(1, "0" * 32, proc="/nonexistent") == []
