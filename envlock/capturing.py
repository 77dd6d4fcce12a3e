"""Run the probe and turn its JSON into a ``Lock``.

From the command line the probe runs in a subprocess started *first*, so that importing torch
there (the bulk of a capture) overlaps with envlock importing pydantic and the models here. From a
training script (``envlock.capture()``) it runs in-process, because seeds and determinism
flags are live state that only that process knows.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from envlock.building import build_lock as build_lock  # where callers always imported it from
from envlock.building import current_lock, import_heavy_modules
from envlock.building import import_models as import_models
from envlock.errors import InterpreterNotFound, ProbeFailed, UnsafeValue, UsageError
from envlock.lockdata import is_view, lock_tables

if TYPE_CHECKING:
    from envlock.comparison import Comparison
    from envlock.deepreport import Progress
    from envlock.model import Lock

# The probe is a package directory run as a program (``python PROBE_PATH``): on the host with
# another venv's interpreter, and copied whole into containers (``restore.verify.probe_files``).
PROBE_PATH = Path(__file__).with_name("probe")
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
    candidate = Path(os.path.abspath(expanded))
    is_path = os.sep in expanded or (os.altsep is not None and os.altsep in expanded)
    if candidate.is_dir() and (is_path or not shutil.which(python)):
        # `--python .venv` is what people type; accept the environment directory.
        for sub in PREFIX_INTERPRETERS:
            if (candidate / sub).exists():
                return str(candidate / sub)
        raise InterpreterNotFound(f"{python} is a directory without bin/python")
    if is_path:
        if not candidate.exists():
            raise InterpreterNotFound(f"interpreter not found: {python}")
        if not os.access(candidate, os.X_OK) or candidate.is_dir():
            raise InterpreterNotFound(f"{python} is not executable")
        return str(candidate)
    found = shutil.which(python)
    if not found:
        raise InterpreterNotFound(f"interpreter not found on PATH: {python}")
    return found


def probe_args(*, torch: bool = True, canary: bool = False, image: str | None = None,
               cwd: str | None = None, deep: bool = False, cache: bool = True,
               progress: bool = False, git_exclude: Sequence[str] = ()) -> list[str]:
    args = []
    for path in git_exclude:
        args += ["--git-exclude", os.path.abspath(path)]
    if not torch:
        args.append("--no-torch")
    if deep:
        args.append("--deep")
        if progress:
            args.append("--progress")
    if not cache:
        args.append("--no-cache")
    if canary:
        args.append("--canary")
    if image:
        args += ["--image", image]
    if cwd:
        args += ["--cwd", cwd]
    return args


def probe_timeout() -> float:
    raw = os.environ.get("ENVLOCK_PROBE_TIMEOUT")
    if not raw:
        return DEFAULT_PROBE_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise UsageError(f"ENVLOCK_PROBE_TIMEOUT must be a number of seconds, not {raw!r}")
    return value


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
        argv = [self.python, str(PROBE_PATH), *args]
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise InterpreterNotFound(f"cannot run {python}: {exc.strerror or exc}") from None
        self.deadline = time.monotonic() + self.timeout

    def _kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone already

    def _finish(self) -> None:
        self._kill_group()
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
                    raise ProbeFailed(f"the probe did not finish within {self.timeout:g}s",
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
            tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
            if b"SyntaxError" in err:
                tail = ["this interpreter is too old for the probe (Python >= 3.8 needed)"]
            raise ProbeFailed(f"the probe failed under {self.python}: {tail[0]}")
        try:
            doc = json.loads(out)
        except ValueError:
            raise ProbeFailed(f"the probe under {self.python} printed no JSON document") from None
        if not isinstance(doc, dict):
            raise ProbeFailed("the probe returned something other than a JSON object")
        return doc


def run_probe_in_process(*, torch: bool = True, canary: bool = False, image: str | None = None,
                         cwd: str | None = None, deep: bool = False,
                         git_exclude: Sequence[str] = ()) -> dict[str, Any]:
    from envlock.probe.collect import collect

    return collect(torch="auto" if torch else "no", canary=canary, image=image, cwd=cwd,
                         deep=deep, git_exclude=[os.path.abspath(p) for p in git_exclude])


def capture(
    *,
    python: str | None = None,
    torch: bool = True,
    canary: bool = False,
    image: str | None = None,
    note: str | None = None,
    cwd: str | None = None,
    in_process: bool | None = None,
    deep: bool = False,
    cache: bool = False,
    git_exclude: Sequence[str] = (),
) -> Lock:
    """Capture the environment as a sealed ``Lock``.

    With no ``python``, this process is probed in-process (its live seeds and flags are what
    get recorded); with ``python``, that interpreter runs the probe. ``deep`` adds each
    distribution's on-disk digest (``files_sha256``); ``cache`` lets a probe in another
    interpreter reuse cached torch facts (never in-process: flags there are live state).
    ``git_exclude``: files kept out of ``[git]`` (the lock about to be written over).
    """
    if image is not None:
        check_image_option(image)
    doc = capture_doc(python=python, torch=torch, canary=canary, image=image, cwd=cwd,
                      in_process=in_process, deep=deep, cache=cache, git_exclude=git_exclude)
    doc.pop("deep", None)
    return build_lock(doc, note=note)


def capture_doc(*, python: str | None = None, torch: bool = True, canary: bool = False,
                image: str | None = None, cwd: str | None = None, in_process: bool | None = None,
                deep: bool = False, cache: bool = False,
                git_exclude: Sequence[str] = ()) -> dict[str, Any]:
    """The probe's document, with the ``--deep`` report under ``"deep"`` when asked for."""
    if in_process is None:
        in_process = python is None
    if in_process:
        return run_probe_in_process(torch=torch, canary=canary, image=image, cwd=cwd, deep=deep,
                                    git_exclude=git_exclude)
    proc, progress = start_probe(python, torch=torch, canary=canary, image=image, cwd=cwd, deep=deep,
                                 cache=cache, git_exclude=git_exclude)
    try:
        import_heavy_modules()
    except BaseException:
        cancel_probe(proc, progress)  # Ctrl-C while the models import
        raise
    return finish_probe(proc, progress)


