"""The public API: lazy, light, and not shadowed by submodules of the same name."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import envlock


def test_public_names_stay_callable_after_importing_every_submodule() -> None:
    for info in pkgutil.walk_packages(envlock.__path__, "envlock."):
        if info.name not in ("envlock.__main__", "envlock.probe"):
            importlib.import_module(info.name)
    for name in ("capture", "verify", "load", "compare", "seed_everything", "deterministic",
                 "apply", "worker_init_fn", "dataloader_generator", "canary"):
        assert callable(getattr(envlock, name)), name
    assert isinstance(envlock.Lock, type)


def test_import_is_light() -> None:
    code = ("import sys, envlock, envlock.commands; "
            "heavy = [m for m in ('pydantic', 'tomlkit', 'docker', 'rich', 'torch') if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_public_submodules_are_reachable_after_a_plain_import() -> None:
    # A fresh interpreter: in this one the test session has imported the submodules already,
    # which binds them on the package and would hide a missing lazy lookup.
    code = ("import sys, envlock; "
            "assert 'envlock.distributed' not in sys.modules; "
            "print(callable(envlock.distributed.check), callable(envlock.runtime.apply), "
            "envlock.errors.UsageError.exit_code, "
            "sorted(n for n in ('distributed', 'runtime', 'capture', 'Lock', 'lock') if n in dir(envlock)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split(" ", 3) == ["True", "True", "2", "['Lock', 'capture', 'distributed', 'lock', 'runtime']\n"]


def test_unknown_attribute_still_raises_attribute_error() -> None:
    try:
        envlock.no_such_thing  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("envlock.no_such_thing resolved")
