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
    code = ("import sys, envlock, envlock.cli; "
            "heavy = [m for m in ('pydantic', 'tomlkit', 'docker', 'rich', 'torch') if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