def start_probe(python: str | None, *, deep: bool = False, **options: Any) -> tuple[ProbeProcess, Progress | None]:
    """The probe started in ``python`` (``probe_args`` options), with ``--deep`` progress drawn
    on a terminal; ``finish_probe`` waits for its document."""
    progress = None
    if deep:
        from envlock.deepreport import Progress

        progress = Progress()
    proc = ProbeProcess(python or sys.executable,
                        probe_args(deep=deep, progress=progress is not None and progress.enabled, **options),
                        on_stderr=progress.feed if progress is not None else None)
    return proc, progress


def finish_probe(proc: ProbeProcess, progress: Progress | None) -> dict[str, Any]:
    try:
        return proc.result()
    finally:
        if progress is not None:
            progress.close()


def cancel_probe(proc: ProbeProcess, progress: Progress | None) -> None:
    """Stop a started probe whose answer is no longer wanted. It runs in its own session, so
    the terminal's SIGINT never reaches it: stopped here, or it outlives envlock."""
    proc.cancel()
    if progress is not None:
        progress.close()


def check_image_option(image: str) -> None:
    """Refuse a malformed ``--image`` before probing: it is the user's input (exit 2), not
    something the probe found wrong with the environment."""
    from envlock.restore.values import image_ref

    try:
        image_ref(image)
    except UnsafeValue as exc:
        why = exc.message.removeprefix("refusing ")
        raise UsageError(f"--image {image!r} is not an image reference: {why}",
                         hint="use REF[:TAG][@sha256:<64 hex digits>]") from None


