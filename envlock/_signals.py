"""How envlock stops: SIGTERM and SIGHUP are Ctrl-C, and a clean-up is never cut short.

A job scheduler (``scancel``, a time limit), ``timeout`` and ``kill`` stop a process with
SIGTERM, a closed terminal with SIGHUP. Python's default for both ends the process at once,
without running a ``finally``: a container envlock started kept running (and its GPU), a
half-built image and a temporary directory stayed. So every command runs inside
``stops_as_interrupt()`` (``commands.main``), which makes the three one path: the first raises
``Interrupted`` (a ``KeyboardInterrupt`` carrying the signal's number), every ``finally`` runs
on the way out, and the exit code is 128 plus the number, as a shell reports a process a
signal ended (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).

Once one was raised, the next are noted, not raised: what they would cut short is the clean-up
the first asked for (SIGKILL still ends the process at once). ``deferred()`` holds them off
around a clean-up that even the first must not interrupt (a container's removal after a normal
end), and raises the first afterwards. A signal the process was started with ignored stays
ignored (``nohup``; a background job's SIGINT), and a handler a program installed itself (envlock's
``main`` called inside another program) is left alone.

A leaf: the commands, the engine and the host recorder all import it, and it imports nothing
of envlock's but ``errors``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, ClassVar

from envlock.errors import Interrupted

if TYPE_CHECKING:
    import subprocess

# The signals that stop envlock as Ctrl-C does.
STOPS: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How long a command envlock started (a host record's training process, a container) is given to
# end on its own after it was sent the stop signal, before it is killed: ``docker stop``'s default,
# well inside Slurm's default KillWait (30 s) between its SIGTERM and its SIGKILL. The variable
# sets another (a job that saves a large checkpoint on SIGTERM, under a longer KillWait).
GRACE_SECONDS = 10.0
GRACE_VAR = "ENVLOCK_STOP_SECONDS"


class _State:
    """Per process: whether a stop was raised, what came since, how deep ``deferred`` is."""

    stopping: int | None = None
    pending: ClassVar[list[int]] = []
    depth = 0
    active = 0  # how many ``stops_as_interrupt`` blocks are open
    told = False


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _State.stopping is not None or _State.depth:
        _State.pending.append(signum)
        if _State.stopping is not None and not _State.told:
            _State.told = True
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write("envlock: stopping; cleaning up first (SIGKILL abandons the clean-up)\n")
                sys.stderr.flush()
        return
    _State.stopping = signum
    raise Interrupted(signum)


def _ours(current: Any) -> bool:
    """Whether a disposition is one envlock may replace: the default, or Python's own Ctrl-C."""
    return current in (signal.SIG_DFL, signal.default_int_handler)


@contextlib.contextmanager
def _installed() -> Iterator[bool]:
    """``_on_signal`` for every stop signal envlock may take over; whether any was installed
    (False off the main thread, where Python delivers no signal)."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous: dict[int, Any] = {}
    try:
        for signum in STOPS:
            current = signal.getsignal(signum)
            if current is _on_signal:
                continue
            if _ours(current):
                previous[signum] = signal.signal(signum, _on_signal)
        yield True
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def stops_as_interrupt() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise ``Interrupted`` while the block runs, the first one
    only (see the module's docstring)."""
    outer = _State.stopping, _State.pending, _State.told
    _State.stopping, _State.pending, _State.told = None, [], False
    _State.active += 1
    try:
        with _installed():
            yield
    finally:
        _State.active -= 1
        _State.stopping, _State.pending, _State.told = outer


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold the stop signals off while the block runs (a clean-up that must finish), then raise
    the first that came, unless envlock is stopping already (it is on its way out)."""
    with _installed() as installed:
        if not installed:
            yield
            return
        _State.depth += 1
        try:
            yield
        finally:
            _State.depth -= 1
            if not _State.depth and _State.pending and _State.stopping is None:
                signum, _State.pending = _State.pending[0], []
                if _State.active:  # on the way out now: the next signals are noted
                    _State.stopping = signum
                raise Interrupted(signum)


def on_the_way_out() -> None:
    """After a stop, what is left is the interpreter's exit: the next stop signals are ignored
    from here on, as they were noted during the clean-up, so a second SIGTERM that lands after
    the clean-up but before the exit cannot turn the documented 143 into a death by signal.
    Only dispositions envlock may replace are touched (see ``_installed``)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOPS:
        current = signal.getsignal(signum)
        if current is _on_signal or _ours(current):
            signal.signal(signum, signal.SIG_IGN)


def stop_process(proc: subprocess.Popen[Any], signum: int, *, group: bool,
                 grace: float = GRACE_SECONDS, say: Callable[[str], None] | None = None) -> bool:
    """Pass a stop signal on to a command envlock started and what it started, wait up to
    ``grace`` seconds for them to end, and kill what has not; True when the command had to be
    killed. ``group``: the command runs in a process group of its own (``own_group``), which
    is signalled whole. Without, it shares envlock's group (the foreground of a terminal, whose
    group may hold more than envlock: a pipeline), so the command and its descendants as they
    stand are signalled one by one, and Ctrl-C not again: the terminal sent it to all of them.
    Held off from further signals (``deferred``) until it is done."""
    import subprocess

    with deferred():
        tree = [] if group else _descendants(proc.pid)
        _send(proc.pid, tree, signum, group=group)
        deadline = time.monotonic() + grace
        killed = False
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            if say is not None:
                say(f"the command did not end {grace:g} s after {signal.Signals(signum).name}; killing it")
            killed = True
            _send(proc.pid, tree, signal.SIGKILL, group=group)
            proc.wait()
        _end_rest(proc.pid, tree, deadline, group=group)
        return killed


def _send(pid: int, tree: list[int], signum: int, *, group: bool) -> None:
    if group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signum)
        return
    if signum == signal.SIGINT:
        return
    for each in (pid, *tree):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(each, signum)


def _end_rest(pid: int, tree: list[int], deadline: float, *, group: bool) -> None:
    """What the command started (a data loader's workers, a launcher's ranks), given until
    ``deadline`` to end after the signal they were sent, then killed."""

    def alive() -> bool:
        if group:
            try:
                os.killpg(pid, 0)
            except (ProcessLookupError, PermissionError):
                return False
            return True
        return any(_running(p) for p in tree)

    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive():
        _send(pid, [p for p in tree if _running(p)], signal.SIGKILL, group=group)


def _running(pid: int) -> bool:
    """Whether a process exists and has not exited (a zombie waits for its parent, init here)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read(4096).rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` now (its children, theirs, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                ppid = int(fh.read(4096).rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def own_group() -> bool:
    """Whether a command envlock starts and waits for should run in a process group of its
    own: yes, unless envlock runs in the foreground of its terminal. There the terminal's Ctrl-C,
    Ctrl-Z and hang-up reach the command as they reach envlock, and the command may read the
    terminal (a debugger), which a process of a background group cannot. Elsewhere (a batch
    job, ``srun``, ``nohup``, a pipe) the group is what a stop signal is passed on to, so that
    nothing the command started outlives it."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return True  # no controlling terminal
    try:
        return os.tcgetpgrp(fd) != os.getpgrp()
    except OSError:
        return True
    finally:
        os.close(fd)
