"""Start the probe in another interpreter and read its JSON document.

Where the probe lives and how it runs as a program; nothing here knows about locks, so capture,
verify and restore (which copies the same directory into images) share it.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from envlock.errors import InterpreterNotFound, ProbeFailed, ProbeTimeout, UsageError
from envlock.probe.flags import DOCUMENT_MARKER, command_line
from envlock.probe.rules import PROBE_RUN_VAR as RUN_VAR  # never recorded in a lock
from envlock.text.terminal import safe

# The probe is a package directory run as a program (``python PROBE_PATH``): on the host with
# another venv's interpreter, and copied whole into containers (``restore.verify.probe_files``).
PROBE_PATH = Path(os.path.abspath(__file__)).parents[1] / "probe"
# Its stdlib-only OS package reader, which restore also copies alone into system-Python builds.
OSPKGS_PATH = PROBE_PATH / "ospkgs.py"
# The probe imports torch (1-3 s warm, 10-30 s from a cold network file system) and, with
# --canary, initialises CUDA and runs a few small kernels; its own subprocesses (git, ldconfig)
# have their own deadlines. Two minutes is several times the slowest cold start measured, and
# short enough that a hung interpreter does not hold a training job's start for ten minutes.
# ENVLOCK_PROBE_TIMEOUT raises it (first CUDA JIT of a new GPU architecture can take longer).
DEFAULT_PROBE_TIMEOUT = 120.0
# The probe's JSON is about the size of the lock, which is at most 16 MiB; 64 MiB leaves room
# and keeps a runaway interpreter from taking gigabytes of envlock's memory.
MAX_PROBE_OUTPUT = 64 << 20
_STDERR_KEEP = 64 << 10
# After the probe exits, how long its leftover children may keep the pipes open.
_EXIT_GRACE = 1.0
# Where an environment directory keeps its interpreter (POSIX venv or conda, then Windows).
PREFIX_INTERPRETERS = ("bin/python", "bin/python3", "Scripts/python.exe")


def resolve_python(python: str) -> str:
    """An interpreter given as a path or a command name, checked to exist and be runnable.

    A path is a path: ``./python3`` is that file, never ``python3`` looked up on PATH (``Path``
    drops the ``./``, so the path is made absolute before anything runs it). Only a bare name
    such as ``python3.11`` is looked up on PATH, as a shell would.
    """
    expanded = os.path.expanduser(python)
    candidate = os.path.abspath(expanded)
    is_path = os.sep in expanded or (os.altsep is not None and os.altsep in expanded)
    if os.path.isdir(candidate) and (is_path or not _which(python)):
        # `--python .venv` is what people type; accept the environment directory.
        for sub in PREFIX_INTERPRETERS:
            if os.path.exists(os.path.join(candidate, sub)):
                return os.path.join(candidate, sub)
        raise InterpreterNotFound(f"{python} is a directory without bin/python")
    if is_path:
        if not os.path.exists(candidate):
            raise InterpreterNotFound(f"interpreter not found: {python}")
        if not os.access(candidate, os.X_OK) or os.path.isdir(candidate):
            raise InterpreterNotFound(f"{python} is not executable")
        return candidate
    found = _which(python)
    if not found:
        raise InterpreterNotFound(f"interpreter not found on PATH: {python}")
    return found


def _which(name: str) -> str | None:
    return shutil.which(name)


def probe_args(*, torch: bool = True, canary: bool = False, image: str | None = None,
               cwd: str | None = None, deep: bool = False, cache: bool = True,
               progress: bool = False, git_exclude: Sequence[str] = ()) -> list[str]:
    """The probe's command line for these options, written from the probe's own flag table."""
    return command_line({
        "git_exclude": [os.path.abspath(path) for path in git_exclude], "no_torch": not torch,
        "deep": deep, "progress": deep and progress, "no_cache": not cache, "canary": canary,
        "image": image, "cwd": cwd})


def seconds_from_env(name: str, default: float) -> float:
    """A deadline in seconds from the variable ``name``, else ``default``; a value that is not a
    positive, finite number is a usage error rather than a wait that never ends."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise UsageError(f"{name} must be a number of seconds, not {raw!r}")
    return value


def probe_timeout() -> float:
    """The probe's deadline in seconds, from ``ENVLOCK_PROBE_TIMEOUT``."""
    return seconds_from_env("ENVLOCK_PROBE_TIMEOUT", DEFAULT_PROBE_TIMEOUT)


