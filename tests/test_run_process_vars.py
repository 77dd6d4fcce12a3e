"""``envlock run`` sets again what the recorded process set itself, ENVLOCK_SEED_WORKERS
included (seed_everything(workers=False) must stay off in the replay)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import LockFactory

from envlock.restore.run import RunOptions, process_variables, run_in_image


def _lock(restore_lock: LockFactory, workers: str, *, by_process: bool = True) -> Any:
    names = ["ENVLOCK_SEED", "ENVLOCK_SEED_WORKERS"] if by_process else ["ENVLOCK_SEED"]
    return restore_lock(env={"ENVLOCK_SEED_WORKERS": workers},
                        determinism={"env": {"ENVLOCK_SEED": "1234"}, "process_env": names})


class _Engine:
    def __init__(self) -> None:
        self.spec: Any = None

    def run(self, spec: Any, **_: Any) -> Any:
        self.spec = spec
        return SimpleNamespace(exit_code=0)


@pytest.mark.parametrize("workers", ["0", "1"])
def test_run_passes_seed_workers_as_recorded(restore_lock: LockFactory, tmp_path: Path, workers: str) -> None:
    engine = _Engine()
    lock = _lock(restore_lock, workers)
    assert run_in_image(engine, lock, "sha256:" + "a" * 64, "t:1",  # type: ignore[arg-type]
                        RunOptions(command=["true"], gpus="none", workspace=tmp_path), python="python3") == 0
    assert engine.spec.env["ENVLOCK_SEED_WORKERS"] == workers
    assert engine.spec.env["ENVLOCK_SEED"] == "1234"


def test_twin_a_variable_set_before_start_is_the_images_not_run_s(restore_lock: LockFactory) -> None:
    assert "ENVLOCK_SEED_WORKERS" not in process_variables(_lock(restore_lock, "0", by_process=False))
    # Whatever the lock holds, only the two meanings pass.
    assert process_variables(_lock(restore_lock, "yes"))["ENVLOCK_SEED_WORKERS"] == "1"
