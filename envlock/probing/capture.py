"""Capture: run the probe and build the lock from its document.

Nothing here chooses an environment (``target`` does, for the command line) or decides what a
lock means; it runs the probe where it is told to and validates what comes back.

The probe runs in-process for ``envlock.capture()`` inside a training script, because seeds and
determinism flags are live state that only that process knows. Anywhere else it runs in the
chosen interpreter (``process``), started *before* pydantic and the models are imported, so
that the probe's own work (importing torch, above all) overlaps envlock's.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from envlock._version import __version__
from envlock.errors import ProbeFailed, UsageError
from envlock.probing.process import ProbeProcess, probe_args

if TYPE_CHECKING:
    from envlock.lock import Lock
    from envlock.probing.progress import Progress


def run_probe_in_process(*, torch: bool = True, canary: bool = False, image: str | None = None,
                         cwd: str | None = None, deep: bool = False,
                         git_exclude: Sequence[str] = ()) -> dict[str, Any]:
    """The probe in this process, for ``envlock.capture()`` inside a training script: seeds and
    determinism flags are live state only this process knows."""
    from envlock.probe.collect import collect
    from envlock.probe.statcache import file_cache_allowed

    return collect(torch="auto" if torch else "no", canary=canary, image=image, cwd=cwd,
                   deep=deep, git_exclude=[os.path.abspath(p) for p in git_exclude],
                   hash_cache=file_cache_allowed())


def run_probe_as_fresh(*, torch: bool, git_exclude: Sequence[str] = ()) -> dict[str, Any] | None:
    """The probe's document of this interpreter, collected in this process the way the probe
    run as a program in a fresh one collects it (``probe.collect.main``): torch's facts from
    the cache, never imported, and the directory this program's path starts with left out as
    the probe leaves out its own. None when torch is wanted and no facts of it are kept.

    Only for verify's kept check (``check.kept.probe_here`` says when): the document keys an
    answer and is never judged, so where it differs from the other interpreter's it is a miss.
    """
    from envlock.probe.collect import CACHED_ONLY, collect

    doc = collect(torch=CACHED_ONLY if torch else "no", cache=True, hash_cache=True,
                  skip_dir=os.path.abspath(sys.path[0] or os.getcwd()),
                  git_exclude=[os.path.abspath(p) for p in git_exclude])
    if torch and doc["probe"].get("torch_facts") != "cached":
        return None
    return doc


class StartedProbe:
    """The probe running in another interpreter, with ``--deep`` progress drawn on a terminal.

    A context manager: entering starts the probe, leaving stops it (a no-op once ``result`` has
    read its document). It runs in a session of its own, so the terminal's Ctrl-C never reaches
    it; envlock must stop it, or it outlives envlock.

    While it runs, Ctrl-C stops the probe at once and is answered as ``KeyboardInterrupt`` when
    envlock next waits on it (``result``) or leaves the block, not wherever the signal lands.
    The work done beside the probe is mostly importing pydantic and the models, and an exception
    raised in the middle of a third-party import can be swallowed there (a bare ``except``) or
    leave a half-imported module: the command then went on waiting for a probe that was never
    stopped. Deferring the exception to a point of envlock's own makes the outcome the same
    wherever the key is pressed. In the main thread only (Python delivers signals there).
    """

    def __init__(self, python: str | None, *, deep: bool = False, **options: Any) -> None:
        self.python = python or sys.executable
        self.progress: Progress | None = None
        if deep:
            from envlock.probing.progress import Progress

            self.progress = Progress()
        self.args = probe_args(deep=deep, progress=self.progress is not None and self.progress.enabled,
                               **options)
        self.interrupted = False
        self._previous: Any = None
        self.process: ProbeProcess | None = None

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.interrupted = True
        if self.process is not None:
            self.process.kill()
        previous = self._previous
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)  # a handler of the program's own (a training script's)

    def result(self) -> dict[str, Any]:
        """Wait for the probe's document."""
        assert self.process is not None, "StartedProbe is used as a context manager"
        try:
            doc = self.process.result()
        except ProbeFailed:
            if self.interrupted:
                raise KeyboardInterrupt from None
            raise
        finally:
            self._close_progress()
        if self.interrupted:
            raise KeyboardInterrupt
        return doc

    def cancel(self) -> None:
        if self.process is not None:
            self.process.cancel()
        self._close_progress()

    def _close_progress(self) -> None:
        if self.progress is not None:
            self.progress.close()

    def __enter__(self) -> StartedProbe:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            self.process = ProbeProcess(self.python, self.args,
                                        on_stderr=self.progress.feed if self.progress is not None else None)
        except BaseException:
            self._restore()
            raise
        return self

    def _restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.cancel()
        self._restore()
        if self.interrupted and kind is None:
            raise KeyboardInterrupt


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
    if in_process is None:
        in_process = python is None
    if in_process:
        from envlock.probe.collect import gc_paused

        with gc_paused():  # a training process: see gc_paused
            doc = run_probe_in_process(torch=torch, canary=canary, image=image, cwd=cwd,
                                       deep=deep, git_exclude=git_exclude)
            doc.pop("deep", None)
            return build_lock(doc, note=note)
    with StartedProbe(python, torch=torch, canary=canary, image=image, cwd=cwd, deep=deep,
                      cache=cache, git_exclude=git_exclude) as probe:
        import_heavy_modules()  # while the probe runs
        doc = probe.result()
    doc.pop("deep", None)
    return build_lock(doc, note=note)


