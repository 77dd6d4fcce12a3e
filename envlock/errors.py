"""One exception hierarchy, so the CLI can map every failure to a documented exit code.

The core never prints or exits; it raises an ``EnvlockError`` subclass, and the CLI prints its
one-line ``message`` (and ``hint``) and returns its ``exit_code``. The codes are the contract
scripts and CI jobs rely on, documented in the README:

    0  ok / no drift               1  drift or differences found (raised: envlock.distributed.RankMismatch)
    2  the input is wrong: usage, an invalid, tampered or unsafe lock (the user fixes the input)
    3  the environment around envlock is wrong: no engine, interpreter or torch, a failed probe
       or build, an unreachable index (the same input can succeed elsewhere)
    130  interrupted (Ctrl-C); 143 stopped by SIGTERM (``kill``, a job scheduler), 129 by
         SIGHUP: 128 plus the signal's number, as shells report a process a signal ended

Every exception envlock raises for a user to read lives here, so the mapping is seen whole.
"""

from __future__ import annotations

import signal

EXIT_OK, EXIT_DRIFT, EXIT_USAGE, EXIT_ENV, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class Interrupted(KeyboardInterrupt):
    """A stop signal (SIGINT, SIGTERM, SIGHUP) on its way out as Ctrl-C's ``KeyboardInterrupt``
    (``envlock._signals``), so that every ``except KeyboardInterrupt`` and ``finally`` cleans up
    for all three; ``signum`` says which, for the exit code."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signum)
        self.signum = signum


def interrupted_exit(exc: KeyboardInterrupt) -> int:
    """The exit code of an interrupted command: 128 plus the signal's number (130 for a plain
    ``KeyboardInterrupt``, which is Ctrl-C's)."""
    return 128 + int(getattr(exc, "signum", signal.SIGINT))



class EnvlockError(Exception):
    """Base class: a failure with a one-line, user-facing message. Exit code 3 unless a
    subclass says otherwise: a failure nobody classified is more likely the environment's."""

    exit_code: int = EXIT_ENV

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


# -- 2: the input is wrong ---------------------------------------------------------------------


class UsageError(EnvlockError):
    """The command line or API call itself is wrong (2): rerunning it unchanged cannot help."""

    exit_code = EXIT_USAGE


class LockInvalid(EnvlockError):
    """The lock cannot be read or does not match the schema (2): the file is the problem."""

    exit_code = EXIT_USAGE


class LockTampered(LockInvalid):
    """The lock parses, but its fingerprint does not match its content (edited after capture):
    2, like any invalid lock, since `envlock fmt` after a deliberate edit fixes it."""


class UnsafeValue(LockInvalid):
    """A value in the lock would reach a Dockerfile or shell and is not provably inert (2)."""


class CompileCacheRefused(EnvlockError):
    """A compile cache (``envlock.save_compile_cache``, ``--compile-cache``) that is not one, is
    damaged, or was made by another torch or Triton than the environment's (2): torch would
    ignore it and compile cold without a word, so envlock refuses it instead."""

    exit_code = EXIT_USAGE


class PackDamaged(EnvlockError):
    """A pack (``envlock pack``) that is not exactly the files its ``SHA256SUMS`` lists, with
    those digests (2): a file changed, missing or unlisted, a link, or a ``SHA256SUMS`` that is
    not one. The pack is the input; another copy of it is the fix."""

    exit_code = EXIT_USAGE


# -- 3: the environment is wrong ---------------------------------------------------------------


class ProbeFailed(EnvlockError):
    """The probe could not run or did not return a JSON document (3)."""

    exit_code = EXIT_ENV


class ProbeTimeout(ProbeFailed):
    """The probe did not finish within its deadline (3): a hung interpreter, import or driver
    call. ``verify --fleet`` names such a node as timed out rather than failed."""


class CaptureIncomplete(EnvlockError):
    """``capture --strict``: the probe could not capture everything (``[[unreadable]]``), so
    no lock was written (3: the environment holds files the probe cannot read safely)."""

    exit_code = EXIT_ENV


class LockTooLarge(EnvlockError):
    """The lock of this environment would be larger than any command reads (3): nothing was
    written, since a lock that verify, show and diff refuse is no lock."""

    exit_code = EXIT_ENV


class InterpreterNotFound(ProbeFailed):
    """The interpreter asked for (``--python``, or one tried inside an image) is not there or
    does not run (3, like the probe failing: the path may well be right on another machine)."""


class OtherProgram(EnvlockError):
    """A replay's command would run another program than the record's (its first word found
    elsewhere on PATH: another interpreter, another environment), so nothing ran (3)."""

    exit_code = EXIT_ENV


class TorchMissing(EnvlockError):
    """The command needs torch, and the environment has none (3)."""

    exit_code = EXIT_ENV


class MissingExtra(EnvlockError):
    """An optional library a format needs (cyclonedx-python-lib) is not installed (3): one
    ``pip install`` next to envlock fixes it, the lock and options are fine."""

    exit_code = EXIT_ENV


# What a hint says when a wheelhouse would do: the option and the command that makes one.
WHEELHOUSE_HINT = "--wheelhouse DIR (made by `envlock bundle -o DIR` where the index is reachable)"


class IndexUnavailable(EnvlockError):
    """The package index could not be reached or answered nonsense (3)."""

    exit_code = EXIT_ENV


class ArtifactsMissing(EnvlockError):
    """Some package's file is on no index, or not in the wheelhouse (3): the lock is valid,
    the places searched lack the file."""

    exit_code = EXIT_ENV


class EngineUnavailable(EnvlockError):
    """No container engine is reachable, or it cannot do what was asked (pull, push, run): 3."""

    exit_code = EXIT_ENV


class ImageNotFound(EngineUnavailable):
    """The engine has no such image and cannot pull it."""


class ContainerFailed(EngineUnavailable):
    """The engine could not create or start a container (the command never ran)."""


class CommandNotFound(ContainerFailed):
    """The container's command is not in the image (no such executable on its PATH)."""


class BuildFailed(EnvlockError):
    """The image build failed (3); ``step`` and ``log_tail`` say where."""

    exit_code = EXIT_ENV

    def __init__(
        self,
        message: str,
        *,
        step: str | None = None,
        log_tail: list[str] | None = None,
        log_path: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.step = step
        self.log_tail = log_tail or []
        self.log_path = log_path


class NotRestorable(EnvlockError):
    """The lock names something that cannot be rebuilt (editable or local sources): 3, the lock
    is valid and records faithfully what this environment cannot provide."""

    exit_code = EXIT_ENV


class HostIncompatible(EnvlockError):
    """The host cannot run the lock's stack (driver too old, no GPU driver)."""

    exit_code = EXIT_ENV


class HashMismatch(EnvlockError):
    """A wheel's hash (or build) is not one the lock (or the bundle's manifest) allows."""

    exit_code = EXIT_ENV


class BadWheel(HashMismatch):
    """A file named like a wheel that is not one (not a zip, no RECORD)."""


class PlainHttp(UnsafeValue):
    """An ``http://`` URL without ``--allow-http``: anyone on the path can swap what it serves."""
