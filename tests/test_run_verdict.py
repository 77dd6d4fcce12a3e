"""``envlock run`` after a build says what the check inside the new image found (verify's own
head line) before the command's output; a run with --no-verify says it was not checked."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import LockFactory, fake_engine_run

from envlock.commands import main
from envlock.lock import save
from envlock.restore import restore as restore_mod


@pytest.fixture
def fake_run(restore_lock: LockFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    lock = restore_lock(packages=[("six", "1.17.0")])
    path = save(lock, tmp_path / "env.lock")
    fake_engine_run(monkeypatch, lock, lambda *a, **k: 0, cached=False)
    return path


def test_a_verified_build_prints_the_verdict(fake_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(fake_run), "--", "true"]) == 0
    err = capsys.readouterr().err
    assert f"{fake_run} inside envlock/x:1 (id " in err and err.count("\n") == 1, err


def test_twin_no_verify_says_it_was_not_checked(fake_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(fake_run), "--no-verify", "--", "true"]) == 0
    err = capsys.readouterr().err
    assert "built but not verified (--no-verify)" in err and "inside" not in err


def test_a_warning_is_named_not_only_counted(fake_run: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The check passed with a warning: `run` said "0 breaking, 1 warning, 45 info" and not
    which. The warning is named as verify names it; the info differences stay counted only."""
    from envlock.drift.result import Comparison, Difference
    from envlock.lock import load

    lock = load(fake_run)
    warning = Difference("packages", "duplicates.six", "1.16.0", None, "warning", "shadowed copy of six 1.16.0 gone")
    infos = tuple(Difference("packages", f"packages.p{i}.installer", "pip", "uv", "info") for i in range(3))
    monkeypatch.setattr(restore_mod, "verify_image_for", lambda *a: (lock, Comparison((warning, *infos))))
    assert main(["run", str(fake_run), "--", "true"]) == 0
    err = capsys.readouterr().err
    head, *rest = err.splitlines()
    assert head.endswith(": 0 breaking, 1 warning, 3 info")
    assert rest == ["  warning  duplicates.six  shadowed copy of six 1.16.0 gone"], err


def test_a_path_up_out_of_the_workspace_is_refused_before_anything_runs(
        restore_lock: LockFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Found as a user: ``cd sub && envlock run ../env.lock -- python ../train.py`` made the image
    ready, then failed inside with "can't open file '/workspace/../train.py'". The container
    sees the workspace alone, so the path is refused first, with the way out."""
    lock = restore_lock(packages=[("six", "1.17.0")])
    path = save(lock, tmp_path / "env.lock")
    ran: list[object] = []

    def runs(*a: object, **k: object) -> int:
        ran.append(a)
        return 0

    fake_engine_run(monkeypatch, lock, runs, cached=False)
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    # ./../sub/here.py is the workspace's own file, but inside it reads /sub/here.py: refused too
    (tmp_path / "sub" / "here.py").write_text("")
    for words in (["python", "../train.py"], ["python", "x.py", "--config=../conf"], ["../train.py"],
                  ["python", "./../sub/here.py"]):
        assert main(["run", str(path), "--", *words]) == 2
        err = capsys.readouterr().err
        assert "is outside the workspace" in err and "--workspace .. and train.py" in err, err
    assert not ran
    # the twin: a path that does not exist here may be the image's own, and one inside the
    # workspace is seen there; both run
    assert main(["run", str(path), "--", "python", "../not-here.py", "here.py", "d/../here.py"]) == 0
    assert main(["run", str(path), "--workspace", "..", "--", "python", "train.py"]) == 0
    assert len(ran) == 2
