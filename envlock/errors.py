"""One exception hierarchy, so the CLI can map every failure to a documented exit code.

The core never prints or exits; it raises one of these. ``exit_code`` is the CLI contract:
2 for anything wrong with the input (usage, invalid or tampered lock), 3 for a problem of the
environment around envlock (no engine, interpreter missing, build failed).
"""

from __future__ import annotations

EXIT_OK, EXIT_DRIFT, EXIT_USAGE, EXIT_ENV, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

# The typing module costs milliseconds at import, and this module is on every path; mypy
# treats any name TYPE_CHECKING as the typing constant.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from envlock.distributed import CheckResult


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
    """``--python`` names something that is not a runnable interpreter."""


class TorchMissing(EnvlockError):
    """The command needs torch, and the environment has none: an environment problem."""

    exit_code = 3


class EngineUnavailable(EnvlockError):
    """No container engine is reachable."""

    exit_code = 3


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


class RankMismatch(EnvlockError):
    """Raised on every rank by ``distributed.check(raise_on_mismatch=True)``; ``result`` has
    the report. Exit code 1, like any drift: the ranks run different stacks."""

    exit_code = EXIT_DRIFT

    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.describe())
        self.result = result
