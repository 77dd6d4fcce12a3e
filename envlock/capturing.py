"""Run the probe and turn its JSON into a ``Lock``.

From the command line the probe runs in a subprocess started *first*, so that importing torch
there (the bulk of a capture) overlaps with envlock importing pydantic and tomlkit here. From a
training script (``envlock.capture()``) it runs in-process, because seeds and determinism
flags are live state that only that process knows.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envlock import __version__
from envlock.errors import InterpreterNotFound, ProbeFailed

if TYPE_CHECKING:
    from envlock.drift import Comparison
    from envlock.model import Lock

PROBE_PATH = Path(__file__).with_name("probe.py")
CANARY_PATH = Path(__file__).with_name("kernels.py")
DEFAULT_PROBE_TIMEOUT = 600.0


def resolve_python(python: str) -> str:
    """An interpreter given as a path or a command name, checked to exist and be runnable."""
    candidate = Path(python).expanduser()
    if candidate.is_dir():
        # `--python .venv` is what people type; accept the environment directory.
        for sub in ("bin/python", "bin/python3", "Scripts/python.exe"):
            if (candidate / sub).exists():
                return str(candidate / sub)
        raise InterpreterNotFound(f"{python} is a directory without bin/python")
    if os.sep in python or candidate.exists():
        if not candidate.exists():
            raise InterpreterNotFound(f"interpreter not found: {python}")
        if not os.access(candidate, os.X_OK):
            raise InterpreterNotFound(f"{python} is not executable")
        return str(candidate)
    found = shutil.which(python)
    if not found:
        raise InterpreterNotFound(f"interpreter not found on PATH: {python}")
    return found


def probe_args(*, torch: bool = True, canary: bool = False, image: str | None = None,
               cwd: str | None = None, deep: bool = False, cache: bool = True,
               progress: bool = False) -> list[str]:
    args = []
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


class ProbeProcess:
    """The probe running in another interpreter; ``result()`` waits for and parses its JSON."""

    def __init__(self, python: str, args: list[str], timeout: float | None = None,
                 on_stderr: Callable[[str], bool] | None = None) -> None:
        """``on_stderr`` sees each stderr line as it comes (deep progress) and returns True
        for the lines it consumed; the rest are kept for the error message."""
        self.python = resolve_python(python)
        self.on_stderr = on_stderr
        self.timeout = timeout or float(os.environ.get("ENVLOCK_PROBE_TIMEOUT", DEFAULT_PROBE_TIMEOUT))
        argv = [self.python, str(PROBE_PATH), *args]
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except OSError as exc:
            raise InterpreterNotFound(f"cannot run {python}: {exc.strerror or exc}") from None

    def cancel(self) -> None:
        """Stop a probe whose answer is no longer wanted (the lock turned out invalid)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()

    def _communicate(self) -> tuple[bytes, bytes]:
        if self.on_stderr is None:
            return self.proc.communicate(timeout=self.timeout)
        import threading

        assert self.proc.stderr is not None and self.proc.stdout is not None
        kept: list[bytes] = []
        stderr, callback = self.proc.stderr, self.on_stderr

        def pump() -> None:
            for raw in stderr:
                if not callback(raw.decode("utf-8", "replace")):
                    kept.append(raw)

        reader = threading.Thread(target=pump, name="envlock-probe-stderr", daemon=True)
        reader.start()
        timer = threading.Timer(self.timeout, self.proc.kill)
        timer.start()
        try:
            out = self.proc.stdout.read()
            self.proc.wait()
            reader.join()
        finally:
            timer.cancel()
            self.proc.stdout.close()
            stderr.close()
        if self.proc.returncode == -9 and not out:
            raise subprocess.TimeoutExpired(self.proc.args, self.timeout)
        return out, b"".join(kept)

    def result(self) -> dict[str, Any]:
        try:
            out, err = self._communicate()
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise ProbeFailed(f"the probe did not finish within {self.timeout:g}s") from None
        except KeyboardInterrupt:
            self.proc.kill()
            self.proc.communicate()
            raise
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
                         cwd: str | None = None, deep: bool = False) -> dict[str, Any]:
    from envlock import probe

    return probe.collect(torch="auto" if torch else "no", canary=canary, image=image, cwd=cwd,
                         deep=deep)


