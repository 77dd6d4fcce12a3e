"""Verify: capture now and judge the environment against a lock.

The one verify path, used by ``envlock verify`` and ``envlock.verify()``. A verify reads the
lock's TOML once and decides from its tables which probe to start (``probe_wanted``); a probe
in another interpreter is started before the lock is validated and before the comparator is
imported, so that work runs beside the probe's.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from envlock.probing.capture import (
    StartedProbe,
    build_lock,
    run_probe_in_process,
)

if TYPE_CHECKING:
    from envlock.drift.expected import Restored
    from envlock.drift.result import Comparison
    from envlock.lock import Lock


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
    document: dict[str, Any] | None = None  # what the probe reported (for a kept answer's key)


def probe_wanted(tables: Collection[str], torch: bool | None) -> tuple[bool, bool]:
    """(import torch, run the canary): what the probe must find out to answer for a lock with
    these top-level tables. ``torch`` None follows the lock; False never imports torch, and
    without torch there is no canary to run."""
    want_torch = "torch" in tables if torch is None else torch
    return want_torch, want_torch and "canary" in tables


def probe_wanted_for(lock: Lock, torch: bool | None = None) -> tuple[bool, bool]:
    """``probe_wanted`` for a lock already read (its tables are the sections it has)."""
    return probe_wanted([name for name in ("torch", "canary") if getattr(lock, name) is not None],
                        torch)


def started_probe(lock_path: str | os.PathLike[str], tables: Collection[str], *, python: str | None,
                  torch: bool | None, deep: bool, cache: bool) -> StartedProbe:
    """The probe a verify of the lock at ``lock_path`` (whose top-level ``tables`` choose what
    it must find out, ``probe_wanted``) starts in another interpreter: the one choice for
    ``check`` and for verify's kept answer (``check/kept``). The lock being verified is left out
    of the git state, as capture leaves out the lock it writes: a lock not yet committed would
    otherwise show as an untracked file that was not there when it was captured."""
    want_torch, want_canary = probe_wanted(tables, torch)
    return StartedProbe(python, torch=want_torch, canary=want_canary, deep=deep, cache=cache,
                        git_exclude=[os.fspath(lock_path)])


def check(lock: Lock | str | os.PathLike[str], *, python: str | None = None,
          torch: bool | None = None, in_process: bool | None = None, strict: bool = False,
          deep: bool = False, cache: bool = False, limit: int | None = None,
          document: dict[str, Any] | None = None) -> Verification:
    """The one verify path (``verify()`` and ``envlock verify``); see ``verify`` for the options.

    ``torch``: None probes torch when the lock has it. ``cache``: reuse cached torch facts in
    another interpreter. ``limit``: files named per distribution by ``deep`` (None: all).
    A lock given as a path is parsed once; its tables choose the probe, which (in another
    interpreter) runs while the lock is validated and the comparator imported. ``document``:
    what that probe already reported (``started_probe``, run by a verify whose kept answer did
    not match), so it is not run again.
    """
    from envlock.lock import read_data

    if in_process is None:
        in_process = python is None
    data: dict[str, Any] | None = None
    if isinstance(lock, (str, os.PathLike)):
        # The lock being verified is left out of the git state, as capture leaves out the lock
        # it writes: a lock not yet committed would otherwise show as an untracked file that
        # was not there when it was captured.
        exclude = [os.fspath(lock)]
        data = read_data(lock)  # an unreadable file is reported before anything starts
        want_torch, want_canary = probe_wanted(data.keys(), torch)
    else:
        exclude = []
        want_torch, want_canary = probe_wanted_for(lock, torch)

    def expected_lock() -> Lock:
        if data is None:
            from envlock.lock import check_seal

            assert not isinstance(lock, (str, os.PathLike))
            check_seal(lock)
            return lock
        from envlock.lock import from_dict

        return from_dict(data, str(lock))

    if document is not None:
        expected = expected_lock()
        doc = dict(document)
    elif in_process:
        expected = expected_lock()
        doc = run_probe_in_process(torch=want_torch, canary=want_canary, deep=deep,
                                   git_exclude=exclude)
    elif data is not None:
        with started_probe(exclude[0], data.keys(), python=python, torch=torch, deep=deep,
                           cache=cache) as probe:
            expected = expected_lock()
            doc = probe.result()
    else:
        with StartedProbe(python, torch=want_torch, canary=want_canary, deep=deep, cache=cache,
                          git_exclude=exclude) as probe:
            expected = expected_lock()
            doc = probe.result()
    reported = dict(doc)
    report = doc.pop("deep", None)
    current = build_lock(doc)
    cmp = judge(expected, current, report, strict=strict,
                process_state="compare" if in_process else "report", limit=limit)
    return Verification(cmp, expected, current, report, reported)


def judge(expected: Lock, current: Lock, report: dict[str, Any] | None, *, strict: bool,
          process_state: Literal["compare", "report"], limit: int | None,
          restored: Restored | None = None) -> Comparison:
    """The verdict ``verify()``, ``envlock verify`` and restore's check inside an image all give:
    the comparison of the two locks, what a restore changed on purpose allowed for (``restored``:
    restore passes its plan's; elsewhere it is read from the image, when this is an image
    restored from ``expected``'s environment), and the ``--deep`` findings (``report``) merged in."""
    from envlock.drift.compare import compare, os_packages_come_from_base, os_packages_from_base
    from envlock.drift.deep import align, merge
    from envlock.drift.expected import allow, restored_here

    if restored is None:
        restored = restored_here(expected)
    cmp = compare(*align(expected, current), strict=strict, process_state=process_state,
                  expected_image_change=restored is not None and restored.image_change)
    if restored is not None:
        cmp = allow(cmp, restored, expected)
    elif os_packages_come_from_base():
        cmp = os_packages_from_base(cmp)
    return merge(cmp, report, limit=limit)
