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
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envlock import __version__
from envlock.errors import InterpreterNotFound, ProbeFailed, UnsafeValue, UsageError

if TYPE_CHECKING:
    from envlock.drift import Comparison
    from envlock.model import Lock

PROBE_PATH = Path(__file__).with_name("probe.py")
CANARY_PATH = Path(__file__).with_name("kernels.py")
OSPKGS_PATH = Path(__file__).with_name("ospkgs.py")
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
               cwd: str | None = None) -> list[str]:
    args = []
    if not torch:
        args.append("--no-torch")
    if canary:
        args.append("--canary")
    if image:
        args += ["--image", image]
    if cwd:
        args += ["--cwd", cwd]
    return args


class ProbeProcess:
    """The probe running in another interpreter; ``result()`` waits for and parses its JSON."""

    def __init__(self, python: str, args: list[str], timeout: float | None = None) -> None:
        self.python = resolve_python(python)
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

    def result(self) -> dict[str, Any]:
        try:
            out, err = self.proc.communicate(timeout=self.timeout)
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
                         cwd: str | None = None) -> dict[str, Any]:
    from envlock import probe

    return probe.collect(torch="auto" if torch else "no", canary=canary, image=image, cwd=cwd)


def build_lock(doc: dict[str, Any], *, note: str | None = None) -> Lock:
    """Validate a probe document as a lock (sealed, ready to save)."""
    from pydantic import ValidationError

    from envlock.lockfile import seal
    from envlock.model import Lock, Meta
    from envlock.probe import scrub_string, secret_values

    if note:
        # The note comes from the user, not the probe: the same scrub, with this process's
        # secrets (`HF_TOKEN=... envlock capture --note "run with $HF_TOKEN"`).
        note = scrub_string(note, secret_values())
    # Timings differ on every run: in a committed lock they would be churn in every diff of
    # an unchanged environment, so they stay out (the model still reads older locks with them).
    doc = {**doc, "probe": {k: v for k, v in (doc.get("probe") or {}).items() if k != "duration_ms"}}
    if isinstance(doc.get("canary"), dict):
        doc["canary"] = {k: v for k, v in doc["canary"].items() if k != "duration_ms"}
    try:
        meta = Meta(tool_version=__version__, created_at=datetime.now(timezone.utc).replace(microsecond=0),
                    note=note)
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
) -> Lock:
    """Capture the environment as a sealed ``Lock``.

    With no ``python``, this process is probed in-process (its live seeds and flags are what
    get recorded); with ``python``, that interpreter runs the probe.
    """
    if image is not None:
        check_image_option(image)
    if in_process is None:
        in_process = python is None
    args = dict(torch=torch, canary=canary, image=image, cwd=cwd)
    if in_process:
        doc = run_probe_in_process(**args)  # type: ignore[arg-type]
    else:
        proc = ProbeProcess(python or sys.executable, probe_args(**args))  # type: ignore[arg-type]
        import_heavy_modules()
        doc = proc.result()
    return build_lock(doc, note=note)


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


def import_heavy_modules() -> None:
    """Import pydantic, the models and the lock writer: called while a probe subprocess runs.

    Pydantic looks for plugins through the entry points of every installed distribution when
    the first model class is built (~46 us each); envlock's own models need none, so the scan
    is skipped for them. get_plugins() caches nothing while disabled, so models a training
    script defines later still get their plugins.
    """
    if "envlock.model" not in sys.modules:
        previous = os.environ.get("PYDANTIC_DISABLE_PLUGINS")
        os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
        try:
            import envlock.model
        finally:
            if previous is None:
                del os.environ["PYDANTIC_DISABLE_PLUGINS"]
            else:
                os.environ["PYDANTIC_DISABLE_PLUGINS"] = previous
    import envlock.lockfile  # noqa: F401


def verify(
    lock: Lock | str | os.PathLike[str],
    *,
    python: str | None = None,
    torch: bool | None = None,
    in_process: bool | None = None,
    strict: bool = False,
) -> Comparison:
    """Capture now and compare with ``lock`` (a Lock or a path); the seal is checked first.

    ``strict``: warnings count as drift too (the result's ``ok`` is False on any warning).

    In-process (the default without ``python``), everything is compared, seeds and flags
    included: call it after ``envlock.apply()``. Another interpreter is a fresh process, so the
    recorded process state is reported in ``Comparison.process`` instead.
    """
    from envlock.drift import compare
    from envlock.lockfile import check_seal, load

    if isinstance(lock, (str, os.PathLike)):
        expected = load(lock)
    else:
        check_seal(lock)
        expected = lock
    if in_process is None:
        in_process = python is None
    want_torch = expected.torch is not None if torch is None else torch
    current = capture(python=python, torch=want_torch, canary=expected.canary is not None and want_torch,
                      in_process=in_process)
    return compare(expected, current, strict=strict,
                   process_state="compare" if in_process else "report")