def check_image_option(image: str) -> None:
    """Refuse a malformed ``--image`` before probing: it is the user's input (exit 2), not
    something the probe found wrong with the environment."""
    from envlock.probe import imageref

    try:
        imageref.parse(image)
    except imageref.InvalidReference as exc:
        raise UsageError(f"--image {image!r} is not an image reference: {exc.reason}",
                         hint="use REF[:TAG][@sha256:<64 hex digits>]") from None


def without_timings(doc: dict[str, Any]) -> dict[str, Any]:
    """Timings differ on every run: in a committed lock they would be churn in every diff of
    an unchanged environment, so they stay out (the model still reads older locks with them)."""
    doc = {**doc, "probe": {k: v for k, v in (doc.get("probe") or {}).items() if k != "duration_ms"}}
    if isinstance(doc.get("canary"), dict):
        doc["canary"] = {k: v for k, v in doc["canary"].items() if k != "duration_ms"}
    return doc


def build_lock(doc: dict[str, Any], *, note: str | None = None) -> Lock:
    """Validate a probe document as a lock (sealed, ready to save): the gate every value the
    probe reports passes before anything is written or compared."""
    from datetime import datetime, timezone

    from pydantic import ValidationError

    from envlock.lock import Lock, Meta, seal
    from envlock.probe.scrub import scrub_string, secret_values

    if note:
        # The note comes from the user, not the probe: the same scrub, with this process's
        # secrets (`HF_TOKEN=... envlock capture --note "run with $HF_TOKEN"`).
        note = scrub_string(note, secret_values())
    doc = without_timings(doc)
    try:
        meta = Meta(tool_version=__version__, created_at=datetime.now(timezone.utc).replace(microsecond=0),
                    note=note)
    except ValidationError as exc:
        raise UsageError(f"--note: {exc.errors()[0]['msg']}") from None
    doc = {**doc, "envlock": meta.model_dump()}
    try:
        try:
            lock = Lock.model_validate(doc)
        except ValidationError as exc:
            # One distribution with a value no lock may carry (a 300-character version, a shell
            # expression, a name that is not UTF-8) is that distribution's [[unreadable]] entry,
            # as a distribution whose files cannot be read is: never the whole capture's failure.
            doc = set_aside_bad_packages(doc, exc)
            lock = Lock.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ProbeFailed(f"the probe reported a value envlock cannot lock: {where}: {err['msg']}") from None
    except RecursionError:
        raise ProbeFailed("the probe reported values nested too deeply to be a lock") from None
    return seal(lock)


def set_aside_bad_packages(doc: dict[str, Any], exc: Any) -> dict[str, Any]:
    """``doc`` with the rows of ``packages`` and ``duplicates`` that ``exc`` (a pydantic
    ValidationError) refused moved to ``unreadable``; ``exc`` is raised again when it refused
    anything else, which is no single distribution's fault."""
    from envlock.probe.rules import unreadable

    bad: dict[tuple[str, int], str] = {}
    for err in exc.errors():
        loc = err["loc"]
        if loc[:2] == ("conda", "packages") and len(loc) > 2 and isinstance(loc[2], int):
            loc = ("conda.packages", *loc[2:])  # one conda record, set aside like a distribution
        if len(loc) < 2 or loc[0] not in ("packages", "duplicates", "conda.packages") \
                or not isinstance(loc[1], int):
            raise exc
        field = ".".join(str(p) for p in loc[2:]) or "entry"
        # The kind of error, not its message: a validator's message may quote the value.
        bad.setdefault((str(loc[0]), loc[1]), f"{field} ({err['type'].replace('_', ' ')})")
    doc = dict(doc)
    entries = list(doc.get("unreadable") or [])
    conda = dict(doc["conda"]) if isinstance(doc.get("conda"), dict) else {}
    rows = {"packages": doc.get("packages"), "duplicates": doc.get("duplicates"),
            "conda.packages": conda.get("packages")}
    for (table, index), why in sorted(bad.items()):
        row = rows[table][index]  # type: ignore[index]
        name = row.get("name") if isinstance(row, dict) else None
        entries.append(unreadable("conda" if table == "conda.packages" else "packages",
                                  f"a value no lock may carry: {why}",
                                  name if isinstance(name, str) else f"{table}-{index}"))
    for table in rows:
        if any(t == table for t, _ in bad):
            kept = [row for i, row in enumerate(rows[table] or ()) if (table, i) not in bad]
            if table == "conda.packages":
                doc["conda"] = {**conda, "packages": kept}
            else:
                doc[table] = kept
    doc["unreadable"] = entries
    return doc


def import_heavy_modules() -> None:
    """Import pydantic, the models, the reader and the writer: called while a probe runs."""
    from envlock.lock import Lock, save  # noqa: F401  (resolving them imports their modules)
