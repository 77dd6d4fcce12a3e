"""Run the probe and turn its JSON into a ``Lock``.

From the command line the probe runs in a subprocess started *first*, so that importing torch
there (the bulk of a capture) overlaps with envlock importing pydantic and the models here. From a
training script (``envlock.capture()``) it runs in-process, because seeds and determinism
flags are live state that only that process knows.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from envlock.building import build_lock, import_heavy_modules
from envlock.errors import UnsafeValue, UsageError
from envlock.lockscan import lock_tables
from envlock.probeproc import PROBE_DIR, ProbeProcess, probe_args

if TYPE_CHECKING:
    from pathlib import Path

    # The probe package's directory, which runs as a program, and its stdlib-only OS package
    # reader (copied alone into images, restore.ospackages): made on first use by __getattr__,
    # so that verify does not import pathlib.
    PROBE_PATH: Path
    OSPKGS_PATH: Path
    from envlock.comparison import Comparison
    from envlock.deepreport import Progress
    from envlock.lock import Lock


def __getattr__(name: str) -> object:
    # The name first: the import system asks every module for ``__path__`` and friends.
    if name not in ("PROBE_PATH", "OSPKGS_PATH"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from pathlib import Path

    return Path(PROBE_DIR) if name == "PROBE_PATH" else Path(PROBE_DIR, "ospkgs.py")


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


def start_probe(python: str | None, *, deep: bool = False, prestarted: ProbeProcess | None = None,
                **options: Any) -> tuple[ProbeProcess, Progress | None]:
    """The probe started in ``python`` (``probe_args`` options), with ``--deep`` progress drawn
    on a terminal; ``finish_probe`` waits for its document.

    ``prestarted``: a probe ``early`` started from the raw arguments, used when its command
    line is exactly the one wanted here, and stopped otherwise.
    """
    progress = None
    if deep:
        from envlock.deepreport import Progress

        progress = Progress()
    args = probe_args(deep=deep, progress=progress is not None and progress.enabled, **options)
    if prestarted is not None:
        if progress is None and prestarted.argv == ProbeProcess.command(python or sys.executable, args):
            return prestarted, None
        prestarted.cancel()
    proc = ProbeProcess(python or sys.executable, args,
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


class Verification(NamedTuple):
    """A verify's verdict and what it was derived from, for a report to quote."""

    comparison: Comparison
    expected: Lock
    current: Lock
    deep: dict[str, Any] | None  # the --deep findings, as the probe reported them


def check(lock: Lock | str | os.PathLike[str], *, python: str | None = None,
          torch: bool | None = None, in_process: bool | None = None, strict: bool = False,
          deep: bool = False, cache: bool = False, early: bool = False,
          limit: int | None = None, prestarted: ProbeProcess | None = None) -> Verification:
    """The one verify path (``verify()`` and ``envlock verify``); see ``verify`` for the options.

    ``torch``: None probes torch when the lock has it. ``cache``: reuse cached torch facts in
    another interpreter. ``limit``: files named per distribution by ``deep`` (None: all).
    ``early`` starts the probe in another interpreter before the lock is read, deciding from
    its table names alone whether to import torch: the probe's import then overlaps reading
    the lock.
    ``prestarted``: the probe ``early`` may have started already; it is adopted when it is the
    one the early start here would start, and stopped otherwise.
    """
    if in_process is None:
        in_process = python is None
    started = None
    # The lock being verified is left out of the git state, as capture leaves out the lock it
    # writes: a lock not yet committed would otherwise show as an untracked file that was not
    # there when it was captured.
    exclude = [os.fspath(lock)] if isinstance(lock, (str, os.PathLike)) else []
    if isinstance(lock, (str, os.PathLike)):
        tables = lock_tables(lock) if early and not in_process else None
        if tables is not None:
            want = "torch" in tables if torch is None else torch
            started = start_probe(python, torch=want, canary="canary" in tables and want,
                                  deep=deep, cache=cache, prestarted=prestarted, git_exclude=exclude)
            prestarted = None
        try:
            from envlock.lock import load

            expected = load(lock)
        except BaseException:
            if started is not None:
                cancel_probe(*started)
            raise
    else:
        from envlock.lock import check_seal  # a Lock object means the models are imported

        check_seal(lock)
        expected = lock
    if prestarted is not None:
        prestarted.cancel()  # not the early path after all: nothing to adopt it for
    if started is None:
        want = expected.torch is not None if torch is None else torch
        doc = capture_doc(python=python, torch=want, canary=expected.canary is not None and want,
                          in_process=in_process, deep=deep, cache=cache, git_exclude=exclude)
    else:
        try:
            import envlock.deepreport  # what judge() needs, imported while the probe still runs
            import envlock.drift  # noqa: F401
        except BaseException:
            cancel_probe(*started)
            raise
        doc = finish_probe(*started)
    report = doc.pop("deep", None)
    current = build_lock(doc)
    cmp = judge(expected, current, report, strict=strict,
                process_state="compare" if in_process else "report", limit=limit)
    return Verification(cmp, expected, current, report)


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