def verify(
    lock: Lock | str | os.PathLike[str],
    *,
    python: str | None = None,
    torch: bool | None = None,
    in_process: bool | None = None,
    strict: bool = False,
    deep: bool = False,
) -> Comparison:
    """Capture now and compare with ``lock`` (a Lock or a path); the seal is checked first.

    ``strict``: warnings count as drift too (the result's ``ok`` is False on any warning).
    ``deep``: also re-hash every installed file against its RECORD; each modified, missing or
    added file is a breaking difference (category ``files``).

    In-process (the default without ``python``), everything is compared, seeds and flags
    included: call it after ``envlock.apply()``. Another interpreter is a fresh process, so the
    recorded process state is reported in ``Comparison.process`` instead.
    """
    return check(lock, python=python, torch=torch, in_process=in_process, strict=strict,
                 deep=deep).comparison


@dataclass(frozen=True)
class Verification:
    """A verify's verdict and what it was derived from, for a report to quote."""

    comparison: Comparison
    expected: Lock
    current: Lock
    deep: dict[str, Any] | None  # the --deep findings, as the probe reported them
    light: bool  # both locks were read without the models (lockdata)


def check(lock: Lock | str | os.PathLike[str], *, python: str | None = None,
          torch: bool | None = None, in_process: bool | None = None, strict: bool = False,
          deep: bool = False, cache: bool = False, early: bool = False,
          limit: int | None = None) -> Verification:
    """The one verify path (``verify()`` and ``envlock verify``); see ``verify`` for the options.

    ``torch``: None probes torch when the lock has it. ``cache``: reuse cached torch facts in
    another interpreter. ``limit``: files named per distribution by ``deep`` (None: all).
    ``early`` starts the probe in another interpreter before the lock is read, deciding from
    its table names alone whether to import torch: the probe's import then overlaps reading
    the lock (a full validation when its seal does not hold). A sealed lock is read without
    pydantic (``lockdata``), and so is what the probe found, to compare with it.
    """
    if in_process is None:
        in_process = python is None
    started = None
    if isinstance(lock, (str, os.PathLike)):
        tables = lock_tables(lock) if early and not in_process else None
        if tables is not None:
            want = "torch" in tables if torch is None else torch
            started = start_probe(python, torch=want, canary="canary" in tables and want,
                                  deep=deep, cache=cache)
        try:
            expected = _read(lock)
        except BaseException:
            if started is not None:
                cancel_probe(*started)
            raise
    else:
        from envlock.lockfile import check_seal

        check_seal(lock)
        expected = lock
    light = is_view(expected)
    if started is None:
        want = expected.torch is not None if torch is None else torch
        doc = capture_doc(python=python, torch=want, canary=expected.canary is not None and want,
                          in_process=in_process, deep=deep, cache=cache)
    else:
        doc = finish_probe(*started)
    report = doc.pop("deep", None)
    current = current_lock(doc, light=light)
    cmp = judge(expected, current, report, strict=strict,
                process_state="compare" if in_process else "report", limit=limit)
    return Verification(cmp, expected, current, report, light and is_view(current))


def _read(path: str | os.PathLike[str]) -> Lock:
    from envlock.lockdata import light_view, read_data

    data = read_data(path)
    lock = light_view(data)
    if lock is None:
        import_heavy_modules()
        from envlock.lockfile import from_dict

        lock = from_dict(data, str(path))
    return lock


def judge(expected: Lock, current: Lock, report: dict[str, Any] | None, *, strict: bool,
          process_state: Literal["compare", "report"], limit: int | None) -> Comparison:
    """The verdict ``verify()`` and ``envlock verify`` both give: the comparison of the two
    locks, OS packages judged as restore's check does inside an image `envlock run` started
    on another base, and the ``--deep`` findings (``report``) merged in."""
    from envlock.deepreport import align, merge
    from envlock.drift import compare, os_packages_come_from_base, os_packages_from_base

    cmp = compare(*align(expected, current), strict=strict, process_state=process_state)
    if os_packages_come_from_base():
        cmp = os_packages_from_base(cmp)
    return merge(cmp, report, limit=limit)
