"""One exception hierarchy, so the CLI can map every failure to a documented exit code.

The core never prints or exits; it raises one of these. ``exit_code`` is the CLI contract:
2 for anything wrong with the input (usage, invalid or tampered lock), 3 for a problem of the
environment around envlock (no engine, interpreter missing, build failed).
"""

from __future__ import annotations

EXIT_OK, EXIT_DRIFT, EXIT_USAGE, EXIT_ENV, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class EnvlockError(Exception):
    """Base class: a failure with a one-line, user-facing message."""

    exit_code: int = 3

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(EnvlockError):
    """The command line or API call itself is wrong."""

    exit_code = 2


class LockInvalid(EnvlockError):
    """The lock cannot be read or does not match the schema."""

    exit_code = 2


class LockTampered(LockInvalid):
    """The lock parses, but its fingerprint does not match its content (edited after capture)."""


class UnsafeValue(LockInvalid):
    """A value in the lock would reach a Dockerfile or shell and is not provably inert."""


class ProbeFailed(EnvlockError):
    """The probe could not run or did not return a JSON document."""

    exit_code = 3


class InterpreterNotFound(ProbeFailed):
    """The interpreter asked for (``--python``, or one tried inside an image) is not there or
    does not run."""


class TorchMissing(EnvlockError):
    """The command needs torch, and the environment has none: an environment problem."""

    exit_code = 3


class EngineUnavailable(EnvlockError):
    """No container engine is reachable, or it cannot do what was asked (pull, push, run)."""

    exit_code = 3


class ImageNotFound(EngineUnavailable):
    """The engine has no such image and cannot pull it."""


class ContainerFailed(EngineUnavailable):
    """The engine could not create or start a container (the command never ran)."""


class CommandNotFound(ContainerFailed):
    """The container's command is not in the image (no such executable on its PATH)."""


class BuildFailed(EnvlockError):
    """The image build failed; ``step`` and ``log_tail`` say where."""

    exit_code = 3

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
    """The lock names something that cannot be rebuilt (editable or local sources)."""

    exit_code = 3


class HostIncompatible(EnvlockError):
    """The host cannot run the lock's stack (driver too old, no GPU driver)."""

    exit_code = 3


class HashMismatch(EnvlockError):
    """A wheel's hash (or build) is not one the lock (or the bundle's manifest) allows."""

    exit_code = 3


class BadWheel(HashMismatch):
    """A file named like a wheel that is not one (not a zip, no RECORD)."""


class PlainHttp(UnsafeValue):
    """An ``http://`` URL without ``--allow-http``: anyone on the path can swap what it serves."""