_MARKER = ("\n" + DOCUMENT_MARKER + "\n").encode("ascii")


def parse_document(out: bytes, where: str) -> dict[str, Any]:
    """The probe's JSON document in its stdout ``out`` (``where``: "under PYTHON", "inside
    IMAGE"): what follows the last marker line, so start-up output printed before it by the
    interpreter (a sitecustomize.py or .pth) cannot break it; ProbeFailed when there is none."""
    at = out.rfind(_MARKER)
    if at < 0:
        raise ProbeFailed(f"the probe {where} printed no JSON document")
    text = out[at + len(_MARKER):].decode("utf-8", "replace")
    try:
        doc, _ = json.JSONDecoder().raw_decode(text)
    except ValueError:
        raise ProbeFailed(f"the probe {where} printed no JSON document") from None
    except RecursionError:
        raise ProbeFailed(f"the probe {where} printed a document nested too deeply to be one "
                          "of envlock's") from None
    if not isinstance(doc, dict):
        raise ProbeFailed("the probe returned something other than a JSON object")
    return doc


def python_version(python: str, timeout: float = 10.0) -> tuple[int, int] | None:
    """``(major, minor)`` of ``python``, or None when it does not run as a Python (Python 2
    included: the statement is valid there)."""
    code = "import sys; sys.stdout.write('envlock-python %d.%d' % sys.version_info[:2])"
    try:
        proc = subprocess.run([python, "-c", code], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=timeout, start_new_session=True, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.fullmatch(rb"envlock-python (\d+)\.(\d+)", proc.stdout.strip())
    return (int(match.group(1)), int(match.group(2))) if match and proc.returncode == 0 else None


def leftovers(root: int, token: str, proc: str = "/proc") -> list[int]:
    """Processes started under the probe, found through ``/proc`` (Linux; elsewhere none):
    every descendant of ``root`` by parent id, and every process whose environment carries
    this run's token, with their descendants. The token finds a child that started its own
    session and was orphaned when its parent exited (its parent is then init)."""
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    needle = f"{RUN_VAR}={token}".encode()
    me = os.getpid()
    children: dict[int, list[int]] = {}
    start = [root]
    for name in names:
        if not name.isdigit() or int(name) in (me, root):
            continue
        pid = int(name)
        try:
            with open(f"{proc}/{name}/stat", "rb") as fh:
                ppid = int(fh.read(4096).rsplit(b")", 1)[1].split()[1])
            with open(f"{proc}/{name}/environ", "rb") as fh:
                environ = fh.read(1 << 20)
        except (OSError, ValueError, IndexError):
            continue  # gone, another user's, or a kernel thread
        children.setdefault(ppid, []).append(pid)
        if needle in environ.split(b"\0"):
            start.append(pid)
    found: set[int] = set()
    todo = list(start)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    found.update(start[1:])
    return sorted(found)


class ProbeProcess:
    """The probe running in another interpreter; ``result()`` waits for and parses its JSON.

    The interpreter is whatever ``--python`` names (it may be a wrapper script), so it runs in
    its own process group: on timeout the whole group is killed, children included, and
    nothing is left holding the pipes. Its output is read as it comes, up to a cap.
    ``on_stderr`` sees each stderr line as it comes (``--deep`` progress) and returns True for
    the lines it consumed; the rest are kept for the error message.
    """

    def __init__(self, python: str, args: list[str], timeout: float | None = None,
                 max_output: int = MAX_PROBE_OUTPUT,
                 on_stderr: Callable[[str], bool] | None = None) -> None:
        self.python = resolve_python(python)
        self.timeout = timeout or probe_timeout()
        self.max_output = max_output
        self.on_stderr = on_stderr
        self._pending = bytearray()
        self._finished = False
        self._killed = False  # kill(): stopped on purpose (Ctrl-C), not failed on its own
        self.argv = [self.python, str(PROBE_PATH), *args]
        import secrets  # here: a command that starts no probe (a warm verify) does not pay it

        # Inherited by everything the interpreter starts, a setsid child included (the probe
        # never records it): how its leftovers are found at the end.
        self.token = secrets.token_hex(16)
        try:
            # Its own session: the terminal's Ctrl-C reaches envlock, which stops the whole
            # group (the interpreter may be a wrapper with children); nothing to read on stdin.
            # Popen restores SIGPIPE and SIGXFSZ to their defaults in the child, as a shell would.
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True,
                                         env={**os.environ, RUN_VAR: self.token})
        except OSError as exc:
            raise InterpreterNotFound(f"cannot run {python}: {exc.strerror or exc}") from None
        self.deadline = time.monotonic() + self.timeout

    def _kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone already

    def kill(self) -> None:
        """Kill the probe's whole group now, from anywhere (a signal handler included): its
        pipes then close, and whoever waits on it sees it end."""
        if not self._finished:
            self._killed = True
            self._kill_group()

    def _finish(self) -> None:
        if self._finished:
            return  # reaped already: its pid, and so its group id, may belong to another now
        self._finished = True
        self._kill_group()
        # A wrapper's child that left the group (setsid, a daemon) would outlive envlock.
        for pid in leftovers(self.proc.pid, self.token):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass  # gone meanwhile
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        self.proc.wait()

    def cancel(self) -> None:
        """Stop a probe whose answer is no longer wanted (the lock turned out invalid)."""
        self._finish()

    def _collect(self) -> tuple[bytes, bytes]:
        """stdout and (the tail of) stderr, until both close, the deadline or the cap."""
        out, err = bytearray(), bytearray()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ, out)
        sel.register(self.proc.stderr, selectors.EVENT_READ, err)
        exited_at: float | None = None
        try:
            while sel.get_map():
                now = time.monotonic()
                if now >= self.deadline:
                    raise ProbeTimeout(f"the probe did not finish within {self.timeout:g}s",
                                      hint="raise ENVLOCK_PROBE_TIMEOUT (seconds) if the interpreter "
                                           "is just slow to start")
                if exited_at is None and self.proc.poll() is not None:
                    exited_at = now
                if exited_at is not None and now - exited_at > _EXIT_GRACE:
                    break  # the probe is done; a child it left behind holds the pipes
                for key, _ in sel.select(timeout=min(self.deadline - now, 0.25)):
                    chunk = os.read(key.fd, 1 << 20)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    buf: bytearray = key.data
                    if buf is err and self.on_stderr is not None:
                        chunk = self._feed(chunk)
                    buf += chunk
                    if buf is out and len(out) > self.max_output:
                        raise ProbeFailed(
                            f"the probe under {self.python} printed more than "
                            f"{self.max_output >> 20} MiB; a probe document is far smaller, so "
                            "this interpreter is not running envlock's probe as expected")
                    if buf is err and len(err) > 2 * _STDERR_KEEP:
                        del err[:-_STDERR_KEEP]
        finally:
            sel.close()
            self._finish()
        err += self._pending  # a last line without its newline is still worth showing
        return bytes(out), bytes(err)

    def _not_python(self, err: bytes) -> None:
        """When the probe failed, raise the plain reason if the program is no Python >= 3.8
        at all: ``--python /bin/ls`` or a pyenv shim of an uninstalled version fail with a
        message of their own whose last line ("Try '/bin/ls --help'") says nothing."""
        version = python_version(self.python)
        if version is not None and version >= (3, 8):
            return  # a Python that could run the probe: its own error is the one to show
        said = next((line.strip() for line in err.decode("utf-8", "replace").splitlines()
                     if line.strip()), "")
        if version is not None:
            raise InterpreterNotFound(
                f"{self.python} is Python {version[0]}.{version[1]}, too old for the probe "
                "(Python >= 3.8 needed)")
        raise InterpreterNotFound(f"{self.python} is not a Python interpreter"
                                  + (f" (it said: {safe(said[:200])})" if said else ""),
                                  hint="pass --python with a Python >= 3.8 or an environment directory")

    def _feed(self, chunk: bytes) -> bytes:
        """Complete stderr lines go to ``on_stderr``; those it does not consume are returned."""
        assert self.on_stderr is not None
        self._pending += chunk
        *lines, rest = bytes(self._pending).split(b"\n")
        self._pending = bytearray(rest[-_STDERR_KEEP:])
        kept = [line for line in lines
                if not self.on_stderr(line.decode("utf-8", "replace") + "\n")]
        return b"".join(line + b"\n" for line in kept)

    def result(self) -> dict[str, Any]:
        out, err = self._collect()
        if self.proc.returncode != 0:
            if not self._killed:  # killed, it says nothing of the interpreter: no need to start it again
                self._not_python(err)
            tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
            if b"SyntaxError" in err:
                tail = ["this interpreter is too old for the probe (Python >= 3.8 needed)"]
            raise ProbeFailed(f"the probe failed under {self.python}: {safe(tail[0])}")
        try:
            return parse_document(out, f"under {self.python}")
        except ProbeFailed:
            self._not_python(err)
            raise

