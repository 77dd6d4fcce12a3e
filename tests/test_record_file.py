"""Writing a replay record: what is refused before the command runs rather than after it (a
record path that cannot be written), and the file written with the lock's atomic write."""

from __future__ import annotations

import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from helpers import REPO, make_lock

from envlock._record import Meta, Record, load, save
from envlock.commands import main


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return tmp_path


# -- refused before the command runs, not after it -------------------------------------------------


def _refused(here: Path, capsys: pytest.CaptureFixture[str], *args: str, tail: tuple[str, ...] = ()) -> str:
    """Runs ``envlock ARGS -- python -c <touch ran> TAIL``; asserts exit 2 and that nothing ran."""
    marker = here / "ran"
    code = main([*args, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')", *tail])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not marker.exists(), "the command ran before the refusal"
    assert "Traceback" not in err
    return err


def test_a_record_path_that_cannot_be_written_is_refused_before_the_run(
        here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(here, capsys, "record", "no/such/dir/run.record")
    assert "directory no/such/dir does not exist" in err
    (here / "adir").mkdir()
    assert "is a directory" in _refused(here, capsys, "record", "adir")
    # One wrong word must not cost the user a file that is not a record.
    script = here / "train.py"
    script.write_text("print('my training script')\n")
    assert "refusing to overwrite train.py: it is not a replay record" in _refused(here, capsys, "record", "train.py")
    assert script.read_text() == "print('my training script')\n"


def test_run_record_checks_its_record_path_before_the_image_is_built(
        here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_lock().save(here / "env.lock")
    err = _refused(here, capsys, "run", "env.lock", "--record", "missing/run.record", "--engine",
                   "unix:///nonexistent.sock")
    assert "directory missing does not exist" in err


# -- the file, written with the lock's atomic write ----------------------------------------------


def _record() -> Record:
    return Record(record=Meta(tool_version="0.1.0", created_at=datetime(2026, 1, 2, tzinfo=timezone.utc),
                              where="host", command=["python", "train.py"], exit_code=0))


def test_save_does_not_write_through_a_file_planted_at_a_predictable_temp_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    target = tmp_path / "run.record"
    os.symlink(victim, f"{target}.tmp-{os.getpid()}")
    save(_record(), target)
    assert victim.read_text() == "keep me\n"
    assert load(target).record.command == ["python", "train.py"]


def test_save_keeps_an_existing_records_mode_and_updates_a_links_target(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    real = shared / "run.record"
    save(_record(), real)
    real.chmod(0o640)
    link = tmp_path / "run.record"
    link.symlink_to(real)
    save(_record(), link)
    assert link.is_symlink() and (real.stat().st_mode & 0o777) == 0o640
    assert load(real).record.command == ["python", "train.py"]
    assert not [p for p in shared.iterdir() if p.name != "run.record"]  # no temp file left
