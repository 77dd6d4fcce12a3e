"""A host ``envlock record``/``replay`` stopped by SIGTERM, with real processes: the training
process and what it started are stopped with envlock (before, they ran on under init), and the
record of what ran until then is written, marked interrupted; a second SIGTERM while envlock
waits for the command does not cut that short."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from envlock.replay.record import load

from helpers import REPO, reap, stop_with  # isort: skip

# Two steps recorded, a worker started in its process group (a data loader's), then a long
# wait; STUBBORN: SIGTERM is ignored (by the worker too, which inherits that), so envlock must
# kill them.
TRAIN = """
import os, signal, subprocess, time
import envlock
if os.environ.get("STUBBORN"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
worker = subprocess.Popen(["sleep", "600"])
for step in range(2):
    envlock.record(step, loss=0.5 * step)
with open("pids.tmp", "w") as fh:
    fh.write(f"{os.getpid()} {worker.pid}")
os.rename("pids.tmp", "pids")
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    """Not running: no such process, or a zombie (exited, not yet reaped by init)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _until_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if not _gone(p)]


def _start(tmp_path: Path, *argv: str, **env: str) -> subprocess.Popen[str]:
    (tmp_path / "train.py").write_text(TRAIN)
    full = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONFAULTHANDLER": "1",
            "ENVLOCK_CACHE_DIR": str(tmp_path / "cache"), **env}
    return subprocess.Popen([sys.executable, "-m", "envlock", *argv, "--", sys.executable, "train.py"],
                            cwd=tmp_path, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _pids(proc: subprocess.Popen[str], tmp_path: Path) -> list[int]:
    deadline = time.monotonic() + 60
    while not (tmp_path / "pids").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the training script never started"
        time.sleep(0.05)
    return [int(p) for p in (tmp_path / "pids").read_text().split()]


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@contextlib.contextmanager
def _watched(proc: subprocess.Popen[str], tmp_path: Path) -> Iterator[list[int]]:
    """The training process's and its worker's pids, once it wrote them; whatever the test
    asserts, nothing it started outlives it (they are killed, envlock too)."""
    pids: list[int] = []
    try:
        pids.extend(_pids(proc, tmp_path))
        yield pids
    finally:
        _kill(pids)
        reap(proc)


def test_sigterm_stops_the_training_process_and_its_workers_and_writes_the_record(tmp_path: Path) -> None:
    proc = _start(tmp_path, "record", "run.record", "--no-trace")
    with _watched(proc, tmp_path) as pids:
        _, err = stop_with(proc, signal.SIGTERM, "envlock record")
        left = _until_gone(pids, 5)
    assert proc.returncode == 143, err
    assert left == [], f"still running after envlock stopped: {left}"
    assert "envlock: the run was stopped by SIGTERM; recorded 2 steps, 0 outputs and 0 inputs until then " \
           "in run.record (marked interrupted)" in err
    rec = load(tmp_path / "run.record")
    assert rec.record.interrupted == "SIGTERM" and [s.step for s in rec.steps] == [0, 1]
    assert rec.record.exit_code == 3  # killed by a signal, as child_exit says


def test_a_second_sigterm_while_envlock_waits_for_a_stubborn_command_changes_nothing(tmp_path: Path) -> None:
    """The command ignores SIGTERM: it and its worker are killed after the grace period
    (ENVLOCK_STOP_SECONDS), and the record is written although a second SIGTERM came meanwhile."""
    proc = _start(tmp_path, "record", "run.record", "--no-trace", STUBBORN="1", ENVLOCK_STOP_SECONDS="2")
    with _watched(proc, tmp_path) as pids:
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        _, err = stop_with(proc, signal.SIGTERM, "envlock record")
        left = _until_gone(pids, 5)
    assert proc.returncode == 143, err
    assert left == [], f"still running after envlock stopped: {left}"
    assert "envlock: the command did not end 2 s after SIGTERM; killing it" in err
    assert "cleaning up first" in err
    rec = load(tmp_path / "run.record")
    assert rec.record.interrupted == "SIGTERM" and len(rec.steps) == 2


def test_a_stopped_replay_stops_its_command_and_says_it_has_no_verdict(tmp_path: Path) -> None:
    from envlock.commands import main

    (tmp_path / "short.py").write_text("import envlock\nenvlock.record(0, loss=0.0)\n")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("PYTHONPATH", str(REPO))
            mp.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
            assert main(["record", "run.record", "--", sys.executable, "short.py"]) == 0
    finally:
        os.chdir(cwd)
    proc = _start(tmp_path, "replay", "run.record", "--no-trace")
    with _watched(proc, tmp_path) as pids:
        out, err = stop_with(proc, signal.SIGTERM, "envlock replay")
        left = _until_gone(pids, 5)
    assert proc.returncode == 143, err
    assert left == []
    assert "envlock: the replay was stopped by SIGTERM before its end: no verdict" in err and out == ""


def test_in_a_terminals_foreground_the_command_shares_it_and_sigterm_still_reaches_what_it_started(
        tmp_path: Path) -> None:
    """envlock in the foreground of a terminal (here a pseudo-terminal it controls): the
    command stays in envlock's process group, so the terminal's Ctrl-C and a debugger's reads
    reach it as before; a SIGTERM sent to envlock alone still reaches the command and its
    worker, which envlock finds below it."""
    import fcntl
    import termios

    master, slave = os.openpty()

    def controlling_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    (tmp_path / "train.py").write_text(TRAIN)
    env = {**os.environ, "PYTHONPATH": str(REPO), "ENVLOCK_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "envlock", "record", "run.record", "--no-trace", "--",
                             sys.executable, "train.py"], cwd=tmp_path, env=env, stdin=slave,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=controlling_terminal)
    os.close(slave)
    try:
        with _watched(proc, tmp_path) as pids:
            assert [os.getpgid(p) for p in pids] == [proc.pid, proc.pid]  # envlock's group, the terminal's
            _, err = stop_with(proc, signal.SIGTERM, "envlock record")
            left = _until_gone(pids, 5)
    finally:
        os.close(master)
    assert proc.returncode == 143, err
    assert left == [], f"still running after envlock stopped: {left}"
    assert load(tmp_path / "run.record").record.interrupted == "SIGTERM"
