"""How envlock stops (``envlock._signals``), in real processes sent real signals.

Each case runs a small program in a Python process of its own (a signal handler is per process,
and only the main thread gets signals), tells the test by a line on stdout when it stands where
the signal must land, and reports what its clean-up did.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, reap  # isort: skip

# A command that sleeps, interrupted: its clean-up announces itself, sleeps (a second signal
# lands there), and finishes; the exit code is main's.
STOPPED = """
import sys, time
from envlock._signals import stops_as_interrupt
from envlock.errors import interrupted_exit
try:
    with stops_as_interrupt():
        try:
            print("running", flush=True)
            time.sleep(60)
        finally:
            print("cleaning", flush=True)
            time.sleep(float(sys.argv[1]))
            print("cleaned", flush=True)
except KeyboardInterrupt as exc:
    print("exit", type(exc).__name__, flush=True)
    sys.exit(interrupted_exit(exc))
"""

# A clean-up that must finish even when the first signal lands in it (``deferred``).
DEFERRED = """
import time
from envlock._signals import deferred, stops_as_interrupt
from envlock.errors import interrupted_exit
import sys
try:
    with stops_as_interrupt():
        with deferred():
            print("removing", flush=True)
            time.sleep(1.0)
            print("removed", flush=True)
        print("after", flush=True)
except KeyboardInterrupt as exc:
    sys.exit(interrupted_exit(exc))
"""


def _start(code: str, *args: str, ignore_hup: bool = False) -> subprocess.Popen[str]:
    def preexec() -> None:
        if ignore_hup:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts a program

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, preexec_fn=preexec)


def _wait_for(proc: subprocess.Popen[str], word: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == word, (line, proc.stderr.read() if proc.stderr else "")


def _finish(proc: subprocess.Popen[str]) -> list[str]:
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        reap(proc)
    return out.split("\n")[:-1] + ([f"stderr: {err}"] if err else [])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_each_stop_signal_is_ctrl_c_with_its_own_exit_code(signum: int) -> None:
    proc = _start(STOPPED, "0")
    _wait_for(proc, "running")
    proc.send_signal(signum)
    lines = _finish(proc)
    assert lines == ["cleaning", "cleaned", "exit Interrupted"], lines
    assert proc.returncode == 128 + signum


def test_a_second_sigterm_during_the_clean_up_does_not_cut_it_short() -> None:
    """Before: the first SIGTERM ended the process without any ``finally``; with SIGTERM made
    an interrupt but nothing more, the second one raised inside the clean-up and abandoned it."""
    proc = _start(STOPPED, "1.0")
    _wait_for(proc, "running")
    proc.send_signal(signal.SIGTERM)
    _wait_for(proc, "cleaning")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    proc.send_signal(signal.SIGHUP)
    lines = _finish(proc)
    assert lines[:3] == ["cleaned", "exit Interrupted",
                         "stderr: envlock: stopping; cleaning up first (SIGKILL abandons the clean-up)\n"], lines
    assert proc.returncode == 143


def test_a_signal_during_a_deferred_clean_up_is_raised_when_it_is_done() -> None:
    proc = _start(DEFERRED)
    _wait_for(proc, "removing")
    proc.send_signal(signal.SIGTERM)
    lines = _finish(proc)
    assert lines == ["removed"], lines
    assert proc.returncode == 143


def test_an_ignored_sighup_stays_ignored() -> None:
    """Under ``nohup`` a closed terminal must not stop envlock."""
    proc = _start(DEFERRED, ignore_hup=True)
    _wait_for(proc, "removing")
    proc.send_signal(signal.SIGHUP)
    lines = _finish(proc)
    assert lines == ["removed", "after"], lines
    assert proc.returncode == 0


def test_the_handlers_are_put_back_after_a_command() -> None:
    from envlock._signals import stops_as_interrupt

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with stops_as_interrupt():
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
    assert {s: signal.getsignal(s) for s in before} == before

