"""The seams of ``record`` / ``replay`` / ``run --record/--replay`` on this host: tolerances
are finite numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_replay_record import rec

from envlock.commands import main


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


# -- tolerances ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "1e400", "x"])
def test_a_tolerance_is_a_finite_number_not_below_zero(project: Path, value: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    rec([1.0]).save(project / "a.record")
    for option in ("--rtol", "--atol"):
        given = f"{option}={value}"  # argparse takes "-inf" after a space for an option
        assert main(["replay", "a.record", given]) == 2
        assert main(["replay", "a.record", given, "--", "true"]) == 2
        assert main(["replay", "a.record", "--against", "a.record", given]) == 2
        assert main(["run", "env.lock", "--replay", "a.record", given, "--", "true"]) == 2
        assert f"argument {option}: {value!r} is not a finite number >= 0" in capsys.readouterr().err


def test_twin_finite_tolerances_are_taken(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec([1.0]).save(project / "a.record")
    rec([1.0 + 1e-12]).save(project / "b.record")
    assert main(["replay", "a.record", "--against", "b.record", "--rtol", "0", "--atol", "1e-9"]) == 0
    assert "within rtol=0.0 atol=1e-09" in capsys.readouterr().out
