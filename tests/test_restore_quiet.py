"""``restore --quiet`` / ``run --quiet``: no build output, one summary line; every build ends
with that summary; a failed quiet build still names pip's error."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from test_restore_engine import FakeAPI, engine

from envlock.commands._parser import build_parser
from envlock.commands.run import split_run_args
from envlock.errors import BuildFailed
from envlock.restore.progress import PlainProgress, QuietProgress, make_progress

BUILDLOGS = Path(__file__).parent / "fixtures" / "buildlogs"


def _chunks(name: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in (BUILDLOGS / name).read_text(encoding="utf-8").splitlines()]


def test_a_quiet_build_prints_one_summary_line(tmp_path: Path) -> None:
    out = io.StringIO()
    engine(FakeAPI(_chunks("ok.jsonl"))).build(tmp_path, tag="t:1", labels={}, log_path=tmp_path / "build.log",
                                                progress=QuietProgress(out))
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("envlock: build: ") and "steps" in lines[0]
    assert "lines of output (all in build.log)" in lines[0]
    assert (tmp_path / "build.log").read_text()  # everything is still kept there


def test_twin_a_plain_build_shows_its_steps_and_ends_with_the_same_summary(tmp_path: Path) -> None:
    """Plain progress is envlock's: a line per step, the builder's own lines only in the log."""
    out = io.StringIO()
    engine(FakeAPI(_chunks("ok.jsonl"))).build(tmp_path, tag="t:1", labels={}, log_path=tmp_path / "build.log",
                                                progress=PlainProgress(out, tmp_path / "build.log"))
    lines = out.getvalue().splitlines()
    assert len(lines) > 3 and lines[-1].startswith("envlock: build: ")
    assert all(line.startswith("[") for line in lines[:-1]), lines
    assert lines[-1].endswith(f"(all in {tmp_path / 'build.log'})")


def test_a_quiet_failed_build_still_names_pips_error(tmp_path: Path) -> None:
    out = io.StringIO()
    with pytest.raises(BuildFailed, match=r"No matching distribution found for six==9\.9\.9"):
        engine(FakeAPI(_chunks("pip-fails.jsonl"))).build(tmp_path, tag="t:1", labels={},
                                                           log_path=tmp_path / "build.log",
                                                           progress=QuietProgress(out))
    assert out.getvalue().count("\n") == 1


@pytest.mark.parametrize("command", [["restore", "env.lock", "--quiet"], ["run", "env.lock", "-q", "--", "true"]])
def test_restore_and_run_take_quiet(command: list[str]) -> None:
    args = build_parser().parse_args(command)
    if command[0] == "run":
        assert split_run_args(args) == ["true"]  # run's options between the lock and --
    assert args.quiet is True
    assert isinstance(make_progress(io.StringIO(), quiet=True), QuietProgress)
