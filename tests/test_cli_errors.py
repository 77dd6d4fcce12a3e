"""The error hierarchy the CLI maps to exit codes: every exception a user can meet is an
EnvlockError with a documented code."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import envlock
from envlock import errors
from envlock.errors import EXIT_DRIFT, EXIT_ENV, EXIT_USAGE, EnvlockError


def _exceptions_defined_in_envlock() -> list[type[BaseException]]:
    found = []
    for info in pkgutil.walk_packages(envlock.__path__, "envlock."):
        # The probe runs on its own, often in another interpreter: its errors end up as
        # probe.errors entries in the lock, never raised to the user.
        if info.name == "envlock.__main__" or info.name.startswith("envlock.probe"):
            continue
        module = importlib.import_module(info.name)
        found += [obj for _, obj in inspect.getmembers(module, inspect.isclass)
                  if issubclass(obj, BaseException) and not issubclass(obj, Warning)
                  and obj.__module__ == info.name]
    return found


def test_every_envlock_exception_is_an_envlock_error_with_a_documented_code() -> None:
    classes = _exceptions_defined_in_envlock()
    assert errors.UsageError in classes and errors.LockTampered in classes
    for cls in classes:
        if issubclass(cls, KeyboardInterrupt):  # a stop signal (errors.Interrupted): exit 128 + its number
            assert cls is errors.Interrupted and errors.interrupted_exit(cls(15)) == 143
            continue
        assert issubclass(cls, EnvlockError), cls
        # 1 for drift raised as an exception (distributed.RankMismatch), else 2 or 3.
        assert cls.exit_code in (EXIT_DRIFT, EXIT_USAGE, EXIT_ENV), cls
        assert cls.__doc__, f"{cls.__qualname__} needs a docstring saying why it exits {cls.exit_code}"


def test_input_problems_exit_2_environment_problems_3() -> None:
    usage: tuple[type[EnvlockError], ...] = (
        errors.UsageError, errors.LockInvalid, errors.LockTampered, errors.UnsafeValue)
    environment: tuple[type[EnvlockError], ...] = (
        errors.ProbeFailed, errors.InterpreterNotFound, errors.TorchMissing,
        errors.EngineUnavailable, errors.BuildFailed, errors.NotRestorable, errors.MissingExtra,
        errors.IndexUnavailable, errors.ArtifactsMissing)
    for cls in usage:
        assert cls("x").exit_code == EXIT_USAGE, cls
    for cls in environment:
        assert cls("x").exit_code == EXIT_ENV, cls


def test_message_and_hint_are_what_the_cli_prints() -> None:
    exc = errors.LockInvalid("env.lock is not valid TOML", hint="run envlock fmt")
    assert (str(exc), exc.message, exc.hint) == ("env.lock is not valid TOML",
                                                 "env.lock is not valid TOML", "run envlock fmt")