def build_lock(doc: dict[str, Any], *, note: str | None = None) -> Lock:
    """Validate a probe document as a lock (sealed, ready to save)."""
    from pydantic import ValidationError

    from envlock.lockfile import seal
    from envlock.model import Lock, Meta

    meta = Meta(tool_version=__version__, created_at=datetime.now(timezone.utc).replace(microsecond=0),
                note=note)
    try:
        lock = Lock.model_validate({**doc, "envlock": meta.model_dump()})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ProbeFailed(f"the probe reported a value envlock cannot lock: {where}: {err['msg']}") from None
    return seal(lock)


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
) -> Lock:
    """Capture the environment as a sealed ``Lock``.

    With no ``python``, this process is probed in-process (its live seeds and flags are what
    get recorded); with ``python``, that interpreter runs the probe. ``deep`` adds each
    distribution's on-disk digest (``files_sha256``); ``cache`` lets a probe in another
    interpreter reuse cached torch facts (never in-process: flags there are live state).
    """
    doc = capture_doc(python=python, torch=torch, canary=canary, image=image, cwd=cwd,
                      in_process=in_process, deep=deep, cache=cache)
    doc.pop("deep", None)
    return build_lock(doc, note=note)


def capture_doc(*, python: str | None = None, torch: bool = True, canary: bool = False,
                image: str | None = None, cwd: str | None = None, in_process: bool | None = None,
                deep: bool = False, cache: bool = False) -> dict[str, Any]:
    """The probe's document, with the ``--deep`` report under ``"deep"`` when asked for."""
    if in_process is None:
        in_process = python is None
    if in_process:
        return run_probe_in_process(torch=torch, canary=canary, image=image, cwd=cwd, deep=deep)
    progress = None
    if deep:
        from envlock.deepreport import Progress

        progress = Progress()
    proc = ProbeProcess(python or sys.executable,
                        probe_args(torch=torch, canary=canary, image=image, cwd=cwd, deep=deep,
                                   cache=cache, progress=progress is not None and progress.enabled),
                        on_stderr=progress.feed if progress is not None else None)
    import_heavy_modules()
    try:
        return proc.result()
    finally:
        if progress is not None:
            progress.close()


def import_heavy_modules() -> None:
    """Import pydantic, the models and tomlkit: called while a probe subprocess runs."""
    import_models()
    import tomlkit  # noqa: F401

    import envlock.lockfile  # noqa: F401


def import_models() -> None:
    """Import envlock's models without pydantic's plugin scan.

    Pydantic looks for plugins through the entry points of every installed distribution when
    the first model class is built (~46 us each); envlock's own models need none, so the scan
    is skipped for them. get_plugins() caches nothing while disabled, so models a training
    script defines later still get their plugins.
    """
    if "envlock.model" not in sys.modules:
        previous = os.environ.get("PYDANTIC_DISABLE_PLUGINS")
        os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
        try:
            import envlock.model  # noqa: F401
        finally:
            if previous is None:
                del os.environ["PYDANTIC_DISABLE_PLUGINS"]
            else:
                os.environ["PYDANTIC_DISABLE_PLUGINS"] = previous


def verify(
    lock: Lock | str | os.PathLike[str],
    *,
    python: str | None = None,
    torch: bool | None = None,
    in_process: bool | None = None,
    deep: bool = False,
) -> Comparison:
    """Capture now and compare with ``lock`` (a Lock or a path); the seal is checked first.

    ``deep``: also re-hash every installed file against its RECORD; each modified, missing or
    added file is a breaking difference (category ``files``).
    """
    from envlock.drift import compare
    from envlock.lockfile import check_seal, load

    if isinstance(lock, (str, os.PathLike)):
        expected = load(lock)
    else:
        check_seal(lock)
        expected = lock
    want_torch = expected.torch is not None if torch is None else torch
    doc = capture_doc(python=python, torch=want_torch,
                      canary=expected.canary is not None and want_torch, in_process=in_process,
                      deep=deep)
    from envlock.deepreport import align, merge

    report = doc.pop("deep", None)
    expected, current = align(expected, build_lock(doc))
    return merge(compare(expected, current), report, limit=None)
